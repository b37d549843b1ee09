//! Waiting in etcd's queue: the mutex recipe's `waitDeletes` (docs/etcd.md, *The recipe*,
//! *Wait*, has every step). Being first *is* the grant; else only the key just before ours is
//! watched, from the revision of the read (no deletion missed, no herd). A lost place ends the
//! wait with an error; a wait that ends without the lock deletes the attempt's own key, whatever
//! state it is in, and never another attempt's.

use crate::error::{map, shape, KIND};
use crate::kv::{header_revision, reads, token_of, Slot};
use crate::lease::Lease;
use crate::EtcdBackend;
use distlock_core::backend::{
    async_trait, AcquireRequest, Attempt, Deadline, Granted, ReleaseWatch, WaitStrategy, Wake,
};
use distlock_core::backoff::Backoff;
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{Backend, Error, Result};
use etcd_client::{
    Client, EventType, GetOptions, SortOrder, SortTarget, Txn, TxnOp, WatchFilterType,
    WatchOptions, WatchStream,
};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Longest pause between two looks at the queue while waiting (a safety net under the watch:
/// a watch on a member that stopped answering can stay silent).
const MAX_TICK: Duration = Duration::from_secs(1);

/// This waiter's place in the queue.
#[derive(Clone, Copy)]
struct Place {
    /// Create revision of our key: the fencing token once we hold the lock.
    rev: i64,
    /// The lease our key is attached to.
    lease: Lease,
    /// A time no later than the start of the lease's current TTL: the send time of the last
    /// keep-alive etcd confirmed, or of a request that preceded the lease's grant. On the
    /// lease clock, which counts while the machine is suspended, as etcd's lease does.
    confirmed_at: LeaseInstant,
}

impl Place {
    fn new(rev: i64, lease: Lease, confirmed_at: LeaseInstant) -> Self {
        Place {
            rev,
            lease,
            confirmed_at,
        }
    }
}

/// One attempt waiting in the queue (`acquire_wait`: the core's retrying [`wait::run`](distlock_core::backend::wait::run) with
/// this strategy): its place once it has one, and the watch on the key just before its own.
pub(crate) struct Waiter<'a> {
    b: &'a EtcdBackend,
    req: &'a AcquireRequest,
    slot: Slot,
    started: LeaseInstant,
    place: Option<Place>,
    /// The watch on the key just before ours, with that key.
    watch: Option<(Vec<u8>, WatchStream)>,
    /// Longest sleep between two looks: a third of the lease, at most [`MAX_TICK`].
    tick: Duration,
    /// Pauses after a broken watch.
    broken: Backoff,
    /// The place is gone (lease expired or key deleted): an error, not retried.
    place_lost: bool,
}

impl<'a> Waiter<'a> {
    pub(crate) fn new(b: &'a EtcdBackend, req: &'a AcquireRequest) -> Self {
        Waiter {
            b,
            req,
            slot: b.slot(&req.key, &req.attempt),
            // Every lease this attempt may put its key on is granted after this instant.
            started: LeaseInstant::now(),
            place: None,
            watch: None,
            tick: MAX_TICK,
            broken: Backoff::default(),
            place_lost: false,
        }
    }

    /// The place is gone (`why`): an error, and the wait is not retried.
    fn lost(&mut self, why: &str) -> Error {
        self.place_lost = true;
        let mine = String::from_utf8_lossy(&self.slot.mine);
        let message = format!(
            "stopped waiting for the lock: {why}, so the waiter's place `{mine}` in the queue is gone"
        );
        Error::connection(KIND, self.b.endpoint(), message)
    }

