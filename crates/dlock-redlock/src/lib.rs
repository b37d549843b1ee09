//! Redlock backend for dlock: one lock over N independent Redis masters.
//!
//! URL: `redlock://[user:password@]host1:port1,host2:port2,host3:port3[/db][?namespace=NS&node_timeout=DUR&quarantine=DUR&check_interval=DUR]`
//! (at least 3 nodes; an odd number such as 3 or 5 is best; the credentials apply to every
//! node). `redlocks://` reaches the nodes with TLS (`rediss://`, dlock-redis's `tls` feature).
//!
//! - `node_timeout` (default 50 ms, at most a tenth of the watchdog lease by default): how long
//!   one node may take to answer one request. A node that does not answer in time does not
//!   count; it never delays a grant by more than this.
//! - `quarantine` (default: the longest lease in use — the watchdog lease, or a longer fixed
//!   lease this client has asked for): how long a node that restarted or lost its data stays
//!   out of every majority. Set it to your longest lease if other processes use longer ones.
//! - `check_interval` (default 500 ms): how often each node's process and data are checked.
//!
//! Each node is a [`dlock_redis::RedisBackend`] (its own connection, scripts and subscriber).
//! A lock is granted when a majority of nodes granted it within the node timeout and the
//! grant's validity (`lease − time spent − drift`, drift = lease/100 + 2 ms) is positive — the
//! same rule by which the core measures its local lease from the attempt's send time. The
//! fencing token is chosen from a majority's counters and raised on a majority before it is
//! handed out, so tokens keep strictly increasing even when nodes restart without their data.
//! Only the reentrant mutex is supported (read-write locks, fair locks and semaphores return
//! [`Error::Unsupported`]). The design and the safety argument are in `docs/redlock.md`.
//!
//! ```no_run
//! # async fn f() -> dlock_core::Result<()> {
//! use std::sync::Arc;
//! let opts = dlock_core::ClientOptions::default();
//! let backend = dlock_redlock::RedlockBackend::connect(
//!     "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379", &opts).await?;
//! let client = dlock_core::Client::new(Arc::new(backend), opts)?;
//! let guard = client.lock("orders:42")?.acquire().await?;
//! println!("token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod config;
mod node;
mod tally;
mod watch;

pub use config::{redact, DEFAULT_CHECK_INTERVAL, DEFAULT_NODE_TIMEOUT, MIN_NODES};
pub use node::NodeStatus;

use crate::node::{Health, View};
use crate::tally::{Ballot, Decision};
use dlock_core::{
    async_trait, AcquireReply, AcquireRequest, Backend, ClientOptions, Error, Granted, HoldKey,
    HolderInfo, LockInfo, LockKind, ReleaseOutcome, ReleaseWatch, RenewOutcome, Result,
};
use dlock_redis::{QuorumReply, QuorumVote, RedisBackend};
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

pub(crate) const KIND: &str = "redlock";

/// The Redlock backend. Build it with [`RedlockBackend::connect`] (or through
/// `dlock::connect("redlock://…")`).
pub struct RedlockBackend {
    shared: Arc<Shared>,
}

/// State shared by the backend and its helpers.
struct Shared {
    health: Arc<Health>,
    endpoint: String,
    /// Token this client handed out for each live hold, by (name, owner): what a re-entry
    /// returns.
    tokens: Mutex<HashMap<TokenKey, u64>>,
    /// Stops the node checks when the backend goes away.
    _stop: DropGuard,
}

fn check_kind(kind: LockKind) -> Result<()> {
    match kind {
        LockKind::Mutex => Ok(()),
        other => Err(Error::unsupported(
            KIND,
            format!("lock kind {}", other.as_str()),
        )),
    }
}

type TokenKey = (Arc<str>, Arc<str>);

/// One node's answer in a fan-out: `(node, None)` for a timeout, `(node, Some(result))`.
type Answer<T> = Pin<Box<dyn Future<Output = (usize, Option<Result<T>>)> + Send>>;
type Answers<T> = FuturesUnordered<Answer<T>>;

