//! TLS to the server with MySQL's `ssl-mode` semantics, through mysql_async's rustls support
//! (feature `tls`); the modes' table is in the [crate docs](crate#tls).
//!
//! mysql_async 0.37's rustls verifier cannot skip the host name check alone, so `VERIFY_CA`
//! checks the name too: connect by a name the certificate has, or give the name it was made
//! for with [`TlsOptions::server_name`].

pub use distlock_core::conn::tlsmode::SslMode;
use distlock_core::conn::tlsmode::SslModeNames;
use distlock_core::conn::{ConnectionString, TlsFiles, TlsNames};
pub use distlock_core::conn::{TlsError, TlsErrorKind};
use distlock_core::{Error, Result};
use std::path::PathBuf;

/// MySQL's spellings of the modes (`VerifyFull` is `VERIFY_IDENTITY`; case and `-`/`_` do not
/// matter when parsing, as for the mysql client).
pub(crate) const MODES: SslModeNames = SslModeNames {
    param: "ssl-mode",
    modes: [
        "DISABLED",
        "PREFERRED",
        "REQUIRED",
        "VERIFY_CA",
        "VERIFY_IDENTITY",
    ],
    loose: true,
    ca_hint: "ssl-ca=PATH (PEM)",
    builtin_roots: true,
    krate: "distlock-mysql",
};

/// How to talk TLS to the server: the URL's `ssl-mode=`, `ssl-ca=`, `ssl-cert=` and
/// `ssl-key=` (MySQL's option names; `ssl_mode` etc. work too), or the same in code
/// ([`MysqlBuilderExt::tls`](crate::MysqlBuilderExt::tls)).
///
/// Files are read when the backend connects; their formats: docs/mysql.md, "TLS".
///
/// ```
/// use distlock_mysql::{SslMode, TlsOptions};
///
/// let tls = TlsOptions::new(SslMode::VerifyFull)
///     .ca("/etc/ssl/mysql/ca.pem")
///     .client_cert("/etc/ssl/mysql/app.pem", "/etc/ssl/mysql/app.key");
/// assert_eq!(tls.mode(), SslMode::VerifyFull);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    mode: SslMode,
    pub(crate) files: TlsFiles,
    server_name: Option<String>,
}

/// How the mysql client names its TLS files (PEM, or DER for certificates).
pub(crate) const NAMES: TlsNames = TlsNames {
    ca: &["ssl-ca", "ssl_ca"],
    cert: &["ssl-cert", "ssl_cert"],
    key: &["ssl-key", "ssl_key"],
};

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions::new(SslMode::default())
    }
}

impl TlsOptions {
    /// `mode`, no CA, no client certificate.
    pub fn new(mode: SslMode) -> Self {
        TlsOptions {
            mode,
            files: TlsFiles::new(NAMES).der_too(),
            server_name: None,
        }
    }

