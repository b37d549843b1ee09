//! `?dialect=`: locks on another library's keys, so that dlock and that library's clients
//! exclude each other on the same lock names (the layouts: docs/redis-dialects.md). Redisson's
//! `RLock` is the hash `NAME`, a dlock grant's field `ATTEMPT_UUID:TOKEN`; python-redis-lock's
//! `Lock` the string `lock:NAME`, a dlock grant's id `dlock:ATTEMPT:TOKEN:OWNER`, its release
//! signal the list `lock-signal:NAME` ([`SIGNAL_EXPIRE_MS`]).
//!
//! dlock keeps its own promises where the layout has room for them: a fencing token per grant
//! (a counter under a key of dlock's, `NS:…`, in the lock's Cluster slot, which the other
//! library never reads), renewals by the watchdog (the lost signal when a renewal finds the
//! grant gone), retried requests that count once, ended attempts that never grant late. There
//! is no server-side queue: waiters retry on every wake-up (no FIFO, no handoff).
//!
//! Only the plain mutex: every other lock kind is refused with [`Error::Unsupported`] by the
//! core, through the backend's [`Capabilities`].

mod signal;

use crate::error::KIND;
use crate::inspect::ms;
use crate::renew::RenewKeys;
use crate::RedisBackend;
use distlock_core::backend::{
    AcquireReply, AcquireRequest, AttemptId, Capabilities, GrantRef, HoldKey, ReleaseWatch,
};
use distlock_core::conn::ConnectionString;
use distlock_core::{
    Error, Finding, ForceReleased, HolderInfo, ListedLock, LockInfo, LockKind, ReleaseOutcome,
    Result, Severity,
};
use redis::Value;
use std::time::Duration;

/// How long python-redis-lock's release signal (`lock-signal:NAME`) lives, in ms: its own
/// default `signal_expire`. A waiter that starts its `BLPOP` later than this after a release
/// misses it and wakes at the holder's lease end instead.
pub(crate) const SIGNAL_EXPIRE_MS: u64 = 1000;

/// Another library's layout of the keys of a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// Redisson's `RLock` (Java), and its ports that share its keys (node-redisson).
    Redisson,
    /// python-redis-lock's `Lock`.
    PythonRedisLock,
}

/// A dialect's words, as data (the code that uses them is written once): its `dialect=` value;
/// its lock and keys of lock `NAME`, in the peer's words; the lock key's prefix before `NAME`,
/// its Redis type, the command that reads it, what it holds; the part of dlock's own keys'
/// names (`NS:PART:…`); its family in `renew_many.lua`; the note of its capabilities.
struct Words {
    param: &'static str,
    peer: &'static str,
    keys: &'static str,
    prefix: &'static str,
    redis_type: &'static str,
    read: &'static str,
    holds: &'static str,
    part: &'static str,
    renew: &'static str,
    note: &'static str,
}

impl Dialect {
    /// The `dialect=` parameter of `cs`, if any.
    pub(crate) fn from_url(cs: &ConnectionString) -> Result<Option<Dialect>> {
        match cs.param("dialect") {
            None | Some("") | Some("dlock") => Ok(None),
            Some("redisson") => Ok(Some(Dialect::Redisson)),
            Some("python-redis-lock") => Ok(Some(Dialect::PythonRedisLock)),
            Some(other) => Err(cs.invalid(format!(
                "unknown dialect `{other}` (known: redisson, python-redis-lock; leave it out for dlock's own layout)"
            ))),
        }
    }

