//! An in-memory reference backend: the [backend contract](distlock_core::backend) in the
//! fewest lines that keep it, run by the whole conformance suite (`tests/memory.rs`), and the
//! template a new backend copies.
//!
//! [`MemoryServer`] plays the lock server: one table of `Entry` values (one per lock) behind
//! a mutex, in this process. [`MemoryBackend`] is a client of it. Each request is one atomic
//! step on one entry, as a script or a transaction is on a real server, and every decision is
//! a method of `Entry` without I/O, tested on its own below. A new backend keeps the same
//! state on its server — per lock the live grants (attempt id, owner, kind, fencing token,
//! lease end, election value), the queue of waiters (each alive for its `waiter_ttl`), the
//! fencing counter and a semaphore's permit count — and the same steps:
//!
//! | request | step on the entry | invariant |
//! |---|---|---|
//! | `acquire` | a grant of this attempt: same token, lease made to run at least `lease` from now; else grant if `Entry::admits` (a new token above every earlier one, floored by the clock); else queue the attempt for `waiter_ttl` and answer the holders' shortest lease left | 1, 2, 3 |
//! | `release` | remove the grant with this attempt *and* token; else `TakenByOther` if another owner holds, `Expired` if not | 4 |
//! | `renew` | the same grant's lease runs at least `lease` from now, never shorter | 4 |
//! | `give_up` | leave the queue, and give back a grant made to this attempt | 5 |
//! | `watch`, `observe` | subscribe to the entry's changes: every grant, release, give-up, expiry and proclamation wakes every watcher | 5, 7 |
//! | `proclaim` | the grant still leads and `seq` is above its last: new value | 7 |
//!
//! It has no network to fault, so the suite's proxy cases skip, saying so; the waiting is the
//! core's default ([`watch_and_retry`](distlock_core::wait::watch_and_retry)).

use distlock_core::backend::{
    async_trait, AcquireReply, AcquireRequest, AttemptId, Backend, Capabilities, GrantRef,
    LockKind, ReleaseWatch, RenewOutcome, Wake,
};
use distlock_core::{
    ClientOptions, Error, HolderInfo, LockInfo, ReleaseOutcome, Result, WaiterInfo,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// The backend kind, as reported by [`Backend::kind`].
pub const KIND: &str = "memory";

/// The kinds whose locks share state on the server: the two sides of a read-write lock. An
/// election is a family of its own, apart from the lock of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Family {
    Mutex,
    Rw,
    Fair,
    Semaphore,
    Election,
}

impl Family {
    fn of(kind: LockKind) -> Family {
        match kind {
            LockKind::Read | LockKind::Write => Family::Rw,
            LockKind::Fair => Family::Fair,
            LockKind::Semaphore { .. } => Family::Semaphore,
            LockKind::Election => Family::Election,
            _ => Family::Mutex,
        }
    }
}

/// Namespace, family, name.
type Key = (String, Family, String);

/// One grant: what `release`, `renew` and `proclaim` address by attempt and token.
#[derive(Debug, Clone)]
struct Grant {
    attempt: AttemptId,
    owner: Arc<str>,
    kind: LockKind,
    token: u64,
    ends: Instant,
    value: Option<String>,
    seq: u64,
}

/// One waiting attempt, alive until it stops refreshing its place.
#[derive(Debug, Clone)]
struct Waiter {
    attempt: AttemptId,
    owner: Arc<str>,
    kind: LockKind,
    since: Instant,
    alive_until: Instant,
}

/// The server's state of one lock.
#[derive(Debug)]
struct Entry {
    /// The last fencing token issued.
    token: u64,
    grants: Vec<Grant>,
    queue: Vec<Waiter>,
    /// A semaphore's permits: the limit of its first use, or of `set_permits`.
    limit: Option<u32>,
    changed: watch::Sender<()>,
}

impl Default for Entry {
    fn default() -> Self {
        Entry {
            token: 0,
            grants: Vec::new(),
            queue: Vec::new(),
            limit: None,
            changed: watch::Sender::new(()),
        }
    }
}

fn permits(kind: LockKind) -> u32 {
    match kind {
        LockKind::Semaphore { permits, .. } => permits,
        _ => 1,
    }
}

/// The token after `last`: above it, and at least the wall clock in microseconds, so that a
/// server that lost its counters ([`MemoryServer::lose_data`]) never issues a token again.
fn next_token(last: u64) -> u64 {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    last.saturating_add(1).max(micros)
}

impl Entry {
    fn notify(&self) {
        self.changed.send_replace(());
    }

    /// Drops the grants whose lease ended and the waiters that stopped refreshing their place,
    /// and wakes the watchers if any went.
    fn expire(&mut self, now: Instant) {
        let before = (self.grants.len(), self.queue.len());
        self.grants.retain(|g| g.ends > now);
        self.queue.retain(|w| w.alive_until > now);
        if before != (self.grants.len(), self.queue.len()) {
            self.notify();
        }
    }

