//! Error type of the test kit.

use std::fmt;

/// Errors returned when starting or talking to a test server.
#[derive(Debug)]
pub enum Error {
    /// The server binary could not be found.
    BinaryMissing {
        /// The binary that was looked for (a name searched on `PATH`, or a path).
        binary: String,
        /// The Debian package that provides it.
        package: String,
    },
    /// The server was found but did not start (or did not become ready).
    Start {
        /// What was being started, e.g. `redis-server on 127.0.0.1:40123`.
        what: String,
        /// Why it failed, including the last lines of the server's log/stderr.
        detail: String,
    },
    /// An I/O error (creating temp dirs, sockets, protocol errors, ...).
    Io(std::io::Error),
}

/// Result type of the test kit.
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BinaryMissing { binary, package } => {
                if binary.contains('/') {
                    write!(f, "{binary} does not exist or is not executable")?;
                } else {
                    write!(f, "{binary} not found on PATH")?;
                }
                write!(
                    f,
                    ": install the Debian package `{package}` (sudo apt-get install {package})"
                )
            }
            Error::Start { what, detail } => write!(f, "failed to start {what}: {detail}"),
            Error::Io(e) => write!(f, "I/O error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_actionable() {
        let e = Error::BinaryMissing {
            binary: "redis-server".into(),
            package: "redis-server".into(),
        };
        assert_eq!(
            e.to_string(),
            "redis-server not found on PATH: install the Debian package `redis-server` \
             (sudo apt-get install redis-server)"
        );
    }
}
