//! `--kind mutex|fair|read|write|semaphore=N`, shared by `run` and `inspect`.

use std::fmt;

/// Which kind of lock a command works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Kind {
    /// The reentrant mutex.
    #[default]
    Mutex,
    /// The first-come-first-served mutex.
    Fair,
    /// The shared side of the read-write lock.
    Read,
    /// The exclusive side of the read-write lock.
    Write,
    /// One permit of a semaphore of N permits.
    Semaphore(u32),
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Mutex => write!(f, "mutex"),
            Kind::Fair => write!(f, "fair"),
            Kind::Read => write!(f, "read"),
            Kind::Write => write!(f, "write"),
            Kind::Semaphore(n) => write!(f, "semaphore={n}"),
        }
    }
}

/// Parses a `--kind` value for clap.
pub fn parse(s: &str) -> Result<Kind, String> {
    match s {
        "mutex" => Ok(Kind::Mutex),
        "fair" => Ok(Kind::Fair),
        "read" => Ok(Kind::Read),
        "write" => Ok(Kind::Write),
        _ => match s.strip_prefix("semaphore=") {
            Some(n) => distlock_torture::history::permits(n).map(Kind::Semaphore),
            None => Err(format!(
                "unknown kind `{s}`; choose mutex, fair, read, write or semaphore=N"
            )),
        },
    }
}

impl Kind {
    /// The lock handle of this kind for `name`.
    pub fn lock(self, client: &distlock::Client, name: &str) -> distlock::Result<distlock::Lock> {
        match self {
            Kind::Mutex => client.lock(name),
            Kind::Fair => client.fair_lock(name),
            Kind::Read => Ok(client.rw_lock(name)?.read()),
            Kind::Write => Ok(client.rw_lock(name)?.write()),
            Kind::Semaphore(_) => Err(distlock::Error::invalid(
                "a semaphore is taken through its own handle",
            )),
        }
    }

    /// The core's kind, as `inspect` asks for it.
    pub fn lock_kind(self) -> distlock::LockKind {
        match self {
            Kind::Mutex => distlock::LockKind::Mutex,
            Kind::Fair => distlock::LockKind::Fair,
            Kind::Read => distlock::LockKind::Read,
            Kind::Write => distlock::LockKind::Write,
            Kind::Semaphore(n) => distlock::LockKind::Semaphore {
                permits: 1,
                limit: n,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse("mutex"), Ok(Kind::Mutex));
        assert_eq!(parse("semaphore=5"), Ok(Kind::Semaphore(5)));
        assert!(parse("semaphore=0").is_err());
        assert!(parse("semaphore=x").is_err());
        assert!(parse("rw").is_err());
        assert_eq!(Kind::Semaphore(3).to_string(), "semaphore=3");
    }
}
