//! The key-values: the key layout, the value formats ([`Record`]), and the transaction
//! operations that read and write them (docs/etcd.md, *The recipe*, has the tables; an
//! election's keys live under a root of their own, its metadata outside the prefix etcd's
//! `concurrency.Election` reads). One key per acquisition attempt: a retry finds its own key by
//! name, and nothing another attempt (even of the same owner) does can touch it. `NAME` and
//! `ATTEMPT` are escaped so that `PREFIX/NAME/` is the prefix of exactly one lock's queue — the
//! prefix etcd's `concurrency.Mutex` (`etcdctl lock PREFIX/NAME`) queues under, so the two
//! exclude each other.

use crate::error::shape;
use crate::lease::Lease;
use distlock_core::backend::{AcquireRequest, AttemptId};
use distlock_core::{LockKind, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};

/// The keys of one lock.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `PREFIX/NAME/`: every waiter and the holder of this lock.
    pub(crate) queue: Vec<u8>,
    /// `PREFIX/NAME`.
    pub(crate) fence: Vec<u8>,
    /// For an election: `PREFIX-election-meta/NAME/`, where each candidate's metadata sits
    /// under the same last segment as its key.
    pub(crate) meta: Option<Vec<u8>>,
}

impl Keys {
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let fence = format!("{prefix}/{}", escape(name)).into_bytes();
        let mut queue = fence.clone();
        queue.push(b'/');
        Keys {
            queue,
            fence,
            meta: None,
        }
    }

    /// The keys of `name` of `kind`; an election's are `PREFIX-election/NAME/` and
    /// `PREFIX-election-meta/NAME/`.
    pub(crate) fn of_kind(prefix: &str, name: &str, kind: LockKind) -> Self {
        if kind != LockKind::Election {
            return Keys::new(prefix, name);
        }
        let mut k = Keys::new(&format!("{prefix}-election"), name);
        k.meta = Some(format!("{prefix}-election-meta/{}/", escape(name)).into_bytes());
        k
    }

    /// The metadata key that goes with queue key `key` (an election's only).
    pub(crate) fn meta_of(&self, key: &[u8]) -> Option<Vec<u8>> {
        let meta = self.meta.as_ref()?;
        let rest = key.strip_prefix(self.queue.as_slice())?;
        let mut m = meta.clone();
        m.extend_from_slice(rest);
        Some(m)
    }

    /// Reads and deletes the attempt's key `mine`, an election candidate's metadata key with
    /// it.
    pub(crate) fn read_and_delete(&self, mine: &[u8]) -> Vec<TxnOp> {
        let meta = self.meta_of(mine).map(|m| TxnOp::delete(m, None));
        let (get, delete) = (TxnOp::get(mine, None), TxnOp::delete(mine, None));
        [get, delete].into_iter().chain(meta).collect()
    }

    /// The last segment of queue key `key`, for messages.
    pub(crate) fn segment<'k>(&self, key: &'k [u8]) -> std::borrow::Cow<'k, str> {
        String::from_utf8_lossy(key.strip_prefix(self.queue.as_slice()).unwrap_or(key))
    }

    /// `PREFIX/NAME/ATTEMPT`: the key of one attempt.
    pub(crate) fn attempt(&self, attempt: &str) -> Vec<u8> {
        let mut k = self.queue.clone();
        k.extend_from_slice(escape(attempt).as_bytes());
        k
    }

    /// The keys of attempt `attempt` of this lock.
    pub(crate) fn slot(self, attempt: &AttemptId) -> Slot {
        let mine = self.attempt(attempt);
        let meta = self.meta_of(&mine);
        let attempt = attempt.clone();
        Slot {
            keys: self,
            mine,
            meta,
            attempt,
        }
    }

    /// Who holds `key` (a key of this lock's queue with value `value`): the owner id for a key
    /// dlock wrote; for a key another program queued under the same prefix (`etcdctl lock`,
    /// Go's `concurrency.Mutex`, whose keys are lease ids with empty values) its name, marked
    /// as foreign.
    pub(crate) fn holder_of(&self, key: &[u8], value: &[u8]) -> String {
        Record::decode(key, value, false).map_or_else(
            |_| format!("(not dlock) {}", self.segment(key)),
            |r| r.owner,
        )
    }
}

/// `%` → `%25`, `/` → `%2F`.
pub(crate) fn escape(s: &str) -> String {
    s.replace('%', "%25").replace('/', "%2F")
}

/// What dlock records of a hold: the TTL in seconds of the lease its keys are on (etcd cannot
/// tell it in the same read; renewals need it to decide between a keep-alive and a longer
/// lease), for an election candidate the number of the last proclamation applied (0: the value
/// it campaigned with), and the owner id (for `inspect`). A lock's key holds `TTL OWNER`, an
/// election candidate's metadata key `TTL SEQ OWNER`. No hold count: re-entry is counted in
/// the client, and a key is one grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) ttl: i64,
    pub(crate) seq: u64,
    pub(crate) owner: String,
}

