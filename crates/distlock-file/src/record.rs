//! Lock file names and the record stored in each lock file.
//!
//! See docs/file-backend.md for the format.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// First line of every lock record.
pub(crate) const MAGIC: &str = "distlock-file 1";

/// Largest lock file accepted; records are well under 1 KiB.
const MAX_RECORD: usize = 64 * 1024;

/// FNV-1a, 128-bit variant (offset basis `0x6c62272e07bb014262b821756295c58d`,
/// prime `2^88 + 0x13b`), over `bytes`.
pub fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = (1 << 88) + 0x13b;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u128::from(b)).wrapping_mul(PRIME))
}

/// The lock file name of lock `name`: 32 lower-case hex digits of FNV-1a-128 of the name's
/// UTF-8 bytes, then `.lock`.
pub fn file_name(name: &str) -> String {
    suffixed_name(name, "lock")
}

/// The file of lock `name` with suffix `suffix` (`lock`, `rw`, `rw-turnstile`, `rw-record`,
/// `election`).
pub(crate) fn suffixed_name(name: &str, suffix: &str) -> String {
    format!("{:032x}.{suffix}", fnv1a_128(name.as_bytes()))
}

/// The fencing token of the next grant after one that had `last` (0: none): above `last`,
/// and at least the wall clock in microseconds since the Unix epoch. The clock floor is what
/// keeps tokens increasing when the counter is lost — the file deleted (by an operator or a
/// `/tmp` cleaner, even while a process still holds the old one) or the directory wiped at a
/// reboot: a grant's token is at least its time in microseconds, and every earlier grant's is
/// at most its own time (plus one per grant made within the same microsecond), so the new
/// counter starts above every token handed out before, unless the wall clock was set back.
/// `None` when `last` is `u64::MAX`.
pub(crate) fn next_token(last: u64) -> Option<u64> {
    let floor = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    Some(last.checked_add(1)?.max(floor))
}

/// The side of a read-write lock a [`HoldLine`] holds (as `usize`, the index of the side in
/// per-side arrays).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// `r`: the shared side.
    Read,
    /// `w`: the exclusive side.
    Write,
}

/// One hold of a lock: a read-write lock's `hold` lines, written and removed under the record
/// file's exclusive lock by the backend that holds it; a mutex's or an election's `holder` line
/// (the write side, with no instance), written while a process holds the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldLine {
    pub(crate) side: Side,
    pub(crate) pid: u32,
    /// Distinguishes the `FileBackend`s of one process (`hold` lines only).
    pub(crate) instance: u64,
    pub(crate) count: u32,
    pub(crate) owner: String,
}

/// Contents of one lock file (a mutex's `.lock`, or a read-write lock's `.rw-record`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Record {
    /// Last fencing token granted (0: never granted).
    pub(crate) token: u64,
    /// The lock's name (absent only in a file never granted).
    pub(crate) name: Option<String>,
    /// Who holds it, while held (mutex, election: the `holder` line).
    pub(crate) holder: Option<HoldLine>,
    /// The holds of a read-write lock.
    pub(crate) holds: Vec<HoldLine>,
    /// The value an election's leader advertises (`value` line, escaped; only while held).
    pub(crate) value: Option<String>,
    /// The number of the leader's last proclamation (`seq` line; 0: the value it was granted
    /// with).
    pub(crate) seq: u64,
}

impl Record {
    /// The bytes written to the file.
    pub(crate) fn encode(&self) -> String {
        let mut lines = vec![MAGIC.to_owned(), format!("token {}", self.token)];
        lines.extend(self.name.as_ref().map(|name| format!("name {name}")));
        lines.extend(
            self.holder
                .as_ref()
                .map(|h| format!("holder {} {} {}", h.pid, h.count, h.owner)),
        );
        if let Some(v) = &self.value {
            lines.push(format!("value {}", escape(v)));
            lines.push(format!("seq {}", self.seq));
        }
        lines.extend(self.holds.iter().map(|h| {
            let side = ['r', 'w'][h.side as usize];
            format!(
                "hold {side} {} {} {} {}",
                h.pid, h.instance, h.count, h.owner
            )
        }));
        lines.push("end\n".to_owned());
        lines.join("\n")
    }