    /// Puts our key at the end of the queue (Go's `tryAcquire`), or finds it there (our
    /// place); takes the lock at once if the key is first, else [looks](Self::look) from there.
    async fn enqueue(&mut self) -> Result<Attempt> {
        let (b, s, req) = (self.b, &self.slot, self.req);
        let sent = LeaseInstant::now();
        let lease = b.grant(req.lease).await?;
        let txn = s.enqueue(req, lease, false);
        // On an error, perhaps applied: the key may be on this lease now.
        let resp = b
            .doubting(&req.attempt, lease, b.txn("acquire", txn))
            .await?;
        if resp.succeeded() {
            let rev = header_revision(&resp)?;
            let [first] = reads(&resp)?;
            if first.is_none_or(|f| f.create_revision() == rev) {
                b.remember(&req.attempt, lease);
                return Ok(Attempt::Granted(Granted::new(token_of(rev)?, sent)));
            }
            return self.look(Place::new(rev, lease, sent)).await;
        }
        // Our key exists: an earlier request of this attempt put it and its reply was lost.
        // This request's lease carries nothing (etcd answered that it put nothing).
        b.revoke_in_background(lease.id);
        let [m, first] = reads(&resp)?;
        let m =
            m.ok_or_else(|| shape("etcd said the attempt's key exists but returned no such key"))?;
        let first_is_mine = first.is_some_and(|f| f.key() == m.key());
        let rev = m.create_revision();
        let Some(h) = b.hold_state(s, rev, Some(m)).await? else {
            return Err(self.lost("its key was deleted (lease expired or revoked)"));
        };
        // That lease was granted during this wait.
        let (id, ttl) = (h.kv.lease(), h.rec.ttl);
        let place = Place::new(rev, Lease { id, ttl }, self.started);
        match first_is_mine {
            true => self.take_turn(place).await,
            false => self.look(place).await,
        }
    }

    /// Our key is first: the lock is ours. One keep-alive, so the lease runs its full TTL (at
    /// least the requested lease) from now; if it does not get through, the lease still runs from
    /// the last confirmed one.
    async fn take_turn(&mut self, place: Place) -> Result<Attempt> {
        self.place = Some(place);
        let sent = LeaseInstant::now();
        let confirmed_at = match self.b.keep_alive(place.lease.id).await {
            Ok(true) => sent,
            Ok(false) => return Err(self.lost("its lease expired as it got the lock")),
            Err(e) => {
                tracing::debug!(error = %e, "keep-alive at grant failed; the lease runs from the last one");
                place.confirmed_at
            }
        };
        self.b.remember(&self.req.attempt, place.lease);
        let token = token_of(place.rev)?;
        Ok(Attempt::Granted(Granted::new(token, confirmed_at)))
    }

