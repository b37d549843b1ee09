//! The keeper task: watchdog renewals in chunks spread over the tick, lease ends, and the
//! releases of dropped guards.
//!
//! Every renewal interval (a third of the watchdog lease) a *round* starts: the watchdog holds
//! are taken in the order of their lease ends (the nearest first) and split into chunks of at
//! most [`RENEW_CHUNK`] holds, of equal size. The chunks go out evenly spaced over the first
//! quarter of the interval (a single chunk at the round's start, as one call did before), each
//! as one `Backend::renew` call in a task of its own, so that 10,000 holds do not reach the
//! server at one instant, and a slow chunk holds up neither the others nor the keeper (which
//! keeps performing releases and watching lease ends meanwhile).
//!
//! Why every lease is kept: a hold is sent within a quarter interval of each round's start, in
//! the same place of the order from round to round (it is sorted by the lease end its last
//! renewal gave it), so two confirmed renewals of a hold are at most 1¼ intervals (5/12 of the
//! lease) apart, and a new hold's first renewal comes at most 1¼ intervals after its grant. A
//! chunk whose call is not confirmed (an error, a timeout, a reply of the wrong size) is tried
//! again by its task a quarter interval later, until the next round, which sends it first (its
//! lease end is then the nearest); so are the holds of a chunk the backend answered
//! `Unconfirmed` (their renewal failed on its own), without the others. A hold the server
//! refuses (`NotHeld`) is lost at once; one whose renewals are never confirmed is lost at its
//! lease end, which its signal knows by itself (`LostSignal::is_lost` compares with the
//! clock) and at which the keeper wakes to take it out of the map.
//!
//! Timers sleep on tokio's clock (CLOCK_MONOTONIC), which stops while the machine is
//! suspended; leases run on the boot-time clock ([`Instant`]), which does not. So while the
//! client has holds, the keeper also wakes every [`SUSPEND_CHECK`] and looks at the boot-time
//! clock: after a resume that outlived a lease, the hold is lost (and every `lost()` future
//! resolves) within that much of the resume, not at a timer that slept through the suspend.
//! One wake-up per client serves all its holds; a client without holds does not wake for it.

use super::{Hold, KeeperMsg, Shared};
use crate::backend::{GrantRef, RenewOutcome};
use crate::clock::Instant;
use crate::lost::LostReason;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The most holds one watchdog `Backend::renew` call carries.
pub(crate) const RENEW_CHUNK: usize = 1000;

/// Longest the keeper sleeps on tokio's clock while the client has holds: how late after a
/// resume from suspend a lease that ran out during it is noticed.
pub(crate) const SUSPEND_CHECK: Duration = Duration::from_secs(1);

/// The part of the interval over which a round's chunks are sent.
fn spread(interval: Duration) -> Duration {
    interval / 4
}

/// The chunks of a round still to be sent.
struct Round {
    chunks: VecDeque<Vec<Arc<Hold>>>,
    /// When the next chunk goes out.
    next_at: Instant,
    /// Between two chunks.
    step: Duration,
    /// When the next round starts: a chunk is not retried past it.
    ends: Instant,
}

