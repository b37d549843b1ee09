//! Turning mysql_async errors into dlock errors a person can act on.

use distlock_core::Error;
use mysql_async::Error as MyError;
use std::time::Duration;

pub(crate) const KIND: &str = "mysql";

/// Server error: the statement was interrupted (`KILL QUERY`).
pub(crate) const INTERRUPTED: u16 = 1317;
/// Server error: unknown thread id (the connection is gone).
pub(crate) const NO_SUCH_THREAD: u16 = 1094;
/// Server error: not the owner of the thread (no privilege to kill it).
pub(crate) const NOT_OWNER: u16 = 1095;

/// Server error codes that mean the connection is gone.
const CONNECTION_GONE: &[u16] = &[
    1053, // ER_SERVER_SHUTDOWN
    1077, // ER_NORMAL_SHUTDOWN
    1927, // ER_CONNECTION_KILLED (MariaDB)
    2006, // CR_SERVER_GONE_ERROR
    2013, // CR_SERVER_LOST
    4031, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8: wait_timeout)
];

/// True if `e` means the connection can no longer be used (its session, and the locks it
/// held, are gone or about to be).
pub(crate) fn conn_dead(e: &MyError) -> bool {
    match e {
        MyError::Server(s) => CONNECTION_GONE.contains(&s.code),
        other => other.is_fatal(),
    }
}

/// Maps a driver error.
pub(crate) fn map(endpoint: &str, e: MyError) -> Error {
    let MyError::Server(s) = &e else {
        return Error::connection(KIND, endpoint, e);
    };
    let text = format!("{} (error {}, SQLSTATE {})", s.message, s.code, s.state);
    let hint = match s.code {
        // ER_SECURE_TRANSPORT_REQUIRED (require_secure_transport=ON)
        3159 => "; the server takes TLS connections only: use ssl-mode=REQUIRED or stricter",
        // ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR, ER_SPECIFIC_ACCESS_DENIED_ERROR
        1142 | 1143 | 1227 => {
            "; the user needs CREATE (once, for dlock's tables) and SELECT/INSERT/UPDATE/DELETE \
             on them (see docs/mysql.md)"
        }
        // ER_BAD_DB_ERROR
        1049 => "; create the database or fix the path of the URL",
        _ => "",
    };
    let text = text + hint;
    match s.code {
        // ER_ACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR,
        // and the refusals above.
        1045 | 1044 | 1698 | 3159 | 1142 | 1143 | 1227 => Error::auth(KIND, endpoint, text),
        // ER_CON_COUNT_ERROR, ER_TOO_MANY_USER_CONNECTIONS, ER_LOCK_WAIT_TIMEOUT,
        // ER_LOCK_DEADLOCK: transient, worth a retry.
        1040 | 1203 | 1205 | 1213 => Error::connection(KIND, endpoint, text),
        c if CONNECTION_GONE.contains(&c) => Error::connection(KIND, endpoint, text),
        _ => Error::unexpected(KIND, text),
    }
}

/// A call that got no answer in time.
pub(crate) fn timeout(endpoint: &str, what: &str, limit: Duration) -> Error {
    distlock_sql::errors::no_answer(KIND, endpoint, what, limit)
}

/// A reply of the wrong shape.
pub(crate) fn shape(what: &str, detail: impl std::fmt::Display) -> Error {
    distlock_sql::errors::unexpected(KIND, what, detail)
}
