//! For backend authors: the narrow [`Backend`] trait, the values that cross it, and the kit
//! of generic parts every backend needs (users of locks need none of this module).
//!
//! Everything generic — waiting, deadlines, the watchdog, cancellation, guards, retries,
//! re-entry, lock-kind checks — lives in the core and is written once. A backend only knows
//! how to talk to its server. The kit gives it the parts that are the same everywhere:
//!
//! | part | what it replaces |
//! |---|---|
//! | [`Capabilities`] | a `check_kind` per backend: the core checks kinds and answers `Unsupported` |
//! | [`Deadline`] | `until(deadline)`, `pause(d, deadline, cancel)`, `remaining` arithmetic |
//! | [`wait::run`] + [`WaitStrategy`], [`wait::retrying`] | a hand-written retrying wait loop per backend |
//! | [`LostRegistry`] | the map of lost signals a session fires when it ends |
//! | [`Subscriptions`] | the per-connection table of waiters behind `SUBSCRIBE` / `LISTEN` |
//! | [`Delegate`] | an `impl Backend` per backend with modes, every method forwarding to the mode in use |
//! | [`Error::connection`](crate::Error::connection), [`Error::unexpected`](crate::Error::unexpected), … | error structs built by hand |
//!
//! # The hold protocol: addressed by grant, idempotent by construction
//! Every acquisition *attempt* has an [`AttemptId`], unique forever, made by the core. The
//! server stores it with the grant, together with the grant's fencing token. Everything after
//! the grant names it ([`GrantRef`]: attempt id and token): renewals, releases, give-ups and
//! handoff messages. So a retried or duplicated request has the effect of one, and a stale
//! request of a lost grant can never touch a newer grant of the same owner.
//!
//! Re-entry is counted in the core, in the process (as Curator does): a backend sees one grant
//! per attempt and never a second acquisition by an attempt it already granted to, except as a
//! retry of the same request. Two clients that use one owner id are two holders.
//!
//! # To ensure correctness, an implementation must
//! 1. grant [`Backend::acquire`] to at most one attempt at a time for a mutex, atomically with
//!    setting the lease (a crashed holder's lock must free itself when the lease ends);
//! 2. treat an acquire by an attempt that already holds the lock as a retry of the same
//!    request: return the *same* fencing token, never count it twice, and make the lease run at
//!    least [`AcquireRequest::lease`] from now (never shortening it);
//! 3. return fencing tokens that strictly increase across all grants of one name, forever:
//!    a restart from an older snapshot, a failover to a replica that missed the last grants or
//!    a counter set back must not make one repeat or go back (the Redis, SQL and file backends
//!    floor every token by a clock; each backend documents the assumption it rests on);
//! 4. renew and release only the grant a [`GrantRef`] names (attempt *and* token), and report
//!    the other cases exactly ([`ReleaseOutcome::Expired`], [`ReleaseOutcome::TakenByOther`],
//!    [`RenewOutcome::NotHeld`]); a renewal makes the lease run at least the given duration from
//!    the moment the server applies it and **never shortens** it;
//! 5. make [`Backend::watch`] deliver a wake-up for every release that happens after `watch`
//!    returned (spurious wake-ups are allowed; missed ones are not, short of a broken
//!    connection, which must end the watch with an error); a backend that hands a released
//!    lock straight to a queued waiter ([`Wake::HandedOver`]) must address the handoff to the
//!    waiting *attempt* (never to the owner or the name), and [`Backend::give_up`] must give
//!    back only a grant made to that attempt. A watch reports a handoff as [`Wake::Granted`]
//!    (the wait ends without another request) only when the backend knows the handoff came
//!    after the server answered the attempt's latest request "held", and measures the lease
//!    from that request's send time; any other handoff is confirmed by one more attempt;
//! 6. report a key holding foreign data, a failed script or a reply of the wrong shape as
//!    [`Error::UnexpectedReply`](crate::Error::UnexpectedReply), never by panicking;
//! 7. if it declares [`LockKind::Election`]: keep elections apart from locks of the same name;
//!    grant an election like a mutex (1–5 hold: one leader at a time, tokens strictly
//!    increasing per election, issued when a candidate becomes leader) with
//!    [`AcquireRequest::value`] stored atomically with the grant; report from
//!    [`Backend::inspect`]`(name, LockKind::Election)` the leader only (waiting candidates are
//!    not holders), with [`HolderInfo::value`] and the leader's token as
//!    [`LockInfo::fencing_token`]; implement [`Backend::proclaim`] and [`Backend::observe`].
//!
//! The conformance suite in `distlock-testkit` checks 1–5 and 7 against a real server,
//! including with replies delayed, dropped and duplicated by a proxy. Invariant 6 is each
//! backend's own test, since only the backend knows what foreign data at its keys looks like
//! (`foreign_data_is_an_unexpected_reply` in distlock-redis, `corrupt_lock_file_is_reported`
//! in distlock-file). The testkit's in-memory backend (`distlock_testkit::memory`) keeps them
//! all in the fewest lines, as a template.
//!
//! # Who does what
//! - **Timeouts of one call** are the backend's: every method bounds each server round trip by
//!   the client's per-call timeout ([`ClientOptions::get_op_timeout`](crate::ClientOptions::get_op_timeout))
//!   and reports an overrun as a retryable [`Error::Connection`](crate::Error::Connection) (see
//!   [`Error::call_timeout`](crate::Error::call_timeout)). The core adds an outer bound only
//!   around the watchdog's renewals.
//! - **Deadlines of a wait** are the core's, passed down to [`Backend::acquire_wait`]; a
//!   backend that waits on the server bounds that wait by the deadline.
//! - **Retries** are the core's: a retryable error (an unknown outcome) makes the core send the
//!   same request again (same attempt, same grant), bounded by the client's retry policy or the
//!   wait's deadline. A backend retries only what provably never reached the server.
//! - **Lock kinds** are checked by the core against [`Backend::capabilities`].
//! - **Cancellation**: the core runs `acquire`, `acquire_wait`, `watch`, `give_up` and `release`
//!   in tasks of its own and never drops them half-way (a wait is stopped with its
//!   cancellation token); `renew`, `inspect`, `set_permits` and the [`Operator`] commands run in the caller's future or under a timeout and may be dropped at any
//!   await point, so they must leave nothing half-done that a later call would trip over.