    fn words(self) -> &'static Words {
        match self {
            Dialect::Redisson => &Words {
                param: "redisson",
                peer: "Redisson's RLock",
                keys: "hash NAME, channel redisson_lock__channel:{NAME}",
                prefix: "",
                redis_type: "hash",
                read: "HGETALL",
                holds: "a Redisson lock hash",
                part: "redisson",
                renew: "r",
                note: "dialect=redisson speaks Redisson's plain RLock only: use a mutex, or dlock's own layout (no dialect=) for other kinds",
            },
            Dialect::PythonRedisLock => &Words {
                param: "python-redis-lock",
                peer: "python-redis-lock's Lock",
                keys: "lock:NAME, signal list lock-signal:NAME",
                prefix: "lock:",
                redis_type: "string",
                read: "GET",
                holds: "a python-redis-lock string",
                part: "pyrl",
                renew: "p",
                note: "dialect=python-redis-lock speaks its plain Lock only: use a mutex, or dlock's own layout (no dialect=) for other kinds",
            },
        }
    }

    /// The parameter's value.
    pub(crate) fn as_str(self) -> &'static str {
        self.words().param
    }

    /// The start of every holder id of `attempt`'s grants: Redisson's field `UUID:`,
    /// python-redis-lock's id `dlock:ATTEMPT:`.
    fn attempt_prefix(self, attempt: &AttemptId) -> String {
        match self {
            Dialect::Redisson => format!("{}:", client_uuid(attempt)),
            Dialect::PythonRedisLock => format!("dlock:{}:", attempt.as_str()),
        }
    }

    /// A dlock grant's holder id: Redisson's field `UUID:TOKEN`, python-redis-lock's id
    /// `dlock:ATTEMPT:TOKEN:OWNER`.
    fn held_by(self, g: &GrantRef) -> String {
        let id = format!("{}{}", self.attempt_prefix(&g.attempt), g.token);
        match self {
            Dialect::Redisson => id,
            Dialect::PythonRedisLock => format!("{id}:{}", g.key.owner),
        }
    }

    /// The lock kinds the dialect speaks: the plain mutex.
    pub(crate) fn capabilities(self) -> Capabilities {
        Capabilities::kinds(&[LockKind::Mutex]).note(self.words().note)
    }
}

crate::scripts::script_set! {
    /// The dialects' scripts (loaded on first use).
    static SCRIPTS: Scripts {
        redisson_acquire: crate::scripts::fenced!("dialect/redisson_acquire.lua"),
        redisson_release: crate::scripts::lua!("dialect/redisson_release.lua"),
        pyrl_acquire: crate::scripts::fenced!("dialect/pyrl_acquire.lua"),
        pyrl_release: crate::scripts::lua!("dialect/pyrl_release.lua"),
        force_release: crate::scripts::lua!("dialect/force_release.lua"),
    }
}

/// A key of dlock's own for the lock stored at `key` (another library's key): `prefix`, then
/// a hash tag that puts it in `key`'s Cluster slot, then `key` itself when it is not the tag.
fn beside(prefix: &str, key: &str) -> Result<String> {
    match crate::cluster::hash_tag(key) {
        Some(tag) => Ok(format!("{prefix}:{{{tag}}}:{key}")),
        None if !key.contains('}') => Ok(format!("{prefix}:{{{key}}}")),
        None => Err(Error::invalid(format!(
            "lock key `{key}` has a `}}` but no hash tag: no key of dlock's (its fencing counter) can share its Redis Cluster slot; \
             rename the lock, or give it a tag such as `{{{}}}`",
            key.replace(['{', '}'], "")
        ))),
    }
}

/// The attempt as a Redisson client id: its 128 bits written as a UUID (8-4-4-4-12 hex);
/// an id of another shape (never made by the core) as it is.
fn client_uuid(attempt: &AttemptId) -> String {
    let a = attempt.as_str();
    if a.len() == 32 && a.bytes().all(|c| c.is_ascii_hexdigit()) {
        format!(
            "{}-{}-{}-{}-{}",
            &a[..8],
            &a[8..12],
            &a[12..16],
            &a[16..20],
            &a[20..]
        )
    } else {
        a.to_owned()
    }
}

/// A Redisson holder field `UUID:THREAD_ID`: the two parts, if it has that shape.
fn redisson_field(field: &str) -> Option<(&str, u64)> {
    let (id, thread) = field.rsplit_once(':')?;
    Some((id, thread.parse().ok()?))
}

/// The dialect of a backend and the namespace of dlock's own keys beside the peer's.
pub(crate) struct Layout {
    pub(crate) dialect: Dialect,
    namespace: String,
}

/// `dlock:ATTEMPT:TOKEN:OWNER`: the owner of a dlock grant's python-redis-lock id, if it is
/// one.
fn pyrl_owner(id: &str) -> Option<(u64, &str)> {
    let rest = id.strip_prefix("dlock:")?;
    let (_, rest) = rest.split_once(':')?;
    let (token, owner) = rest.split_once(':')?;
    Some((token.parse().ok()?, owner))
}

