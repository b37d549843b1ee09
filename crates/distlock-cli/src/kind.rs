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

/// The kind of lock `name` is, for `inspect` and `release` without `--kind`: `given` when
/// the user gave one; else the one kind the backend has state for under `name` (its listing,
/// exact name); [`distlock::LockKind::Mutex`] when it has none, or cannot list. Prints the
/// error and returns the exit code when the name has state of several kinds (which one is
/// meant is the user's to say) or the listing fails.
pub async fn resolve(
    client: &distlock::Client,
    name: &str,
    given: Option<Kind>,
) -> Result<distlock::LockKind, u8> {
    if let Some(k) = given {
        return Ok(k.lock_kind());
    }
    let listed = match client.list(name).await {
        Ok(l) => l,
        Err(distlock::Error::Unsupported { .. }) => return Ok(distlock::LockKind::Mutex),
        Err(e) => {
            eprintln!("dlock: cannot look up the kind of lock `{name}`: {e}");
            return Err(crate::EXIT_ERROR);
        }
    };
    let mut kinds: Vec<distlock::LockKind> = listed
        .iter()
        // An election of the same name is another namespace (`dlock leader` shows it).
        .filter(|l| l.info.name == name && l.kind != distlock::LockKind::Election)
        .map(|l| l.kind)
        .collect();
    kinds.dedup();
    match kinds.as_slice() {
        [] => Ok(distlock::LockKind::Mutex),
        [one] => Ok(*one),
        many => {
            let names: Vec<&str> = many.iter().map(|k| k.as_str()).collect();
            eprintln!(
                "dlock: `{name}` names locks of several kinds ({}); say which with --kind",
                names.join(", ")
            );
            Err(crate::EXIT_USAGE)
        }
    }
}

/// The name of `kind` for people: `read-write` for either side of a read-write lock (whose
/// holders of both sides are shown together), else the kind's own name.
pub fn describe(kind: distlock::LockKind) -> &'static str {
    match kind {
        distlock::LockKind::Read | distlock::LockKind::Write => "read-write",
        k => k.as_str(),
    }
}

/// True when the backend has no state at all for a lock: no holder, no waiter, and no
/// fencing token ever issued (a name never used, a typo, or one whose state expired).
pub fn is_unknown(info: &distlock::LockInfo) -> bool {
    info.holders.is_empty() && info.fencing_token == 0 && info.waiters.unwrap_or(0) == 0
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