    /// One look at the queue from our place: keeps the lease alive when a third of it has
    /// gone, takes the lock if our key is first, else watches the key before ours.
    async fn look(&mut self, mut place: Place) -> Result<Attempt> {
        self.place = Some(place);
        let lease_len = Duration::from_secs(place.lease.ttl.unsigned_abs());
        self.tick = (lease_len / 3).min(MAX_TICK);
        let since = place.confirmed_at.elapsed();
        if since >= lease_len {
            return Err(self.lost(&format!(
                "no keep-alive of its lease reached etcd for {lease_len:?}"
            )));
        }
        if since >= lease_len / 3 {
            let sent = LeaseInstant::now();
            match self.b.keep_alive(place.lease.id).await {
                Ok(true) => {
                    place.confirmed_at = sent;
                    self.place = Some(place);
                }
                Ok(false) => return Err(self.lost("its lease expired")),
                Err(e) if e.is_retryable() => {
                    tracing::debug!(error = %e, "waiter keep-alive failed; retrying");
                }
                // The place is kept: a give-up after this error still knows the key's lease.
                Err(e) => return Err(e),
            }
        }
        // Our key and the key just before it, read at one revision.
        let pred = TxnOp::get(
            self.slot.keys.queue.clone(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_max_create_revision(place.rev - 1)
                    .with_limit(1),
            ),
        );
        let txn = Txn::new().and_then([TxnOp::get(self.slot.mine.clone(), None), pred]);
        let resp = self.b.txn("wait", txn).await?;
        let [mine, pred] = reads(&resp)?;
        if mine.is_none_or(|m| m.create_revision() != place.rev) {
            return Err(self.lost("its key was deleted (lease expired or revoked)"));
        }
        let Some(pred) = pred else {
            // First in the queue: the lock is ours.
            return self.take_turn(place).await;
        };
        if (self.watch.as_ref()).is_none_or(|(k, _)| k.as_slice() != pred.key()) {
            self.watch = None;
            let opts = WatchOptions::new()
                .with_start_revision(header_revision(&resp)? + 1)
                .with_filters([WatchFilterType::NoPut]);
            match self.b.watch(pred.key(), opts).await {
                Ok(s) => self.watch = Some((pred.key().to_vec(), s)),
                Err(e) if e.is_retryable() => {
                    tracing::debug!(error = %e, "cannot watch the key before ours; polling");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Attempt::Held {
            retry_in: Some(self.tick),
        })
    }
}

#[async_trait]
impl WaitStrategy for Waiter<'_> {
    async fn attempt(&mut self, _: Deadline, _: &CancellationToken) -> Result<Attempt> {
        match self.place {
            Some(place) => self.look(place).await,
            None => self.enqueue().await,
        }
    }

    async fn wake(&mut self, until: Deadline) -> Result<Option<Wake>> {
        let Some((_, stream)) = self.watch.as_mut() else {
            until.reached().await;
            return Ok(None);
        };
        tokio::select! {
            m = stream.message() => match m {
                // The creation notice, or the deletion: look again either way.
                Ok(Some(r)) if !r.canceled() => {
                    self.broken.reset();
                    Ok(Some(Wake::Released))
                }
                _ => {
                    // Broken or canceled (no leader, compaction): look again after a short
                    // pause, with a new watch.
                    self.watch = None;
                    tokio::time::sleep(until.cap(self.broken.next_delay().min(self.tick))).await;
                    Ok(None)
                }
            },
            _ = until.reached() => Ok(None),
        }
    }

    /// Connection trouble is retried (the next request names the same key, so it finds the
    /// place, or the grant, the failed one made); a lost place is not: the wait ends with an
    /// error rather than waiting behind a key that no longer exists.
    fn retry(&mut self, e: &Error) -> bool {
        self.watch = None;
        !self.place_lost && e.is_retryable()
    }

    /// Stopped without the lock: leave the queue, and give back a grant this attempt may have
    /// got meanwhile (its key became first as the deadline passed). The request names this
    /// attempt's key and nothing else.
    async fn give_up(&mut self) {
        let place = self.place.as_ref().map(|p| p.lease);
        if let Err(e) = self.b.leave(self.req, place).await {
            tracing::debug!(error = %e, "could not leave the queue; the key's lease is revoked once etcd answers");
        }
    }
}

/// A watch that failed (`why`), as etcd-client's own watch errors are mapped.
fn watch_error(endpoint: &str, why: String) -> Error {
    map(endpoint, etcd_client::Error::WatchError(why))
}

/// A subscription to the deletions under one lock's queue (and with `puts`, to every change
/// under it: an election's observers see new candidates and proclamations too).
pub(crate) struct QueueWatch {
    stream: WatchStream,
    endpoint: String,
    puts: bool,
}

#[async_trait]
impl ReleaseWatch for QueueWatch {
    async fn changed(&mut self) -> Result<Wake> {
        loop {
            let resp = match self.stream.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => return Err(watch_error(&self.endpoint, "watch stream ended".into())),
                Err(e) => return Err(map(&self.endpoint, e)),
            };
            if resp.canceled() {
                let why = format!("watch canceled: {}", resp.cancel_reason());
                return Err(watch_error(&self.endpoint, why));
            }
            let puts = self.puts;
            if (resp.events().iter()).any(|e| puts || e.event_type() == EventType::Delete) {
                return Ok(Wake::Released);
            }
        }
    }
}

impl EtcdBackend {
    /// A watch on `key` (with `opts`), not yet confirmed by the server.
    async fn watch(&self, key: &[u8], opts: WatchOptions) -> Result<WatchStream> {
        let watch = |c: Client| {
            let (key, opts) = (key.to_vec(), opts.clone());
            async move { c.watch_client().watch(key, Some(opts)).await }
        };
        self.call("watch", watch).await
    }

    /// A watch on every key under `prefix`, confirmed by the server: deletions only (a
    /// lock's releases, `Backend::watch`), or with `puts` every change (`Backend::observe`:
    /// a new candidate, a proclamation, a lease move, a resignation or expiry; metadata keys
    /// change only together with their candidate key, in one transaction, so the candidate
    /// prefix alone sees every change an observer reads).
    pub(crate) async fn watch_prefix(
        &self,
        prefix: Vec<u8>,
        puts: bool,
    ) -> Result<Box<dyn ReleaseWatch>> {
        let mut opts = WatchOptions::new().with_prefix();
        if !puts {
            opts = opts.with_filters([WatchFilterType::NoPut]);
        }
        let mut stream = self.watch(&prefix, opts).await?;
        // Wait for the server to confirm the watch, so no release after this call is missed.
        let first = tokio::time::timeout(self.op_timeout, stream.message())
            .await
            .map_err(|_| Error::call_timeout(KIND, &self.endpoint, "watch", self.op_timeout))?
            .map_err(|e| map(&self.endpoint, e))?;
        if !first.is_some_and(|r| r.created() && !r.canceled()) {
            let why = "the watch was not created".into();
            return Err(watch_error(&self.endpoint, why));
        }
        Ok(Box::new(QueueWatch {
            stream,
            endpoint: self.endpoint.clone(),
            puts,
        }))
    }
}