/// Lets the requests still running finish in a task of their own.
fn finish_in_background<T: Send + 'static>(mut rest: Answers<T>) {
    if !rest.is_empty() {
        tokio::spawn(async move { while rest.next().await.is_some() {} });
    }
}

fn token_key(key: &HoldKey) -> TokenKey {
    (key.name.clone(), key.owner.clone())
}

impl RedlockBackend {
    /// Connects to every node of `url` in parallel, checks them, and starts a background check
    /// per node. Fails if fewer than a majority of nodes can be reached, or if any node refuses
    /// the credentials.
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        opts.validate()?;
        let cfg = config::parse(url, opts)?;
        let t = opts.get_connect_timeout();
        let conns = join_all(cfg.nodes.iter().map(|n| async move {
            tokio::time::timeout(t, RedisBackend::connect(&n.url, opts)).await
        }))
        .await;
        let mut nodes = Vec::new();
        let mut problems = Vec::new();
        for (addr, c) in cfg.nodes.iter().zip(conns) {
            let problem = match c {
                Ok(Ok(b)) => {
                    nodes.push(node::Node::new(addr, Some(Arc::new(b))));
                    continue;
                }
                Ok(Err(e @ (Error::Auth { .. } | Error::InvalidUrl { .. }))) => return Err(e),
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no connection within {t:?}"),
            };
            let n = node::Node::new(addr, None);
            n.set_error(problem.clone());
            problems.push(format!("{}: {problem}", addr.endpoint));
            nodes.push(n);
        }
        let n = nodes.len();
        let q = tally::quorum(n);
        let endpoint = cfg
            .nodes
            .iter()
            .map(|a| a.endpoint.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let connected = nodes.iter().filter(|x| x.backend().is_some()).count();
        if connected < q {
            return Err(Error::Connection {
                backend: KIND,
                endpoint,
                source: format!(
                    "only {connected} of {n} redlock nodes could be reached (need {q}): {}",
                    problems.join("; ")
                )
                .into(),
            });
        }
        join_all(
            nodes
                .iter()
                .filter_map(|x| x.backend())
                .map(|b| async move {
                    let _ = tokio::time::timeout(t, b.load_quorum_scripts()).await;
                }),
        )
        .await;
        let health = Arc::new(Health {
            nodes,
            cfg,
            opts: opts.clone(),
            max_lease_ms: Default::default(),
        });
        health.initialize().await;
        let stop = CancellationToken::new();
        for i in 0..n {
            tokio::spawn(node::node_task(health.clone(), i, stop.clone()));
        }
        Ok(RedlockBackend {
            shared: Arc::new(Shared {
                health,
                endpoint,
                tokens: Mutex::default(),
                _stop: stop.drop_guard(),
            }),
        })
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.shared.health.nodes.len()
    }

    /// Nodes needed for a majority.
    pub fn quorum(&self) -> usize {
        self.shared.health.q()
    }

    /// What this client knows about each node right now.
    pub fn node_status(&self) -> Vec<NodeStatus> {
        let now = Instant::now();
        self.shared
            .health
            .nodes
            .iter()
            .map(|n| n.status(now))
            .collect()
    }

    /// The per-node timeout in use.
    pub fn node_timeout(&self) -> Duration {
        self.shared.health.cfg.node_timeout
    }

    /// How long a restarted node stays out of majorities right now.
    pub fn quarantine(&self) -> Duration {
        self.shared.health.quarantine_len()
    }
}

impl Shared {
    fn n(&self) -> usize {
        self.health.nodes.len()
    }

    fn q(&self) -> usize {
        self.health.q()
    }

    fn nt(&self) -> Duration {
        self.health.cfg.node_timeout
    }

