//! The values that cross the [`Backend`](crate::backend::Backend) trait.

#[cfg(doc)]
use crate::backend::{Backend, ReleaseWatch};
use crate::lost::LostSignal;
use std::sync::Arc;
use std::time::Duration;

/// What kind of lock is asked for. A backend declares the kinds it implements in its
/// [`Capabilities`](crate::backend::Capabilities); the core answers
/// [`Error::Unsupported`](crate::Error::Unsupported) for the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LockKind {
    /// Exclusive, reentrant lock.
    #[default]
    Mutex,
    /// The shared side of a read-write lock: many owners at once, none while a writer holds it
    /// (except the writer itself, which may also take the read side: a downgrade).
    Read,
    /// The exclusive side of a read-write lock.
    Write,
    /// Exclusive, reentrant, and first come first served: a free lock goes to the oldest
    /// waiter, never to a newcomer.
    Fair,
    /// `permits` permits of a counting semaphore of `limit` permits. Every acquisition is its
    /// own hold with its own lease.
    Semaphore {
        /// Permits this hold takes.
        permits: u32,
        /// Permits the semaphore has when it is first used (see
        /// [`Backend::set_permits`] to change it).
        limit: u32,
    },
    /// Leadership of an election ([`Client::election`](crate::Client::election)): exclusive
    /// like a mutex, in its own namespace (an election and a lock of the same name are
    /// independent), and the grant carries the candidate's advertised value
    /// ([`AcquireRequest::value`], [`HolderInfo::value`]).
    Election,
}

impl LockKind {
    /// Lower-case name, as used by the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::Read => "read",
            LockKind::Write => "write",
            LockKind::Fair => "fair",
            LockKind::Semaphore { .. } => "semaphore",
            LockKind::Election => "election",
        }
    }
}

/// Identifies one owner's hold on one lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HoldKey {
    /// Lock name, already validated.
    pub name: Arc<str>,
    /// Owner id, already validated.
    pub owner: Arc<str>,
    /// Lock kind.
    pub kind: LockKind,
}

impl HoldKey {
    /// The hold of `owner` on lock `name` of `kind` (both already validated).
    pub fn new(name: impl Into<Arc<str>>, owner: impl Into<Arc<str>>, kind: LockKind) -> Self {
        HoldKey {
            name: name.into(),
            owner: owner.into(),
            kind,
        }
    }
}

/// Identifies one acquisition attempt, and the grant it wins: unique forever (128 random
/// bits, 32 lower-case hex digits). The server stores it with the grant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttemptId(Arc<str>);

impl AttemptId {
    /// A new id, unique forever.
    pub fn new() -> Self {
        // Hex digits written straight into a buffer: no formatting machinery, one allocation.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let bits = fastrand::u128(..);
        let mut text = [0u8; 32];
        for (i, digit) in text.iter_mut().enumerate() {
            *digit = HEX[((bits >> (124 - 4 * i)) & 0xf) as usize];
        }
        // Every byte is an ASCII hex digit.
        let text = std::str::from_utf8(&text).unwrap_or_default();
        AttemptId(Arc::from(text))
    }

    /// An id read back from a server (e.g. in a handoff message or an inspect).
    pub fn from_server(id: impl Into<Arc<str>>) -> Self {
        AttemptId(id.into())
    }

    /// The id as text (what backends store).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for AttemptId {
    fn default() -> Self {
        AttemptId::new()
    }
}

impl std::fmt::Display for AttemptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Maps keyed by attempt look up by the id's text (the hash and order of the id are its
/// text's).
impl std::borrow::Borrow<str> for AttemptId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for AttemptId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// The address of one grant on the server: the lock, the attempt that won it, and its fencing
/// token. Renewals and releases name it, so they touch that grant and no other.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GrantRef {
    /// Lock name, owner and kind.
    pub key: HoldKey,
    /// The attempt that won the grant.
    pub attempt: AttemptId,
    /// The grant's fencing token.
    pub token: u64,
}

