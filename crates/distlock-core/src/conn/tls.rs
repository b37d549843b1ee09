//! The one TLS error of every backend.

use std::fmt;

/// What went wrong with TLS, as the `source` of an
/// [`Error::Connection`](crate::Error::Connection): downcast it to tell the cases apart.
///
/// Every backend that speaks TLS gives this type (re-exported by each, e.g.
/// `distlock_postgres::TlsError`), so one downcast serves them all. Its `Display` is the
/// actionable message, in the words of the backend's settings (e.g. `sslrootcert=` or
/// `ssl-ca=`).
///
/// ```
/// use distlock_core::conn::{TlsError, TlsErrorKind};
/// use distlock_core::Error;
///
/// let e = Error::connection(
///     "postgres",
///     "db:5432",
///     TlsError::new(TlsErrorKind::Expired, "the certificate expired"),
/// );
/// if let Error::Connection { source, .. } = &e {
///     let tls = source.downcast_ref::<TlsError>().expect("a TLS error");
///     assert_eq!(tls.kind(), TlsErrorKind::Expired);
///     assert_eq!(tls.to_string(), "TLS: the certificate expired");
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    kind: TlsErrorKind,
    message: String,
}

/// The kinds of [`TlsError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsErrorKind {
    /// The server does not offer TLS (PostgreSQL `ssl = off`, MySQL `have_ssl` not `YES`,
    /// a plain-text port), and the mode needs it.
    NotSupportedByServer,
    /// The server's certificate does not chain to the trusted root certificates.
    Untrusted,
    /// The certificate is not valid for the host name.
    WrongHost,
    /// The certificate has expired or is not valid yet.
    Expired,
    /// The server refused the client certificate, or wanted one and got none.
    ClientCertRejected,
    /// Any other failure of the handshake or of the TLS setup.
    Handshake,
}

