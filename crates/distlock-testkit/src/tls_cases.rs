//! Helpers of the backends' TLS tests (`tests/*_tls.rs`): connect and take a lock, expect a
//! connect to fail, and find the [`TlsError`] an error carries.
//!
//! Every backend gives the core's [`TlsError`] as the source of an
//! [`Error::Connection`], so these work for any of them; the backends are not dependencies
//! of this crate (a test hands in the result of its own connect).

use distlock_core::conn::TlsError;
use distlock_core::{Backend, Client, ClientOptions, Error, Result};
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