impl Layout {
    pub(crate) fn new(dialect: Dialect, namespace: &str) -> Self {
        Layout {
            dialect,
            namespace: namespace.to_owned(),
        }
    }

    /// The peer's lock key of `name`: `NAME` (Redisson) or `lock:NAME` (python-redis-lock).
    pub(crate) fn lock_key(&self, name: &str) -> String {
        [self.dialect.words().prefix, name].concat()
    }

    /// Redisson's unlock channel of `name`: its `prefixName`, `PREFIX:{NAME}`, or `PREFIX:NAME`
    /// when the name has a `{` (the name's own tag then keeps both in one slot).
    fn channel(name: &str) -> String {
        match name.contains('{') {
            true => format!("redisson_lock__channel:{name}"),
            false => format!("redisson_lock__channel:{{{name}}}"),
        }
    }

    /// python-redis-lock's release signal of `name`.
    fn signal(name: &str) -> String {
        format!("lock-signal:{name}")
    }

    /// dlock's key `what` for lock `name`, in the lock key's slot.
    fn own(&self, what: &str, name: &str) -> Result<String> {
        let prefix = format!("{}:{}:{what}", self.namespace, self.dialect.words().part);
        beside(&prefix, &self.lock_key(name))
    }

    fn fence_key(&self, name: &str) -> Result<String> {
        self.own("fence", name)
    }

    /// Redisson: dlock's holder names (field → dlock owner) beside the hash.
    fn names_key(&self, name: &str) -> Result<String> {
        self.own("owners", name)
    }

    fn ended_key(&self, name: &str, attempt: &AttemptId) -> Result<String> {
        Ok(format!("{}:{}", self.own("ended", name)?, attempt.as_str()))
    }

    /// The grant's part of `renew_many.lua`.
    pub(crate) fn renew_keys<'a>(&self, grant: &GrantRef) -> Result<RenewKeys<'a>> {
        let name = &grant.key.name;
        let mut keys = vec![self.lock_key(name)];
        if self.dialect == Dialect::Redisson {
            keys.push(self.names_key(name)?);
        }
        Ok(RenewKeys {
            keys,
            family: self.dialect.words().renew,
            held_by: self.dialect.held_by(grant).into(),
        })
    }

    /// A finding for `dlock doctor`: which dialect this URL speaks.
    pub(crate) fn finding(layout: Option<&Layout>) -> Finding {
        match layout {
            None => Finding::new(
                Severity::Ok,
                "dialect",
                "dlock's own layout (NS:{NAME}…): shared with dlock clients only; add ?dialect=redisson or ?dialect=python-redis-lock to lock the keys of those libraries",
            ),
            Some(l) => {
                let w = l.dialect.words();
                Finding::new(
                    Severity::Ok,
                    "dialect",
                    format!(
                        "dialect={}: mutexes on {} keys ({}), shared with its clients; dlock's fencing counters under `{}:{}:…`; no FIFO queue or handoff (docs/redis-dialects.md)",
                        w.param, w.peer, w.keys, l.namespace, w.part
                    ),
                )
            }
        }
    }
}

/// An error of a script on lock `name`: a `WRONGTYPE` (the peer's key holds other data) is
/// said in the dialect's words — the lock key is the name itself, not under dlock's namespace.
fn on_key(l: &Layout, name: &str, e: Error) -> Error {
    match &e {
        Error::UnexpectedReply { message, .. } if message.contains("WRONGTYPE") => {
            Error::unexpected(
                KIND,
                format!(
                    "key `{}` holds data of another type, not {} ({message}); with dialect={} the lock is that key itself, so another application's data under the same name gets in the way: choose a lock name no other data uses",
                    l.lock_key(name),
                    l.dialect.words().holds,
                    l.dialect.as_str()
                ),
            )
        }
        _ => e,
    }
}