/// One acquisition attempt.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// Who asks for what.
    pub key: HoldKey,
    /// This attempt's id: a retry of the request carries the same one, so the server can tell
    /// a retry from a second acquisition.
    pub attempt: AttemptId,
    /// Lease to set on grant (a retry of a granted attempt makes it run at least this long from
    /// now, never shortening it).
    pub lease: Duration,
    /// Signal of the hold this grant would create. Backends that learn of loss from their
    /// server (session end, dropped connection) keep a clone and fire it.
    pub lost: LostSignal,
    /// `Some(ttl)` when the caller will wait if the lock is held: backends with a server-side
    /// queue register the caller as a waiter that counts as alive for `ttl` (refreshed by each
    /// attempt). `None` for `try_acquire`.
    pub waiter_ttl: Option<Duration>,
    /// For the read side of a read-write lock: the live write grant this owner holds on the
    /// same lock, which the read grant may be granted beside (a downgrade). `None` otherwise.
    pub write_grant: Option<GrantRef>,
    /// For [`LockKind::Election`]: the candidate's value, stored with the grant and reported
    /// by [`Backend::inspect`] as the leader's [`HolderInfo::value`]. `None` for locks.
    pub value: Option<Arc<str>>,
}

impl AcquireRequest {
    /// A single attempt (no queueing).
    pub fn new(key: HoldKey, lease: Duration, lost: LostSignal) -> Self {
        AcquireRequest {
            key,
            attempt: AttemptId::new(),
            lease,
            lost,
            waiter_ttl: None,
            write_grant: None,
            value: None,
        }
    }

    /// The address of the grant this attempt wins with `token`.
    pub fn grant(&self, token: u64) -> GrantRef {
        GrantRef {
            key: self.key.clone(),
            attempt: self.attempt.clone(),
            token,
        }
    }
}

/// A grant from a wait: the token and a time no later than the moment the server granted it
/// (the send time of an attempt that preceded the grant), from which the local view of the
/// lease is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// Fencing token.
    pub token: u64,
    /// Local time (on the lease clock, which counts suspend) before the grant happened on the
    /// server: the send time of the request that was granted, or of the last request before a
    /// handoff.
    pub requested_at: crate::clock::Instant,
}

impl Granted {
    /// A grant with fencing token `token`, measured from `requested_at`.
    pub fn new(token: u64, requested_at: crate::clock::Instant) -> Self {
        Granted {
            token,
            requested_at,
        }
    }
}

/// Why a [`ReleaseWatch`] woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The lock was released (or may have been): try again.
    Released,
    /// The server handed the lock straight to this waiting attempt, with this fencing token;
    /// the lease is the one the attempt asked for, running from after its last request.
    HandedOver {
        /// Fencing token of the grant.
        token: u64,
    },
    /// A handoff as [`Wake::HandedOver`], made after the server had answered the attempt's
    /// request number `request` (the backend's own numbering of its requests). A backend that
    /// knows when that request was sent may vouch for it as [`Wake::Granted`]; the wait loop
    /// confirms any other handoff with one more attempt.
    HandedOverAfter {
        /// Fencing token of the grant.
        token: u64,
        /// The number of the attempt's request the server had answered before the handoff.
        request: u64,
    },
    /// A handoff the backend vouches for as a grant: the server handed the lock to this
    /// attempt after answering a request sent at `requested_at` (its latest, answered "held"),
    /// and the lease it asked for, measured from then, has not run out. The wait ends with it.
    Granted {
        /// Fencing token of the grant.
        token: u64,
        /// Send time of the request the handoff followed: the lease runs from no earlier.
        requested_at: crate::clock::Instant,
    },
}

/// Answer to one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// Granted to this attempt; the fencing token of this grant.
    Granted {
        /// Strictly increasing per name; the same token when a granted attempt is retried.
        token: u64,
    },
    /// Held by another owner.
    Held {
        /// How long the current holder's lease still runs, when the server knows.
        /// Waiters sleep at most this long before trying again.
        ttl: Option<Duration>,
    },
}

/// Result of releasing one hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The lock is free now.
    Released,
    /// This owner still holds the lock through other (re-entrant) guards of this client
    /// (reported by the core; backends never return it).
    StillHeld {
        /// Holds this owner still has.
        remaining: u32,
    },
    /// The server had no grant with this address any more: its lease had already run out (or
    /// an operator removed it).
    Expired,
    /// Another owner holds the lock now (ours ran out and it was taken).
    TakenByOther,
}

impl ReleaseOutcome {
    /// True when this release gave the lock back (fully or one re-entrant level).
    pub fn was_held(self) -> bool {
        matches!(
            self,
            ReleaseOutcome::Released | ReleaseOutcome::StillHeld { .. }
        )
    }
}