impl Record {
    /// The value of a lock's key, or with `election` of a candidate's metadata key.
    pub(crate) fn encode(&self, election: bool) -> String {
        let (ttl, seq, owner) = (self.ttl, self.seq, &self.owner);
        match election {
            false => format!("{ttl} {owner}"),
            true => format!("{ttl} {seq} {owner}"),
        }
    }

    /// Reads [`encode`](Self::encode)'s value from key `key`: a TTL above 0 (and with
    /// `election` a number), a non-empty owner.
    pub(crate) fn decode(key: &[u8], value: &[u8], election: bool) -> Result<Record> {
        let parse = || {
            let (ttl, rest) = std::str::from_utf8(value).ok()?.split_once(' ')?;
            let ttl = ttl.parse().ok().filter(|t| *t > 0)?;
            let (seq, owner) = match election {
                false => (0, rest),
                true => rest
                    .split_once(' ')
                    .and_then(|(s, o)| Some((s.parse().ok()?, o)))?,
            };
            let owner = (!owner.is_empty()).then(|| owner.to_owned())?;
            Some(Record { ttl, seq, owner })
        };
        parse().ok_or_else(|| {
            let what = match election {
                false => "a dlock hold (`TTL OWNER`)",
                true => "a dlock candidate's metadata (`TTL SEQ OWNER`)",
            };
            shape(format!(
                "key `{}` holds `{}`, not {what}; is another program writing under this prefix?",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(value)
            ))
        })
    }
}

/// Compare-and-swap retries before giving up on a key that keeps changing under us.
pub(crate) const CAS_ATTEMPTS: usize = 8;

pub(crate) fn token_of(rev: i64) -> Result<u64> {
    u64::try_from(rev)
        .ok()
        .filter(|t| *t > 0)
        .ok_or_else(|| shape(format!("revision {rev} is not a valid fencing token")))
}

/// The create revision a grant's token stands for; `None` for a token no key can have.
pub(crate) fn revision_of(token: u64) -> Option<i64> {
    i64::try_from(token).ok().filter(|r| *r > 0)
}

/// The first key-value (if any) of every Get in a transaction response, in order.
pub(crate) fn firsts(resp: &TxnResponse) -> Vec<Option<KeyValue>> {
    let first = |r| match r {
        TxnOpResponse::Get(mut g) => Some(g.take_kvs().into_iter().next()),
        _ => None,
    };
    resp.op_responses().into_iter().filter_map(first).collect()
}

/// [`firsts`] of the first `N` Gets of a transaction response.
pub(crate) fn reads<const N: usize>(resp: &TxnResponse) -> Result<[Option<KeyValue>; N]> {
    let mut all = firsts(resp);
    all.truncate(N);
    (all.try_into()).map_err(|_| shape("a transaction returned fewer reads than it made"))
}

pub(crate) fn header_revision(resp: &TxnResponse) -> Result<i64> {
    resp.header()
        .map(|h| h.revision())
        .ok_or_else(|| shape("a transaction reply without a header"))
}

/// The first key of a queue: the holder.
pub(crate) fn first_of(queue: &[u8]) -> TxnOp {
    TxnOp::get(
        queue.to_vec(),
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        ),
    )
}

/// The keys of one attempt: its lock's, its own key (`PREFIX/NAME/ATTEMPT`), and an election
/// candidate's metadata key.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) keys: Keys,
    pub(crate) mine: Vec<u8>,
    pub(crate) meta: Option<Vec<u8>>,
    pub(crate) attempt: AttemptId,
}

impl Slot {
    /// The metadata of this election candidate, read as `m` (none: not dlock's layout).
    pub(crate) fn record(&self, m: Option<KeyValue>) -> Result<(KeyValue, Record)> {
        let m = m.ok_or_else(|| {
            shape(format!(
                "election candidate `{}` has no metadata key; is another program writing under \
                 this prefix?",
                String::from_utf8_lossy(&self.mine)
            ))
        })?;
        let rec = Record::decode(m.key(), m.value(), true)?;
        Ok((m, rec))
    }

