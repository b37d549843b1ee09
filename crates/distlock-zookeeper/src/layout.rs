//! Node names and paths, and the grant rules of the recipes (pure functions, unit tested).

use distlock_core::{Error, LockKind, Result};
use std::fmt::Write as _;

use crate::KIND;

/// The two independent lock families that may share one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    /// `lock-` nodes in `/<ns>/<name>`.
    Mutex,
    /// `read-` and `write-` nodes in `/<ns>/<name>/rw`.
    Rw,
    /// `latch-` nodes (Curator's `LeaderLatch`) in `/<ns>-election/<name>`: elections.
    Election,
}

/// What one lock node stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum NodeKind {
    Lock,
    Read,
    Write,
    /// An election candidate (Curator's `LeaderLatch` node).
    Latch,
}

impl NodeKind {
    pub(crate) fn of(kind: LockKind) -> Result<NodeKind> {
        match kind {
            // The mutex recipe is first come first served already: a fair lock is the same lock.
            LockKind::Mutex | LockKind::Fair => Ok(NodeKind::Lock),
            LockKind::Read => Ok(NodeKind::Read),
            LockKind::Write => Ok(NodeKind::Write),
            LockKind::Election => Ok(NodeKind::Latch),
            other => Err(Error::unsupported(
                KIND,
                format!("lock kind {}", other.as_str()),
            )),
        }
    }

    pub(crate) fn family(self) -> Family {
        match self {
            NodeKind::Lock => Family::Mutex,
            NodeKind::Read | NodeKind::Write => Family::Rw,
            NodeKind::Latch => Family::Election,
        }
    }

    /// The word in the node name (`_c_<id>-<word>-<seq>`).
    pub(crate) fn word(self) -> &'static str {
        match self {
            NodeKind::Lock => "lock",
            NodeKind::Read => "read",
            NodeKind::Write => "write",
            NodeKind::Latch => "latch",
        }
    }
}

/// Percent-encodes a lock name or namespace into one ZooKeeper path segment: ASCII letters,
/// digits and `-_.~:@+=,` stay, every other byte (`/`, `%`, spaces, non-ASCII…) becomes `%XX`,
/// and the reserved segments `.` and `..` are encoded whole. The mapping is injective, so two
/// names never share a node.
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~:@+=,".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    if out == "." || out == ".." {
        out = out.replace('.', "%2E");
    }
    out
}

/// The directory holding the lock nodes of `name` of `kind` under `base` (`/<chroot>/<ns>`).
/// Elections live beside the namespace, in `/<chroot>/<ns>-election/<name>`: Curator's
/// `InterProcessMutex` on `/<ns>/<name>` sorts every child of its path, so an election's
/// nodes must not be there.
pub(crate) fn dir(base: &str, name: &str, family: Family) -> String {
    match family {
        Family::Mutex => format!("{base}/{}", encode_segment(name)),
        Family::Rw => format!("{base}/{}/rw", encode_segment(name)),
        Family::Election => format!("{base}{ELECTION_SUFFIX}/{}", encode_segment(name)),
    }
}

/// What the election root adds to the namespace's path segment.
pub(crate) const ELECTION_SUFFIX: &str = "-election";

/// What a dlock candidate's node name carries after its attempt id: `dlock=<owner>`.
const OWNER_MARK: &str = "dlock=";

/// One lock node, parsed from its name `_c_<id>-<word>-<sequence>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Child {
    pub(crate) name: String,
    pub(crate) kind: NodeKind,
    pub(crate) seq: i64,
}

/// Parses a child name; `None` for anything that is not one of our lock nodes (the `rw`
/// directory, foreign nodes).
pub(crate) fn parse_child(name: &str) -> Option<Child> {
    let mut parts = name.rsplitn(3, '-');
    let seq = parts.next()?;
    let word = parts.next()?;
    let prefix = parts.next()?;
    if !prefix.starts_with("_c_") || seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let kinds = [
        NodeKind::Lock,
        NodeKind::Read,
        NodeKind::Write,
        NodeKind::Latch,
    ];
    let kind = kinds.into_iter().find(|k| k.word() == word)?;
    Some(Child {
        name: name.to_owned(),
        kind,
        seq: seq.parse().ok()?,
    })
}