/// The keeper task. Ends when `stop` fires, after performing the releases still queued.
pub(crate) async fn keeper(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<KeeperMsg>,
    stop: CancellationToken,
) {
    let interval = shared.opts.renew_interval();
    let mut next_round = Instant::now() + interval;
    let mut round: Option<Round> = None;
    // Chunk renewals in flight: aborted when the keeper stops.
    let mut renewals = JoinSet::new();
    // Reused from round to round.
    let mut order = Vec::new();
    // The earliest lease end of the holds in the map, or earlier: lease ends only move later,
    // and the scan is done again when one may be earlier (a fixed-lease hold arrives and wakes
    // the keeper; a watchdog hold's lease outlasts the next round's start, which scans). So the
    // keeper does not look at every hold for every message it handles.
    let mut next_expiry = None;
    let mut rescan = true;
    loop {
        if rescan {
            next_expiry = next_expiry_of(&shared);
            rescan = false;
        }
        let next_send = round.as_ref().map_or(next_round, |r| r.next_at);
        let wake_at = next_expiry.map_or(next_send, |e: Instant| e.min(next_send));
        // A timer on tokio's clock sleeps through a suspend: with holds to watch, look at the
        // boot-time clock again at least every SUSPEND_CHECK.
        let mut sleep_until = wake_at.to_tokio();
        if next_expiry.is_some() {
            sleep_until = sleep_until.min(tokio::time::Instant::now() + SUSPEND_CHECK);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            msg = rx.recv() => match msg {
                Some(msg) => handle(&shared, msg),
                None => break,
            },
            _ = shared.wake.notified() => rescan = true,
            // A chunk is done: its holds' lease ends moved on (or they are gone).
            Some(_) = renewals.join_next(), if !renewals.is_empty() => rescan = true,
            _ = tokio::time::sleep_until(sleep_until) => {}
        }
        let now = Instant::now();
        if round.is_none() && now >= next_round {
            round = plan(&shared, &mut order, now, interval);
            next_round = now + interval;
            rescan = true;
        }
        if let Some(r) = &mut round {
            while now >= r.next_at {
                let Some(chunk) = r.chunks.pop_front() else {
                    break;
                };
                renewals.spawn(renew_chunk(shared.clone(), chunk, interval, r.ends));
                r.next_at = r.next_at + r.step;
            }
            if r.chunks.is_empty() {
                round = None;
            }
        }
        if next_expiry.is_some_and(|e| e <= now) {
            expire_overdue(&shared);
            rescan = true;
        }
    }
    rx.close();
    while let Ok(msg) = rx.try_recv() {
        handle(&shared, msg);
    }
}

/// The chunks of a round starting at `now`: every watchdog hold, nearest lease end first, in
/// chunks of at most [`RENEW_CHUNK`] of equal size. `None` when there is nothing to renew.
fn plan(
    shared: &Shared,
    order: &mut Vec<(Instant, Arc<Hold>)>,
    now: Instant,
    interval: Duration,
) -> Option<Round> {
    order.clear();
    order.extend(shared.holds().values().filter_map(|h| {
        if h.lost.is_lost() {
            return None;
        }
        let st = h.state();
        (st.watchdog_guards > 0).then(|| (st.deadline, h.clone()))
    }));
    if order.is_empty() {
        return None;
    }
    order.sort_unstable_by_key(|(deadline, _)| *deadline);
    let count = order.len().div_ceil(RENEW_CHUNK);
    let size = order.len().div_ceil(count);
    let chunks = order
        .chunks(size)
        .map(|c| c.iter().map(|(_, h)| h.clone()).collect())
        .collect();
    order.clear();
    Some(Round {
        chunks,
        next_at: now,
        step: spread(interval) / u32::try_from(count).unwrap_or(u32::MAX),
        ends: now + interval,
    })
}

/// Renews one chunk; retries it a quarter interval later while it is not confirmed, until the
/// round ends (`round_ends`).
async fn renew_chunk(
    shared: Arc<Shared>,
    mut holds: Vec<Arc<Hold>>,
    interval: Duration,
    round_ends: Instant,
) {
    let retry = interval / 4;
    let mut items = Vec::with_capacity(holds.len());
    loop {
        // Released or lost since the round was planned: not renewed.
        holds.retain(|h| !h.lost.is_lost() && h.state().watchdog_guards > 0);
        if holds.is_empty() {
            return;
        }
        // Only what was not confirmed is sent again: the whole chunk after a failed call,
        // the holds whose renewal failed on their own otherwise.
        holds = renew(&shared, holds, &mut items).await;
        if holds.is_empty() {
            return;
        }
        // A renewal that was not confirmed is tried again soon, not only at the next round:
        // one lost or late reply must not cost the lease.
        if Instant::now() + retry >= round_ends {
            return;
        }
        tokio::time::sleep(retry).await;
    }
}