/// `Backend::acquire` in a dialect.
pub(crate) async fn acquire(
    b: &RedisBackend,
    l: &Layout,
    req: &AcquireRequest,
) -> Result<AcquireReply> {
    let name = &req.key.name;
    let lease = crate::lease_ms(req.lease);
    let owner: &str = &req.key.owner;
    let ended = l.ended_key(name, &req.attempt)?;
    let lock = l.lock_key(name);
    let fence = l.fence_key(name)?;
    let cmd = match l.dialect {
        Dialect::Redisson => {
            let names = l.names_key(name)?;
            let id = client_uuid(&req.attempt);
            SCRIPTS
                .redisson_acquire
                .cmd(&[&lock, &fence, &names, &ended], &[&id, owner, &lease])
        }
        Dialect::PythonRedisLock => {
            let prefix = l.dialect.attempt_prefix(&req.attempt);
            SCRIPTS
                .pyrl_acquire
                .cmd(&[&lock, &fence, &ended], &[&prefix, owner, &lease])
        }
    };
    let sent = b.unanswered.sent(&req.attempt);
    let (v, acked) = b
        .eval_ending(&SCRIPTS.all(), &cmd, None, b.wait_replicas)
        .await
        .map_err(|e| on_key(l, name, e))?;
    sent.answered();
    let reply = crate::acquire_outcome(req, &v, crate::pair("acquire", &v)?)?;
    if let AcquireReply::Granted { token } = reply {
        b.confirm_replicas(&req.grant(token), acked).await?;
    }
    Ok(reply)
}

/// `Backend::release` of `grant` in a dialect, or (`None`) `Backend::give_up` of `attempt`
/// (any grant of it goes back), with the attempt's end record when a request of it may still
/// reach the server.
pub(crate) async fn release(
    b: &RedisBackend,
    l: &Layout,
    key: &HoldKey,
    attempt: &AttemptId,
    grant: Option<&GrantRef>,
) -> Result<ReleaseOutcome> {
    // The grant's field or id, or its prefix for a give-up.
    let (held_by, mode) = match grant {
        Some(g) => (l.dialect.held_by(g), "release"),
        None => (l.dialect.attempt_prefix(attempt), "giveup"),
    };
    let name = &key.name;
    let lock = l.lock_key(name);
    let cmd = match l.dialect {
        Dialect::Redisson => SCRIPTS.redisson_release.cmd(
            &[&lock, &l.names_key(name)?],
            &[&held_by, &Layout::channel(name), mode],
        ),
        Dialect::PythonRedisLock => SCRIPTS.pyrl_release.cmd(
            &[&lock, &Layout::signal(name)],
            &[&held_by, mode, &SIGNAL_EXPIRE_MS.to_string()],
        ),
    };
    let record = b.end_record(attempt, || l.ended_key(name, attempt))?;
    let (v, _) = b
        .eval_ending(&SCRIPTS.all(), &cmd, record.as_ref(), None)
        .await
        .map_err(|e| on_key(l, name, e))?;
    crate::release_outcome(mode, crate::pair(mode, &v)?.0)
}

/// `Backend::watch` in a dialect: Redisson's unlock channel (every release of either library
/// publishes there), or one `BLPOP` on python-redis-lock's signal list at a time.
pub(crate) async fn watch(
    b: &RedisBackend,
    l: &Layout,
    req: &AcquireRequest,
) -> Result<Box<dyn ReleaseWatch>> {
    match l.dialect {
        Dialect::Redisson => {
            b.subscriber
                .watch(Layout::channel(&req.key.name), &req.attempt)
                .await
        }
        Dialect::PythonRedisLock => Ok(Box::new(signal::SignalWatch::start(
            b.subscriber.client(),
            Layout::signal(&req.key.name),
            b.endpoint.clone(),
        ))),
    }
}

/// The holders of Redisson hash fields: a dlock grant by its owner (from `names`), another
/// client as `UUID:THREAD_ID (redisson)`. The fencing token of a dlock grant is its field's
/// thread id.
fn redisson_holders(
    fields: &[(String, String)],
    names: &[(String, String)],
    left: Option<Duration>,
) -> (Vec<HolderInfo>, Option<u64>) {
    let mut token = None;
    let holders = fields
        .iter()
        .map(|(field, count)| {
            let count = count.parse().unwrap_or(1);
            let owner = match names.iter().find(|(f, _)| f == field) {
                Some((_, owner)) => {
                    token = redisson_field(field).map(|(_, t)| t);
                    owner.clone()
                }
                None => format!("{field} (redisson)"),
            };
            HolderInfo::new(owner, count).with_lease_left(left)
        })
        .collect();
    (holders, token)
}