    /// Parses a file's bytes; an empty file is a fresh lock. `Err` says what is wrong.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Record, String> {
        if bytes.is_empty() {
            return Ok(Record::default());
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_owned())?;
        let mut lines = text.split('\n');
        if lines.next() != Some(MAGIC) {
            return Err(format!("its first line is not `{MAGIC}`"));
        }
        let mut token = None;
        let mut rec = Record::default();
        let mut ended = false;
        for line in lines {
            if line == "end" {
                ended = true;
                break;
            }
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "token" => token = Some(number("token", value)?),
                "name" => rec.name = Some(value.to_owned()),
                "holder" | "hold" => {
                    let hold = match (key, value.split_once(' ')) {
                        ("holder", _) => parse_hold(Side::Write, value, false),
                        (_, Some(("r", rest))) => parse_hold(Side::Read, rest, true),
                        (_, Some(("w", rest))) => parse_hold(Side::Write, rest, true),
                        _ => None,
                    };
                    let hold =
                        hold.ok_or_else(|| format!("its {key} line `{value}` is malformed"))?;
                    match key {
                        "holder" => rec.holder = Some(hold),
                        _ => rec.holds.push(hold),
                    }
                }
                "value" => rec.value = Some(unescape(value)),
                "seq" => rec.seq = number("seq", value)?,
                // Lines added by later versions are skipped.
                _ => {}
            }
        }
        if !ended {
            return Err("it is truncated (no `end` line)".to_owned());
        }
        rec.token = token.ok_or_else(|| "it has no `token` line".to_owned())?;
        Ok(rec)
    }
}

fn number(what: &str, value: &str) -> Result<u64, String> {
    (value.parse()).map_err(|_| format!("its {what} `{value}` is not a number"))
}

/// An election value on one line: `\` as `\\`, line feed as `\n`, carriage return as `\r`.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
}

/// The reverse of [`escape`]; an unknown escape is kept as it is.
fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars().peekable();
    while let Some(c) = chars.next() {
        let escaped = chars.next_if(|&n| c == '\\' && matches!(n, 'n' | 'r' | '\\'));
        out.push(match escaped {
            Some('n') => '\n',
            Some('r') => '\r',
            Some(n) => n,
            None => c,
        });
    }
    out
}

/// A hold of `side` from `PID INSTANCE COUNT OWNER` (a `hold` line after its side) or, without
/// `instance`, `PID COUNT OWNER` (a `holder` line); the owner may contain spaces.
fn parse_hold(side: Side, value: &str, instance: bool) -> Option<HoldLine> {
    let mut parts = value.splitn(3 + usize::from(instance), ' ');
    let pid = parts.next()?.parse().ok()?;
    let instance = match instance {
        true => parts.next()?.parse().ok()?,
        false => 0,
    };
    let count = parts.next()?.parse().ok()?;
    let owner = parts.next().filter(|o| !o.is_empty())?.to_owned();
    Some(HoldLine {
        side,
        pid,
        instance,
        count,
        owner,
    })
}

