//! TLS to the server with libpq's `sslmode` semantics, through rustls (feature `tls`); what
//! each mode encrypts and checks: docs/postgres.md, *TLS*.

pub use distlock_core::conn::tlsmode::SslMode;
use distlock_core::conn::tlsmode::SslModeNames;
use distlock_core::conn::{ConnectionString, TlsFiles, TlsNames};
pub use distlock_core::conn::{TlsError, TlsErrorKind};
use distlock_core::{Error, Result};
use std::fmt;
use std::path::PathBuf;
use tokio_postgres::config::Host;

/// libpq's spellings of the modes.
pub(crate) const MODES: SslModeNames = SslModeNames {
    param: "sslmode",
    modes: ["disable", "prefer", "require", "verify-ca", "verify-full"],
    loose: false,
    ca_hint: "sslrootcert=PATH (PEM), or sslrootcert=system with verify-full",
    builtin_roots: false,
    krate: "distlock-postgres",
};

/// The certificates a server's certificate is checked against (`sslrootcert=`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RootCert {
    /// The CA certificates (PEM) in a file.
    File(PathBuf),
    /// The operating system's trusted roots (`sslrootcert=system`; only with
    /// `verify-full`, as libpq requires).
    System,
}

impl fmt::Display for RootCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootCert::File(p) => write!(f, "sslrootcert={}", p.display()),
            RootCert::System => f.write_str("sslrootcert=system (the system's trusted roots)"),
        }
    }
}

/// How libpq and PostgreSQL name the TLS settings, for messages.
const WORDS: distlock_core::conn::TlsWords = distlock_core::conn::TlsWords {
    ca: "sslrootcert=PATH",
    client_cert: "sslcert=PATH and sslkey=PATH",
    server_ca: "ssl_ca_file",
    plain: "turn `ssl = on` in the server's postgresql.conf, or use sslmode=prefer or disable",
};

/// How libpq names its TLS files.
const NAMES: TlsNames = TlsNames {
    ca: &["sslrootcert"],
    cert: &["sslcert"],
    key: &["sslkey"],
};

/// How to talk TLS to the server: the URL's `sslmode=`, `sslrootcert=`, `sslcert=` and
/// `sslkey=`, or the same given in code ([`PostgresBuilderExt::tls`](crate::PostgresBuilderExt::tls)).
/// What is read when (never `~/.postgresql/`, unlike libpq): docs/postgres.md, *TLS*.
///
/// ```
/// use distlock_postgres::{SslMode, TlsOptions};
///
/// let tls = TlsOptions::new(SslMode::VerifyFull)
///     .root_cert("/etc/ssl/pg/ca.pem")
///     .client_cert("/etc/ssl/pg/app.pem", "/etc/ssl/pg/app.key");
/// assert_eq!(tls.mode(), SslMode::VerifyFull);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    mode: SslMode,
    root: Option<RootCert>,
    client: Option<(PathBuf, PathBuf)>,
}

impl TlsOptions {
    /// `mode`, no root certificate, no client certificate.
    pub fn new(mode: SslMode) -> Self {
        TlsOptions {
            mode,
            ..Default::default()
        }
    }

    /// Trust the CA certificates (PEM) in `path` (`sslrootcert=PATH`).
    pub fn root_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.root = Some(RootCert::File(path.into()));
        self
    }

    /// Trust the operating system's roots (`sslrootcert=system`); needs
    /// [`SslMode::VerifyFull`].
    pub fn system_roots(mut self) -> Self {
        self.root = Some(RootCert::System);
        self
    }

    /// Present the client certificate chain in `cert` (PEM) with its private key in `key`
    /// (PEM: PKCS#8, PKCS#1 or SEC1), for servers that ask for one (`hostssl … cert`, or
    /// `clientcert=verify-ca|verify-full` in `pg_hba.conf`).
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client = Some((cert.into(), key.into()));
        self
    }

    /// The mode.
    pub fn mode(&self) -> SslMode {
        self.mode
    }

    /// The root certificates, if any.
    pub fn root(&self) -> Option<&RootCert> {
        self.root.as_ref()
    }

    /// Reads `sslmode`, `sslrootcert`, `sslcert` and `sslkey` of a URL.
    pub(crate) fn from_url(cs: &ConnectionString) -> Result<Self> {
        let mode = match cs.param("sslmode") {
            Some("allow") => {
                return Err(cs.invalid(
                    "sslmode=allow (unencrypted first, TLS only if refused) is not supported; \
                     use sslmode=prefer (TLS first) or disable",
                ))
            }
            v => MODES.from_url(cs, v)?.unwrap_or_default(),
        };
        let files = TlsFiles::from_url(cs, NAMES)?;
        let mut tls = TlsOptions::new(mode);
        match files.ca() {
            None => {}
            Some(p) if p.as_os_str() == "system" => tls = tls.system_roots(),
            Some(p) => tls = tls.root_cert(p),
        }
        if let Some((cert, key)) = files.client() {
            tls = tls.client_cert(cert, key);
        }
        tls.check().map_err(|reason| cs.invalid(reason))?;
        Ok(tls)
    }

    /// The combinations libpq refuses, and those this build cannot do.
    fn check(&self) -> std::result::Result<(), String> {
        if self.root == Some(RootCert::System) && self.mode != SslMode::VerifyFull {
            return Err(format!(
                "sslrootcert=system needs sslmode=verify-full (a public CA signs certificates \
                 for anyone's host, so only the host name check makes it safe), not {}",
                MODES.setting(self.mode)
            ));
        }
        let files = self.root.is_some() || self.client.is_some();
        MODES.check(self.mode, self.root.is_some(), files, cfg!(feature = "tls"))
    }

    /// Checks the options and reads the files: the connector every connection to `config`'s
    /// hosts uses. Sets the driver's `sslmode` (libpq ignores sslmode on unix sockets, and the
    /// server offers no TLS there).
    pub(crate) fn connector(&self, config: &mut tokio_postgres::Config) -> Result<Tls> {
        use tokio_postgres::config::SslMode as D;
        self.check().map_err(Error::InvalidArgument)?;
        let tcp = config.get_hosts().iter().any(|h| matches!(h, Host::Tcp(_)));
        config.ssl_mode(match self.mode {
            _ if !tcp || self.mode == SslMode::Disable => D::Disable,
            SslMode::Prefer => D::Prefer,
            _ => D::Require,
        });
        // The one host connected to, if there is one, for messages.
        let host = match config.get_hosts() {
            [Host::Tcp(h)] => Some(h.clone()),
            _ => None,
        };
        Tls::new(self, host)
    }
}