    fn find(&self, grant: &GrantRef) -> Option<usize> {
        (self.grants.iter()).position(|g| g.attempt == grant.attempt && g.token == grant.token)
    }

    /// Whether `req` may be granted now, beside the live grants and behind the waiters queued
    /// before it: a mutex, a write side or an election only when free; a read side beside
    /// readers (and its owner's own write grant: a downgrade) unless a writer waits before it;
    /// a fair lock only to the first in line; a semaphore while its permits suffice.
    fn admits(&self, req: &AcquireRequest) -> bool {
        let mut ahead = self.queue.iter().take_while(|w| w.attempt != req.attempt);
        match req.key.kind {
            LockKind::Read => {
                let own = |g: &Grant| {
                    req.write_grant
                        .as_ref()
                        .is_some_and(|w| w.attempt == g.attempt && w.token == g.token)
                };
                let downgrade = self.grants.iter().any(own);
                self.grants
                    .iter()
                    .all(|g| g.kind == LockKind::Read || own(g))
                    && (downgrade || !ahead.any(|w| w.kind == LockKind::Write))
            }
            LockKind::Fair => self.grants.is_empty() && ahead.next().is_none(),
            LockKind::Semaphore { permits: n, .. } => {
                let used: u32 = self.grants.iter().map(|g| permits(g.kind)).sum();
                used.saturating_add(n) <= self.limit.unwrap_or(0)
            }
            _ => self.grants.is_empty(),
        }
    }

    fn acquire(&mut self, req: &AcquireRequest, now: Instant) -> Result<AcquireReply> {
        if let LockKind::Semaphore { limit, .. } = req.key.kind {
            self.limit.get_or_insert(limit);
        }
        if let Some(g) = self.grants.iter_mut().find(|g| g.attempt == req.attempt) {
            g.ends = g.ends.max(now + req.lease);
            return Ok(AcquireReply::Granted { token: g.token });
        }
        let reads = |g: &Grant| g.kind == LockKind::Read && g.owner == req.key.owner;
        if req.key.kind == LockKind::Write && self.grants.iter().any(reads) {
            return Err(Error::invalid(format!(
                "owner `{}` holds the read side of `{}` and asked for the write side: upgrades \
                 are refused (two readers upgrading would wait for each other forever)",
                req.key.owner, req.key.name
            )));
        }
        if !self.admits(req) {
            if let Some(ttl) = req.waiter_ttl {
                match self.queue.iter_mut().find(|w| w.attempt == req.attempt) {
                    Some(w) => w.alive_until = now + ttl,
                    None => self.queue.push(Waiter {
                        attempt: req.attempt.clone(),
                        owner: req.key.owner.clone(),
                        kind: req.key.kind,
                        since: now,
                        alive_until: now + ttl,
                    }),
                }
            }
            let ttl = self
                .grants
                .iter()
                .map(|g| g.ends.saturating_duration_since(now))
                .min();
            return Ok(AcquireReply::Held { ttl });
        }
        self.queue.retain(|w| w.attempt != req.attempt);
        self.token = next_token(self.token);
        self.grants.push(Grant {
            attempt: req.attempt.clone(),
            owner: req.key.owner.clone(),
            kind: req.key.kind,
            token: self.token,
            ends: now + req.lease,
            value: req.value.as_deref().map(str::to_owned),
            seq: 0,
        });
        self.notify();
        Ok(AcquireReply::Granted { token: self.token })
    }

    fn release(&mut self, grant: &GrantRef) -> ReleaseOutcome {
        if let Some(i) = self.find(grant) {
            self.grants.remove(i);
            self.notify();
            ReleaseOutcome::Released
        } else if self.grants.iter().any(|g| g.owner != grant.key.owner) {
            ReleaseOutcome::TakenByOther
        } else {
            ReleaseOutcome::Expired
        }
    }

    fn renew(&mut self, grant: &GrantRef, lease: Duration, now: Instant) -> RenewOutcome {
        match self.find(grant) {
            Some(i) => {
                let g = &mut self.grants[i];
                g.ends = g.ends.max(now + lease);
                RenewOutcome::Renewed
            }
            None => RenewOutcome::NotHeld,
        }
    }

    fn give_up(&mut self, attempt: &AttemptId) {
        let before = (self.grants.len(), self.queue.len());
        self.grants.retain(|g| g.attempt != *attempt);
        self.queue.retain(|w| w.attempt != *attempt);
        if before != (self.grants.len(), self.queue.len()) {
            self.notify();
        }
    }

