//! The nodes and what this client knows about each: its connection, its process (run id), its
//! epoch (the marker that the node is *initialised*: its data has not been lost since its
//! restart quarantine was set), and the quarantine the epoch carries: stored **on the node**,
//! by its clock, so that every client honours it (this client keeps an estimate for its views
//! and messages). A background task per node checks it every `check_interval`, and at once
//! when an operation saw something suspicious on it. Why each rule is there: `docs/redlock.md`,
//! "Node health".

use crate::config::Config;
use crate::tally::quorum;
use distlock_core::{ClientOptions, Error, Result};
use distlock_redis::{RedisNode, ServerInfo};
use futures_util::future::join_all;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Shortest pause between two checks of one node, so errors do not turn into a check storm.
const MIN_CHECK_GAP: Duration = Duration::from_millis(25);

/// One node: `host:port` for messages, the URL its `RedisNode` connects with, and what this
/// client knows about it.
#[derive(Default)]
pub(crate) struct Node {
    pub(crate) endpoint: String,
    pub(crate) url: String,
    state: Mutex<NodeState>,
    check_now: Notify,
    /// One initialisation of this node at a time (per client).
    init: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct NodeState {
    backend: Option<Arc<RedisNode>>,
    /// Run id of the process seen by the last good check.
    run_id: Option<String>,
    /// The node epoch this client trusts (valid for `run_id`); `None`: the node is new or lost
    /// its data and is not initialised again yet (no quarantine set): its votes do not count.
    epoch: Option<String>,
    /// When the node's quarantine ends, as estimated from its epoch and its clock (the node
    /// decides: its votes say how much is left by its own clock).
    quarantine_until: Option<Instant>,
    /// The last check reached the node.
    reachable: bool,
    /// Why the node is suspect since the last good check (an error, an epoch mismatch...).
    suspect: Option<String>,
    /// Bumped by every suspicion, so a check that began before it does not clear it.
    suspect_gen: u64,
    last_error: Option<String>,
}

/// A node as one operation sees it.
#[derive(Clone)]
pub(crate) struct View {
    pub(crate) backend: Option<Arc<RedisNode>>,
    pub(crate) epoch: Option<String>,
    /// The node's answers count toward a majority.
    pub(crate) counts: bool,
    /// Why not, for messages.
    pub(crate) why_not: Option<String>,
}

/// What a caller can learn about a node (for tests, tools and messages).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeStatus {
    /// `host:port`.
    pub endpoint: String,
    /// The node's answers count toward a majority right now.
    pub counts: bool,
    /// Run id of the node's process, once seen.
    pub run_id: Option<String>,
    /// Time left in restart quarantine.
    pub quarantined_for: Option<Duration>,
    /// Why the node does not count, if it does not.
    pub problem: Option<String>,
}

/// How much of the quarantine `epoch` (`RANDOM:UNTIL_MS:RUN_ID`) carries is left at the node's
/// time `node_now_ms` (an epoch of the older `RANDOM:RUN_ID` form carries none).
pub(crate) fn quarantine_left(epoch: &str, node_now_ms: u64) -> Option<Duration> {
    let until: u64 = match epoch.split(':').collect::<Vec<_>>()[..] {
        [_, until, _] => until.parse().unwrap_or(0),
        _ => 0,
    };
    Some(Duration::from_millis(until.saturating_sub(node_now_ms))).filter(|d| !d.is_zero())
}