/// The TLS connector every connection of a backend uses, with what its errors need to say
/// about the settings: the options, and the one host connected to, when there is one.
pub(crate) struct Tls {
    pub(crate) opts: TlsOptions,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    host: Option<String>,
    #[cfg(feature = "tls")]
    config: tokio_postgres_rustls::MakeRustlsConnect,
}

impl Tls {
    #[cfg(feature = "tls")]
    fn host_name(&self) -> String {
        self.host
            .as_ref()
            .map(|h| format!("`{h}`"))
            .unwrap_or_else(|| "connected to".into())
    }

    /// What of the server's certificate is checked, in words.
    pub(crate) fn checks(&self) -> &'static str {
        let mode = self.opts.mode;
        let chain = mode != SslMode::Disable && self.opts.root.is_some();
        SslMode::checked(chain, mode == SslMode::VerifyFull)
    }

    /// What a driver error of connecting says about TLS, if it is about TLS.
    pub(crate) fn explain(&self, e: &tokio_postgres::Error) -> Option<TlsError> {
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            if s.to_string() == "server does not support TLS" {
                return Some(TlsError::new(
                    TlsErrorKind::NotSupportedByServer,
                    format!(
                        "the server does not support TLS (it refused the TLS request), and {} \
                         needs it: {}",
                        MODES.setting(self.opts.mode),
                        WORDS.plain
                    ),
                ));
            }
            #[cfg(feature = "tls")]
            {
                // The handshake's error, and an alert after it (TLS 1.3 servers check the
                // client's certificate then), come as I/O errors wrapping the rustls error.
                if let Some(r) = distlock_core::conn::rustls_error(s) {
                    return Some(imp::classify(self, &r));
                }
                if let Some(t) = s
                    .downcast_ref::<std::io::Error>()
                    .and_then(|io| imp::bad_name(self, io))
                {
                    return Some(t);
                }
            }
            source = s.source();
        }
        None
    }
}

#[cfg(not(feature = "tls"))]
mod imp {
    use super::*;

    pub(crate) type Stream = tokio_postgres::tls::NoTlsStream;

    impl Tls {
        pub(super) fn new(opts: &TlsOptions, host: Option<String>) -> Result<Self> {
            let opts = opts.clone();
            Ok(Tls { opts, host })
        }

        /// The connector handed to tokio-postgres.
        pub(crate) fn connector(&self) -> tokio_postgres::NoTls {
            tokio_postgres::NoTls
        }
    }
}

#[cfg(feature = "tls")]
mod imp {
    use super::*;
    use distlock_core::conn::{ClientCert, ServerCheck};
    use tokio_postgres::tls::MakeTlsConnect;
    use tokio_postgres::Socket;
    use tokio_postgres_rustls::MakeRustlsConnect;

    /// An encrypted connection to the server (tokio-postgres-rustls's, with SCRAM's
    /// `tls-server-end-point` channel binding).
    pub(crate) type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

    /// What of the server's certificate `opts` checks (its files: the roots only when they are
    /// a file): nothing without roots (libpq's prefer/require encrypt without checking), the
    /// chain with them, the name too for verify-full.
    fn check(opts: &TlsOptions, files: &TlsFiles) -> Result<ServerCheck> {
        let roots = match (&opts.root, opts.mode) {
            (None, _) | (_, SslMode::Disable) => return Ok(ServerCheck::None),
            (Some(RootCert::File(_)), _) => {
                files.roots()?.unwrap_or_else(rustls::RootCertStore::empty)
            }
            (Some(RootCert::System), _) => {
                distlock_core::conn::system_roots().map_err(|e| match e {
                    Error::InvalidArgument(m) => Error::InvalidArgument(format!(
                        "sslrootcert=system: {m} (sslrootcert=PATH)"
                    )),
                    other => other,
                })?
            }
        };
        Ok(match opts.mode {
            SslMode::VerifyFull => ServerCheck::ChainAndName(roots),
            _ => ServerCheck::Chain(roots),
        })
    }

