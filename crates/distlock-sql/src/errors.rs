//! The errors both SQL backends build the same way (on the core's `Error` constructors).

use distlock_core::Error;
use std::time::Duration;

/// A call to `endpoint` that got no answer within `limit` (retryable: `Connection`).
pub fn no_answer(backend: &'static str, endpoint: &str, what: &str, limit: Duration) -> Error {
    Error::connection(
        backend,
        endpoint,
        format!(
            "{what} got no answer within {limit:?} (is the server paused, overloaded or unreachable?)"
        ),
    )
}

/// A reply of the wrong shape to `what` (`UnexpectedReply`).
pub fn unexpected(backend: &'static str, what: &str, detail: impl std::fmt::Display) -> Error {
    Error::unexpected(backend, format!("{what}: unexpected reply ({detail})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        let e = no_answer("postgres", "h:1", "renewing", Duration::from_secs(2));
        assert!(e.is_retryable());
        for (e, text) in [
            (e, "renewing got no answer within 2s"),
            (
                unexpected("mysql", "GET_LOCK", "NULL"),
                "GET_LOCK: unexpected reply (NULL)",
            ),
        ] {
            assert!(e.to_string().contains(text), "{e}");
        }
    }
}
