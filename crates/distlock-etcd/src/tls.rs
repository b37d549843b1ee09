//! TLS (`etcds://`): the CA to trust and the client certificate, and telling TLS failures
//! apart in the errors etcd-client passes on.

use distlock_core::conn::{ClientCert, TlsFiles, TlsNames, TlsWords};
pub use distlock_core::conn::{TlsError, TlsErrorKind};
use distlock_core::{operator, Finding, Severity};
use etcd_client::{Certificate, Identity, TlsOptions};

/// How `etcds://` names its TLS files (`ca_file` is `cacert` as `rediss://` spells it).
pub(crate) const NAMES: TlsNames = TlsNames {
    ca: &["cacert", "ca_file"],
    ..TlsNames::CACERT
};

/// The TLS options for etcd-client: the CA from `cacert` (else the system's roots) and the
/// client certificate. Fails with a message naming the file for a file that cannot be read
/// or does not look like PEM.
pub(crate) fn options(files: &TlsFiles) -> distlock_core::Result<TlsOptions> {
    let tls = match files.read_ca()? {
        Some(ca) => TlsOptions::new().ca_certificate(Certificate::from_pem(ca)),
        None => TlsOptions::new().with_native_roots(),
    };
    Ok(match files.read_client()? {
        Some((cert, key)) => tls.identity(Identity::from_pem(cert, key)),
        None => tls,
    })
}

/// The `tls` finding of `doctor` for a connection to `hosts` (`host:port`), over TLS with
/// `tls` (`etcds://`) or over plain http.
pub(crate) fn transport(hosts: &[String], tls: Option<&TlsFiles>) -> Finding {
    let Some(t) = tls else {
        let fix = "lock keys, owner ids and any password travel unencrypted and \
                   unauthenticated; start the members with --cert-file/--key-file and connect \
                   with etcds://…?cacert=PATH";
        return operator::plain(hosts.iter().map(String::as_str), "http", fix);
    };
    let ca = (t.ca()).map_or("the system's CA certificates".into(), |p| {
        format!("the CA in {}", p.display())
    });
    let client = operator::client_cert_shown(t.client().is_some());
    let message = format!(
        "https: every member's certificate checked against {ca} (and its host name or \
         address); {client}"
    );
    Finding::new(Severity::Ok, "tls", message)
}

/// How `etcds://` and etcd name the TLS settings, for messages.
pub(crate) const WORDS: TlsWords = TlsWords {
    ca: "`?cacert=PATH` (a PEM file)",
    client_cert: "`?cert=PATH&key=PATH`",
    server_ca: "--trusted-ca-file",
    plain: "is it a plain-http member? Then use etcd:// instead of etcds://",
};