impl Node {
    fn state(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn backend(&self) -> Option<Arc<RedisNode>> {
        self.state().backend.clone()
    }

    pub(crate) fn set_error(&self, e: String) {
        let mut st = self.state();
        st.reachable = false;
        st.last_error = Some(e);
    }

    /// Something an operation saw makes the node suspect (an error, an epoch mismatch, scripts
    /// it had forgotten): it stops counting until a check confirms its process and epoch.
    pub(crate) fn suspect(&self, why: impl Into<String>) {
        let mut st = self.state();
        st.suspect_gen += 1;
        if st.suspect.replace(why.into()).is_none() {
            self.check_now.notify_one();
        }
    }

    /// A vote said the node's quarantine still runs `left` by its own clock.
    pub(crate) fn note_quarantine(&self, left: Duration) {
        let until = Instant::now() + left;
        let mut st = self.state();
        if st.quarantine_until.is_none_or(|u| u < until) {
            st.quarantine_until = Some(until);
        }
    }

    pub(crate) fn view(&self, now: Instant) -> View {
        let st = self.state();
        let backend = st.backend.clone();
        let last = st.last_error.as_deref();
        let why_not = if backend.is_none() {
            Some(format!("not connected ({})", last.unwrap_or("connecting")))
        } else if !st.reachable {
            let why = last.unwrap_or("not checked yet");
            Some(format!("unreachable ({why})"))
        } else if let Some(why) = &st.suspect {
            Some(format!("re-checking the node after {why}"))
        } else if st.epoch.is_none() {
            let why = last.unwrap_or("new, or it lost its data");
            Some(format!("not initialised yet ({why})"))
        } else {
            st.quarantine_until.filter(|u| *u > now).map(|u| {
                format!(
                    "in restart quarantine for {:?} more (it lost its data; set on the node by \
                     whoever initialised it, by the node's clock)",
                    u - now,
                )
            })
        };
        View {
            backend,
            epoch: st.epoch.clone(),
            counts: why_not.is_none(),
            why_not,
        }
    }

    pub(crate) fn status(&self, now: Instant) -> NodeStatus {
        let v = self.view(now);
        let st = self.state();
        NodeStatus {
            endpoint: self.endpoint.clone(),
            counts: v.counts,
            run_id: st.run_id.clone(),
            quarantined_for: st
                .quarantine_until
                .and_then(|u| u.checked_duration_since(now))
                .filter(|d| !d.is_zero()),
            problem: v.why_not,
        }
    }
}

/// The nodes and the health logic.
pub(crate) struct Health {
    pub(crate) nodes: Vec<Node>,
    pub(crate) cfg: Config,
    pub(crate) opts: ClientOptions,
    /// Longest lease seen in a request, in ms (lengthens the default quarantine).
    pub(crate) max_lease_ms: AtomicU64,
}

pub(crate) fn epoch_valid(epoch: &str, run_id: &str) -> bool {
    epoch
        .rsplit_once(':')
        .is_some_and(|(_, r)| r == run_id && !r.is_empty())
}

impl Health {
    pub(crate) fn q(&self) -> usize {
        quorum(self.nodes.len())
    }

    /// How long a restarted node stays out: the quarantine from the URL, or else the longest
    /// lease in use; plus the clock-drift allowance.
    pub(crate) fn quarantine_len(&self) -> Duration {
        let q = self.cfg.quarantine.unwrap_or_else(|| {
            let seen = Duration::from_millis(self.max_lease_ms.load(Relaxed));
            self.opts.get_watchdog_lease().max(seen)
        });
        q + distlock_core::drift(q)
    }

    pub(crate) fn note_lease(&self, lease: Duration) {
        let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self.max_lease_ms.fetch_max(ms, Relaxed);
    }

    pub(crate) fn views(&self) -> Vec<View> {
        let now = Instant::now();
        self.nodes.iter().map(|n| n.view(now)).collect()
    }

    pub(crate) async fn connect_node(&self, i: usize) -> Result<Arc<RedisNode>> {
        let node = &self.nodes[i];
        let t = self.opts.get_connect_timeout();
        let b = tokio::time::timeout(t, RedisNode::connect(&node.url, &self.opts))
            .await
            .map_err(|_| {
                Error::connection(
                    crate::KIND,
                    node.endpoint.clone(),
                    format!("no connection within {t:?}"),
                )
            })??;
        let b = Arc::new(b);
        // Best effort: they load on demand too.
        let _ = tokio::time::timeout(t, b.load_scripts()).await;
        node.state().backend = Some(b.clone());
        Ok(b)
    }

    /// Checks node `i`: its process (a restart means it must be initialised again: it may have
    /// lost recent writes), its epoch (missing or stale: the same) and the quarantine the epoch
    /// carries, then initialises it if `init` is set.
    pub(crate) async fn check(&self, i: usize, init: bool) {
        let node = &self.nodes[i];
        let gen = node.state().suspect_gen;
        let backend = match node.backend() {
            Some(b) => b,
            None => match self.connect_node(i).await {
                Ok(b) => b,
                Err(e) => return node.set_error(e.to_string()),
            },
        };
        let t = self.opts.get_op_timeout();
        let (info, epoch) = match within(t, backend.node_epoch()).await {
            Ok(v) => v,
            Err(e) => return node.set_error(e),
        };
        let now = Instant::now();
        let valid = epoch.clone().filter(|e| epoch_valid(e, &info.run_id));
        let stale = epoch.filter(|_| valid.is_none());
        let needs_init = {
            let mut st = node.state();
            if st.run_id.as_ref().is_some_and(|old| *old != info.run_id) {
                tracing::warn!(node = %node.endpoint, "redlock node restarted; not counted until initialised again and out of quarantine");
                st.epoch = None;
            }
            st.run_id = Some(info.run_id.clone());
            match (&st.epoch, &valid) {
                (Some(known), Some(v)) if known != v => {
                    tracing::warn!(node = %node.endpoint, "redlock node lost its data and was initialised again");
                }
                (Some(_), None) => {
                    tracing::warn!(node = %node.endpoint, "redlock node lost its data; not counted until initialised again and out of quarantine");
                }
                _ => {}
            }
            st.epoch = valid;
            // The node's own record decides (whoever initialised it set it, by its clock).
            let left = st
                .epoch
                .as_deref()
                .and_then(|e| quarantine_left(e, info.now_ms));
            st.quarantine_until = left.map(|left| now + left);
            st.reachable = true;
            if st.epoch.is_some() {
                st.last_error = None;
            }
            if st.suspect_gen == gen {
                st.suspect = None;
            }
            st.epoch.is_none()
        };
        if let Some(s) = stale {
            // Made for an earlier process of this node: its holds may be older than what that
            // process confirmed. Remove it so every client stops counting the node.
            let _ = tokio::time::timeout(t, backend.drop_epoch(&s)).await;
        }
        if needs_init && init {
            self.init_node(i, &info).await;
        }
    }

