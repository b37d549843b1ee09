//! Telling a TLS failure apart in the error a driver returned, in a backend's words.
#![cfg(feature = "rustls")]

use super::{rustls_error, ClientCert, TlsError, TlsErrorKind, TlsWords};
use std::error::Error;

impl TlsWords {
    /// The TLS error in `e` or its chain (feature `rustls`), worded with these settings: a
    /// rustls error by its kind ([`TlsErrorKind::of_rustls`]); else what `other` makes of
    /// `e` (a driver that passes the handshake's failure on as text, or as a bare I/O error),
    /// `None` for an error that is not TLS's.
    ///
    /// ```
    /// use distlock_core::conn::{ClientCert, TlsErrorKind, TlsWords};
    ///
    /// const WORDS: TlsWords = TlsWords { ca: "`?cacert=PATH`", client_cert: "`?cert=PATH&key=PATH`",
    ///     server_ca: "ssl.trustStore", plain: "use zk://" };
    /// let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
    /// let io = std::io::Error::new(std::io::ErrorKind::InvalidData, alert);
    /// let e = WORDS.classify(&io, ClientCert::None, |_| None).expect("TLS");
    /// assert_eq!(e.kind(), TlsErrorKind::ClientCertRejected);
    /// let plain = std::io::Error::other("refused");
    /// assert!(WORDS.classify(&plain, ClientCert::None, |_| None).is_none());
    /// ```
    pub fn classify(
        &self,
        e: &(dyn Error + 'static),
        cert: ClientCert<'_>,
        other: impl FnOnce(&(dyn Error + 'static)) -> Option<(TlsErrorKind, String)>,
    ) -> Option<TlsError> {
        let given = matches!(cert, ClientCert::Given(_));
        let (kind, detail) = match rustls_error(e) {
            Some(r) => (TlsErrorKind::of_rustls(&r, given), r.to_string()),
            None => other(e)?,
        };
        Some(TlsError::worded(kind, &detail, self, cert))
    }
}