/// The holder of a python-redis-lock id: a dlock grant by its owner, another as
/// `ID (python-redis-lock)`.
fn pyrl_holder(id: &str, left: Option<Duration>) -> (HolderInfo, Option<u64>) {
    match pyrl_owner(id) {
        Some((token, owner)) => (HolderInfo::new(owner, 1).with_lease_left(left), Some(token)),
        None => (
            HolderInfo::new(format!("{id} (python-redis-lock)"), 1).with_lease_left(left),
            None,
        ),
    }
}

/// `Backend::inspect` in a dialect (a mutex; the peers keep no waiter count on the server).
pub(crate) async fn inspect(b: &RedisBackend, l: &Layout, name: &str) -> Result<LockInfo> {
    let lock = l.lock_key(name);
    let mut pipe = redis::pipe();
    pipe.cmd(l.dialect.words().read).arg(&lock);
    pipe.cmd("PTTL").arg(&lock);
    pipe.cmd("GET").arg(l.fence_key(name)?);
    if l.dialect == Dialect::Redisson {
        pipe.cmd("HGETALL").arg(l.names_key(name)?);
    }
    let mut vals: Vec<Value> = b.query_pipe(&pipe).await?;
    if vals.len() == 3 {
        vals.push(Value::Array(Vec::new()));
    }
    let bad = |what: &str| crate::error::unexpected("inspect of", name, what);
    let (held, pttl, fence, names): (Value, i64, Option<String>, Vec<(String, String)>) =
        redis::from_redis_value(Value::Array(vals)).map_err(|e| bad(&format!("replies: {e}")))?;
    let (left, counter) = (ms(pttl), crate::counter(&l.fence_key(name)?, fence)?);
    let (holders, token) = match l.dialect {
        Dialect::Redisson => {
            let fields: Vec<_> = redis::from_redis_value(held).map_err(|_| bad("holders"))?;
            redisson_holders(&fields, &names, left)
        }
        Dialect::PythonRedisLock => {
            let id: Option<String> = redis::from_redis_value(held).map_err(|_| bad("holder"))?;
            match id.map(|id| pyrl_holder(&id, left)) {
                Some((h, token)) => (vec![h], token),
                None => (Vec::new(), None),
            }
        }
    };
    Ok(LockInfo::new(name)
        .with_holders(holders)
        .with_fencing_token(token.unwrap_or(counter)))
}

/// Whether the fields of a hash look like a Redisson lock's: holder ids `CLIENT:THREAD` with
/// a re-entry count each (node-redisson's thread part is a UUID, Redisson's a number).
fn redisson_like(fields: &[(String, String)]) -> bool {
    !fields.is_empty()
        && fields
            .iter()
            .all(|(f, c)| f.contains(':') && c.parse::<u32>().is_ok_and(|n| n > 0))
}

/// `Operator::list` in a dialect: the peer's locks whose names start with `prefix` (held
/// ones: the peers leave nothing behind a release). Redisson's are the hashes that look like
/// its locks ([`redisson_like`]); python-redis-lock's the strings `lock:…`.
pub(crate) async fn list(b: &RedisBackend, l: &Layout, prefix: &str) -> Result<Vec<ListedLock>> {
    let w = l.dialect.words();
    let pattern = l.lock_key(&crate::ops::glob_escape(prefix)) + "*";
    let mut keys = Vec::new();
    crate::ops::scan(b, &pattern, Some(w.redis_type), |batch| keys.extend(batch)).await?;
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let Some(name) = key.strip_prefix(w.prefix) else {
            continue;
        };
        // Names no key of dlock's can sit beside (see `beside`) are not dlock's to show.
        if !name.starts_with(prefix) || beside("x", &key).is_err() {
            continue;
        }
        if l.dialect == Dialect::Redisson {
            let fields: Vec<(String, String)> = b.query(redis::cmd("HGETALL").arg(&key)).await?;
            if !redisson_like(&fields) {
                continue;
            }
        }
        let info = inspect(b, l, name).await?;
        if info.held() {
            out.push(ListedLock::new(LockKind::Mutex, info));
        }
    }
    Ok(out)
}