    fn tokens(&self) -> MutexGuard<'_, HashMap<TokenKey, u64>> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn forget(&self, key: &HoldKey) {
        self.tokens().remove(&token_key(key));
    }

    /// The random pause before the next attempt after a split vote (0 to the node timeout), so
    /// that clients that split the nodes do not collide again.
    fn jitter(&self) -> Duration {
        let max = u64::try_from(self.nt().as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(fastrand::u64(0..=max))
    }

    fn no_quorum(&self, answered: usize, problems: &[String]) -> Error {
        Error::Connection {
            backend: KIND,
            endpoint: self.endpoint.clone(),
            source: format!(
                "only {answered} of {} redlock nodes answered (need {}): {}",
                self.n(),
                self.q(),
                if problems.is_empty() {
                    "no details".to_owned()
                } else {
                    problems.join("; ")
                }
            )
            .into(),
        }
    }

    /// Node `i`'s vote from its answer (`None`: none within the node timeout); also a problem
    /// to report and a non-retryable error, if any.
    fn vote(
        &self,
        i: usize,
        view: &View,
        answer: Option<Result<QuorumVote>>,
    ) -> (Ballot, Option<String>, Option<Error>) {
        let node = &self.health.nodes[i];
        let ep = &node.endpoint;
        let nt = self.nt();
        match answer {
            None => (
                Ballot {
                    maybe_granted: true,
                    ..Ballot::default()
                },
                Some(format!("{ep}: no answer within {nt:?}")),
                None,
            ),
            Some(Err(e)) if e.is_retryable() => {
                node.suspect(format!("an error ({e})"));
                (
                    Ballot {
                        maybe_granted: true,
                        ..Ballot::default()
                    },
                    Some(format!("{ep}: {e}")),
                    None,
                )
            }
            Some(Err(e)) => (Ballot::default(), Some(format!("{ep}: {e}")), Some(e)),
            Some(Ok(v)) => match v.reply {
                QuorumReply::EpochMismatch => {
                    node.suspect("an epoch change (lost data or re-seeded)");
                    (
                        Ballot::default(),
                        Some(format!(
                            "{ep}: lost its data or was re-seeded since the last check; re-checking"
                        )),
                        None,
                    )
                }
                reply => {
                    if v.scripts_reloaded {
                        node.suspect("it had forgotten its scripts (restarted?)");
                    }
                    let counted = view.counts && !v.scripts_reloaded;
                    let problem = (!counted).then(|| {
                        format!(
                            "{ep}: {}",
                            view.why_not
                                .as_deref()
                                .unwrap_or("had forgotten its scripts (restarted?); re-checking")
                        )
                    });
                    (
                        Ballot {
                            reply: Some(reply),
                            counted,
                            maybe_granted: false,
                        },
                        problem,
                        None,
                    )
                }
            },
        }
    }

    /// Raises the counter to `token` on the listed nodes (with the hold count to set), in
    /// parallel. Per node: `Some(true)` confirmed, `Some(false)` not, `None` not asked.
    async fn raise(
        &self,
        views: &[View],
        key: &HoldKey,
        token: u64,
        list: &[(usize, u32)],
    ) -> Vec<Option<bool>> {
        let nt = self.nt();
        let done = join_all(list.iter().map(|&(i, count)| {
            let b = views[i].backend.clone();
            async move {
                let Some(b) = b else { return (i, false) };
                let ok = match tokio::time::timeout(nt, b.raise_fence(key, token, count)).await {
                    Ok(Ok(Some(c))) => c >= token,
                    Ok(Err(e)) if e.is_retryable() => {
                        self.health.nodes[i].suspect(format!("an error ({e})"));
                        false
                    }
                    _ => false,
                };
                (i, ok)
            }
        }))
        .await;
        let mut out = vec![None; views.len()];
        for (i, ok) in done {
            out[i] = Some(ok);
        }
        out
    }

    /// Takes back, quietly and in parallel, what a failed attempt may have been granted.
    /// Nodes that did not answer are included only if this client has no hold of the owner
    /// (otherwise the abort could take a hold of the live lock instead of the attempt's).
    async fn abort(&self, views: &[View], key: &HoldKey, ballots: &[Ballot]) {
        let unknown_too = !self.tokens().contains_key(&token_key(key));
        let nt = self.nt();
        join_all(
            ballots
                .iter()
                .enumerate()
                .filter(|(_, b)| b.granted() || (unknown_too && b.maybe_granted))
                .filter_map(|(i, _)| views[i].backend.clone())
                .map(|b| async move {
                    let _ = tokio::time::timeout(nt, b.quorum_abort(key)).await;
                }),
        )
        .await;
    }

    /// Runs `op` on every connected node, each bounded by `t`, polled by the caller as they
    /// finish: `(node, None)` for a timeout, `(node, Some(result))` otherwise. A caller that has
    /// its majority hands the rest to [`finish_in_background`], so a slow node's request still
    /// completes (in order on its connection) without keeping the caller waiting.
    fn fan_out<T, F, Fut>(&self, views: &[View], t: Duration, op: F) -> Answers<T>
    where
        T: Send + 'static,
        F: Fn(Arc<RedisBackend>) -> Fut,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        views
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let fut = op(v.backend.clone()?);
                Some(
                    Box::pin(async move { (i, tokio::time::timeout(t, fut).await.ok()) })
                        as Answer<T>,
                )
            })
            .collect()
    }

    /// Per-node bound of releases and renewals: they need not fit the node timeout (a grant's
    /// validity does not depend on them: the core measures a renewal from its send time), and
    /// they return as soon as a majority decided.
    fn call_timeout(&self) -> Duration {
        self.health.opts.get_op_timeout().max(self.nt())
    }

    fn watch_timeout(&self) -> Duration {
        (self.nt() * 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }
}