use crate::error::Result;
use std::time::{Duration, Instant};

pub use crate::caps::Capabilities;
pub use crate::deadline::Deadline;
pub use crate::delegate::Delegate;
pub use crate::lost::{LostReason, LostSignal};
pub use crate::lost_registry::LostRegistry;
pub use crate::operator::{self, Operator};
pub use crate::subscriptions::{NoWatch, Subscription, Subscriptions};
pub use crate::types::{
    AcquireReply, AcquireRequest, AttemptId, Finding, ForceReleased, GrantRef, Granted, HoldKey,
    HolderInfo, ListedLock, LockInfo, LockKind, ReleaseOutcome, RenewOutcome, Severity, WaiterInfo,
    Wake,
};
pub use crate::wait::{self, Attempt, WaitStrategy};
pub use async_trait::async_trait;

/// A subscription to release notifications of one lock, for one waiting attempt (from
/// [`Backend::watch`]; [`Subscription`] is the kit's implementation).
#[async_trait]
pub trait ReleaseWatch: Send {
    /// Resolves after the next release notification that concerns this waiter (possibly
    /// spuriously). An error means the subscription broke and notifications may have been
    /// missed; the caller drops the watch, tries to acquire, and subscribes again.
    ///
    /// # Cancel safety
    /// Must be cancel safe: the wait loop drops it when its sleep ends first. A notification
    /// that arrived is kept for the next call.
    ///
    /// # Errors
    /// [`Error::Connection`](crate::Error::Connection) when the subscription broke.
    async fn changed(&mut self) -> Result<Wake>;
}