    impl Tls {
        pub(super) fn new(opts: &TlsOptions, host: Option<String>) -> Result<Self> {
            let mut files = TlsFiles::new(NAMES);
            if let Some(RootCert::File(p)) = &opts.root {
                files = files.with_ca(p);
            }
            if let Some((cert, key)) = &opts.client {
                files = files.with_client(cert, key);
            }
            let mut config = files.client_config(check(opts, &files)?)?;
            // PostgreSQL 17's direct TLS (sslnegotiation=direct) needs it; older servers
            // ignore it.
            config.alpn_protocols = vec![b"postgresql".to_vec()];
            Ok(Tls {
                opts: opts.clone(),
                host,
                config: MakeRustlsConnect::new(config),
            })
        }

        /// The connector handed to tokio-postgres.
        pub(crate) fn connector(&self) -> MakeRustlsConnect {
            self.config.clone()
        }
    }

    /// The rustls error of a handshake, in the words of the settings.
    pub(super) fn classify(ctx: &Tls, e: &rustls::Error) -> TlsError {
        use TlsErrorKind as K;
        let root = ctx
            .opts
            .root
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| "sslrootcert".into());
        match TlsErrorKind::of_rustls(e, ctx.opts.client.is_some()) {
            K::WrongHost => TlsError::new(
                K::WrongHost,
                format!(
                    "the server's certificate is not valid for the host name {} ({e}); \
                     sslmode=verify-full checks it: connect by a name (or address) the \
                     certificate lists, or use sslmode=verify-ca to check the chain only",
                    ctx.host_name()
                ),
            ),
            K::Untrusted => TlsError::new(
                K::Untrusted,
                format!(
                    "the server's certificate is not trusted by {root} ({e}): give the CA \
                     that signed it in sslrootcert=, or use sslmode=require without \
                     sslrootcert to encrypt without checking"
                ),
            ),
            kind => {
                let cert = ctx
                    .opts
                    .client
                    .as_ref()
                    .map(|(c, _)| format!(" sslcert={}", c.display()));
                let cert = cert.as_deref().map_or(ClientCert::None, ClientCert::Given);
                TlsError::worded(kind, &e.to_string(), &WORDS, cert)
            }
        }
    }

    /// A host name tokio-postgres-rustls could not make a TLS server name of.
    pub(super) fn bad_name(ctx: &Tls, io: &std::io::Error) -> Option<TlsError> {
        io.get_ref()?
            .downcast_ref::<rustls::pki_types::InvalidDnsNameError>()?;
        Some(TlsError::new(
            TlsErrorKind::WrongHost,
            format!(
                "{} is not a host name or IP address a certificate can be checked against \
                 ({})",
                ctx.host_name(),
                MODES.setting(ctx.opts.mode)
            ),
        ))
    }
}

pub(crate) use imp::Stream;

#[cfg(test)]
mod tests {
    use super::*;

    fn url(q: &str) -> Result<TlsOptions> {
        TlsOptions::from_url(&ConnectionString::parse(&format!(
            "postgres://u:pw@h/d?{q}"
        ))?)
    }

    #[test]
    fn url_parameters() {
        assert_eq!(url("").unwrap().mode(), SslMode::Prefer);
        assert_eq!(url("sslmode=disable").unwrap().mode(), SslMode::Disable);
        let t = url("sslmode=verify-full&sslrootcert=/ca.pem&sslcert=/c&sslkey=/k").unwrap();
        assert_eq!(
            t,
            TlsOptions::new(SslMode::VerifyFull)
                .root_cert("/ca.pem")
                .client_cert("/c", "/k")
        );
        let t = url("sslmode=verify-full&sslrootcert=system").unwrap();
        assert_eq!(t.root(), Some(&RootCert::System));
        for bad in [
            "sslmode=allow",
            "sslmode=strict",
            "sslmode=verify-ca",
            "sslmode=verify-full",
            "sslmode=require&sslrootcert=system",
            "sslmode=verify-ca&sslrootcert=",
            "sslcert=/c",
            "sslkey=/k",
        ] {
            let e = url(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidUrl { .. }), "{bad}: {e}");
            assert!(!e.to_string().contains("pw"), "{e}");
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn unreadable_files_are_named() {
        let tls = TlsOptions::new(SslMode::VerifyCa).root_cert("/nonexistent/ca.pem");
        let Err(e) = tls.connector(&mut tokio_postgres::Config::new()) else {
            panic!("a missing root certificate file is refused")
        };
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(
            e.to_string().contains("sslrootcert=/nonexistent/ca.pem"),
            "{e}"
        );
    }
}