#[async_trait]
impl Backend for Shared {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        check_kind(req.key.kind)?;
        self.health.note_lease(req.lease);
        let key = &req.key;
        let start = Instant::now();
        let views = self.health.views();
        // A vote not in yet may still run on its node: counted as unknown (given back on
        // failure).
        let mut ballots = vec![
            Ballot {
                maybe_granted: true,
                ..Ballot::default()
            };
            views.len()
        ];
        let mut problems = Vec::new();
        let mut hard = None;
        let nt = self.nt();
        let mut votes: Answers<QuorumVote> = FuturesUnordered::new();
        for (i, v) in views.iter().enumerate() {
            let (Some(b), Some(epoch)) = (v.backend.clone(), v.epoch.clone()) else {
                let why = v.why_not.clone().unwrap_or_default();
                ballots[i] = Ballot::default();
                problems.push(format!("{}: {why}", self.health.nodes[i].endpoint));
                continue;
            };
            let (key, lease) = (key.clone(), req.lease);
            votes.push(Box::pin(async move {
                let vote = async move { b.quorum_acquire(&key, lease, &epoch).await };
                (i, tokio::time::timeout(nt, vote).await.ok())
            }));
        }
        while let Some((i, answer)) = votes.next().await {
            let (b, p, e) = self.vote(i, &views[i], answer);
            ballots[i] = b;
            problems.extend(p);
            if hard.is_none() {
                hard = e;
            }
            if tally::settled(&ballots) {
                // The rest cannot change the outcome. Their requests went into their
                // connections' queues at the first poll; they finish in the background (a
                // request whose caller is gone before it is written is never sent), so the
                // slower nodes still get the hold, and anything given back below is queued
                // behind them.
                break;
            }
        }
        finish_in_background(votes);
        let known = self.tokens().get(&token_key(key)).copied();
        let q = self.q();
        match tally::decide(&ballots, known) {
            Decision::Reentry { token, count } => {
                let fixes = tally::reentry_fixes(&ballots, token, count);
                if !fixes.is_empty() {
                    self.raise(&views, key, token, &fixes).await;
                }
                if tally::validity(req.lease, start.elapsed()).is_some() {
                    self.tokens().insert(token_key(key), token);
                    return Ok(AcquireReply::Granted { token });
                }
                self.abort(&views, key, &ballots).await;
                Ok(AcquireReply::Held {
                    ttl: Some(self.jitter()),
                })
            }
            Decision::Fresh { token } => {
                let raises = tally::fresh_raises(&ballots, token);
                let raised = if raises.is_empty() {
                    Vec::new()
                } else {
                    self.raise(&views, key, token, &raises).await
                };
                let confirmed = tally::confirmations(&ballots, token, &raised);
                if confirmed >= q && tally::validity(req.lease, start.elapsed()).is_some() {
                    self.tokens().insert(token_key(key), token);
                    return Ok(AcquireReply::Granted { token });
                }
                tracing::debug!(name = %key.name, confirmed, q, "redlock grant not confirmed in time; giving it back");
                self.abort(&views, key, &ballots).await;
                Ok(AcquireReply::Held {
                    ttl: Some(self.jitter()),
                })
            }
            Decision::Held { ttl } => {
                self.abort(&views, key, &ballots).await;
                Ok(AcquireReply::Held { ttl })
            }
            Decision::Split => {
                self.abort(&views, key, &ballots).await;
                Ok(AcquireReply::Held {
                    ttl: Some(self.jitter()),
                })
            }
            Decision::NoQuorum { answered } => {
                self.abort(&views, key, &ballots).await;
                Err(hard.unwrap_or_else(|| self.no_quorum(answered, &problems)))
            }
        }
    }

    async fn watch(&self, key: &HoldKey) -> Result<Box<dyn ReleaseWatch>> {
        let views = self.health.views();
        let t = self.watch_timeout();
        let got = join_all(views.iter().map(|v| {
            let b = v.backend.clone();
            async move {
                let b = b?;
                tokio::time::timeout(t, b.watch(key)).await.ok()?.ok()
            }
        }))
        .await;
        let watches: Vec<Box<dyn ReleaseWatch>> = got.into_iter().flatten().collect();
        if watches.is_empty() {
            return Err(Error::Connection {
                backend: KIND,
                endpoint: self.endpoint.clone(),
                source: "could not subscribe to release messages on any redlock node".into(),
            });
        }
        Ok(Box::new(watch::QuorumWatch::new(
            self.n(),
            watches,
            self.nt(),
        )))
    }

    async fn release(&self, key: &HoldKey) -> Result<ReleaseOutcome> {
        check_kind(key.kind)?;
        let views = self.health.views();
        let t = self.call_timeout();
        let mut answers = self.fan_out(&views, t, |b| {
            let key = key.clone();
            async move { b.release(&key).await }
        });
        let q = self.q();
        let mut outcomes: Vec<Option<ReleaseOutcome>> = vec![None; self.n()];
        let mut problems = Vec::new();
        while let Some((i, r)) = answers.next().await {
            let node = &self.health.nodes[i];
            match r {
                Some(Ok(o)) => outcomes[i] = Some(o),
                Some(Err(e)) => {
                    if e.is_retryable() {
                        node.suspect(format!("an error ({e})"));
                    }
                    problems.push(format!("{}: {e}", node.endpoint));
                }
                None => problems.push(format!("{}: no answer within {t:?}", node.endpoint)),
            }
            let count =
                |f: fn(&ReleaseOutcome) -> bool| outcomes.iter().flatten().filter(|o| f(o)).count();
            if count(|o| *o == ReleaseOutcome::Released) >= q
                || count(|o| matches!(o, ReleaseOutcome::StillHeld { .. })) >= q
            {
                break;
            }
        }
        finish_in_background(answers);
        match tally::release_outcome(&outcomes) {
            Ok(o) => {
                if !matches!(o, ReleaseOutcome::StillHeld { .. }) {
                    self.forget(key);
                }
                Ok(o)
            }
            Err(answered) => Err(self.no_quorum(answered, &problems)),
        }
    }

    async fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        if holds.is_empty() {
            return Ok(Vec::new());
        }
        for (k, lease) in holds {
            check_kind(k.kind)?;
            self.health.note_lease(*lease);
        }
        let views = self.health.views();
        let t = self.call_timeout();
        let mut answers = self.fan_out(&views, t, |b| {
            let holds = holds.to_vec();
            async move { b.renew(&holds).await }
        });
        let mut per_node: Vec<(bool, Option<Vec<RenewOutcome>>)> =
            views.iter().map(|v| (v.counts, None)).collect();
        let mut problems: Vec<String> = Vec::new();
        while let Some((i, r)) = answers.next().await {
            let node = &self.health.nodes[i];
            match r {
                Some(Ok(o)) if o.len() == holds.len() => per_node[i].1 = Some(o),
                Some(Ok(_)) => problems.push(format!(
                    "{}: renewed a batch of the wrong size",
                    node.endpoint
                )),
                Some(Err(e)) => {
                    if e.is_retryable() {
                        node.suspect(format!("an error ({e})"));
                    }
                    problems.push(format!("{}: {e}", node.endpoint));
                }
                None => problems.push(format!("{}: no answer within {t:?}", node.endpoint)),
            }
            if tally::renew_outcomes(&per_node, holds.len())
                .iter()
                .all(Option::is_some)
            {
                break;
            }
        }
        finish_in_background(answers);
        let outcomes = tally::renew_outcomes(&per_node, holds.len());
        let undecided: Vec<&str> = holds
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| o.is_none())
            .map(|((k, _), _)| &*k.name)
            .collect();
        if !undecided.is_empty() {
            problems.extend(views.iter().zip(&self.health.nodes).filter_map(|(v, n)| {
                v.why_not
                    .as_ref()
                    .filter(|_| v.backend.is_some())
                    .map(|w| format!("{}: {w}", n.endpoint))
            }));
            return Err(Error::Connection {
                backend: KIND,
                endpoint: self.endpoint.clone(),
                source: format!(
                    "the renewal of {} was neither confirmed nor refused by a majority ({} of {} nodes needed): {}",
                    undecided
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    self.q(),
                    self.n(),
                    problems.join("; ")
                )
                .into(),
            });
        }
        let outcomes: Vec<RenewOutcome> = outcomes.into_iter().flatten().collect();
        for ((k, _), o) in holds.iter().zip(&outcomes) {
            if *o == RenewOutcome::NotHeld {
                self.forget(k);
            }
        }
        Ok(outcomes)
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        check_kind(kind)?;
        let views = self.health.views();
        let t = self.watch_timeout();
        let infos = join_all(views.iter().zip(&self.health.nodes).map(|(v, node)| {
            let b = v.backend.clone();
            async move {
                let Some(b) = b else {
                    return Err(format!("{}: not connected", node.endpoint));
                };
                match tokio::time::timeout(t, b.inspect(name, LockKind::Mutex)).await {
                    Ok(Ok(i)) => Ok(i),
                    Ok(Err(e)) => Err(format!("{}: {e}", node.endpoint)),
                    Err(_) => Err(format!("{}: no answer within {t:?}", node.endpoint)),
                }
            }
        }))
        .await;
        let (infos, problems): (Vec<LockInfo>, Vec<String>) = {
            let mut ok = Vec::new();
            let mut bad = Vec::new();
            for i in infos {
                match i {
                    Ok(i) => ok.push(i),
                    Err(p) => bad.push(p),
                }
            }
            (ok, bad)
        };
        let q = self.q();
        if infos.len() < q {
            return Err(self.no_quorum(infos.len(), &problems));
        }
        Ok(merge_infos(name, &infos, q))
    }
}

