//! Waiting in etcd's queue: the mutex recipe's `waitDeletes` (docs/etcd.md, *The recipe*, has
//! every step). The attempt's own key on its own lease (a retry finds the key a request with a
//! lost reply made); being first *is* the grant, as in Go's `concurrency.Mutex`; else it
//! watches only the key created just before its own, from the revision of the read (a deletion
//! in between is not missed): no herd. A lost place (lease gone, no keep-alive for a whole
//! lease) ends the wait with an error; a wait that ends without the lock deletes the attempt's
//! own key, whatever state it is in, and never another attempt's.

use crate::error::{map, shape, timed_out, KIND};
use crate::kv::Keys;
use crate::kv::{enqueue, header_revision, reads, token_of};
use crate::lease::Lease;
use crate::EtcdBackend;
use distlock_core::backend::{
    async_trait, wait, AcquireRequest, Attempt, Deadline, Granted, ReleaseWatch, WaitStrategy, Wake,
};
use distlock_core::backoff::{Backoff, RetryPolicy};
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{Backend, Error, Result};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchFilterType, WatchOptions, WatchStream,
};
use std::time::{Duration, Instant};
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

/// `acquire_wait`: the core's retrying wait loop ([`wait::run`]) with an etcd [`Waiter`].
pub(crate) async fn acquire_wait(
    b: &EtcdBackend,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Result<Option<Granted>> {
    let (keys, mine) = b.keys_of(&req.key, &req.attempt);
    let mut waiter = Waiter {
        b,
        req,
        keys,
        mine,
        // Every lease this attempt may put its key on is granted after this instant.
        started: LeaseInstant::now(),
        place: None,
        watch: None,
        tick: MAX_TICK,
        broken: Backoff::default(),
        place_lost: false,
    };
    let deadline = Deadline::from(deadline);
    wait::run(&mut waiter, deadline, cancel, RetryPolicy::default()).await
}

/// One attempt waiting in the queue: its place once it has one, and the watch on the key
/// just before its own.
struct Waiter<'a> {
    b: &'a EtcdBackend,
    req: &'a AcquireRequest,
    keys: Keys,
    mine: Vec<u8>,
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

impl Waiter<'_> {
    /// The place is gone (`why`): an error, and the wait is not retried.
    fn lost(&mut self, why: &str) -> Error {
        self.place_lost = true;
        let mine = String::from_utf8_lossy(&self.mine);
        let message = format!(
            "stopped waiting for the lock: {why}, so the waiter's place `{mine}` in the queue is gone"
        );
        Error::connection(KIND, self.b.endpoint(), message)
    }

    /// Puts our key at the end of the queue (Go's `tryAcquire`), or finds it there (our
    /// place); takes the lock at once if the key is first.
    async fn enqueue(&mut self) -> Result<Option<Granted>> {
        let (b, keys, mine, req) = (self.b, &self.keys, self.mine.as_slice(), self.req);
        let sent = LeaseInstant::now();
        let lease = b.grant(req.lease).await?;
        let absent = Compare::create_revision(mine.to_vec(), CompareOp::Equal, 0);
        let txn = enqueue(keys, mine, req, lease, absent);
        // On an error, perhaps applied: the key may be on this lease now.
        let resp = b
            .doubting(&req.attempt, lease, b.txn("acquire", txn))
            .await?;
        let (rev, lease, confirmed_at, first_is_mine) = if resp.succeeded() {
            let rev = header_revision(&resp)?;
            let [first] = reads(&resp)?;
            if first.is_none_or(|f| f.create_revision() == rev) {
                b.remember(&req.attempt, lease);
                return Ok(Some(Granted::new(token_of(rev)?, sent)));
            }
            (rev, lease, sent, false)
        } else {
            // Our key exists: an earlier request of this attempt put it and its reply was lost.
            // This request's lease carries nothing (etcd answered that it put nothing).
            b.revoke_in_background(lease.id);
            let [m, first] = reads(&resp)?;
            let m = m.ok_or_else(|| {
                shape("etcd said the attempt's key exists but returned no such key")
            })?;
            let first_is_mine = first.is_some_and(|f| f.key() == m.key());
            let rev = m.create_revision();
            let Some(h) = b.hold_state(keys, mine, rev, Some(m)).await? else {
                return Err(self.lost("its key was deleted (lease expired or revoked)"));
            };
            let (id, ttl) = (h.kv.lease(), h.rec.ttl);
            // That lease was granted during this wait.
            (rev, Lease { id, ttl }, self.started, first_is_mine)
        };
        self.place = Some(Place {
            rev,
            lease,
            confirmed_at,
        });
        if first_is_mine {
            self.take_turn().await.map(Some)
        } else {
            Ok(None)
        }
    }

    /// Our key is first: the lock is ours. One keep-alive, so the lease runs its full TTL (at
    /// least the requested lease) from now; if it does not get through, the lease still runs from
    /// the last confirmed one.
    async fn take_turn(&mut self) -> Result<Granted> {
        let Some(place) = self.place else {
            return Err(shape("no place in the queue"));
        };
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
        Ok(Granted::new(token_of(place.rev)?, confirmed_at))
    }

    /// One look at the queue from our place: keeps the lease alive when a third of it has
    /// gone, takes the lock if our key is first, else watches the key before ours.
    async fn look(&mut self) -> Result<Attempt> {
        let Some(Place {
            rev,
            lease,
            confirmed_at,
        }) = self.place
        else {
            return Err(shape("no place in the queue"));
        };
        let lease_len = Duration::from_secs(lease.ttl.unsigned_abs());
        self.tick = (lease_len / 3).min(MAX_TICK);
        if confirmed_at.elapsed() >= lease_len {
            return Err(self.lost(&format!(
                "no keep-alive of its lease reached etcd for {lease_len:?}"
            )));
        }
        if confirmed_at.elapsed() >= lease_len / 3 {
            let sent = LeaseInstant::now();
            match self.b.keep_alive(lease.id).await {
                Ok(true) => {
                    self.place = Some(Place {
                        rev,
                        lease,
                        confirmed_at: sent,
                    })
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
            self.keys.queue.clone(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_max_create_revision(rev - 1)
                    .with_limit(1),
            ),
        );
        let txn = Txn::new().and_then([TxnOp::get(self.mine.clone(), None), pred]);
        let resp = self.b.txn("wait", txn).await?;
        let [mine, pred] = reads(&resp)?;
        if mine.is_none_or(|m| m.create_revision() != rev) {
            return Err(self.lost("its key was deleted (lease expired or revoked)"));
        }
        let Some(pred) = pred else {
            // First in the queue: the lock is ours.
            return self.take_turn().await.map(Attempt::Granted);
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
        if self.place.is_none() {
            if let Some(g) = self.enqueue().await? {
                return Ok(Attempt::Granted(g));
            }
        }
        self.look().await
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
            .map_err(|_| timed_out(&self.endpoint, "watch", self.op_timeout))?
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