/// `Operator::force_release` in a dialect: as the peer's own forced unlock (Redisson's
/// `forceUnlock`, python-redis-lock's `reset`), waking the waiters the same way.
pub(crate) async fn force_release(
    b: &RedisBackend,
    l: &Layout,
    name: &str,
) -> Result<ForceReleased> {
    let lock = l.lock_key(name);
    let fence = l.fence_key(name)?;
    let cmd = match l.dialect {
        Dialect::Redisson => SCRIPTS.force_release.cmd(
            &[&lock, &l.names_key(name)?, &fence],
            &["redisson", &Layout::channel(name)],
        ),
        Dialect::PythonRedisLock => SCRIPTS.force_release.cmd(
            &[&lock, &Layout::signal(name), &fence],
            &["python-redis-lock", "", &SIGNAL_EXPIRE_MS.to_string()],
        ),
    };
    let (v, _) = b.eval_ending(&SCRIPTS.all(), &cmd, None, None).await?;
    let bad = |_| crate::error::unexpected("forced release of", name, "reply");
    let (held, pttl, names, fence): (Value, i64, Vec<(String, String)>, Option<String>) =
        redis::from_redis_value(v).map_err(bad)?;
    let left = ms(pttl);
    let removed = match l.dialect {
        Dialect::Redisson => {
            let fields: Vec<(String, String)> = redis::from_redis_value(held).map_err(bad)?;
            redisson_holders(&fields, &names, left).0
        }
        Dialect::PythonRedisLock => {
            let ids: Vec<String> = redis::from_redis_value(held).map_err(bad)?;
            ids.iter().map(|id| pyrl_holder(id, left).0).collect()
        }
    };
    Ok(ForceReleased::new(
        removed,
        crate::counter(&l.fence_key(name)?, fence)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_keys_share_the_lock_keys_slot() {
        use crate::cluster::slot;
        for name in ["orders", "a{b}c", "{x}", "with space", "é"] {
            for d in [Dialect::Redisson, Dialect::PythonRedisLock] {
                let l = Layout::new(d, "dlock");
                let lock = l.lock_key(name);
                for own in [
                    l.fence_key(name).unwrap(),
                    l.names_key(name).unwrap(),
                    l.ended_key(name, &AttemptId::new()).unwrap(),
                ] {
                    assert_eq!(slot(&own), slot(&lock), "{own} beside {lock}");
                }
            }
            // Redisson's own channel shares the slot too (its prefixName rule).
            assert_eq!(slot(&Layout::channel(name)), slot(name), "{name}");
        }
        assert_eq!(Layout::channel("orders"), "redisson_lock__channel:{orders}");
        assert_eq!(Layout::channel("a{b}c"), "redisson_lock__channel:a{b}c");
        let e = Layout::new(Dialect::Redisson, "dlock")
            .fence_key("a}b")
            .unwrap_err()
            .to_string();
        assert!(e.contains("hash tag"), "{e}");
    }

    #[test]
    fn ids() {
        let a = AttemptId::from_server("0123456789abcdef0123456789abcdef");
        assert_eq!(client_uuid(&a), "01234567-89ab-cdef-0123-456789abcdef");
        assert_eq!(
            redisson_field("01234567-89ab-cdef-0123-456789abcdef:42"),
            Some(("01234567-89ab-cdef-0123-456789abcdef", 42))
        );
        assert_eq!(redisson_field("nothread"), None);
        assert_eq!(pyrl_owner("dlock:ab:17:host:1:x"), Some((17, "host:1:x")));
        assert_eq!(pyrl_owner("b64randomid=="), None);
        let f = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert!(redisson_like(&f(&[("6f1e-uuid:77", "2")])));
        assert!(!redisson_like(&f(&[("name", "alice")])));
        assert!(!redisson_like(&f(&[("a:b", "0")])));
        assert!(!redisson_like(&[]));
    }
}