/// Result of renewing one hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    /// The lease now runs at least the requested duration from when the server applied it.
    Renewed,
    /// The owner no longer holds the lock.
    NotHeld,
    /// This hold's renewal failed on its own (its data unreadable, a compare-and-swap that
    /// kept losing, an error for its key alone) while the others of the batch have their
    /// outcomes: neither confirmed nor refused. The watchdog tries it again as it does a
    /// failed batch, and presumes it lost if its lease runs out first. A backend logs the error
    /// (the outcome carries none); when every item of a batch failed it returns the error
    /// instead ([`RenewOutcome::each`]).
    Unconfirmed,
}

impl RenewOutcome {
    /// The outcomes of a batch whose items were renewed one by one (`results`, in the order of
    /// `holds`): a failed item is [`RenewOutcome::Unconfirmed`] and its error is logged, so one
    /// bad hold does not leave the others of its batch unconfirmed. If every item failed, the
    /// first error is returned instead (so a one-item `extend` sees it, and a retryable one is
    /// retried).
    ///
    /// # Errors
    /// The first item's error, when every item failed.
    pub fn each(
        backend: &'static str,
        holds: &[(GrantRef, Duration)],
        results: Vec<crate::Result<RenewOutcome>>,
    ) -> crate::Result<Vec<RenewOutcome>> {
        if results.iter().all(std::result::Result::is_err) {
            return match results.into_iter().next() {
                Some(Err(e)) => Err(e),
                _ => Ok(Vec::new()),
            };
        }
        Ok(results
            .into_iter()
            .zip(holds)
            .map(|(r, (grant, _))| {
                r.unwrap_or_else(|e| {
                    tracing::warn!(backend, name = %grant.key.name, error = %e,
                        "the renewal of this lock failed; the others of its batch went on; retrying soon, the lock is lost if its lease runs out first");
                    RenewOutcome::Unconfirmed
                })
            })
            .collect())
    }
}

/// One holder of a lock, as reported by [`Backend::inspect`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HolderInfo {
    /// Owner id.
    pub owner: String,
    /// Re-entrant hold count (for a semaphore: the permits this acquisition holds).
    pub count: u32,
    /// Remaining lease, if the server knows it.
    pub lease_left: Option<Duration>,
    /// For a read-write lock: [`LockKind::Read`] or [`LockKind::Write`]; `None` otherwise.
    pub side: Option<LockKind>,
    /// For an election's leader: the value it advertises (set at the grant, changed by
    /// [`Backend::proclaim`]); `None` for locks.
    pub value: Option<String>,
}

/// State of one lock, as seen by the server right now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LockInfo {
    /// Lock name.
    pub name: String,
    /// Current holders (one for a held mutex, none when free).
    pub holders: Vec<HolderInfo>,
    /// Last fencing token issued for this name (0 if none ever was).
    pub fencing_token: u64,
    /// Live waiters queued on the server, when the backend keeps a queue.
    pub waiters: Option<u32>,
    /// For a semaphore: its permit count.
    pub permits: Option<u32>,
    /// The live waiters queued on the server, first in line first, when the backend can
    /// name them (empty when nobody waits or the backend reports only a count: see
    /// [`LockInfo::waiters`]).
    pub queue: Vec<WaiterInfo>,
}

/// One waiter queued on a lock, as reported by [`Backend::inspect`] in [`LockInfo::queue`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WaiterInfo {
    /// Owner id of the waiting attempt.
    pub owner: String,
    /// How long it has waited, by the server's clock, when the server records arrivals.
    pub waited: Option<Duration>,
    /// For a read-write lock: the side it waits for; `None` otherwise.
    pub side: Option<LockKind>,
}

impl WaiterInfo {
    /// A waiter `owner`, its wait and side unknown (backends build waiters with this and the
    /// `with_` methods: the struct may gain fields).
    ///
    /// ```
    /// use distlock_core::WaiterInfo;
    /// use std::time::Duration;
    /// let w = WaiterInfo::new("web-2:77:0a1b2c3d:1").with_waited(Some(Duration::from_secs(2)));
    /// assert_eq!(w.origin(), Some(("web-2", 77)));
    /// ```
    pub fn new(owner: impl Into<String>) -> Self {
        WaiterInfo {
            owner: owner.into(),
            waited: None,
            side: None,
        }
    }

    /// The same, having waited `waited`.
    pub fn with_waited(mut self, waited: Option<Duration>) -> Self {
        self.waited = waited;
        self
    }