    /// Trust the CA certificates in `path` (`ssl-ca=PATH`), and only them.
    pub fn ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.files = self.files.with_ca(path);
        self
    }

    /// Present the client certificate chain in `cert` with its private key in `key`
    /// (`ssl-cert=PATH&ssl-key=PATH`), for accounts that `REQUIRE X509` (or `SUBJECT`,
    /// `ISSUER`).
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.files = self.files.with_client(cert, key);
        self
    }

    /// Check the server's certificate for `name` instead of the host connected to (a tunnel,
    /// a proxy, or an IP address the certificate does not name).
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The mode.
    pub fn mode(&self) -> SslMode {
        self.mode
    }

    /// Reads `ssl-mode`, `ssl-ca`, `ssl-cert` and `ssl-key` of a URL (absent: `PREFERRED`, or
    /// `VERIFY_CA` when `ssl-ca` is given, as the mysql client does).
    pub(crate) fn from_url(cs: &ConnectionString) -> Result<Self> {
        let files = TlsFiles::from_url(cs, NAMES)?.der_too();
        let mode = match MODES.from_url(cs, cs.param("ssl-mode").or(cs.param("ssl_mode")))? {
            None if files.ca().is_some() => SslMode::VerifyCa,
            m => m.unwrap_or_default(),
        };
        let tls = TlsOptions {
            files,
            ..TlsOptions::new(mode)
        };
        tls.check().map_err(|reason| cs.invalid(reason))?;
        Ok(tls)
    }

    /// The combinations that make no sense, and those this build cannot do.
    fn check(&self) -> std::result::Result<(), String> {
        let (ca, client) = (self.files.ca().is_some(), self.files.client().is_some());
        if self.mode == SslMode::Disable && (ca || client) {
            return Err(
                "ssl-mode=DISABLED with ssl-ca/ssl-cert: nothing would use them; \
                        drop them or choose REQUIRED, VERIFY_CA or VERIFY_IDENTITY"
                    .into(),
            );
        }
        MODES.check(self.mode, ca, ca || client, cfg!(feature = "tls"))
    }

    /// The driver's TLS settings (`None`: unencrypted), the files read now.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a file that cannot be read or holds no certificate or key.
    pub(crate) fn ssl_opts(&self) -> Result<Option<mysql_async::SslOpts>> {
        self.check().map_err(Error::InvalidArgument)?;
        #[cfg(not(feature = "tls"))]
        return Ok(None);
        #[cfg(feature = "tls")]
        imp::ssl_opts(self)
    }

    /// What a driver error of connecting says about TLS, if it is about TLS.
    pub(crate) fn explain(&self, e: &mysql_async::Error) -> Option<TlsError> {
        use mysql_async::{DriverError, Error as E};
        match e {
            E::Driver(DriverError::NoClientSslFlagFromServer) => Some(TlsError::new(
                TlsErrorKind::NotSupportedByServer,
                format!(
                    "the server does not support TLS, and {} needs it: give the server \
                     ssl_cert and ssl_key (have_ssl must be YES), or use ssl-mode=PREFERRED or \
                     DISABLED",
                    MODES.setting(self.mode)
                ),
            )),
            #[cfg(feature = "tls")]
            E::Io(_) => imp::classify_io(self, e),
            _ => None,
        }
    }
}

#[cfg(feature = "tls")]
mod imp {
    use super::*;
    use distlock_core::conn::{ClientCert, TlsWords};
    use mysql_async::{ClientIdentity, SslOpts};
    use rustls::AlertDescription;

    pub(super) fn ssl_opts(opts: &TlsOptions) -> Result<Option<SslOpts>> {
        let mode = opts.mode;
        let mut ssl = match mode {
            SslMode::Disable => return Ok(None),
            SslMode::Prefer | SslMode::Require => SslOpts::default()
                .with_danger_accept_invalid_certs(true)
                .with_danger_skip_domain_validation(true),
            SslMode::VerifyCa | SslMode::VerifyFull => {
                let ssl = SslOpts::default().with_danger_tls_hostname_override(
                    opts.server_name.clone().map(std::borrow::Cow::Owned),
                );
                match opts.files.read_ca()? {
                    Some(ca) => ssl
                        .with_root_certs(vec![ca.into()])
                        .with_disable_built_in_roots(true),
                    None => ssl,
                }
            }
        };
        if let Some((chain, key)) = opts.files.read_client()? {
            ssl = ssl.with_client_identity(Some(ClientIdentity::new(chain.into(), key.into())));
        }
        if mode == SslMode::Require && opts.files.ca().is_some() {
            tracing::warn!(
                "ssl-mode=REQUIRED does not check the server's certificate: ssl-ca is unused \
                 (use VERIFY_CA or VERIFY_IDENTITY to check it)"
            );
        }
        Ok(Some(ssl))
    }