    /// Puts this attempt's keys on `lease`: for a lock its key (`TTL OWNER`); for an election
    /// its key holding just `value` and its metadata key (with proclamation number `seq`).
    pub(crate) fn put(&self, owner: &str, value: &[u8], lease: Lease, seq: u64) -> Vec<TxnOp> {
        let put = |key: Vec<u8>, value: Vec<u8>| {
            TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease.id)))
        };
        let (ttl, owner) = (lease.ttl, owner.to_owned());
        let rec = Record { ttl, seq, owner };
        match &self.meta {
            None => vec![put(self.mine.clone(), rec.encode(false).into_bytes())],
            Some(meta) => vec![
                put(self.mine.clone(), value.to_vec()),
                put(meta.clone(), rec.encode(true).into_bytes()),
            ],
        }
    }

    /// The transaction that queues attempt `req` (on `lease`) — its keys put, the fence
    /// rewritten — if its guard holds, else reads its key and the queue's first. The acquire
    /// (`alone`) gets in only while nobody is queued, so it is first if it does; a waiter gets in
    /// while its key is not there yet, and reads the queue's first key to learn whether it is.
    pub(crate) fn enqueue(&self, req: &AcquireRequest, lease: Lease, alone: bool) -> Txn {
        let value = req.value.as_deref().unwrap_or_default().as_bytes();
        let queue = &self.keys.queue;
        let mut then = self.put(&req.key.owner, value, lease, 0);
        then.push(TxnOp::put(self.keys.fence.clone(), "", None));
        let guard = match alone {
            true => Compare::create_revision(queue.clone(), CompareOp::Equal, 0).with_prefix(),
            false => {
                then.push(first_of(queue));
                Compare::create_revision(self.mine.clone(), CompareOp::Equal, 0)
            }
        };
        (Txn::new().when([guard]).and_then(then))
            .or_else([TxnOp::get(self.mine.clone(), None), first_of(queue)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let k = Keys::new("dlock", "a/b%c");
        assert_eq!(k.fence, b"dlock/a%2Fb%25c");
        assert_eq!(k.queue, b"dlock/a%2Fb%25c/");
        assert_eq!(k.attempt("0f/1"), b"dlock/a%2Fb%25c/0f%2F1");
        // A name that is a prefix of another does not share its queue.
        let short = Keys::new("dlock", "a");
        for other in ["a/x", "ab"] {
            let theirs = Keys::new("dlock", other).attempt("0");
            assert!(!theirs.starts_with(&short.queue), "{other}");
        }
        // etcdctl lock dlock/orders queues under the same prefix.
        assert_eq!(Keys::new("dlock", "orders").queue, b"dlock/orders/");
    }

    #[test]
    fn election_layout() {
        let k = Keys::of_kind("dlock", "sched/a", LockKind::Election);
        assert_eq!(k.fence, b"dlock-election/sched%2Fa");
        assert_eq!(k.queue, b"dlock-election/sched%2Fa/");
        let mine = k.attempt("0f1");
        assert_eq!(mine, b"dlock-election/sched%2Fa/0f1");
        assert_eq!(
            k.meta_of(&mine).unwrap(),
            b"dlock-election-meta/sched%2Fa/0f1"
        );
        // Outside the lock layout and outside the prefix etcd's recipe reads.
        assert!(!k.queue.starts_with(b"dlock/"));
        assert!(!k.meta_of(&mine).unwrap().starts_with(&k.queue));
        assert_eq!(Keys::new("dlock", "x").meta_of(b"dlock/x/1"), None);
        // A foreign leader (`etcdctl elect`) is named by its key's last segment.
        let e = Keys::of_kind("dlock", "e", LockKind::Election);
        let foreign = e.segment(b"dlock-election/e/694d8f2a3b1c5e07");
        assert_eq!(foreign, "694d8f2a3b1c5e07");
        for (kind, queue) in [
            (LockKind::Election, "dlock-election/x/"),
            (LockKind::Mutex, "dlock/x/"),
        ] {
            assert_eq!(Keys::of_kind("dlock", "x", kind).queue, queue.as_bytes());
        }
    }

    #[test]
    fn records() {
        let lock = Record {
            ttl: 30,
            seq: 0,
            owner: "me: 1 2".into(),
        };
        let candidate = Record {
            ttl: 2,
            seq: 7,
            owner: "host a: 1".into(),
        };
        let lock_bad = [
            &b""[..],
            b"x",
            b"1",
            b"1 ",
            b"x o",
            b"0 o",
            b"-1 o",
            b"\xff",
        ];
        let candidate_bad = [&b""[..], b"1 2", b"1 x o", b"0 1 o", b"1 1 ", b"\xff"];
        for (rec, election, bad) in [
            (&lock, false, &lock_bad[..]),
            (&candidate, true, &candidate_bad),
        ] {
            let value = rec.encode(election);
            assert_eq!(
                Record::decode(b"k", value.as_bytes(), election).unwrap(),
                *rec
            );
            for bad in bad {
                assert!(Record::decode(b"k", bad, election).is_err(), "{bad:?}");
            }
        }
        let k = Keys::new("dlock", "n");
        let value = lock.encode(false);
        assert_eq!(k.holder_of(b"dlock/n/abc", value.as_bytes()), "me: 1 2");
        assert_eq!(
            k.holder_of(b"dlock/n/694d8f2a3b1c5e07", b""),
            "(not dlock) 694d8f2a3b1c5e07"
        );
    }
}
