//! Turning tokio-postgres errors into dlock errors a person can act on.

use distlock_core::Error;
use std::time::Duration;
use tokio_postgres::error::SqlState;

pub(crate) const KIND: &str = "postgres";

/// Maps a driver error. Server errors are classified by SQLSTATE; everything else (I/O, a
/// closed connection, a protocol error) is a connection error.
pub(crate) fn map(endpoint: &str, e: tokio_postgres::Error) -> Error {
    let Some(db) = e.as_db_error() else {
        return Error::connection(KIND, endpoint, e);
    };
    let code = db.code();
    let text = format!("{} (SQLSTATE {})", db.message(), code.code());
    if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    {
        // pg_hba.conf has only `hostssl` lines for this login.
        let message = match db.message().ends_with("no encryption") {
            true => format!(
                "{text}; the server takes this login over TLS only: use sslmode=require or \
                 stricter"
            ),
            false => text,
        };
        return Error::auth(KIND, endpoint, message);
    }
    if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        return Error::auth(KIND, endpoint, format!(
                "{text}; the role needs CREATE on the schema (once, to create dlock's tables) and \
                 SELECT/INSERT/UPDATE/DELETE on them, or create them beforehand (see docs/postgres.md)"
            ));
    }
    if *code == SqlState::INVALID_CATALOG_NAME {
        return Error::unexpected(
            KIND,
            format!("{text}; create the database or fix the path of the URL"),
        );
    }
    // Class 08 (connection exception), 53300 too many connections, 57P0x shutdown/termination.
    let c = code.code();
    if c.starts_with("08")
        || *code == SqlState::TOO_MANY_CONNECTIONS
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::IDLE_SESSION_TIMEOUT
    {
        return Error::connection(KIND, endpoint, text);
    }
    Error::unexpected(KIND, text)
}

/// A call that got no answer in time.
pub(crate) fn timeout(endpoint: &str, what: &str, limit: Duration) -> Error {
    distlock_sql::errors::no_answer(KIND, endpoint, what, limit)
}

/// A reply of the wrong shape.
pub(crate) fn shape(what: &str, detail: impl std::fmt::Display) -> Error {
    distlock_sql::errors::unexpected(KIND, what, detail)
}