    /// The rustls error anywhere in `e` (a TLS 1.3 server's alert after the handshake, when it
    /// checks the client's certificate, comes as an I/O error wrapping it), else a failed
    /// TLS setup.
    pub(super) fn classify_io(ctx: &TlsOptions, e: &mysql_async::Error) -> Option<TlsError> {
        if let Some(r) = distlock_core::conn::rustls_error(e) {
            return Some(classify(ctx, &r));
        }
        let mysql_async::Error::Io(mysql_async::IoError::Tls(other)) = e else {
            return None;
        };
        let message = format!("the TLS setup failed: {other}");
        Some(TlsError::new(TlsErrorKind::Handshake, message))
    }

    /// The rustls error of a handshake, in the words of the settings.
    fn classify(ctx: &TlsOptions, r: &rustls::Error) -> TlsError {
        use TlsErrorKind as K;
        let kind = match r {
            // A server may answer a client certificate it refuses (or the lack of one) with
            // handshake_failure: the message below hedges.
            rustls::Error::AlertReceived(AlertDescription::HandshakeFailure) => {
                K::ClientCertRejected
            }
            _ => TlsErrorKind::of_rustls(r, ctx.files.client().is_some()),
        };
        let message = match kind {
            K::WrongHost => format!(
                "the server's certificate is not valid for the host name ({r}); connect by a \
                 name the certificate has, or name it with TlsOptions::server_name{}",
                match ctx.mode {
                    SslMode::VerifyCa => " (with this driver VERIFY_CA checks the name too)",
                    _ => "",
                }
            ),
            K::Untrusted => format!(
                "the server's certificate is not trusted ({r}): it must chain to {}",
                match ctx.files.ca() {
                    Some(p) => format!("ssl-ca={}", p.display()),
                    None => "the built-in public roots (no ssl-ca given)".into(),
                }
            ),
            kind => {
                let cert = ctx
                    .files
                    .client()
                    .map(|(c, _)| format!(" ssl-cert={}", c.display()));
                // Without one, a refused handshake may be about something else: the message
                // hedges.
                let cert = cert
                    .as_deref()
                    .map_or(ClientCert::Unknown, ClientCert::Given);
                return TlsError::worded(kind, &r.to_string(), &WORDS, cert);
            }
        };
        TlsError::new(kind, message)
    }

    /// How the mysql client and the server name the TLS settings, for messages.
    const WORDS: TlsWords = TlsWords {
        ca: "ssl-ca=PATH",
        client_cert: "ssl-cert=PATH&ssl-key=PATH",
        server_ca: "ssl_ca",
        plain: "give the server ssl_cert and ssl_key, or use ssl-mode=PREFERRED or DISABLED",
    };
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;
    use std::path::Path;

    fn tls(url: &str) -> Result<TlsOptions> {
        TlsOptions::from_url(&ConnectionString::parse(url).expect("parse"))
    }

    #[test]
    fn url_options() {
        assert_eq!(tls("mysql://u@h/d").expect("ok").mode(), SslMode::Prefer);
        for (v, m) in [
            ("disabled", SslMode::Disable),
            ("Preferred", SslMode::Prefer),
            ("REQUIRED", SslMode::Require),
            ("verify_ca&ssl-ca=/x", SslMode::VerifyCa),
            ("verify-identity", SslMode::VerifyFull),
        ] {
            assert_eq!(
                tls(&format!("mysql://u@h/d?ssl-mode={v}")).expect(v).mode(),
                m
            );
        }
        let t = tls("mysql://u@h/d?ssl_ca=/ca.pem&ssl-cert=/c&ssl-key=/k").expect("ca");
        assert_eq!(t.mode(), SslMode::VerifyCa);
        assert_eq!(t.files.ca(), Some(Path::new("/ca.pem")));
        assert_eq!(t.files.client(), Some((Path::new("/c"), Path::new("/k"))));
        for bad in [
            "mysql://u@h/d?ssl-mode=maybe",
            "mysql://u@h/d?ssl-mode=VERIFY_CA",
            "mysql://u@h/d?ssl-mode=DISABLED&ssl-ca=/x",
            "mysql://u@h/d?ssl-cert=/c",
            "mysql://u@h/d?ssl-ca=",
        ] {
            assert!(tls(bad).is_err(), "{bad}");
        }
    }
}