impl TlsError {
    /// A TLS error of `kind`; `message` says what failed and what to do about it (it is the
    /// `Display`, after `TLS: `). It must not hold secrets.
    pub fn new(kind: TlsErrorKind, message: impl Into<String>) -> Self {
        TlsError {
            kind,
            message: message.into(),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> TlsErrorKind {
        self.kind
    }

    /// The message, without the `TLS: ` that `Display` puts in front.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// How a backend names its TLS settings and its server's, for [`TlsError::worded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsWords {
    /// How the user names the CA to trust, e.g. "`?cacert=PATH`" or "ssl-ca=PATH".
    pub ca: &'static str,
    /// How the user gives a client certificate, e.g. "`?cert=PATH&key=PATH`".
    pub client_cert: &'static str,
    /// The server's setting of the CAs it takes client certificates from, e.g.
    /// "--trusted-ca-file".
    pub server_ca: &'static str,
    /// What to do about a server that did not answer with TLS, e.g. "is it a plain-http
    /// member? Then use etcd:// instead of etcds://".
    pub plain: &'static str,
}

/// The client certificate of a failed handshake, for [`TlsError::worded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCert<'a> {
    /// Not known (an application's own driver settings).
    Unknown,
    /// None was given.
    None,
    /// This one, as the user gave it (e.g. `sslcert=/etc/app.pem`; empty when there is
    /// nothing to name).
    Given(&'a str),
}

impl TlsError {
    /// The error of `kind` in the words of a backend's settings: `detail` is what failed
    /// (rustls's reason, or what the connection did).
    ///
    /// ```
    /// use distlock_core::conn::{ClientCert, TlsError, TlsErrorKind, TlsWords};
    ///
    /// const WORDS: TlsWords = TlsWords {
    ///     ca: "`?cacert=PATH`",
    ///     client_cert: "`?cert=PATH&key=PATH`",
    ///     server_ca: "--trusted-ca-file",
    ///     plain: "use etcd:// instead",
    /// };
    /// let e = TlsError::worded(TlsErrorKind::Untrusted, "UnknownIssuer", &WORDS, ClientCert::None);
    /// assert!(e.message().contains("name the CA that signed it with `?cacert=PATH`"));
    /// let e = TlsError::worded(
    ///     TlsErrorKind::ClientCertRejected, "BadCertificate", &WORDS, ClientCert::Given(" cert=/c.pem"),
    /// );
    /// assert!(e.message().contains("refused the client certificate cert=/c.pem"));
    /// ```
    pub fn worded(
        kind: TlsErrorKind,
        detail: &str,
        words: &TlsWords,
        cert: ClientCert<'_>,
    ) -> TlsError {
        let TlsWords {
            ca,
            client_cert,
            server_ca,
            plain,
        } = words;
        use TlsErrorKind as K;
        let message = match (kind, cert) {
            (K::Untrusted, _) => format!(
                "the server's certificate is not trusted ({detail}); name the CA that signed it \
                 with {ca}"
            ),
            (K::WrongHost, _) => format!(
                "the server's certificate is not valid for the host or address in the URL \
                 ({detail}); connect by a name or address its certificate lists"
            ),
            (K::Expired, _) => format!(
                "the server's certificate has expired or is not valid yet ({detail}); renew it, \
                 or check the clocks"
            ),
            (K::ClientCertRejected, ClientCert::Given(c)) => format!(
                "the server refused the client certificate{c} ({detail}); it must be signed by \
                 a CA in the server's {server_ca} and not be expired"
            ),
            (K::ClientCertRejected, ClientCert::None) => format!(
                "the server requires a client certificate ({detail}); give one with \
                 {client_cert} (PEM files)"
            ),
            (K::ClientCertRejected, ClientCert::Unknown) => format!(
                "the server refused the client certificate, or wanted one and got none \
                 ({detail}); give one signed by a CA in the server's {server_ca} with \
                 {client_cert}"
            ),
            (K::NotSupportedByServer, _) => {
                format!("the server did not answer with TLS ({detail}); {plain}")
            }
            _ => format!("the TLS handshake failed ({detail})"),
        };
        TlsError::new(kind, message)
    }
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS: {}", self.message)
    }
}

impl std::error::Error for TlsError {}

#[cfg(feature = "rustls")]
impl TlsErrorKind {
    /// The kind of a rustls handshake error, whatever the backend (feature `rustls`): a
    /// certificate the client rejected by why (host name, validity period, anything else:
    /// untrusted), an alert by which the server rejected the client's certificate (or its
    /// absence) — `DecryptError` too when `client_cert_given` (what OpenSSL answers a
    /// certificate whose issuer's name it knows but whose signature does not check) — and
    /// [`Handshake`](Self::Handshake) for the rest. The backend words the message.
    ///
    /// ```
    /// use distlock_core::conn::TlsErrorKind;
    /// use rustls::{AlertDescription, CertificateError, Error};
    ///
    /// let expired = Error::InvalidCertificate(CertificateError::Expired);
    /// assert_eq!(TlsErrorKind::of_rustls(&expired, false), TlsErrorKind::Expired);
    /// let decrypt = Error::AlertReceived(AlertDescription::DecryptError);
    /// assert_eq!(TlsErrorKind::of_rustls(&decrypt, true), TlsErrorKind::ClientCertRejected);
    /// assert_eq!(TlsErrorKind::of_rustls(&decrypt, false), TlsErrorKind::Handshake);
    /// ```
    pub fn of_rustls(e: &rustls::Error, client_cert_given: bool) -> TlsErrorKind {
        use rustls::{AlertDescription as A, CertificateError as C};
        match e {
            rustls::Error::InvalidCertificate(c) => match c {
                C::NotValidForName | C::NotValidForNameContext { .. } => TlsErrorKind::WrongHost,
                C::Expired
                | C::ExpiredContext { .. }
                | C::NotValidYet
                | C::NotValidYetContext { .. } => TlsErrorKind::Expired,
                _ => TlsErrorKind::Untrusted,
            },
            rustls::Error::AlertReceived(
                A::CertificateRequired
                | A::BadCertificate
                | A::UnknownCA
                | A::CertificateUnknown
                | A::UnsupportedCertificate
                | A::CertificateExpired
                | A::CertificateRevoked
                | A::AccessDenied,
            ) => TlsErrorKind::ClientCertRejected,
            rustls::Error::AlertReceived(A::DecryptError) if client_cert_given => {
                TlsErrorKind::ClientCertRejected
            }
            _ => TlsErrorKind::Handshake,
        }
    }
}

/// The rustls error in `e` or its chain of sources (feature `rustls`), when there is one:
/// tokio-rustls hands it over wrapped in an [`std::io::Error`], whose `source()` skips it, so
/// those are opened too, also inside an `Arc<dyn Error + Send + Sync>` (as redis-rs keeps it).
///
/// ```
/// use distlock_core::conn::rustls_error;
/// use std::sync::Arc;
///
/// let alert = rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA);
/// let io = || std::io::Error::new(std::io::ErrorKind::InvalidData, alert.clone());
/// assert_eq!(rustls_error(&io()), Some(alert.clone()));
/// let kept: Arc<dyn std::error::Error + Send + Sync> = Arc::new(io());
/// assert_eq!(rustls_error(&kept), Some(alert));
/// assert_eq!(rustls_error(&std::io::Error::other("no TLS here")), None);
/// ```
#[cfg(feature = "rustls")]
pub fn rustls_error(e: &(dyn std::error::Error + 'static)) -> Option<rustls::Error> {
    let mut cur = Some(e);
    // A bound, should a chain ever loop.
    for _ in 0..16 {
        let err = cur?;
        let inner: &(dyn std::error::Error + 'static) = err
            .downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()
            .map_or(err, |arc| arc.as_ref());
        let wrapped = inner
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>());
        if let Some(r) = inner.downcast_ref::<rustls::Error>().or(wrapped) {
            return Some(r.clone());
        }
        cur = err.source();
    }
    None
}

/// The crypto provider of every TLS connection dlock makes (feature `rustls`): aws-lc-rs,
/// the one provider compiled in.
#[cfg(feature = "rustls")]
pub fn crypto_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Installs [`crypto_provider`] as the process-wide default, for drivers that build their
/// rustls configuration on it (feature `rustls`); a provider the program installed first
/// stays.
#[cfg(feature = "rustls")]
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// The one trust-store rule (feature `rustls`): with no CA file, the system's CA certificates
/// (as `rustls-native-certs` finds them); certificates it cannot parse are skipped.
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the system has no usable CA
/// certificate at all (then name a CA file).
#[cfg(feature = "rustls")]
pub fn system_roots() -> crate::Result<rustls::RootCertStore> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = rustls::RootCertStore::empty();
    let (_added, _skipped) = store.add_parsable_certificates(found.certs);
    if store.is_empty() {
        let why = found
            .errors
            .first()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        return Err(crate::Error::InvalidArgument(format!(
            "no trusted root certificate found on this system{why}; install the CA \
             certificates (Debian: ca-certificates) or name a CA file"
        )));
    }
    Ok(store)
}