/// The earliest instant a hold of this client must be presumed gone.
fn next_expiry_of(shared: &Shared) -> Option<Instant> {
    shared.holds().values().map(|h| h.expires_at()).min()
}

fn handle(shared: &Arc<Shared>, msg: KeeperMsg) {
    match msg {
        KeeperMsg::Release { hold, watchdog } => {
            let shared = shared.clone();
            tokio::spawn(async move {
                let r = crate::guard::release_hold(&shared, &hold, watchdog).await;
                if let Err(e) = r {
                    tracing::warn!(name = %hold.key().name, error = %e,
                        "background release of a dropped guard failed; the lock frees when its lease ends");
                }
            });
        }
        KeeperMsg::GiveBack(grant) => {
            let shared = shared.clone();
            tokio::spawn(async move { crate::guard::give_back(&shared, &grant).await });
        }
    }
}

/// One batched renewal of `batch` (`items` is the reused request buffer). Returns the holds
/// it could not confirm: all of them if the call failed, those the backend answered
/// [`RenewOutcome::Unconfirmed`] otherwise.
async fn renew(
    shared: &Shared,
    batch: Vec<Arc<Hold>>,
    items: &mut Vec<(GrantRef, Duration)>,
) -> Vec<Arc<Hold>> {
    let lease = shared.opts.watchdog_lease;
    items.clear();
    items.extend(batch.iter().map(|h| (h.grant.clone(), lease)));
    let started = Instant::now();
    let timeout = shared.opts.renew_timeout();
    let backend = shared.backend.kind();
    let span = tracing::debug_span!("dlock.renew", backend, holds = items.len());
    let res = tokio::time::timeout(timeout, shared.backend.renew(items))
        .instrument(span)
        .await;
    match res {
        Ok(Ok(outcomes)) if outcomes.len() == batch.len() => {
            let mut renewed = 0;
            let mut unconfirmed = Vec::new();
            for (hold, out) in batch.into_iter().zip(outcomes) {
                match out {
                    RenewOutcome::Renewed => {
                        renewed += 1;
                        hold.update(|st| st.confirmed(started, lease));
                    }
                    RenewOutcome::NotHeld => shared.mark_lost(&hold, LostReason::NotHeld),
                    RenewOutcome::Unconfirmed => unconfirmed.push(hold),
                }
            }
            metrics::counter!("dlock_renewals_total", "backend" => backend).increment(renewed);
            if !unconfirmed.is_empty() {
                metrics::counter!("dlock_renewal_failures_total", "backend" => backend)
                    .increment(1);
            }
            unconfirmed
        }
        Ok(Ok(outcomes)) => {
            tracing::error!(
                expected = batch.len(),
                got = outcomes.len(),
                "backend renewed a batch of the wrong size"
            );
            metrics::counter!("dlock_renewal_failures_total", "backend" => backend).increment(1);
            batch
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, holds = batch.len(), "renewal failed; retrying soon, the lock is lost if its lease runs out first");
            metrics::counter!("dlock_renewal_failures_total", "backend" => backend).increment(1);
            batch
        }
        Err(_) => {
            tracing::warn!(
                ?timeout,
                holds = batch.len(),
                "renewal timed out; retrying soon"
            );
            metrics::counter!("dlock_renewal_failures_total", "backend" => backend).increment(1);
            batch
        }
    }
}

/// Fires the lost signal of every hold whose lease has run out without confirmation.
fn expire_overdue(shared: &Shared) {
    let now = Instant::now();
    let overdue: Vec<Arc<Hold>> = shared
        .holds()
        .values()
        .filter(|h| h.expires_at() <= now)
        .cloned()
        .collect();
    for h in overdue {
        shared.mark_lost(&h, LostReason::LeaseExpired);
    }
}
