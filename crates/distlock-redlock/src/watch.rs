//! Waiting: one release subscription per node (the lock's channel, the attempt's own, or an
//! election's observe channel), merged.

use distlock_core::backend::{async_trait, ReleaseWatch, Wake};
use distlock_core::Result;
use futures_util::future::select_all;
use std::time::Duration;

/// The subscriptions of one lock or election on every node that could be subscribed.
///
/// A release watch (`need` from [`crate::tally::wake_threshold`], `keep` all): a holder
/// releases on all its nodes (a majority at least), each publishing once, so the watch wakes
/// when enough distinct nodes have published for that to be one full release — not once per
/// node, which would send every waiter back `n` times per release. Fewer messages than that (a
/// node that missed the release) leave the waiter to its fallback sleep (the holder's lease, or
/// the waiter's heartbeat), never stuck. A broken subscription may have missed a release: the
/// watch ends, the waiter tries again and subscribes anew.
///
/// An election's observe watch (`need` 1, `keep` a majority): every change of the election that
/// counts is written on a majority of nodes, each publishing, and any majority shares a node
/// with the subscribed majority: so a message from any node wakes the observer (it reads the
/// leader again), and the watch goes on while a majority of subscriptions works. Once fewer
/// work, a change could be missed: the watch ends with the last error, and the core subscribes
/// again.
pub(crate) struct QuorumWatch {
    /// `None` once broken.
    watches: Vec<Option<Box<dyn ReleaseWatch>>>,
    /// Nodes that published since the last wake-up.
    pending: Vec<bool>,
    need: usize,
    /// Fewest working subscriptions the watch goes on with.
    keep: usize,
    /// Longest random pause before reporting the next release (see [`QuorumWatch::changed`]):
    /// starts at [`FIRST_SPREAD`] and doubles with every release this waiter was woken for
    /// (and so lost), up to `max_spread`.
    spread: Duration,
    max_spread: Duration,
}

/// The random pause before the first wake-up of a wait: short, since a lone waiter pays it.
pub(crate) const FIRST_SPREAD: Duration = Duration::from_millis(2);

impl QuorumWatch {
    pub(crate) fn new(
        watches: Vec<Box<dyn ReleaseWatch>>,
        need: usize,
        keep: usize,
        max_spread: Duration,
    ) -> Self {
        QuorumWatch {
            spread: FIRST_SPREAD.min(max_spread),
            max_spread,
            need,
            keep,
            pending: vec![false; watches.len()],
            watches: watches.into_iter().map(Some).collect(),
        }
    }
}

#[async_trait]
impl ReleaseWatch for QuorumWatch {
    /// # Cancel safety
    /// Cancel safe: messages seen so far stay in `self` until a wake-up is returned.
    async fn changed(&mut self) -> Result<Wake> {
        loop {
            if self.pending.iter().filter(|p| **p).count() >= self.need {
                // Every waiter of the lock got the same messages at the same moment; if all
                // tried at once they would split the nodes between them and all fail. A random
                // pause lets the first one take a clean majority while the others, trying
                // later, find it held and wait for the next release. A waiter woken again
                // lost the last round: there is contention, so it spreads wider.
                // A queued waiter is woken alone (by the nodes where it is first): no pause.
                if !self.spread.is_zero() {
                    let max = u64::try_from(self.spread.as_micros()).unwrap_or(u64::MAX);
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(0..=max))).await;
                }
                // Only now: dropped during the pause, the wake-up is still owed.
                self.pending.iter_mut().for_each(|p| *p = false);
                self.spread = (self.spread * 2).min(self.max_spread);
                return Ok(Wake::Released);
            }
            let pending = &self.pending;
            let waiting: Vec<_> = (self.watches.iter_mut().enumerate())
                .filter(|(i, _)| !pending[*i])
                .filter_map(|(i, w)| w.as_mut().map(|w| (i, w)))
                .map(|(i, w)| Box::pin(async move { (i, w.changed().await) }))
                .collect();
            if waiting.is_empty() {
                // Cannot happen (need <= keep <= the working watches); wake rather than spin.
                self.pending.iter_mut().for_each(|p| *p = false);
                return Ok(Wake::Released);
            }
            let (i, r) = select_all(waiting).await.0;
            match r {
                // A handoff cannot happen (a node never grants to a waiter by itself):
                // anything is a release as far as the quorum is concerned.
                Ok(_) => self.pending[i] = true,
                Err(e) => {
                    tracing::debug!(error = %e, "a node's subscription broke");
                    self.watches[i] = None;
                    if self.watches.iter().flatten().count() < self.keep {
                        return Err(e);
                    }
                }
            }
        }
    }
}
