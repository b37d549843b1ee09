//! `zks://`: TLS through zookeeper-client's rustls support (feature `tls`), and why a TLS
//! connect failed.
//!
//! The driver tries every server and, when none answers, says only "no hosts": it keeps the
//! handshake errors to itself. So after a failed TLS connect we shake hands with each server
//! ourselves, with the same CA and client certificate, and give the first TLS failure as the
//! core's [`TlsError`] (the source of an [`Error::Connection`]).

#[cfg(feature = "tls")]
pub(crate) use imp::Tls;
#[cfg(not(feature = "tls"))]
pub(crate) use off::Tls;

#[cfg(not(feature = "tls"))]
mod off {
    use distlock_core::conn::{TlsError, TlsFiles};
    use distlock_core::{Error, Result};
    use std::time::Duration;
    use zookeeper_client as zk;

    /// Without the `tls` feature there are no TLS settings: [`Tls::load`] refuses `zks://`.
    #[derive(Debug)]
    pub(crate) enum Tls {}

    impl Tls {
        pub(crate) fn load(_: &TlsFiles) -> Result<Tls> {
            Err(Error::invalid(
                "zks:// (TLS) needs distlock-zookeeper built with its `tls` feature",
            ))
        }

        pub(crate) async fn connect(
            &self,
            _: zk::Connector,
            _: &str,
        ) -> std::result::Result<zk::Client, zk::Error> {
            match *self {}
        }

        pub(crate) async fn probe(
            &self,
            _: &str,
            _: Duration,
        ) -> (Option<String>, Option<TlsError>) {
            match *self {}
        }

        pub(crate) fn client_cert(&self) -> bool {
            match *self {}
        }
    }
}

#[cfg(feature = "tls")]
mod imp {
    use distlock_core::conn::{
        ClientCert, ServerCheck, TlsError, TlsErrorKind, TlsFiles, TlsWords,
    };
    use distlock_core::{Error, Result};
    use rustls::pki_types::ServerName;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;
    use zookeeper_client as zk;

    /// The TLS settings of a `zks://` URL, read once at connect.
    pub(crate) struct Tls {
        /// For the driver.
        options: zk::TlsOptions,
        /// The same trust and identity, for our own handshakes in [`diagnose`](Self::diagnose).
        probe: Arc<rustls::ClientConfig>,
        client_cert: bool,
    }

    impl std::fmt::Debug for Tls {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Tls")
                .field("client_cert", &self.client_cert)
                .finish_non_exhaustive()
        }
    }

    /// PEM bytes as the driver takes them.
    fn text(pem: &[u8]) -> String {
        String::from_utf8_lossy(pem).into_owned()
    }

    impl Tls {
        /// Reads the PEM files a `zks://` URL names.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] naming the parameter for a file that cannot be read or
        /// holds no certificate (or key).
        pub(crate) fn load(files: &TlsFiles) -> Result<Tls> {
            let (Some(ca), Some(ca_pem), Some(roots)) =
                (files.ca(), files.read_ca()?, files.roots()?)
            else {
                return Err(Error::invalid("zks:// needs `cacert=PATH`"));
            };
            let mut options = zk::TlsOptions::new()
                .with_pem_ca(&text(&ca_pem))
                .map_err(|e| TlsFiles::file_error("cacert", ca, e))?;
            let probe = files.client_config(ServerCheck::ChainAndName(roots))?;
            if let (Some((cert, _)), Some((cert_pem, key_pem))) =
                (files.client(), files.read_client()?)
            {
                options = options
                    .with_pem_identity(&text(&cert_pem), &text(&key_pem))
                    .map_err(|e| TlsFiles::file_error("cert", cert, e))?;
            }
            Ok(Tls {
                options,
                probe: Arc::new(probe),
                client_cert: files.client().is_some(),
            })
        }

        /// Connects through the driver, every server over TLS.
        pub(crate) async fn connect(
            &self,
            connector: zk::Connector,
            hosts: &str,
        ) -> std::result::Result<zk::Client, zk::Error> {
            // The driver builds its rustls config on the process-wide provider; with more than
            // one provider compiled in there may be none by default, so dlock's (as every
            // backend uses) is installed unless the program installed one already.
            distlock_core::conn::install_crypto_provider();
            connector
                .with_tls(self.options.clone())
                .secure_connect(hosts)
                .await
        }

        /// Shakes hands with each server of `hosts` (`h:p,h:p`), spending at most `within` on
        /// each: the protocol version (`TLSv1.3`) of the first that completes, and the first
        /// TLS failure.
        pub(crate) async fn probe(
            &self,
            hosts: &str,
            within: Duration,
        ) -> (Option<String>, Option<TlsError>) {
            let (mut version, mut failure) = (None, None);
            for (host, port) in split(hosts) {
                match tokio::time::timeout(within, self.handshake(host, port)).await {
                    Ok(Some(Ok(v))) => version = version.or(Some(v)),
                    Ok(Some(Err(e))) => failure = failure.or(e),
                    _ => {}
                }
            }
            (version, failure)
        }

        /// Whether a client certificate is shown.
        pub(crate) fn client_cert(&self) -> bool {
            self.client_cert
        }

        /// A TLS handshake of our own with `host`: `None` if the name is not one, the TCP
        /// connection fails or no version was agreed, else the version or the failure.
        async fn handshake(
            &self,
            host: &str,
            port: u16,
        ) -> Option<std::result::Result<String, Option<TlsError>>> {
            let name = ServerName::try_from(host.to_owned()).ok()?;
            let tcp = tokio::net::TcpStream::connect((host, port)).await.ok()?;
            let connector = tokio_rustls::TlsConnector::from(self.probe.clone());
            let mut s = match connector.connect(name, tcp).await {
                Ok(s) => s,
                Err(e) => return Some(Err(self.classify(&e))),
            };
            // TLS 1.3: a server that refuses the client's certificate (or its absence) says so
            // after the handshake; the client speaks first in ZooKeeper, so anything read here
            // is that alert (or the server hanging up).
            let mut b = [0u8; 1];
            let alert = tokio::time::timeout(Duration::from_millis(500), s.read(&mut b));
            if let Ok(Err(e)) = alert.await {
                return Some(Err(self.classify(&e)));
            }
            Some(Ok(match s.get_ref().1.protocol_version()? {
                rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2".to_owned(),
                rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3".to_owned(),
                other => format!("{other:?}"),
            }))
        }

        fn classify(&self, e: &std::io::Error) -> Option<TlsError> {
            let cert = match self.client_cert {
                true => ClientCert::Given(""),
                false => ClientCert::None,
            };
            WORDS.classify(e, cert, |_| {
                Some(match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => (
                        TlsErrorKind::NotSupportedByServer,
                        "the server closed the connection during the TLS handshake".to_owned(),
                    ),
                    _ => (TlsErrorKind::Handshake, e.to_string()),
                })
            })
        }
    }

    /// `h:p,h:p` as `(host, port)` pairs (IPv6 addresses without their brackets).
    fn split(hosts: &str) -> impl Iterator<Item = (&str, u16)> {
        hosts.split(',').filter_map(|hp| {
            let (host, port) = hp.rsplit_once(':')?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Some((host, port.parse().ok()?))
        })
    }

    /// How `zks://` and ZooKeeper name the TLS settings, for messages.
    const WORDS: TlsWords = TlsWords {
        ca: "`?cacert=PATH`",
        client_cert: "`?cert=PATH&key=PATH`",
        server_ca: "ssl.trustStore",
        plain: "is this its plain clientPort? Then use its secureClientPort, or zk:// instead \
                of zks://",
    };
}