    fn proclaim(&mut self, grant: &GrantRef, seq: u64, value: &str) -> RenewOutcome {
        let Some(i) = self.find(grant) else {
            return RenewOutcome::NotHeld;
        };
        let g = &mut self.grants[i];
        if seq > g.seq {
            (g.seq, g.value) = (seq, Some(value.to_owned()));
            self.notify();
        }
        RenewOutcome::Renewed
    }

    fn inspect(&self, name: &str, family: Family, now: Instant) -> LockInfo {
        let side = |k: LockKind| (family == Family::Rw).then_some(k);
        let holders = (self.grants.iter())
            .map(|g| {
                HolderInfo::new(&*g.owner, permits(g.kind))
                    .with_lease_left(Some(g.ends.saturating_duration_since(now)))
                    .with_side(side(g.kind))
                    .with_value(g.value.clone())
            })
            .collect();
        let queue = (self.queue.iter())
            .map(|w| {
                WaiterInfo::new(&*w.owner)
                    .with_waited(Some(now.saturating_duration_since(w.since)))
                    .with_side(side(w.kind))
            })
            .collect::<Vec<_>>();
        LockInfo::new(name)
            .with_holders(holders)
            .with_fencing_token(self.token)
            .with_waiters(Some(queue.len() as u32))
            .with_permits(self.limit.filter(|_| family == Family::Semaphore))
            .with_queue(queue)
    }
}

/// The lock server: every lock's state, shared by the [`MemoryBackend`]s it
/// [connects](MemoryServer::connect). Cheap to clone (clones are the same server).
#[derive(Debug, Clone, Default)]
pub struct MemoryServer {
    locks: Arc<Mutex<HashMap<Key, Entry>>>,
}

impl MemoryServer {
    /// A server without locks.
    pub fn new() -> Self {
        MemoryServer::default()
    }

    /// A client of this server, as a separate process would have (its namespace is
    /// `opts`' namespace).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on invalid options.
    pub fn connect(&self, opts: &ClientOptions) -> Result<MemoryBackend> {
        opts.validate()?;
        Ok(MemoryBackend {
            server: self.clone(),
            namespace: opts.get_namespace().to_owned(),
        })
    }

    /// Removes every grant of every lock named `name`, as an operator might behind the
    /// holders' backs: their next renewal finds them gone. The fencing counters stay.
    pub fn break_lock(&self, name: &str) {
        self.each(|key, e| {
            if key.2 == name {
                e.grants.clear();
                e.notify();
            }
        });
    }

    /// Forgets every lock, as a server without persistence does when it restarts: watchers
    /// are told their subscription broke, and new tokens still exceed the old ones (they are
    /// floored by the clock).
    pub fn lose_data(&self) {
        self.each(|_, _| ());
        if let Ok(mut locks) = self.locks.lock() {
            locks.clear();
        }
    }

    fn each(&self, mut f: impl FnMut(&Key, &mut Entry)) {
        if let Ok(mut locks) = self.locks.lock() {
            locks.iter_mut().for_each(|(k, e)| f(k, e));
        }
    }

    /// One atomic step on the entry of lock `name` of `kind` in namespace `ns`, after its
    /// expired grants and waiters went.
    fn step<T>(
        &self,
        ns: &str,
        kind: LockKind,
        name: &str,
        f: impl FnOnce(&mut Entry, Instant) -> T,
    ) -> Result<T> {
        let mut locks = (self.locks.lock())
            .map_err(|_| Error::unexpected(KIND, "a step on the server panicked"))?;
        let entry = locks
            .entry((ns.to_owned(), Family::of(kind), name.to_owned()))
            .or_default();
        let now = Instant::now();
        entry.expire(now);
        Ok(f(entry, now))
    }
}

/// A client of a [`MemoryServer`]: the [`Backend`] the conformance suite runs as the
/// reference (every lock kind and elections; no operator commands).
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    server: MemoryServer,
    namespace: String,
}

impl MemoryBackend {
    fn step<T>(
        &self,
        kind: LockKind,
        name: &str,
        f: impl FnOnce(&mut Entry, Instant) -> T,
    ) -> Result<T> {
        self.server.step(&self.namespace, kind, name, f)
    }

    fn subscribe(&self, kind: LockKind, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        let rx = self.step(kind, name, |e, _| e.changed.subscribe())?;
        Ok(Box::new(Changes(rx)))
    }
}

/// A watch on one entry: wakes at every change after it was made.
struct Changes(watch::Receiver<()>);

#[async_trait]
impl ReleaseWatch for Changes {
    async fn changed(&mut self) -> Result<Wake> {
        match self.0.changed().await {
            Ok(()) => Ok(Wake::Released),
            Err(_) => Err(Error::connection(
                KIND,
                "memory",
                "the server lost its data",
            )),
        }
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        format!("memory (namespace {})", self.namespace)
    }