/// A lock service. The [module docs](self) list the invariants an implementation keeps and
/// who does what; each method below says what it must guarantee.
///
/// Implement it with [`macro@async_trait`]:
///
/// ```
/// use distlock_core::backend::*;
/// use distlock_core::Result;
/// use std::time::Duration;
///
/// /// A backend that only ever finds the lock held (a skeleton to fill in).
/// struct AlwaysHeld;
///
/// #[async_trait]
/// impl Backend for AlwaysHeld {
///     fn kind(&self) -> &'static str { "held" }
///     fn endpoint(&self) -> String { "nowhere".into() }
///     fn capabilities(&self) -> Capabilities { Capabilities::kinds(&[LockKind::Mutex]) }
///     async fn acquire(&self, _: &AcquireRequest) -> Result<AcquireReply> {
///         Ok(AcquireReply::Held { ttl: None })
///     }
///     async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
///         let subs: Subscriptions<String> = Subscriptions::new("held", "nowhere");
///         Ok(Box::new(subs.subscribe(req.key.name.to_string(), &req.attempt).0))
///     }
///     async fn give_up(&self, _: &AcquireRequest) -> Result<()> { Ok(()) }
///     async fn release(&self, _: &GrantRef) -> Result<ReleaseOutcome> {
///         Ok(ReleaseOutcome::Expired)
///     }
///     async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
///         Ok(vec![RenewOutcome::NotHeld; holds.len()])
///     }
///     async fn inspect(&self, name: &str, _: LockKind) -> Result<LockInfo> {
///         Ok(LockInfo::new(name))
///     }
/// }
/// ```
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Short lower-case name of the backend kind, e.g. `redis`: a constant, used in messages,
    /// errors and metric labels. No I/O.
    fn kind(&self) -> &'static str;

    /// Where the backend talks to, for messages: host and port, path, or node list — never
    /// with credentials. Cheap and without I/O.
    fn endpoint(&self) -> String;

    /// What this backend implements. The core checks every lock kind against it before it
    /// calls the backend, and answers the standard [`Error::Unsupported`](crate::Error::Unsupported)
    /// itself, so the other methods only ever see declared kinds (when called through a
    /// [`Client`](crate::Client)). The default declares everything ([`Capabilities::all`]).
    ///
    /// Must be cheap, without I/O, and the same for the life of the value: the core calls
    /// it for each acquisition.
    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    /// One attempt to acquire `req.key` for the attempt `req.attempt`; never waits for the
    /// lock.
    ///
    /// Must guarantee (invariants 1–3): a grant sets the lease `req.lease` atomically with
    /// it; a retry by an attempt that already holds is answered with the same token and makes
    /// the lease run at least `req.lease` from now, never shorter; tokens strictly increase
    /// per name. [`AcquireReply::Held`] carries the holder's remaining lease when the server
    /// knows it (waiters sleep at most that long). With `req.waiter_ttl = Some(ttl)` a backend
    /// with a server-side queue registers the attempt as a waiter alive for `ttl`; with
    /// `req.write_grant` set (the read side) it may grant beside that write grant of the same
    /// owner (a downgrade).
    ///
    /// # Cancel safety
    /// Need not be cancel safe: the core runs it to completion in a task of its own.
    ///
    /// # Errors
    /// A retryable [`Error::Connection`](crate::Error::Connection) when the outcome is unknown
    /// (the request may have been applied): the core retries with the same attempt, or gives
    /// it up ([`Backend::give_up`]). [`Error::UnexpectedReply`](crate::Error::UnexpectedReply)
    /// for foreign data; [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a
    /// request the server cannot honour (e.g. a lease longer than a session).
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply>;

    /// Subscribes to release notifications for `req.key.name`, on behalf of the waiting
    /// attempt `req.attempt` (handoffs to other attempts, even of the same owner, are not its
    /// own). Called before the attempt's next request, so a release between that request and
    /// the wait is not missed.
    ///
    /// Must guarantee (invariant 5): every release after this returns wakes the watch (or
    /// ends it with an error); dropping the watch unsubscribes (the kit's [`Subscriptions`]
    /// counts references). A backend without notifications returns a watch that never fires:
    /// waiters then wake at the holder's lease end or their heartbeat.
    ///
    /// # Cancel safety
    /// Need not be cancel safe: the wait loop runs it to completion.
    ///
    /// # Errors
    /// A retryable error when the subscription cannot be made now (the waiter then sleeps
    /// until the holder's lease end and tries again).
    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>>;

    /// A watch for `req` that is in place **now**, without a round trip, if the backend has
    /// one (e.g. Redis, once its client's wake-up channel is subscribed: every handoff to
    /// one of its waiters comes there). The wait loop asks for it before its first attempt,
    /// so that a notice sent any time after that attempt reaches the server is not missed,
    /// and then needs no second attempt after subscribing. Must not block or wait. The
    /// default is `None`: the loop subscribes with [`Backend::watch`] after the lock was
    /// found held, then tries once more.
    fn watch_ready(&self, req: &AcquireRequest) -> Option<Box<dyn ReleaseWatch>> {
        let _ = req;
        None
    }

    /// The attempt `req.attempt` stops (its wait ran out or was cancelled, or its last request
    /// failed with an unknown outcome): leave the server's queue, and give back a grant made
    /// to *that attempt* in the meantime — handed over, or granted by a request whose reply was
    /// lost — never one of another attempt of the same owner. Idempotent.
    ///
    /// # Cancel safety
    /// Need not be cancel safe: the core runs it to completion.
    ///
    /// # Errors
    /// Any error is logged and otherwise ignored: whatever the attempt left frees itself at
    /// its lease (or waiter ttl) end.
    async fn give_up(&self, req: &AcquireRequest) -> Result<()>;

    /// Waits for the lock until `deadline` (`None`: no deadline), or until `cancel` fires.
    ///
    /// The default is [`wait::watch_and_retry`]: it waits with [`Backend::watch`] and retries
    /// [`Backend::acquire`] on every wake-up or when the holder's lease would run out, and
    /// gives the attempt up when it stops without the lock. Backends with a server-side queue
    /// or wait (etcd, ZooKeeper, SQL) override it, with the kit's [`wait::run`] or
    /// [`wait::retrying`] so that backoff, deadline, cancellation and the last-error report
    /// behave the same everywhere.
    ///
    /// Must guarantee: `Ok(Some(granted))` only for a grant to `req.attempt`, with
    /// `granted.requested_at` no later than the server's grant; no grant is left behind when
    /// it returns anything else (give it up); it returns promptly after `cancel` fires.
    ///
    /// # Cancel safety
    /// Need not be cancel safe: the core never drops it; it stops it with `cancel`.
    ///
    /// # Errors
    /// `Ok(None)` if the deadline passed or `cancel` fired first; the last retryable error if
    /// the deadline passed right after failed attempts; a non-retryable error at once.
    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<Option<Granted>> {
        crate::wait::watch_and_retry(self, req, deadline, cancel).await
    }

    /// Releases the grant `grant` names (and only it: invariant 4). Idempotent: a retry after
    /// the release went through answers [`ReleaseOutcome::Expired`]; a grant that is gone
    /// answers `Expired`, or [`ReleaseOutcome::TakenByOther`] if another owner holds now.
    /// Never answers [`ReleaseOutcome::StillHeld`] (re-entry is the core's).
    ///
    /// # Cancel safety
    /// Need not be cancel safe: the core runs it in a task of its own.
    ///
    /// # Errors
    /// A retryable error when the outcome is unknown (the core retries; a retry that finds
    /// the grant gone is reported as released).
    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome>;

    /// Renews many grants at once, each so that its lease runs at least the given duration
    /// from when the server applies it, never shortening it (invariant 4). The watchdog calls
    /// this once per chunk of at most 1,000 holds per tick (chunks spread over the first
    /// quarter of the interval, possibly several in flight at once); `extend` with one item.
    /// Returns one outcome per item, in order: [`RenewOutcome::NotHeld`] fires that hold's
    /// lost signal. A hold whose renewal fails on its own (its key's data unreadable, a
    /// compare-and-swap that kept losing, an error for that key alone) is answered
    /// [`RenewOutcome::Unconfirmed`] while the others get their outcomes: one bad hold must not
    /// leave the rest of its batch unconfirmed ([`RenewOutcome::each`] collects per-item
    /// results so).
    ///
    /// # Cancel safety
    /// Must be cancel safe: the watchdog drops it when the client's per-call timeout (or the
    /// renewal interval) runs out, and `extend` runs in the caller's future. A renewal that
    /// is dropped may or may not have been applied; because it never shortens a lease, either
    /// is safe.
    ///
    /// # Errors
    /// An `Err` means the whole batch could not be confirmed (the server unreachable, the
    /// session gone): the watchdog retries a quarter interval later, and the core presumes the
    /// locks lost when their leases run out first. It retries [`RenewOutcome::Unconfirmed`]
    /// items the same way, alone.
    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>>;

    /// The lock's current state, as the server sees it now. Read-only.
    ///
    /// # Cancel safety
    /// Must be cancel safe (it only reads; callers drop it freely).
    ///
    /// # Errors
    /// Connection errors (retried by the core) and unexpected replies.
    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo>;

    /// Replaces the advertised value of the election grant `grant` names with `value`, if
    /// that grant still leads and `seq` is greater than the sequence number of the value it
    /// advertises now (a grant starts at 0 with the value it was granted with; the core
    /// numbers a leadership's proclamations 1, 2, …). So a retried or duplicated proclamation
    /// has the effect of one, and a late one never overwrites a newer value. Answers
    /// [`RenewOutcome::Renewed`] when the grant leads (whether or not this `seq` was new) and
    /// [`RenewOutcome::NotHeld`] when it is gone. Wakes [`Backend::observe`] watches when the
    /// value changed. Must not touch the lease. The default answers
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    ///
    /// # Cancel safety
    /// Must be cancel safe: if dropped, the value may or may not have changed (the core
    /// retries with the same `seq`).
    ///
    /// # Errors
    /// A retryable error when the outcome is unknown; unexpected replies.
    async fn proclaim(&self, _grant: &GrantRef, _seq: u64, _value: &str) -> Result<RenewOutcome> {
        Err(crate::Error::unsupported(self.kind(), "elections"))
    }

    /// Subscribes to the changes of election `name`: a new leader (granted or handed over),
    /// a leader that resigned, expired or lost its session, and a proclaimed value. The watch
    /// resolves (with [`Wake::Released`]) after each change that happens after `observe`
    /// returned; spurious wake-ups are allowed, missed ones are not (a broken subscription
    /// ends the watch with an error). Observers read the state with [`Backend::inspect`] after
    /// each wake-up, and sleep at most until the leader's lease end, so a backend whose server
    /// does not announce expiries need not fake them. The default answers
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    ///
    /// # Cancel safety
    /// Need not be cancel safe; the watch's `changed` must be (as for [`Backend::watch`]).
    ///
    /// # Errors
    /// A retryable error when the subscription cannot be made now.
    async fn observe(&self, _name: &str) -> Result<Box<dyn ReleaseWatch>> {
        Err(crate::Error::unsupported(self.kind(), "elections"))
    }

    /// Sets the number of permits of semaphore `name` (permits already held stay held; if
    /// more are held than the new count, new acquisitions wait until enough are returned).
    /// The default answers [`Error::Unsupported`](crate::Error::Unsupported).
    ///
    /// # Cancel safety
    /// Must be cancel safe: if dropped, the count may or may not have changed.
    ///
    /// # Errors
    /// Connection errors (not retried: the caller sets it again) and unexpected replies.
    async fn set_permits(&self, _name: &str, _permits: u32) -> Result<()> {
        Err(crate::Error::unsupported(self.kind(), "semaphores"))
    }

    /// The operator commands (`dlock list`, `dlock release --force`, `dlock doctor`, the
    /// service's clock) of this backend, if it has them: usually `Some(self)` with an
    /// [`Operator`] impl beside this one. The default is `None`: the client answers
    /// [`Error::Unsupported`](crate::Error::Unsupported) for them, and the local clock for
    /// [`Client::server_time`](crate::Client::server_time). Cheap and without I/O.
    fn operator(&self) -> Option<&dyn Operator> {
        None
    }
}
