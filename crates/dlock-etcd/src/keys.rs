//! Key layout and the value format of a waiter/holder key.
//!
//! | key | lease | value |
//! |---|---|---|
//! | `PREFIX/NAME/OWNER` | the hold's own lease | `COUNT TTL` (`0 TTL` while waiting) |
//! | `PREFIX/NAME` | none | empty; its mod revision is the newest queue key's create revision |
//!
//! `NAME` and `OWNER` are escaped (`%` → `%25`, `/` → `%2F`) so that `PREFIX/NAME/` is the
//! prefix of exactly one lock's queue.

use crate::error::shape;
use dlock_core::Result;

/// The keys of one owner on one lock.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `PREFIX/NAME/`: every waiter and the holder of this lock.
    pub(crate) queue: Vec<u8>,
    /// `PREFIX/NAME/OWNER`.
    pub(crate) mine: Vec<u8>,
    /// `PREFIX/NAME`.
    pub(crate) fence: Vec<u8>,
}

impl Keys {
    pub(crate) fn new(prefix: &str, name: &str, owner: &str) -> Self {
        let fence = format!("{prefix}/{}", escape(name)).into_bytes();
        let mut queue = fence.clone();
        queue.push(b'/');
        let mut mine = queue.clone();
        mine.extend_from_slice(escape(owner).as_bytes());
        Keys { queue, mine, fence }
    }

    /// The owner id of a key of this lock's queue.
    pub(crate) fn owner_of(&self, key: &[u8]) -> Result<String> {
        let rest = key.strip_prefix(self.queue.as_slice()).ok_or_else(|| {
            shape(format!(
                "key `{}` is not in the queue `{}`",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(&self.queue)
            ))
        })?;
        let s = std::str::from_utf8(rest).map_err(|_| {
            shape(format!(
                "queue key `{}` is not UTF-8",
                String::from_utf8_lossy(key)
            ))
        })?;
        unescape(s).ok_or_else(|| shape(format!("queue key `{s}` is not an escaped owner id")))
    }
}

/// `%` → `%25`, `/` → `%2F`.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3)?;
        match code {
            "25" => out.push('%'),
            "2F" => out.push('/'),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    if rest.contains('/') {
        return None;
    }
    out.push_str(rest);
    Some(out)
}

/// What a queue key holds: the owner's hold count (0 while it waits) and the TTL in seconds
/// of the lease the key is attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) count: u32,
    pub(crate) ttl: i64,
}

impl Entry {
    pub(crate) fn encode(self) -> String {
        format!("{} {}", self.count, self.ttl)
    }

    pub(crate) fn decode(key: &[u8], value: &[u8]) -> Result<Entry> {
        let bad = || {
            shape(format!(
                "key `{}` holds `{}`, not a dlock hold count (`COUNT TTL`); \
                 is another program writing under this prefix?",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(value)
            ))
        };
        let s = std::str::from_utf8(value).map_err(|_| bad())?;
        let (count, ttl) = s.split_once(' ').ok_or_else(bad)?;
        Ok(Entry {
            count: count.parse().map_err(|_| bad())?,
            ttl: ttl.parse().map_err(|_| bad())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let k = Keys::new("dlock", "a/b%c", "me/1");
        assert_eq!(k.fence, b"dlock/a%2Fb%25c");
        assert_eq!(k.queue, b"dlock/a%2Fb%25c/");
        assert_eq!(k.mine, b"dlock/a%2Fb%25c/me%2F1");
        assert_eq!(k.owner_of(&k.mine).unwrap(), "me/1");
        assert!(k.owner_of(b"dlock/other/x").is_err());
        assert!(k.owner_of(b"dlock/a%2Fb%25c/x/y").is_err());
        assert!(k.owner_of(b"dlock/a%2Fb%25c/%zz").is_err());
        // A name that is a prefix of another does not share its queue.
        let short = Keys::new("dlock", "a", "o");
        assert!(!Keys::new("dlock", "a/x", "o")
            .mine
            .starts_with(&short.queue));
        assert!(!Keys::new("dlock", "ab", "o").mine.starts_with(&short.queue));
    }

    #[test]
    fn entries() {
        let e = Entry { count: 3, ttl: 30 };
        assert_eq!(Entry::decode(b"k", e.encode().as_bytes()).unwrap(), e);
        for bad in [&b""[..], b"x", b"1", b"1 x", b"-1 3", b"\xff"] {
            assert!(Entry::decode(b"k", bad).is_err());
        }
    }
}