/// The lock nodes of `family` among `names`, in sequence (= creation) order.
pub(crate) fn queue(names: &[String], family: Family) -> Vec<Child> {
    let mut q: Vec<Child> = names
        .iter()
        .filter_map(|n| parse_child(n))
        .filter(|c| c.kind.family() == family)
        .collect();
    q.sort_by_key(|c| c.seq);
    q
}

/// Where one node stands in its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Turn {
    /// The node holds the lock.
    Granted,
    /// Not yet: watch this node (by name) and look again when it goes.
    WaitFor(String),
    /// The node is not in the queue (deleted, or its session ended).
    Gone,
}

/// The recipes' grant rules:
/// - mutex (`lock-`): the lowest node holds; the others each watch their predecessor;
/// - write: the lowest of all `read-`/`write-` nodes holds; the others watch their predecessor;
/// - read: holds when no `write-` node precedes it (readers overlap); otherwise watches the
///   closest `write-` node before it.
///
/// `head_downgraded`: the lowest node is a `write-` node whose holder let the write side go
/// and kept reading (a downgrade); it then counts as a reader for readers behind it (writers
/// still wait for it, as for any predecessor).
pub(crate) fn turn(queue: &[Child], ours: &str, head_downgraded: bool) -> Turn {
    let Some(idx) = queue.iter().position(|c| c.name == ours) else {
        return Turn::Gone;
    };
    let me = &queue[idx];
    let before = &queue[..idx];
    match me.kind {
        NodeKind::Lock | NodeKind::Write | NodeKind::Latch => match before.last() {
            None => Turn::Granted,
            Some(pred) => Turn::WaitFor(pred.name.clone()),
        },
        NodeKind::Read => {
            let skip = usize::from(head_downgraded);
            match before
                .iter()
                .skip(skip)
                .rev()
                .find(|c| c.kind == NodeKind::Write)
            {
                None => Turn::Granted,
                Some(w) => Turn::WaitFor(w.name.clone()),
            }
        }
    }
}

/// True when a reader `ours` would need to know whether the head of the queue is a
/// downgraded writer to decide its turn.
pub(crate) fn needs_head_check(queue: &[Child], ours: &str) -> bool {
    let Some(me) = queue.iter().find(|c| c.name == ours) else {
        return false;
    };
    me.kind == NodeKind::Read
        && queue
            .first()
            .is_some_and(|h| h.kind == NodeKind::Write && h.seq < me.seq)
}

/// The nodes of a queue that hold the lock right now.
pub(crate) fn holders(queue: &[Child], head_downgraded: bool) -> Vec<&Child> {
    match queue.first() {
        None => Vec::new(),
        Some(first)
            if first.kind == NodeKind::Read
                || (head_downgraded && first.kind == NodeKind::Write) =>
        {
            std::iter::once(first)
                .chain(queue[1..].iter().take_while(|c| c.kind == NodeKind::Read))
                .collect()
        }
        Some(first) => vec![first],
    }
}

/// The side a holder's node of `kind` holds: none for a mutex or a candidate, the write side for a `write-`
/// node whose write grant was not released (`downgraded`), the read side otherwise.
pub(crate) fn side(kind: NodeKind, downgraded: bool) -> Option<LockKind> {
    match kind {
        NodeKind::Lock | NodeKind::Latch => None,
        NodeKind::Write if !downgraded => Some(LockKind::Write),
        _ => Some(LockKind::Read),
    }
}