    /// The same, waiting for side `side` of a read-write lock.
    pub fn with_side(mut self, side: Option<LockKind>) -> Self {
        self.side = side;
        self
    }

    /// The host name and process id in the waiter's owner id (see [`HolderInfo::origin`]).
    pub fn origin(&self) -> Option<(&str, u32)> {
        owner_origin(&self.owner)
    }
}

impl HolderInfo {
    /// A holder `owner` with hold count `count` (for a semaphore: its permits), lease and
    /// side unknown. (Backends build holders with this and the `with_` methods: the struct
    /// may gain fields.)
    ///
    /// ```
    /// use distlock_core::{HolderInfo, LockKind};
    /// use std::time::Duration;
    /// let h = HolderInfo::new("host:1:ab:1", 1)
    ///     .with_lease_left(Some(Duration::from_secs(3)))
    ///     .with_side(Some(LockKind::Read));
    /// assert_eq!(h.count, 1);
    /// ```
    pub fn new(owner: impl Into<String>, count: u32) -> Self {
        HolderInfo {
            owner: owner.into(),
            count,
            lease_left: None,
            side: None,
            value: None,
        }
    }

    /// The same, with remaining lease `lease_left`.
    pub fn with_lease_left(mut self, lease_left: Option<Duration>) -> Self {
        self.lease_left = lease_left;
        self
    }

    /// The same, on side `side` of a read-write lock.
    pub fn with_side(mut self, side: Option<LockKind>) -> Self {
        self.side = side;
        self
    }

    /// The same, advertising `value` (an election's leader).
    pub fn with_value(mut self, value: Option<String>) -> Self {
        self.value = value;
        self
    }

    /// The host name and process id in the holder's owner id, when it is one the core made
    /// (`HOST:PID:RANDOM:SEQ`, the default of every lock handle); `None` for an owner id the
    /// application chose (`with_owner`), which names no process.
    ///
    /// ```
    /// use distlock_core::HolderInfo;
    /// let h = HolderInfo::new("web-1:4242:0a1b2c3d:7", 1);
    /// assert_eq!(h.origin(), Some(("web-1", 4242)));
    /// assert_eq!(HolderInfo::new("nightly-report", 1).origin(), None);
    /// ```
    pub fn origin(&self) -> Option<(&str, u32)> {
        owner_origin(&self.owner)
    }
}

/// The host and pid of an owner id of the core's making: `HOST:PID:RANDOM:SEQ`, with RANDOM
/// 8 hex digits and PID and SEQ decimal (see `new_client_id` in client.rs).
pub(crate) fn owner_origin(owner: &str) -> Option<(&str, u32)> {
    let mut parts = owner.rsplitn(4, ':');
    let seq = parts.next()?;
    let random = parts.next()?;
    let pid = parts.next()?;
    let host = parts.next()?;
    let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if host.is_empty()
        || !decimal(seq)
        || random.len() != 8
        || !random.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    let pid = pid.parse().ok().filter(|_| decimal(pid))?;
    Some((host, pid))
}

impl LockInfo {
    /// The state of lock `name`: free, no token ever issued, no queue or permit count known.
    /// (Backends build the state with this and the `with_` methods: the struct may gain
    /// fields.)
    ///
    /// ```
    /// use distlock_core::{HolderInfo, LockInfo};
    /// let info = LockInfo::new("orders:42")
    ///     .with_holders(vec![HolderInfo::new("me", 1)])
    ///     .with_fencing_token(7)
    ///     .with_waiters(Some(2));
    /// assert!(info.held());
    /// assert_eq!(info.permits, None);
    /// ```
    pub fn new(name: impl Into<String>) -> Self {
        LockInfo {
            name: name.into(),
            ..LockInfo::default()
        }
    }

    /// The same, held by `holders`.
    pub fn with_holders(mut self, holders: Vec<HolderInfo>) -> Self {
        self.holders = holders;
        self
    }

    /// The same, with `token` as the last fencing token issued.
    pub fn with_fencing_token(mut self, token: u64) -> Self {
        self.fencing_token = token;
        self
    }

    /// The same, with `waiters` live waiters queued on the server.
    pub fn with_waiters(mut self, waiters: Option<u32>) -> Self {
        self.waiters = waiters;
        self
    }

    /// The same, for a semaphore of `permits` permits.
    pub fn with_permits(mut self, permits: Option<u32>) -> Self {
        self.permits = permits;
        self
    }