    /// A fresh look at every node: its connection, process, and whether it is initialised (a
    /// valid epoch). `None` for nodes that cannot be reached now.
    async fn look(&self) -> Vec<Option<(Arc<RedisNode>, ServerInfo, bool)>> {
        let t = self.opts.get_op_timeout();
        join_all(self.nodes.iter().map(|n| async move {
            let b = n.backend()?;
            let (info, e) = tokio::time::timeout(t, b.node_epoch()).await.ok()?.ok()?;
            let ok = e.is_some_and(|e| epoch_valid(&e, &info.run_id));
            Some((b, info, ok))
        }))
        .await
    }

    /// At connect, once every node was checked: a new cluster (no node is initialised and
    /// fewer than a majority could be) is initialised as a whole, so none of its nodes waits
    /// in quarantine for nothing; the others one by one ([`Health::init_node`]). A node of a
    /// new cluster is quarantined until its process is the quarantine old: if the whole
    /// cluster just restarted without its data, leases granted before may run that long
    /// (Redlock's delayed restart).
    pub(crate) async fn initialize(&self) {
        join_all((0..self.nodes.len()).map(|i| self.check(i, false))).await;
        let looks = self.look().await;
        let initialised = looks.iter().flatten().filter(|l| l.2).count();
        let unreachable = looks.iter().filter(|l| l.is_none()).count();
        if initialised == 0 && unreachable < self.q() {
            join_all(looks.iter().enumerate().filter_map(|(i, l)| {
                let (b, info, ok) = l.as_ref()?;
                (!ok).then(|| self.adopt_new_epoch(i, b, info, self.fresh_quarantine(info)))
            }))
            .await;
        }
        join_all(looks.iter().enumerate().filter_map(|(i, l)| {
            let (_, info, _) = l.as_ref()?;
            self.nodes[i]
                .state()
                .epoch
                .is_none()
                .then(|| self.init_node(i, info))
        }))
        .await;
    }