/// Reads the whole file from offset 0.
pub(crate) fn read(file: &File) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    loop {
        let len = buf.len();
        if len >= MAX_RECORD {
            let e = format!("lock file larger than {MAX_RECORD} bytes");
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        buf.resize(len + 4096, 0);
        let read = file.read_at(&mut buf[len..], len as u64);
        buf.truncate(len + read.as_ref().map_or(0, |n| *n));
        match read {
            Ok(0) => return Ok(buf),
            Err(e) if e.kind() != io::ErrorKind::Interrupted => return Err(e),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32, count: u32, owner: &str) -> Option<HoldLine> {
        Some(hold(Side::Write, pid, 0, count, owner))
    }

    fn hold(side: Side, pid: u32, instance: u64, count: u32, owner: &str) -> HoldLine {
        let owner = owner.into();
        HoldLine {
            side,
            pid,
            instance,
            count,
            owner,
        }
    }

    fn reparsed(rec: &Record) -> Result<Record, String> {
        Record::parse(rec.encode().as_bytes())
    }

    #[test]
    fn tokens_increase_and_follow_the_clock() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_micros() as u64;
        // A fresh or lost counter starts at the clock, not at 1.
        let first = next_token(0).expect("token");
        assert!(first >= now, "{first} < {now}");
        // Always above the last one, even when it is ahead of the clock.
        assert_eq!(
            next_token(first + 1_000_000_000).expect("token"),
            first + 1_000_000_001
        );
        assert!(next_token(first).expect("token") > first);
        assert_eq!(next_token(u64::MAX), None);
    }

    #[test]
    fn fnv_vectors() {
        // Reference values of the FNV-1a 128-bit hash.
        assert_eq!(fnv1a_128(b""), 0x6c62272e07bb014262b821756295c58d);
        assert_eq!(fnv1a_128(b"a"), 0xd228cb696f1a8caf78912b704e4a8964);
        assert_eq!(fnv1a_128(b"foobar"), 0x343e1662793c64bf6f0d3597ba446f18);
        assert_eq!(file_name("a"), "d228cb696f1a8caf78912b704e4a8964.lock");
        assert_ne!(file_name("a/b"), file_name("a\\b"));
    }

    #[test]
    fn round_trip() {
        let held = Record {
            token: 42,
            name: Some("orders/{42} π with spaces".into()),
            holder: holder(7, 3, "host:7:abc:1 odd owner"),
            ..Record::default()
        };
        let free = Record {
            holder: None,
            ..held.clone()
        };
        let rw = Record {
            token: 9,
            name: Some("rw name".into()),
            holds: vec![
                hold(Side::Write, 12, 3, 2, "w owner"),
                hold(Side::Read, 13, 0, 1, "r"),
            ],
            ..Record::default()
        };
        let text = rw.encode();
        assert!(
            text.contains("hold w 12 3 2 w owner\nhold r 13 0 1 r\n"),
            "{text}"
        );
        for rec in [held, free.clone(), rw] {
            assert_eq!(reparsed(&rec), Ok(rec));
        }
        assert_eq!(Record::parse(b""), Ok(Record::default()));
        // Trailing bytes after `end` (a longer old record being shortened) are ignored.
        let torn = free.encode() + "er 1 1 x\n";
        assert!(Record::parse(torn.as_bytes()).is_ok());
        assert_eq!(
            suffixed_name("a", "rw"),
            "d228cb696f1a8caf78912b704e4a8964.rw"
        );
    }

    #[test]
    fn records_of_the_previous_version_read_and_rewrite_unchanged() {
        let text = "distlock-file 1\ntoken 7\nname n m\nholder 12 1 o w\nvalue a\\nb\nseq 2\nhold r 13 4 1 x y\nend\n";
        let rec = Record::parse(text.as_bytes()).expect("a record");
        assert_eq!((rec.value.as_deref(), rec.seq), (Some("a\nb"), 2));
        assert_eq!(rec.encode(), text);
    }

    #[test]
    fn election_values() {
        for v in [
            "",
            "10.0.0.7:8080",
            "a b\nc\\n\r\\",
            "π {\"zone\": \"b\"}",
            "\\",
        ] {
            let rec = Record {
                token: 5,
                name: Some("e".into()),
                holder: holder(1, 1, "o"),
                value: Some(v.into()),
                seq: 3,
                ..Record::default()
            };
            assert_eq!(rec.encode().lines().count(), 7, "{}", rec.encode());
            assert_eq!(reparsed(&rec), Ok(rec), "{v:?}");
        }
        assert_eq!(unescape("a\\xb\\"), "a\\xb\\");
    }

    #[test]
    fn corrupt() {
        let record = |body: &str| format!("distlock-file 1\n{body}end\n").into_bytes();
        for (bytes, why) in [
            (b"hello".to_vec(), "first line"),
            (record("token x\n"), "not a number"),
            (b"distlock-file 1\ntoken 3\n".to_vec(), "truncated"),
            (record(""), "no `token`"),
            (record("token 1\nholder x\n"), "holder"),
            (record("token 1\nseq x\n"), "seq"),
            (record("token 1\nhold x 1 1 1 o\n"), "hold"),
            (record("token 1\nhold r 1 1 1\n"), "hold"),
            (record("token 1\nhold r a 1 1 o\n"), "hold"),
            (record("token 1\nhold r 1 1 -1 o\n"), "hold"),
            (record("token 1\nhold w 1 1 1 \n"), "hold"),
            (vec![0xff, 0xfe], "UTF-8"),
        ] {
            let e = Record::parse(&bytes).unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
    }
}