    fn capabilities(&self) -> Capabilities {
        (Capabilities::all().with(LockKind::Election))
            .listing(false)
            .forced_release(false)
            .diagnosis(false)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.step(req.key.kind, &req.key.name, |e, now| e.acquire(req, now))?
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.subscribe(req.key.kind, &req.key.name)
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.step(req.key.kind, &req.key.name, |e, _| e.give_up(&req.attempt))
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.step(grant.key.kind, &grant.key.name, |e, _| e.release(grant))
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        (holds.iter())
            .map(|(g, lease)| self.step(g.key.kind, &g.key.name, |e, now| e.renew(g, *lease, now)))
            .collect()
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.step(kind, name, |e, now| e.inspect(name, Family::of(kind), now))
    }

    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        self.step(grant.key.kind, &grant.key.name, |e, _| {
            e.proclaim(grant, seq, value)
        })
    }

    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        self.subscribe(LockKind::Election, name)
    }

    async fn set_permits(&self, name: &str, permits: u32) -> Result<()> {
        let kind = LockKind::Semaphore {
            permits: 1,
            limit: permits,
        };
        self.step(kind, name, |e, _| {
            e.limit = Some(permits);
            e.notify();
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::backend::{HoldKey, LostSignal};

    fn ask(owner: &str, kind: LockKind, queue: bool) -> AcquireRequest {
        let key = HoldKey::new("n", owner, kind);
        let mut req = AcquireRequest::new(key, Duration::from_secs(10), LostSignal::new());
        req.waiter_ttl = queue.then_some(Duration::from_secs(1));
        req
    }

    fn token(reply: Result<AcquireReply>) -> Option<u64> {
        match reply.expect("acquire") {
            AcquireReply::Granted { token } => Some(token),
            AcquireReply::Held { .. } => None,
        }
    }

    #[test]
    fn a_retry_is_the_same_grant_and_never_shortens() {
        let (mut e, now) = (Entry::default(), Instant::now());
        let mut req = ask("a", LockKind::Mutex, false);
        let t = token(e.acquire(&req, now)).expect("free");
        req.lease = Duration::from_millis(1);
        assert_eq!(token(e.acquire(&req, now)), Some(t));
        assert_eq!(e.grants[0].ends, now + Duration::from_secs(10));
        assert_eq!(
            token(e.acquire(&ask("a", LockKind::Mutex, false), now)),
            None
        );
        let stale = GrantRef {
            token: t - 1,
            ..req.grant(t)
        };
        assert_eq!(e.release(&stale), ReleaseOutcome::Expired);
        assert_eq!(e.release(&req.grant(t)), ReleaseOutcome::Released);
        assert!(token(e.acquire(&ask("b", LockKind::Mutex, false), now)) > Some(t));
    }

    #[test]
    fn a_waiting_writer_holds_new_readers_back_but_not_a_downgrade() {
        let (mut e, now) = (Entry::default(), Instant::now());
        let r1 = ask("r1", LockKind::Read, false);
        assert!(token(e.acquire(&r1, now)).is_some());
        let w = ask("w", LockKind::Write, true);
        assert_eq!(token(e.acquire(&w, now)), None);
        assert_eq!(
            token(e.acquire(&ask("r2", LockKind::Read, true), now)),
            None
        );
        assert!(
            e.acquire(&ask("r1", LockKind::Write, false), now).is_err(),
            "upgrade"
        );
        e.give_up(&r1.attempt);
        let tw = token(e.acquire(&w, now)).expect("the writer, first in line");
        let mut down = ask("w", LockKind::Read, false);
        down.write_grant = Some(w.grant(tw));
        assert!(token(e.acquire(&down, now)).is_some(), "downgrade");
    }

    #[test]
    fn fair_locks_go_in_line_and_semaphores_count_permits() {
        let (mut e, now) = (Entry::default(), Instant::now());
        let (a, b) = (
            ask("a", LockKind::Fair, true),
            ask("b", LockKind::Fair, true),
        );
        let ta = token(e.acquire(&a, now)).expect("free");
        assert_eq!(token(e.acquire(&b, now)), None);
        assert_eq!(e.release(&a.grant(ta)), ReleaseOutcome::Released);
        assert_eq!(
            token(e.acquire(&ask("c", LockKind::Fair, false), now)),
            None
        );
        assert!(token(e.acquire(&b, now)).is_some(), "the first in line");
        let mut s = Entry::default();
        let sem = |n| LockKind::Semaphore {
            permits: n,
            limit: 3,
        };
        assert!(token(s.acquire(&ask("a", sem(2), false), now)).is_some());
        assert_eq!(token(s.acquire(&ask("b", sem(2), false), now)), None);
        assert!(token(s.acquire(&ask("c", sem(1), false), now)).is_some());
        s.expire(now + Duration::from_secs(11));
        assert!(s.grants.is_empty(), "leases end on the server");
    }
}
