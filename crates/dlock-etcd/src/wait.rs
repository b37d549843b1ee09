//! Waiting in etcd's queue: the mutex recipe's `waitDeletes`.
//!
//! A waiter puts its key (count 0) with its own lease, then repeatedly asks for the key created
//! just before its own. None: the lock is ours; claim it (count 1). Otherwise it watches that
//! one key for its deletion (from the revision of the read, so a deletion in between is not
//! missed) and asks again. Only the next waiter wakes on a release: no herd.
//!
//! While it waits, the waiter keeps its lease alive. If etcd says the lease is gone, or no
//! keep-alive got through for a whole lease, its place in the queue is gone and the wait ends
//! with an error rather than waiting behind a key that no longer exists. On deadline or
//! cancellation the waiter revokes its lease, which deletes its key: nothing is left behind.

use crate::error::KIND;
use crate::keys::{Entry, Keys};
use crate::{gets, header_revision, nth_first, token_of, Attempt, EtcdBackend, Lease};
use dlock_core::backoff::Backoff;
use dlock_core::{AcquireRequest, Error, Granted, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchFilterType, WatchOptions, WatchStream,
};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Longest pause between two looks at the queue while waiting (a safety net under the watch:
/// a watch on a member that stopped answering can stay silent).
const MAX_TICK: Duration = Duration::from_secs(1);

/// This waiter's place in the queue.
struct Place {
    /// Create revision of our key: the fencing token once we hold the lock.
    rev: i64,
    /// The lease our key is attached to, and its TTL in seconds.
    lease: i64,
    ttl: i64,
    /// True if this wait created the key (and so must delete it when it stops waiting).
    created: bool,
    /// Send time of the last keep-alive (or grant) etcd confirmed.
    confirmed_at: Instant,
}

enum Enqueued {
    Granted(Granted),
    Waiting(Place),
}

enum Turn {
    Granted(Granted),
    /// Our shared key vanished (the other task of this owner stopped waiting): queue again.
    Requeue,
}

pub(crate) async fn acquire_wait(
    b: &EtcdBackend,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Result<Option<Granted>> {
    b.check_kind(req.key.kind)?;
    let keys = b.keys(&req.key);
    let mut backoff = Backoff::default();
    loop {
        if stopped(deadline, cancel) {
            return Ok(None);
        }
        let mut place = match enqueue(b, &keys, req).await {
            Ok(Enqueued::Granted(g)) => return Ok(Some(g)),
            Ok(Enqueued::Waiting(p)) => p,
            Err(e) if e.is_retryable() => {
                tracing::debug!(error = %e, "cannot queue for the lock yet; retrying");
                if !pause(backoff.next_delay(), deadline, cancel).await {
                    return Ok(None);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        backoff.reset();
        let res = wait_turn(b, &keys, &mut place, deadline, cancel).await;
        match res {
            Ok(Some(Turn::Granted(g))) => return Ok(Some(g)),
            Ok(Some(Turn::Requeue)) => continue,
            other => {
                leave(b, &keys, &place).await;
                return other.map(|_| None);
            }
        }
    }
}

/// Takes the lock at once if possible; else puts our key at the end of the queue.
async fn enqueue(b: &EtcdBackend, keys: &Keys, req: &AcquireRequest) -> Result<Enqueued> {
    let sent = Instant::now();
    let lease = b.grant(req.lease).await?;
    let attempt = match b.attempt(keys, lease).await {
        Ok(a) => a,
        Err(e) => {
            b.revoke_in_background(lease.id);
            return Err(e);
        }
    };
    match attempt {
        Attempt::Granted { token } => Ok(Enqueued::Granted(Granted {
            token,
            requested_at: sent,
        })),
        Attempt::Reentered { token, used } => {
            if !used {
                b.revoke_in_background(lease.id);
            }
            Ok(Enqueued::Granted(Granted {
                token,
                requested_at: sent,
            }))
        }
        Attempt::Queued { mine } => {
            b.revoke_in_background(lease.id);
            shared_place(&mine, sent).map(Enqueued::Waiting)
        }
        Attempt::Held { .. } => match join_queue(b, keys, lease).await {
            Ok(Some(rev)) => Ok(Enqueued::Waiting(Place {
                rev,
                lease: lease.id,
                ttl: lease.ttl,
                created: true,
                confirmed_at: sent,
            })),
            Ok(None) => {
                // Another task of this owner queued the same key just now: share it.
                b.revoke_in_background(lease.id);
                match b.get("acquire", &keys.mine).await?.as_ref() {
                    Some(m) => shared_place(m, sent).map(Enqueued::Waiting),
                    None => Err(Error::Connection {
                        backend: KIND,
                        endpoint: b.endpoint.clone(),
                        source: "the queue changed while joining it; try again".into(),
                    }),
                }
            }
            Err(e) => {
                b.revoke_in_background(lease.id);
                Err(e)
            }
        },
    }
}

/// Puts our key (count 0) with `lease`. `Ok(Some(rev))`: created at `rev`; `Ok(None)`: the
/// owner's key exists already.
async fn join_queue(b: &EtcdBackend, keys: &Keys, lease: Lease) -> Result<Option<i64>> {
    let txn = Txn::new()
        .when([Compare::create_revision(
            keys.mine.clone(),
            CompareOp::Equal,
            0,
        )])
        .and_then([
            TxnOp::put(
                keys.mine.clone(),
                Entry {
                    count: 0,
                    ttl: lease.ttl,
                }
                .encode(),
                Some(PutOptions::new().with_lease(lease.id)),
            ),
            TxnOp::put(keys.fence.clone(), "", None),
        ]);
    let resp = b.txn("acquire", txn).await?;
    if resp.succeeded() {
        Ok(Some(header_revision(&resp)?))
    } else {
        Ok(None)
    }
}

fn shared_place(mine: &KeyValue, sent: Instant) -> Result<Place> {
    let e = Entry::decode(mine.key(), mine.value())?;
    Ok(Place {
        rev: mine.create_revision(),
        lease: mine.lease(),
        ttl: e.ttl,
        created: false,
        confirmed_at: sent,
    })
}

/// Our key and the key just before it, read at one revision.
struct Position {
    mine: Option<KeyValue>,
    pred: Option<KeyValue>,
    revision: i64,
}

async fn position(b: &EtcdBackend, keys: &Keys, rev: i64) -> Result<Position> {
    let pred = TxnOp::get(
        keys.queue.clone(),
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_max_create_revision(rev - 1)
                .with_limit(1),
        ),
    );
    let txn = Txn::new().and_then([TxnOp::get(keys.mine.clone(), None), pred]);
    let resp = b.txn("wait", txn).await?;
    let revision = header_revision(&resp)?;
    let mut all = gets(&resp);
    Ok(Position {
        mine: nth_first(&mut all, 0)?,
        pred: nth_first(&mut all, 1)?,
        revision,
    })
}

fn place_lost(b: &EtcdBackend, keys: &Keys, why: &str) -> Error {
    Error::Connection {
        backend: KIND,
        endpoint: b.endpoint.clone(),
        source: format!(
            "stopped waiting for the lock: {why}, so the waiter's place `{}` in the queue is gone",
            String::from_utf8_lossy(&keys.mine)
        )
        .into(),
    }
}

async fn wait_turn(
    b: &EtcdBackend,
    keys: &Keys,
    place: &mut Place,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Result<Option<Turn>> {
    let lease_len = Duration::from_secs(place.ttl.unsigned_abs());
    let tick = (lease_len / 3).min(MAX_TICK);
    let mut backoff = Backoff::default();
    // The watch on the key just before ours, with that key.
    let mut watch: Option<(Vec<u8>, WatchStream)> = None;
    loop {
        if stopped(deadline, cancel) {
            return Ok(None);
        }
        if place.confirmed_at.elapsed() >= lease_len {
            return Err(place_lost(
                b,
                keys,
                &format!("no keep-alive of its lease reached etcd for {lease_len:?}"),
            ));
        }
        if place.confirmed_at.elapsed() >= lease_len / 3 {
            let sent = Instant::now();
            match b.keep_alive(place.lease).await {
                Ok(true) => place.confirmed_at = sent,
                Ok(false) => return Err(place_lost(b, keys, "its lease expired")),
                Err(e) if e.is_retryable() => {
                    tracing::debug!(error = %e, "waiter keep-alive failed; retrying");
                }
                Err(e) => return Err(e),
            }
        }
        let pos = match position(b, keys, place.rev).await {
            Ok(p) => p,
            Err(e) if e.is_retryable() => {
                tracing::debug!(error = %e, "cannot read the queue; retrying");
                watch = None;
                if !pause(backoff.next_delay().min(tick), deadline, cancel).await {
                    return Ok(None);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        backoff.reset();
        let mine = match pos.mine {
            Some(m) if m.create_revision() == place.rev => m,
            _ if !place.created => return Ok(Some(Turn::Requeue)),
            _ => {
                return Err(place_lost(
                    b,
                    keys,
                    "its key was deleted (lease expired or revoked)",
                ))
            }
        };
        let Some(pred) = pos.pred else {
            // First in the queue: the lock is ours. Claim it.
            match claim(b, keys, &mine, place).await {
                Ok(Some(g)) => return Ok(Some(Turn::Granted(g))),
                Ok(None) => continue,
                Err(e) if e.is_retryable() => {
                    if !pause(backoff.next_delay().min(tick), deadline, cancel).await {
                        return Ok(None);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            }
        };
        if watch
            .as_ref()
            .is_none_or(|(k, _)| k.as_slice() != pred.key())
        {
            watch = None;
            let opts = WatchOptions::new()
                .with_start_revision(pos.revision + 1)
                .with_filters([WatchFilterType::NoPut]);
            let res = b
                .call("watch", |c| {
                    let (key, opts) = (pred.key().to_vec(), opts.clone());
                    async move { c.watch_client().watch(key, Some(opts)).await }
                })
                .await;
            match res {
                Ok(s) => watch = Some((pred.key().to_vec(), s)),
                Err(e) if e.is_retryable() => {
                    tracing::debug!(error = %e, "cannot watch the key before ours; polling");
                }
                Err(e) => return Err(e),
            }
        }
        let mut sleep = tick;
        if let Some(d) = deadline {
            sleep = sleep.min(d.saturating_duration_since(Instant::now()));
        }
        match watch.as_mut() {
            Some((_, stream)) => {
                tokio::select! {
                    m = stream.message() => match m {
                        Ok(Some(r)) if !r.canceled() => {
                            // The creation notice, or the deletion: look again either way.
                        }
                        _ => {
                            // Broken or canceled (no leader, compaction): look again after a
                            // short pause, with a new watch.
                            watch = None;
                            if !pause(backoff.next_delay().min(tick), deadline, cancel).await {
                                return Ok(None);
                            }
                        }
                    },
                    _ = tokio::time::sleep(sleep) => {}
                    _ = cancel.cancelled() => return Ok(None),
                }
            }
            None => {
                if !pause(sleep, None, cancel).await {
                    return Ok(None);
                }
            }
        }
    }
}

/// Count + 1 on our key, which is first in the queue, and a fresh keep-alive so the lease runs
/// for its full length from now. `Ok(None)`: the key changed meanwhile; look again.
async fn claim(
    b: &EtcdBackend,
    keys: &Keys,
    mine: &KeyValue,
    place: &mut Place,
) -> Result<Option<Granted>> {
    let e = Entry::decode(mine.key(), mine.value())?;
    let count = e
        .count
        .checked_add(1)
        .ok_or_else(|| crate::error::shape("hold count would overflow"))?;
    let txn = Txn::new()
        .when([Compare::mod_revision(
            keys.mine.clone(),
            CompareOp::Equal,
            mine.mod_revision(),
        )])
        .and_then([TxnOp::put(
            keys.mine.clone(),
            Entry { count, ttl: e.ttl }.encode(),
            Some(PutOptions::new().with_ignore_lease()),
        )]);
    let sent = Instant::now();
    let (cas, alive) = tokio::join!(b.txn("claim", txn), b.keep_alive(mine.lease()));
    if !cas?.succeeded() {
        return Ok(None);
    }
    // Ours now. The lease runs at least from the last confirmed keep-alive.
    let requested_at = match alive {
        Ok(true) => sent,
        _ => place.confirmed_at,
    };
    Ok(Some(Granted {
        token: token_of(place.rev)?,
        requested_at,
    }))
}

/// Stops waiting: revokes our lease, which deletes our key (only if this wait created it).
async fn leave(b: &EtcdBackend, keys: &Keys, place: &Place) {
    if !place.created {
        return;
    }
    if let Err(e) = b.revoke(place.lease).await {
        tracing::debug!(error = %e, "could not revoke the waiter's lease; deleting its key");
        let txn = Txn::new()
            .when([Compare::create_revision(
                keys.mine.clone(),
                CompareOp::Equal,
                place.rev,
            )])
            .and_then([TxnOp::delete(keys.mine.clone(), None)]);
        if let Err(e) = b.txn("give up", txn).await {
            tracing::debug!(error = %e, "could not leave the queue; the key expires with its lease");
        }
    }
}

fn stopped(deadline: Option<Instant>, cancel: &CancellationToken) -> bool {
    cancel.is_cancelled() || deadline.is_some_and(|d| Instant::now() >= d)
}

/// Sleeps `d` (capped by `deadline`); false if cancelled or the deadline passed.
async fn pause(d: Duration, deadline: Option<Instant>, cancel: &CancellationToken) -> bool {
    let d = match deadline {
        Some(dl) => {
            let left = dl.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            d.min(left)
        }
        None => d,
    };
    tokio::select! {
        _ = tokio::time::sleep(d) => deadline.is_none_or(|dl| Instant::now() < dl),
        _ = cancel.cancelled() => false,
    }
}