/// A TLS alert from the server that reached the client only as text (hyper passes the
/// rustls error on as a message when it breaks the HTTP/2 connection).
fn alert_text(e: &(dyn std::error::Error + 'static)) -> Option<(TlsErrorKind, String)> {
    let shown = format!("{e:?}");
    let at = shown.find("received fatal alert: ")?;
    let alert: String = shown[at + "received fatal alert: ".len()..]
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    let kind = match alert.as_str() {
        "CertificateRequired"
        | "BadCertificate"
        | "UnknownCA"
        | "CertificateExpired"
        | "CertificateRevoked"
        | "CertificateUnknown"
        | "UnsupportedCertificate"
        | "AccessDenied" => TlsErrorKind::ClientCertRejected,
        _ => TlsErrorKind::Handshake,
    };
    Some((kind, format!("received fatal alert: {alert}")))
}

/// True if `e`'s chain holds tokio-rustls's "tls handshake eof": the server hung up on the
/// client's hello (a plain-http etcd listener does that).
fn handshake_eof(e: &(dyn std::error::Error + 'static)) -> bool {
    // At most 17 errors deep, should a chain ever loop.
    std::iter::successors(Some(e), |e| e.source())
        .take(17)
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .any(|io| {
            io.kind() == std::io::ErrorKind::UnexpectedEof
                && io.to_string().contains("tls handshake eof")
        })
}

/// What went wrong, if `e` is a TLS failure (`cert`: the client certificate of the handshake).
pub(crate) fn classify(e: &etcd_client::Error, cert: ClientCert) -> Option<TlsError> {
    // etcd-client's error has no `source()`: start from what it wraps.
    let inner: &(dyn std::error::Error + 'static) = match e {
        etcd_client::Error::GRpcStatus(s) => s,
        etcd_client::Error::TransportError(t) => t,
        etcd_client::Error::IoError(i) => i,
        _ => return None,
    };
    WORDS.classify(inner, cert, |e| {
        alert_text(e).or_else(|| {
            let closed = "the server closed the connection during the TLS handshake";
            handshake_eof(e).then(|| (TlsErrorKind::NotSupportedByServer, closed.to_owned()))
        })
    })
}

/// True if `e` says the connection broke under a request (closed, broken pipe, reset): what
/// a plain-http client sees from a member that only speaks TLS, and how a TLS 1.3 server
/// that refuses the client's certificate (or its absence) after the handshake may look to
/// the client (the alert it sends can be lost in the HTTP/2 layer).
pub(crate) fn closed_under_request(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(s) = e else {
        return false;
    };
    let d = format!("{s:?}").to_ascii_lowercase();
    ["connection closed", "broken pipe", "brokenpipe", "reset"]
        .iter()
        .any(|w| d.contains(w))
}

/// True if the member at `host` (`host:port`) answers an HTTP/2 connection preface in the
/// clear with a SETTINGS frame, within `limit`: it serves plain http, not TLS.
pub(crate) async fn speaks_plain_http2(host: &str, limit: std::time::Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The client preface, then an empty SETTINGS frame (length 0, type 4, no flags, stream 0).
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(host).await.ok()?;
        s.write_all(PREFACE).await.ok()?;
        // A server's first frame is its SETTINGS: a 9-byte header whose 4th byte is the type.
        let mut head = [0u8; 9];
        s.read_exact(&mut head).await.ok()?;
        Some(head[3] == 0x04)
    };
    matches!(tokio::time::timeout(limit, ask).await, Ok(Some(true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check that tells a plain-http member from a TLS member that closed the connection
    /// after the handshake (an etcds:// client's hello can end in a bare "connection closed"
    /// against a plain member, which once read as a refused client certificate).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plain_members_answer_http2_in_the_clear_and_tls_members_do_not() {
        let limit = std::time::Duration::from_secs(5);
        let plain = distlock_testkit::EtcdCluster::start().expect("plain etcd");
        let tls = distlock_testkit::EtcdCluster::start_tls(1, true).expect("tls etcd");
        for _ in 0..3 {
            let at = plain.client_addr(0).to_string();
            assert!(speaks_plain_http2(&at, limit).await, "plain member {at}");
            let at = tls.client_addr(0).to_string();
            assert!(!speaks_plain_http2(&at, limit).await, "tls member {at}");
        }
        assert!(!speaks_plain_http2("127.0.0.1:1", limit).await);
    }

    #[test]
    fn doctor_says_how_the_connection_is_protected() {
        use distlock_core::Severity;
        let hosts = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let local = transport(&hosts(&["127.0.0.1:2379", "[::1]:1", "localhost:2"]), None);
        assert_eq!(local.severity, Severity::Ok);
        let f = transport(&hosts(&["127.0.0.1:2379", "10.0.0.1:2379"]), None);
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.message.contains("etcds://"), "{f:?}");
        let tls = transport(&hosts(&["10.0.0.1:2379"]), Some(&TlsFiles::new(NAMES)));
        assert!(tls.message.contains("system's CA"));
    }

    #[test]
    fn unreadable_and_non_pem_files_are_named() {
        let missing = TlsFiles::new(NAMES).with_ca("/nonexistent/ca.pem");
        let e = options(&missing).expect_err("missing").to_string();
        assert!(
            e.contains("cannot read `cacert=/nonexistent/ca.pem`"),
            "{e}"
        );
        let dir = std::env::temp_dir().join(format!("dlock-etcd-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").expect("write");
        let bad = TlsFiles::new(NAMES).with_client(&junk, &junk);
        let e = options(&bad).expect_err("junk").to_string();
        assert!(e.contains("is not a PEM file with a CERTIFICATE"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