    /// Initialises node `i` (reachable, without a valid epoch): creates its epoch with a
    /// quarantine that outlasts every lease it may have voted for before it lost its data — the
    /// longest lease horizon of a majority of other initialised nodes (every such lease was
    /// confirmed by a majority, which meets them) — or, if fewer than a majority of nodes can
    /// be initialised (a new cluster), one until its process is the quarantine old. Its fencing
    /// counters are not copied: a vote's token is never below the node's clock, which the
    /// quarantine lets pass every token issued before (docs/redlock.md, "Fencing tokens strictly
    /// increase").
    pub(crate) async fn init_node(&self, i: usize, info: &ServerInfo) {
        let node = &self.nodes[i];
        let _one = node.init.lock().await;
        if node.state().epoch.is_some() {
            return;
        }
        let looks = self.look().await;
        let Some((me, _, done)) = looks[i].clone() else {
            return;
        };
        if done {
            // Someone else just did it; the next check adopts it.
            node.check_now.notify_one();
            return;
        }
        let sources: Vec<Arc<RedisNode>> = looks
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, l)| l.as_ref().filter(|l| l.2).map(|l| l.0.clone()))
            .collect();
        let unreachable = looks.iter().filter(|l| l.is_none()).count();
        let need = match horizons_needed(sources.len(), unreachable, self.q()) {
            Ok(need) => need,
            Err(why) => return node.state().last_error = Some(why),
        };
        let quarantine = match need {
            0 => self.fresh_quarantine(info),
            // Locks it had may still be held elsewhere for as long as the longest lease in use:
            // this client's, or a longer one the sources saw (their horizon), plus the drift.
            _ => match self.horizon(&sources, need).await {
                Ok(h) => self.quarantine_len().max(h),
                Err(why) => return node.state().last_error = Some(why),
            },
        };
        if need >= self.q() {
            tracing::info!(node = %node.endpoint, ?quarantine, "redlock node initialised from a majority's lease horizons; quarantined");
        }
        self.adopt_new_epoch(i, &me, info, quarantine).await;
    }

    /// The quarantine of a node of a new cluster: until its process is the quarantine old.
    fn fresh_quarantine(&self, info: &ServerInfo) -> Duration {
        self.quarantine_len().saturating_sub(info.uptime)
    }

    /// Creates node `i`'s epoch (if its process is still `info.run_id`), carrying a quarantine
    /// of `quarantine` from now by the node's clock, and trusts it. If another client created
    /// one first, that one (and its quarantine) is adopted.
    async fn adopt_new_epoch(
        &self,
        i: usize,
        me: &RedisNode,
        info: &ServerInfo,
        quarantine: Duration,
    ) {
        let node = &self.nodes[i];
        let t = self.opts.get_op_timeout();
        // The random part (the node adds the quarantine's end and the run id it vouches for).
        let random = format!("{:016x}", fastrand::u64(..));
        let create = me.create_epoch(&random, &info.run_id, quarantine);
        let (epoch, node_now) = match within(t, create).await {
            Ok(Ok((e, node_now))) if epoch_valid(&e, &info.run_id) => (e, node_now),
            Ok(_) => {
                // The process changed under us: the next check starts over.
                node.check_now.notify_one();
                return;
            }
            Err(e) => return node.set_error(e),
        };
        let mut st = node.state();
        if st.run_id.as_deref() == Some(info.run_id.as_str()) {
            // From the node's clock at the creation: if anything, the estimate ends late.
            st.quarantine_until =
                quarantine_left(&epoch, node_now).map(|left| Instant::now() + left);
            st.epoch = Some(epoch);
            st.last_error = None;
        }
    }

    /// The longest lease horizon of `sources` (how long a lease granted through them may still
    /// run, 0 if none may) plus the drift; at least `need` of them must answer.
    async fn horizon(
        &self,
        sources: &[Arc<RedisNode>],
        need: usize,
    ) -> std::result::Result<Duration, String> {
        let t = self.opts.get_op_timeout();
        let reads = join_all(sources.iter().map(|s| within(t, s.lease_horizon()))).await;
        let ok = reads.iter().filter(|r| r.is_ok()).count();
        if ok < need {
            let last_err = reads.into_iter().filter_map(Result::err).next_back();
            let why = last_err.map(|e| format!(": {e}")).unwrap_or_default();
            return Err(format!(
                "initialising failed: only {ok} nodes told their lease horizon, {need} needed{why}"
            ));
        }
        let h = reads.into_iter().flatten().max().flatten();
        Ok(h.map_or(Duration::ZERO, |h| h + distlock_core::drift(h)))
    }
}

/// `fut` bounded by `t`: its error, or the timeout, as text.
async fn within<T>(
    t: Duration,
    fut: impl std::future::Future<Output = Result<T>>,
) -> std::result::Result<T, String> {
    match tokio::time::timeout(t, fut).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {t:?}")),
    }
}

/// How many of the `sources` (the other nodes with a valid epoch; `unreachable` nodes could
/// not be asked, majority `q`) must tell their lease horizon to initialise a node: a majority,
/// when a majority of other nodes is initialised; all of them when fewer than a majority of
/// nodes can be initialised — no grant was ever confirmed by a majority (a new cluster, or one
/// whose start was interrupted), or a majority lost its data, which no scheme survives for
/// locks held at that moment — and 0 (none: the node is quarantined until its process is old
/// enough) when there are none. Else not now (the reason).
fn horizons_needed(
    sources: usize,
    unreachable: usize,
    q: usize,
) -> std::result::Result<usize, String> {
    if sources >= q {
        Ok(q)
    } else if sources + unreachable < q {
        Ok(sources)
    } else {
        Err(format!(
            "{sources} of the other nodes are initialised, {q} needed to initialise this one; {unreachable} unreachable"
        ))
    }
}

/// The per-node check loop; ends when `stop` fires (when the backend is dropped).
pub(crate) async fn node_task(h: Arc<Health>, i: usize, stop: CancellationToken) {
    let rest = h.cfg.check_interval.saturating_sub(MIN_CHECK_GAP);
    stop.run_until_cancelled(async {
        loop {
            h.check(i, true).await;
            tokio::time::sleep(MIN_CHECK_GAP).await;
            let _ = tokio::time::timeout(rest, h.nodes[i].check_now.notified()).await;
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizons_needed_to_initialise() {
        // A majority of the others initialised: a majority of their horizons.
        assert_eq!(horizons_needed(3, 0, 3), Ok(3));
        assert_eq!(horizons_needed(4, 0, 3), Ok(3));
        // Fewer than a majority can be initialised: all the initialised ones, or none.
        assert_eq!(horizons_needed(1, 1, 3), Ok(1));
        assert_eq!(horizons_needed(0, 0, 3), Ok(0));
        // A majority may be initialised among the unreachable: not now.
        assert!(horizons_needed(1, 2, 3)
            .unwrap_err()
            .contains("1 of the other nodes"));
    }
}