/// One view of a lock from the nodes' views: a holder is one seen on at least `q` nodes, with
/// the hold count most nodes report and the lease a majority still has; the token is the
/// largest counter (an upper bound of the last token handed out: failed attempts also count).
fn merge_infos(name: &str, infos: &[LockInfo], q: usize) -> LockInfo {
    let mut seen: HashMap<&str, Vec<&HolderInfo>> = HashMap::new();
    for info in infos {
        for h in &info.holders {
            // Our token field, and anything else that cannot be an owner id.
            if h.owner.chars().any(char::is_control) {
                continue;
            }
            seen.entry(h.owner.as_str()).or_default().push(h);
        }
    }
    let mut holders: Vec<HolderInfo> = seen
        .into_iter()
        .filter(|(_, hs)| hs.len() >= q)
        .map(|(owner, hs)| {
            let mut leases: Vec<Option<Duration>> = hs.iter().map(|h| h.lease_left).collect();
            // Longest first (None: no expiry, longest of all); the q-th is how long a majority
            // still has the hold.
            leases.sort_by_key(|l| std::cmp::Reverse((l.is_none(), *l)));
            HolderInfo {
                owner: owner.to_owned(),
                count: tally::plurality(hs.iter().map(|h| h.count)).unwrap_or(1),
                lease_left: leases.get(q - 1).copied().flatten(),
                ..HolderInfo::default()
            }
        })
        .collect();
    holders.sort_by(|a, b| a.owner.cmp(&b.owner));
    LockInfo {
        name: name.to_owned(),
        holders,
        fencing_token: infos.iter().map(|i| i.fencing_token).max().unwrap_or(0),
        ..LockInfo::default()
    }
}