/// The name prefix of the node acquisition attempt `attempt` of `owner` creates
/// (`_c_<attempt>-<word>-`; the server appends the sequence number). The attempt id plays the
/// part of Curator's "protection" id: a retry finds the node of a create whose answer was lost
/// by this prefix. An election candidate's node also carries its owner id
/// (`_c_<attempt>-dlock=<owner, percent-encoded>-latch-`), since its data must be the value
/// alone (Curator's `LeaderLatch` shows a node's data as the participant's id); Curator orders
/// latch nodes by what follows the last `latch-`, the sequence number.
pub(crate) fn name_prefix(attempt: &str, kind: NodeKind, owner: &str) -> String {
    match kind {
        NodeKind::Latch => format!(
            "_c_{attempt}-{OWNER_MARK}{}-{}-",
            encode_segment(owner),
            kind.word()
        ),
        _ => format!("_c_{attempt}-{}-", kind.word()),
    }
}

/// The owner id a dlock candidate's latch node name carries; `None` for a node dlock did not
/// make (a Curator `LeaderLatch` participant: `_c_<uuid>-latch-<seq>`).
pub(crate) fn latch_owner(name: &str) -> Option<String> {
    let rest = name.strip_prefix("_c_")?;
    let (attempt, rest) = rest.split_once('-')?;
    check_attempt(attempt).ok()?;
    let rest = rest.strip_prefix(OWNER_MARK)?;
    let (owner, _seq) = rest.rsplit_once("-latch-")?;
    decode_segment(owner)
}

/// Decodes a path segment written by [`encode_segment`]; `None` for a segment that is not one
/// (no name maps to it).
pub(crate) fn decode_segment(s: &str) -> Option<String> {
    let name = String::from_utf8(distlock_core::conn::percent_decode_strict(s).ok()?).ok()?;
    // Only the canonical encoding names anything (`%41` is not where `A` lives).
    (encode_segment(&name) == s).then_some(name)
}

/// Checks that an attempt id can be part of a node name and cannot be a prefix of another's
/// (`-` ends it in the name): 1 to 64 ASCII letters and digits.
pub(crate) fn check_attempt(attempt: &str) -> Result<()> {
    if attempt.is_empty()
        || attempt.len() > 64
        || !attempt.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(Error::invalid(format!(
            "attempt id `{attempt}` is not 1 to 64 ASCII letters and digits"
        )));
    }
    Ok(())
}

/// What a lock node's data says: its owner id; whether the write side of a `write-` node was
/// released while its owner kept reading (a downgrade); and the attempts whose read grants share
/// the node (the read side taken beside the owner's write grant).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NodeData {
    pub(crate) owner: String,
    pub(crate) downgraded: bool,
    pub(crate) readers: Vec<String>,
}

const DOWNGRADED: &str = "read";
const READER: &str = "r:";

impl NodeData {
    pub(crate) fn new(owner: &str) -> Self {
        NodeData {
            owner: owner.to_owned(),
            ..Default::default()
        }
    }