    /// The same, with `queue` as the waiters in line, first first.
    pub fn with_queue(mut self, queue: Vec<WaiterInfo>) -> Self {
        self.queue = queue;
        self
    }

    /// The longest wait among the queued waiters the server reported a wait for.
    ///
    /// ```
    /// use distlock_core::{LockInfo, WaiterInfo};
    /// use std::time::Duration;
    /// let info = LockInfo::new("jobs").with_queue(vec![
    ///     WaiterInfo::new("a").with_waited(Some(Duration::from_secs(3))),
    ///     WaiterInfo::new("b").with_waited(Some(Duration::from_secs(1))),
    /// ]);
    /// assert_eq!(info.oldest_wait(), Some(Duration::from_secs(3)));
    /// ```
    pub fn oldest_wait(&self) -> Option<Duration> {
        self.queue.iter().filter_map(|w| w.waited).max()
    }

    /// True when someone holds the lock.
    pub fn held(&self) -> bool {
        !self.holders.is_empty()
    }

    /// Permits in use (the sum of the holders' counts), for a semaphore.
    pub fn permits_in_use(&self) -> u32 {
        self.holders.iter().map(|h| h.count).sum()
    }
}

/// One lock in a [`Operator::list`](crate::Operator::list) answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedLock {
    /// The kind of lock the state belongs to (for a read-write lock: [`LockKind::Write`]).
    pub kind: LockKind,
    /// Holders, waiters and last fencing token.
    pub info: LockInfo,
}

impl ListedLock {
    /// A listed lock of `kind`.
    pub fn new(kind: LockKind, info: LockInfo) -> Self {
        ListedLock { kind, info }
    }
}

/// What [`Operator::force_release`](crate::Operator::force_release) removed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ForceReleased {
    /// The holders that were removed.
    pub removed: Vec<HolderInfo>,
    /// The fencing counter after the release: higher than every token handed out before it.
    pub fencing_token: u64,
}

impl ForceReleased {
    /// A report of `removed` holders and the counter's new value.
    pub fn new(removed: Vec<HolderInfo>, fencing_token: u64) -> Self {
        ForceReleased {
            removed,
            fencing_token,
        }
    }
}

/// How serious a [`Finding`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Severity {
    /// The check passed.
    Ok,
    /// Worth knowing; locks still work as documented.
    Warning,
    /// Locks can be granted twice or tokens can go back with this setting.
    Unsafe,
}

/// One result of [`Operator::diagnose`](crate::Operator::diagnose).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// How serious it is.
    pub severity: Severity,
    /// Short name of the check, e.g. `maxmemory-policy`.
    pub check: String,
    /// What was found and, unless it is fine, what to change.
    pub message: String,
}

impl Finding {
    /// A finding.
    pub fn new(severity: Severity, check: impl Into<String>, message: impl Into<String>) -> Self {
        Finding {
            severity,
            check: check.into(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{owner_origin, AttemptId};

    #[test]
    fn attempt_ids_are_32_lower_hex_digits_and_differ() {
        let ids: Vec<AttemptId> = (0..1000).map(|_| AttemptId::new()).collect();
        for id in &ids {
            assert_eq!(id.len(), 32, "{id}");
            assert!(
                id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{id}"
            );
        }
        let distinct: std::collections::HashSet<&str> = ids.iter().map(|i| i.as_str()).collect();
        assert_eq!(distinct.len(), ids.len());
        // All 128 bits are used: over 1,000 ids every digit position takes more than one value.
        for pos in 0..32 {
            let seen: std::collections::HashSet<u8> =
                ids.iter().map(|i| i.as_bytes()[pos]).collect();
            assert!(seen.len() > 1, "digit {pos} never changes");
        }
    }

    #[test]
    fn owner_origin_reads_only_the_cores_shape() {
        assert_eq!(owner_origin("h:1:deadbeef:0"), Some(("h", 1)));
        // The host is all before the last three fields.
        assert_eq!(owner_origin("a:b:12:00ff00ff:3"), Some(("a:b", 12)));
        for other in [
            "",
            "job",
            "h:1:deadbeef",
            ":1:deadbeef:0",
            "h:x:deadbeef:0",
            "h:1:deadbee:0",
            "h:1:deadbeeg:0",
            "h:1:deadbeef:",
            "h:+1:deadbeef:0",
            "h:99999999999:deadbeef:0",
        ] {
            assert_eq!(owner_origin(other), None, "{other}");
        }
    }
}
