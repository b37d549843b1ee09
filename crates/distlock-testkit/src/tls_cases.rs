//! Helpers of the backends' TLS tests (`tests/*_tls.rs`): connect and take a lock, expect a
//! connect to fail, find the [`TlsError`] an error carries, check that no error shows a
//! secret, and read `doctor`'s `tls` finding.
//!
//! Every backend gives the core's [`TlsError`] as the source of an
//! [`Error::Connection`], so these work for any of them; the backends are not dependencies
//! of this crate (a test hands in the result of its own connect).

use distlock_core::conn::TlsError;
use distlock_core::{Backend, Client, ClientOptions, Error, Finding, Result};
use std::sync::Arc;
use std::time::Duration;

/// The client options of the TLS tests: a 10 s connect timeout (a TLS handshake on a loaded
/// machine may take a while; a failing one answers at once).
pub fn client_options() -> ClientOptions {
    ClientOptions::default().connect_timeout(Duration::from_secs(10))
}

/// Connected (or panics with the error): takes and gives back a lock named after the test
/// process, so the connection is shown to work, not just to open.
///
/// # Panics
/// When `backend` is an error or the lock cannot be taken and released.
pub async fn works<B: Backend + 'static>(backend: Result<B>) {
    let b = backend.unwrap_or_else(|e| panic!("connect: {e} / {e:?}"));
    let c = Client::new(Arc::new(b), client_options()).expect("client");
    let g = c
        .lock(&format!("tls-{}", std::process::id()))
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    g.release().await.expect("release");
}

/// The error of a connect that must fail.
///
/// # Panics
/// When it connected.
pub fn fails<B>(backend: Result<B>) -> Error {
    match backend {
        Ok(_) => panic!("connected, and should not have"),
        Err(e) => e,
    }
}

/// The [`TlsError`] of an [`Error::Connection`].
///
/// # Panics
/// When `e` is another error, or a connection error whose source is not a [`TlsError`].
pub fn tls_error(e: &Error) -> &TlsError {
    match e {
        Error::Connection { source, .. } => source
            .downcast_ref::<TlsError>()
            .unwrap_or_else(|| panic!("not a TLS error: {e} / {e:?}")),
        other => panic!("not a connection error: {other} / {other:?}"),
    }
}

/// Asserts that no text of `e` shows `secret`: its `Display`, its `Debug`, and the `Display`
/// and `Debug` of every error in its `source` chain (`what` names the case in the panic).
///
/// # Panics
/// When one of them contains `secret`.
pub fn assert_hides(what: &str, e: &Error, secret: &str) {
    let mut texts = vec![e.to_string(), format!("{e:?}")];
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        texts.push(format!("{s} / {s:?}"));
        source = s.source();
    }
    for t in &texts {
        assert!(!t.contains(secret), "{what}: the secret shows in {t}");
    }
}

/// `doctor`'s `tls` finding of a connected backend (or panics: not connected, the diagnosis
/// failed, or it has no `tls` check).
///
/// # Panics
/// When `backend` is an error, the diagnosis fails or finds nothing about TLS.
pub async fn tls_finding<B: Backend + 'static>(backend: Result<B>) -> Finding {
    let b = backend.unwrap_or_else(|e| panic!("connect: {e} / {e:?}"));
    let c = Client::new(Arc::new(b), client_options()).expect("client");
    let findings = c.diagnose().await.expect("diagnose");
    findings
        .into_iter()
        .find(|x| x.check == "tls")
        .expect("a tls finding")
}

/// Asserts that `doctor`'s `tls` finding of a connected backend is fine and says the session
/// is encrypted (`encrypted (TLSv1.…`) and `says` (what of the certificate was checked).
///
/// # Panics
/// As [`tls_finding`], and when the finding is not `Ok` or does not say so.
pub async fn assert_encrypted<B: Backend + 'static>(backend: Result<B>, says: &str) {
    let tls = tls_finding(backend).await;
    assert_eq!(tls.severity, distlock_core::Severity::Ok, "{tls:?}");
    assert!(
        tls.message.starts_with("encrypted (TLSv1.") && tls.message.contains(says),
        "{tls:?} should say {says}"
    );
}