/// Runs the core's wait loop, remembering whether the last attempt failed for want of a
/// majority: a wait that ends at its deadline that way reports it (a connection error saying
/// how many nodes answered), not "held by another owner the whole time".
struct Recorder {
    shared: Arc<Shared>,
    last: Mutex<Option<(String, String)>>,
}

impl Recorder {
    fn last(&self) -> MutexGuard<'_, Option<(String, String)>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Backend for Recorder {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.shared.endpoint.clone()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        let r = self.shared.acquire(req).await;
        *self.last() = match &r {
            Err(Error::Connection {
                endpoint, source, ..
            }) => Some((endpoint.clone(), source.to_string())),
            _ => None,
        };
        r
    }

    async fn watch(&self, key: &HoldKey) -> Result<Box<dyn ReleaseWatch>> {
        self.shared.watch(key).await
    }

    async fn release(&self, key: &HoldKey) -> Result<ReleaseOutcome> {
        self.shared.release(key).await
    }

    async fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.shared.renew(holds).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.shared.inspect(name, kind).await
    }
}

#[async_trait]
impl Backend for RedlockBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.shared.endpoint.clone()
    }

    /// One attempt on every node in parallel; see the crate docs. "Held by another owner" is
    /// `Ok(Held)`; "fewer than a majority of nodes answered" is [`Error::Connection`].
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.shared.acquire(req).await
    }

    async fn watch(&self, key: &HoldKey) -> Result<Box<dyn ReleaseWatch>> {
        self.shared.watch(key).await
    }

    /// The core's waiting strategy, except that a wait that ends because no majority could be
    /// reached returns that error instead of a timeout.
    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let rec = Recorder {
            shared: self.shared.clone(),
            last: Mutex::new(None),
        };
        let res = dlock_core::wait::watch_and_retry(&rec, req, deadline, cancel).await;
        if let Ok(None) = res {
            if !cancel.is_cancelled() {
                if let Some((endpoint, source)) = rec.last().take() {
                    return Err(Error::Connection {
                        backend: KIND,
                        endpoint,
                        source: source.into(),
                    });
                }
            }
        }
        res
    }

    async fn release(&self, key: &HoldKey) -> Result<ReleaseOutcome> {
        self.shared.release(key).await
    }

    async fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.shared.renew(holds).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.shared.inspect(name, kind).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(owner: &str, count: u32, ms: u64) -> HolderInfo {
        HolderInfo {
            owner: owner.into(),
            count,
            lease_left: Some(Duration::from_millis(ms)),
            ..HolderInfo::default()
        }
    }

    #[test]
    fn merged_inspect() {
        let node = |holders: Vec<HolderInfo>, fence| LockInfo {
            name: "n".into(),
            holders,
            fencing_token: fence,
            ..LockInfo::default()
        };
        let token = || holder(dlock_redis::TOKEN_FIELD, 9, 900);
        let infos = [
            node(vec![holder("a", 2, 900), token()], 9),
            node(vec![holder("a", 2, 700), token()], 9),
            node(vec![holder("b", 1, 500)], 11),
            node(vec![holder("a", 1, 300), token()], 9),
            node(vec![], 3),
        ];
        let m = merge_infos("n", &infos, 3);
        assert_eq!(m.holders, vec![holder("a", 2, 300)]);
        assert_eq!(m.fencing_token, 11);
        let m = merge_infos("n", &infos[2..], 2);
        assert!(!m.held());
    }
}