    /// `owner`, then `read` once downgraded, then one `r:<attempt>` line per joined read
    /// grant. Owner ids have no control characters, so a line break cannot be part of one; a
    /// plain owner id (what older versions and Curator-like writers store) parses as well.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut s = self.owner.clone();
        if self.downgraded {
            s.push('\n');
            s.push_str(DOWNGRADED);
        }
        for r in &self.readers {
            s.push('\n');
            s.push_str(READER);
            s.push_str(r);
        }
        s.into_bytes()
    }

    /// `None` for data we did not write.
    pub(crate) fn parse(data: &[u8]) -> Option<NodeData> {
        let s = std::str::from_utf8(data).ok()?;
        let mut lines = s.split('\n');
        let mut nd = NodeData::new(lines.next()?);
        for line in lines {
            if line == DOWNGRADED {
                nd.downgraded = true;
            } else if let Some(r) = line.strip_prefix(READER).filter(|r| !r.is_empty()) {
                nd.readers.push(r.to_owned());
            } else {
                return None;
            }
        }
        Some(nd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(specs: &[(&str, i64)]) -> Vec<String> {
        specs
            .iter()
            .enumerate()
            .map(|(i, (w, s))| format!("_c_{i:032x}-{w}-{s:010}"))
            .collect()
    }

    #[test]
    fn encoding() {
        assert_eq!(encode_segment("orders:42"), "orders:42");
        assert_eq!(encode_segment("a/b c%"), "a%2Fb%20c%25");
        assert_eq!(encode_segment("π"), "%CF%80");
        assert_eq!(encode_segment("{x}"), "%7Bx%7D");
        assert_eq!(encode_segment("."), "%2E");
        assert_eq!(encode_segment(".."), "%2E%2E");
        assert_eq!(encode_segment("..."), "...");
        assert_ne!(encode_segment("a/b"), encode_segment("a%2Fb"));
        assert_eq!(dir("/dlock", "a/b", Family::Mutex), "/dlock/a%2Fb");
        assert_eq!(dir("/r/dlock", "x", Family::Rw), "/r/dlock/x/rw");
    }

    #[test]
    fn child_names() {
        use NodeKind::{Lock, Read, Write};
        for (name, want) in [
            ("_c_0123abcd-lock-0000000042", Some((Lock, 42))),
            ("_c_ff-write-0000000007", Some((Write, 7))),
            // 64-bit sequence numbers (19 digits) parse too.
            (
                "_c_ff-read-2147483648000000000",
                Some((Read, 2_147_483_648_000_000_000)),
            ),
            ("rw", None),
            ("lock-0000000001", None),
            ("_c_ff-lock-", None),
            ("_c_ff-lock-12a", None),
            ("x_c_ff-lock-0000000001", None),
        ] {
            assert_eq!(parse_child(name).map(|c| (c.kind, c.seq)), want, "{name}");
        }
    }

    #[test]
    fn latch_names() {
        let id = "0123456789abcdef0123456789abcdef";
        let owner = "host-1-latch-7 π/x";
        let name = format!("{}0000000042", name_prefix(id, NodeKind::Latch, owner));
        let c = parse_child(&name).expect("a latch node");
        assert_eq!((c.kind, c.seq), (NodeKind::Latch, 42));
        assert_eq!(latch_owner(&name).as_deref(), Some(owner));
        // Curator's LeaderLatch node: a participant, not dlock's.
        let curator = "_c_2b0a6a4e-8f3c-4f7e-9d4a-1c2b3d4e5f60-latch-0000000041";
        assert_eq!(
            parse_child(curator).map(|c| (c.kind, c.seq)),
            Some((NodeKind::Latch, 41))
        );
        assert_eq!(latch_owner(curator), None);
        // Latch nodes sort with each other by sequence, apart from the mutex queue.
        let names = [&name, curator, "_c_ff-lock-0000000001"].map(str::to_owned);
        let q = queue(&names, Family::Election);
        assert_eq!(q.iter().map(|c| c.seq).collect::<Vec<_>>(), [41, 42]);
        assert_eq!(turn(&q, &name, false), Turn::WaitFor(curator.to_owned()));
        assert_eq!(queue(&names, Family::Mutex).len(), 1);
        assert_eq!(
            dir("/dlock", "a/b", Family::Election),
            "/dlock-election/a%2Fb"
        );
    }

    #[test]
    fn mutex_rules() {
        let n = names(&[("lock", 5), ("lock", 3), ("read", 1), ("lock", 9)]);
        let q = queue(&n, Family::Mutex);
        assert_eq!(q.iter().map(|c| c.seq).collect::<Vec<_>>(), [3, 5, 9]);
        assert_eq!(turn(&q, &n[1], false), Turn::Granted);
        assert_eq!(turn(&q, &n[0], false), Turn::WaitFor(n[1].clone()));
        assert_eq!(turn(&q, &n[3], false), Turn::WaitFor(n[0].clone()));
        let other_family = turn(&q, &n[2], false);
        assert_eq!(other_family, Turn::Gone, "read nodes are another family");
        assert_eq!(holders(&q, false).len(), 1);
        assert!(!needs_head_check(&q, &n[0]));
    }

    #[test]
    fn read_write_rules() {
        // r1 r2 w3 r4 w5 r6
        let (r, w) = ("read", "write");
        let n = names(&[(r, 1), (r, 2), (w, 3), (r, 4), (w, 5), (r, 6)]);
        let wait = |i: usize| Turn::WaitFor(n[i].clone());
        let seqs = |h: Vec<&Child>| h.iter().map(|c| c.seq).collect::<Vec<_>>();
        let all = queue(&n, Family::Rw);
        // A writer first excludes everyone… until it downgrades: then readers up to the next
        // writer join it, writers still wait.
        let from_w3 = queue(&n[2..], Family::Rw);
        for (q, i, head_downgraded, want) in [
            (&all, 0, false, Turn::Granted),
            (&all, 1, false, Turn::Granted), // readers overlap
            (&all, 2, false, wait(1)),
            (&all, 3, false, wait(2)),
            (&all, 4, false, wait(3)),
            (&all, 5, false, wait(4)), // the closest writer
            (&from_w3, 2, false, Turn::Granted),
            (&from_w3, 3, false, wait(2)),
            (&from_w3, 3, true, Turn::Granted),
            (&from_w3, 4, true, wait(3)),
            (&from_w3, 5, true, wait(4)),
        ] {
            assert_eq!(turn(q, &n[i], head_downgraded), want, "node {i}");
        }
        assert_eq!(seqs(holders(&all, false)), [1, 2]);
        assert_eq!(seqs(holders(&from_w3, false)), [3]);
        assert_eq!(seqs(holders(&from_w3, true)), [3, 4]);
        assert!(holders(&[], false).is_empty());
        assert!(!needs_head_check(&all, &n[3]), "the head is a reader");
        assert!(needs_head_check(&from_w3, &n[3]));
        assert!(!needs_head_check(&from_w3, &n[4]), "writers do not care");
        assert_eq!(side(NodeKind::Lock, false), None);
        assert_eq!(side(NodeKind::Latch, false), None);
        assert_eq!(side(NodeKind::Write, false), Some(LockKind::Write));
        assert_eq!(side(NodeKind::Write, true), Some(LockKind::Read));
        assert_eq!(side(NodeKind::Read, false), Some(LockKind::Read));
    }

    #[test]
    fn data() {
        let mut nd = NodeData::new("a:1");
        assert_eq!(NodeData::parse(&nd.encode()), Some(nd.clone()));
        nd.readers.push("ab12".into());
        assert_eq!(NodeData::parse(&nd.encode()), Some(nd.clone()));
        nd.downgraded = true;
        nd.readers.push("cd34".into());
        assert_eq!(NodeData::parse(&nd.encode()), Some(nd.clone()));
        // What older versions wrote.
        assert_eq!(
            NodeData::parse(b"a:1\nread"),
            Some(NodeData {
                owner: "a:1".into(),
                downgraded: true,
                readers: vec![]
            })
        );
        // Curator stores the client's address: an owner id for `inspect`.
        assert_eq!(
            NodeData::parse(b"127.0.0.1").map(|d| d.owner),
            Some("127.0.0.1".into())
        );
        assert_eq!(NodeData::parse(b"a\nb"), None);
        assert_eq!(NodeData::parse(b"a\nr:"), None);
        assert_eq!(NodeData::parse(&[0xff]), None);
    }

    #[test]
    fn attempts_in_names() {
        let id = "0123456789abcdef0123456789abcdef";
        assert!(check_attempt(id).is_ok());
        for bad in ["", "a-b", "a/b", &"a".repeat(65)] {
            assert!(check_attempt(bad).is_err(), "{bad}");
        }
        let name = format!("{}0000000042", name_prefix(id, NodeKind::Lock, "o"));
        let c = parse_child(&name).expect("ours");
        assert_eq!((c.kind, c.seq), (NodeKind::Lock, 42));
        // Curator's own nodes (a UUID with dashes) parse and sort with ours.
        let curator = "_c_2b0a6a4e-8f3c-4f7e-9d4a-1c2b3d4e5f60-lock-0000000041";
        assert_eq!(parse_child(curator).map(|c| c.seq), Some(41));
        // One attempt's prefix never matches another attempt's node.
        assert!(
            !format!("{}0000000001", name_prefix("abc", NodeKind::Lock, "o"))
                .starts_with(&name_prefix("ab", NodeKind::Lock, "o"))
        );
    }
}
