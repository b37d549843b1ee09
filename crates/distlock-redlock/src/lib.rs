//! Redlock backend for dlock: one lock over N independent Redis masters.
//!
//! URL: `redlock://[user:password@]host1:port1,host2:port2,host3:port3[/db][?namespace=NS&node_timeout=DUR&quarantine=DUR&check_interval=DUR]`
//! (at least 3 nodes; an odd number such as 3 or 5 is best; the credentials apply to every
//! node). `redlocks://` reaches the nodes with TLS (`rediss://`, distlock-redis's `tls` feature).
//!
//! - `node_timeout` (default 50 ms, at most a tenth of the watchdog lease by default): how long
//!   one node may take to answer one request. A node that does not answer in time does not
//!   count; it never delays a grant by more than this.
//! - `quarantine` (default: the longest lease in use — the watchdog lease, or a longer fixed
//!   lease this client has asked for): how long a node that restarted or lost its data stays
//!   out of every majority when this client is the one that seeds it. The quarantine is stored
//!   on the node (an end time by the node's clock) and every client honours it; the seeder
//!   also lengthens it to the longest lease the other nodes saw in use (their lease horizon).
//! - `check_interval` (default 500 ms): how often each node's process and data are checked.
//!
//! Each node is a [`distlock_redis::RedisBackend`] (its own connection, scripts and subscriber).
//! A lock is granted when a majority of nodes granted it within the node timeout and the
//! grant's validity (`lease − time spent − drift`, drift = lease/100 + 2 ms) is positive — the
//! same rule by which the core measures its local lease from the attempt's send time. The
//! fencing token is chosen from a majority's counters and raised on a majority before it is
//! handed out, so tokens keep strictly increasing even when nodes restart without their data.
//! Every per-node hold is addressed by the attempt id that won it: a retried vote returns the
//! same grant, a retried release or renewal has the effect of one, and nothing touches another
//! attempt's hold (re-entry is counted by the core, in the client).
//! Only the mutex is supported (read-write locks, fair locks and semaphores return
//! [`Error::Unsupported`]). The design and the safety argument are in `docs/redlock.md`.
//!
//! ```no_run
//! # async fn f() -> distlock_core::Result<()> {
//! use std::sync::Arc;
//! let opts = distlock_core::ClientOptions::default();
//! let backend = distlock_redlock::RedlockBackend::connect(
//!     "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379", &opts).await?;
//! let client = distlock_core::Client::new(Arc::new(backend), opts)?;
//! let guard = client.lock("orders:42")?.acquire().await?;
//! println!("token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod config;
mod node;
mod ops;
mod tally;
mod watch;

pub use config::{redact, DEFAULT_CHECK_INTERVAL, DEFAULT_NODE_TIMEOUT, MIN_NODES};
pub use node::NodeStatus;

use crate::node::{Health, View};
use crate::tally::{Ballot, Decision};
use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, AttemptId, Backend, ClientOptions, Error, GrantRef,
    Granted, HolderInfo, LockInfo, LockKind, ReleaseOutcome, ReleaseWatch, RenewOutcome, Result,
};
use distlock_redis::{QuorumReply, QuorumVote, RedisBackend};
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
/// `distlock::connect("redlock://…")`).
pub struct RedlockBackend {
    shared: Arc<Shared>,
}

/// State shared by the backend and its helpers.
struct Shared {
    health: Arc<Health>,
    endpoint: String,
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

/// One node's answer in a fan-out: `(node, None)` for a timeout, `(node, Some(result))`.
type Answer<T> = Pin<Box<dyn Future<Output = (usize, Option<Result<T>>)> + Send>>;
type Answers<T> = FuturesUnordered<Answer<T>>;
/// The votes of one attempt, each run to its end (never dropped half-way).
type Votes = FuturesUnordered<Pin<Box<dyn Future<Output = (usize, Result<QuorumVote>)> + Send>>>;

/// Lets the votes still running finish in a task of their own; if the attempt wins with the
/// token sent on `won`, the nodes among them that voted for it are raised to that token (so
/// their hold carries the grant's address: renewals and the release name attempt and token).
/// A release that reaches such a node first still removes it (see `release`).
fn finish_votes(
    mut rest: Votes,
    views: Vec<View>,
    name: Arc<str>,
    attempt: AttemptId,
    t: Duration,
    won: tokio::sync::oneshot::Receiver<u64>,
) {
    if rest.is_empty() {
        return;
    }
    tokio::spawn(async move {
        let mut late = Vec::new();
        while let Some((i, answer)) = rest.next().await {
            if let Ok(QuorumVote {
                reply: QuorumReply::Granted { counter: t } | QuorumReply::Holds { token: t, .. },
                ..
            }) = answer
            {
                late.push((i, t));
            }
        }
        let Ok(token) = won.await else { return };
        join_all(
            late.into_iter()
                .filter(|(_, t)| *t != token)
                .filter_map(|(i, _)| views[i].backend.clone())
                .map(|b| {
                    let (name, attempt) = (name.clone(), attempt.clone());
                    async move {
                        let _ =
                            tokio::time::timeout(t, b.raise_fence(&name, &attempt, token)).await;
                    }
                }),
        )
        .await;
    });
}

/// Lets the requests still running finish in a task of their own.
fn finish_in_background<T: Send + 'static>(mut rest: Answers<T>) {
    if !rest.is_empty() {
        tokio::spawn(async move { while rest.next().await.is_some() {} });
    }
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

    /// A majority voted for the attempt but the grant could not be confirmed in time (a raise
    /// that did not arrive, or votes so slow that no validity is left). Nobody else holds the
    /// lock, so this is not `Held`: a retryable error. The attempt's holds stay (they are
    /// addressed to it): its retry finds them and confirms them, and an attempt that stops
    /// instead is given up by the core, which removes them.
    fn unconfirmed(&self, name: &str, confirmed: usize, q: usize, took: Duration) -> Error {
        tracing::debug!(
            name,
            confirmed,
            q,
            ?took,
            "redlock grant not confirmed in time"
        );
        Error::Connection {
            backend: KIND,
            endpoint: self.endpoint.clone(),
            source: format!(
                "a majority voted for this attempt on `{name}` but only {confirmed} of the {q}                  nodes needed confirmed its token with validity left (after {took:?}; slow                  nodes?)"
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
                    if let Some(left) = v.quarantine {
                        // The node's own record, by its own clock, whatever this client
                        // thought: it lost its data and whoever seeded it set the end.
                        node.note_quarantine(left);
                    }
                    let counted = view.counts && !v.scripts_reloaded && v.quarantine.is_none();
                    let problem = (!counted).then(|| {
                        let why = match (&view.why_not, v.quarantine) {
                            (Some(w), _) => w.clone(),
                            (None, Some(left)) => {
                                format!("in restart quarantine for {left:?} more by its own clock")
                            }
                            (None, None) => {
                                "had forgotten its scripts (restarted?); re-checking".to_owned()
                            }
                        };
                        format!("{ep}: {why}")
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

    /// Raises the counter to `token` and records it with the attempt's hold on the listed
    /// nodes, in parallel. Per node: `Some(true)` confirmed, `Some(false)` not, `None` not
    /// asked.
    async fn raise(
        &self,
        views: &[View],
        name: &str,
        attempt: &AttemptId,
        token: u64,
        list: &[usize],
    ) -> Vec<Option<bool>> {
        let nt = self.nt();
        let done = join_all(list.iter().map(|&i| {
            let b = views[i].backend.clone();
            async move {
                let Some(b) = b else { return (i, false) };
                let ok = match tokio::time::timeout(nt, b.raise_fence(name, attempt, token)).await {
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

    /// Takes back, quietly and in parallel, what an attempt that did not win may have been
    /// granted: on every node that voted for it or may have (no answer in time). The request
    /// names the attempt, so it can only remove that attempt's holds; a vote still in flight
    /// on a node runs before it (one connection per node, in order).
    async fn abort(&self, views: &[View], name: &str, attempt: &AttemptId, ballots: &[Ballot]) {
        let nt = self.nt();
        join_all(
            ballots
                .iter()
                .enumerate()
                .filter(|(_, b)| b.granted() || b.maybe_granted)
                .filter_map(|(i, _)| views[i].backend.clone())
                .map(|b| async move {
                    let quiet = b.quorum_release(name, attempt, None, false);
                    let _ = tokio::time::timeout(nt, quiet).await;
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
        // Nodes asked whose vote is not in yet.
        let mut asked = vec![false; views.len()];
        let mut votes: Votes = FuturesUnordered::new();
        for (i, v) in views.iter().enumerate() {
            let (Some(b), Some(epoch)) = (v.backend.clone(), v.epoch.clone()) else {
                let why = v.why_not.clone().unwrap_or_default();
                ballots[i] = Ballot::default();
                problems.push(format!("{}: {why}", self.health.nodes[i].endpoint));
                continue;
            };
            let (key, attempt, lease) = (key.clone(), req.attempt.clone(), req.lease);
            asked[i] = true;
            votes.push(Box::pin(async move {
                (i, b.quorum_acquire(&key, &attempt, lease, &epoch).await)
            }));
        }
        // One deadline for all votes, and no vote future is ever dropped before it is done: a
        // request whose caller is gone before it is written is never sent, and a vote that
        // runs late must still run — before anything sent after it on its connection (the
        // give-back of a failed attempt, a release), and so that it can be given the token.
        let deadline = tokio::time::Instant::now() + nt;
        loop {
            let (i, answer) = match tokio::time::timeout_at(deadline, votes.next()).await {
                Ok(Some((i, r))) => (i, Some(r)),
                Ok(None) => break,
                Err(_) => {
                    // The votes still out count as unknown (their ballots say "may have
                    // granted" already).
                    for (i, _) in asked.iter().enumerate().filter(|(_, a)| **a) {
                        let (_, p, _) = self.vote(i, &views[i], None);
                        problems.extend(p);
                    }
                    break;
                }
            };
            asked[i] = false;
            let (b, p, e) = self.vote(i, &views[i], answer);
            ballots[i] = b;
            problems.extend(p);
            if hard.is_none() {
                hard = e;
            }
            if tally::settled(&ballots, votes.len()) {
                // The rest cannot change the outcome: they finish in the background, so the
                // slower nodes still get the hold — this attempt's, by its id — and anything
                // given back or released later is queued behind them.
                break;
            }
        }
        // Votes still out finish in the background; if this attempt wins, those that voted
        // for it get its token too (they were not there to be raised).
        let (won, token_rx) = tokio::sync::oneshot::channel();
        finish_votes(
            votes,
            views.clone(),
            key.name.clone(),
            req.attempt.clone(),
            self.call_timeout(),
            token_rx,
        );
        let (name, attempt) = (&*key.name, &req.attempt);
        let q = self.q();
        match tally::decide(&ballots) {
            Decision::Again { token } => {
                // A retry of an attempt whose grant stands on a majority (its reply was lost):
                // the same token; the votes made every lease run at least `lease` from now.
                // Nodes of the attempt that store another token get this one (best effort:
                // a majority has it already).
                let fixes = tally::raises(&ballots, token);
                if !fixes.is_empty() {
                    self.raise(&views, name, attempt, token, &fixes).await;
                }
                if tally::validity(req.lease, start.elapsed()).is_some() {
                    let _ = won.send(token);
                    return Ok(AcquireReply::Granted { token });
                }
                Err(self.unconfirmed(name, q, q, start.elapsed()))
            }
            Decision::Fresh { token } => {
                let fixes = tally::raises(&ballots, token);
                let raised = if fixes.is_empty() {
                    Vec::new()
                } else {
                    self.raise(&views, name, attempt, token, &fixes).await
                };
                let confirmed = tally::confirmations(&ballots, token, &raised);
                if confirmed >= q && tally::validity(req.lease, start.elapsed()).is_some() {
                    let _ = won.send(token);
                    return Ok(AcquireReply::Granted { token });
                }
                Err(self.unconfirmed(name, confirmed, q, start.elapsed()))
            }
            Decision::Held { ttl } => {
                self.abort(&views, name, attempt, &ballots).await;
                Ok(AcquireReply::Held { ttl })
            }
            Decision::Split => {
                self.abort(&views, name, attempt, &ballots).await;
                Ok(AcquireReply::Held {
                    ttl: Some(self.jitter()),
                })
            }
            Decision::NoQuorum { answered } => {
                self.abort(&views, name, attempt, &ballots).await;
                Err(hard.unwrap_or_else(|| self.no_quorum(answered, &problems)))
            }
        }
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        let views = self.health.views();
        let t = self.watch_timeout();
        let got = join_all(views.iter().map(|v| {
            let b = v.backend.clone();
            async move {
                let b = b?;
                tokio::time::timeout(t, b.watch(req)).await.ok()?.ok()
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

    /// Releases whatever the attempt holds on any node (a grant whose reply was lost, or votes
    /// that finished after the attempt stopped), announcing the release where it held one.
    /// Idempotent; only that attempt's holds are touched.
    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        check_kind(req.key.kind)?;
        let views = self.health.views();
        let t = self.call_timeout();
        let (name, attempt) = (req.key.name.clone(), req.attempt.clone());
        let mut answers = self.fan_out(&views, t, |b| {
            let (name, attempt) = (name.clone(), attempt.clone());
            async move { b.quorum_release(&name, &attempt, None, true).await }
        });
        let mut answered = 0;
        let mut problems = Vec::new();
        while let Some((i, r)) = answers.next().await {
            let node = &self.health.nodes[i];
            match r {
                Some(Ok(_)) => answered += 1,
                Some(Err(e)) => problems.push(format!("{}: {e}", node.endpoint)),
                None => problems.push(format!("{}: no answer within {t:?}", node.endpoint)),
            }
        }
        // Fewer than a majority reached: a grant this attempt may have got could still stand
        // (until its lease ends); say so.
        if answered < self.q() {
            return Err(self.no_quorum(answered, &problems));
        }
        Ok(())
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        check_kind(grant.key.kind)?;
        let views = self.health.views();
        let t = self.call_timeout();
        let (name, attempt, token) = (grant.key.name.clone(), grant.attempt.clone(), grant.token);
        // Set once a majority released this grant: then a node that holds the attempt under
        // another token (its vote came in after the decision, before the raise reached it)
        // holds part of this very grant — attempt ids are unique — and is released too.
        let (verdict, decided) = tokio::sync::watch::channel(false);
        let mut answers = self.fan_out(&views, t, |b| {
            let (name, attempt, mut rx) = (name.clone(), attempt.clone(), decided.clone());
            async move {
                match b.quorum_release(&name, &attempt, Some(token), true).await? {
                    Ok(o) => Ok(o),
                    Err(_other_token) => {
                        tokio::spawn(async move {
                            // Ends as soon as the release is decided either way (the sender
                            // goes away with the call).
                            let released = matches!(
                                tokio::time::timeout(t, rx.wait_for(|v| *v)).await,
                                Ok(Ok(_))
                            );
                            if released {
                                let _ = tokio::time::timeout(
                                    t,
                                    b.quorum_release(&name, &attempt, None, true),
                                )
                                .await;
                            }
                        });
                        // Not this grant's address here (yet): as far as the majority goes,
                        // nothing to release on this node.
                        Ok(ReleaseOutcome::Expired)
                    }
                }
            }
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
            if outcomes
                .iter()
                .filter(|o| **o == Some(ReleaseOutcome::Released))
                .count()
                >= q
            {
                verdict.send_replace(true);
                break;
            }
        }
        drop(decided);
        // The slower nodes' releases are on their connections already: they finish in order.
        finish_in_background(answers);
        tally::release_outcome(&outcomes).map_err(|answered| self.no_quorum(answered, &problems))
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        if holds.is_empty() {
            return Ok(Vec::new());
        }
        for (g, lease) in holds {
            check_kind(g.key.kind)?;
            self.health.note_lease(*lease);
        }
        let views = self.health.views();
        let t = self.call_timeout();
        // Set to which grants a majority renewed: a node that holds one of those attempts
        // under another token (its vote came in after the decision, and the raise did not
        // reach it) holds part of that very grant — attempt ids are unique — and is given the
        // token and renewed too, so it rejoins the grant.
        let (verdict, decided) = tokio::sync::watch::channel(None::<Vec<bool>>);
        let mut answers = self.fan_out(&views, t, |b| {
            let (holds, mut rx) = (holds.to_vec(), decided.clone());
            async move {
                let outs = b.quorum_renew(&holds).await?;
                let behind: Vec<usize> = (0..outs.len()).filter(|&h| outs[h].is_err()).collect();
                if !behind.is_empty() {
                    tokio::spawn(async move {
                        let renewed =
                            match tokio::time::timeout(t, rx.wait_for(Option::is_some)).await {
                                Ok(Ok(v)) => v.clone().unwrap_or_default(),
                                _ => return,
                            };
                        for h in behind
                            .into_iter()
                            .filter(|&h| renewed.get(h) == Some(&true))
                        {
                            let (g, lease) = &holds[h];
                            let raised = b.raise_fence(&g.key.name, &g.attempt, g.token);
                            if let Ok(Ok(Some(_))) = tokio::time::timeout(t, raised).await {
                                let item = [(g.clone(), *lease)];
                                let _ = tokio::time::timeout(t, b.quorum_renew(&item)).await;
                            }
                        }
                    });
                }
                // Not this grant's address here (yet): as far as the majority goes, not held.
                Ok(outs
                    .into_iter()
                    .map(|o| o.unwrap_or(RenewOutcome::NotHeld))
                    .collect::<Vec<_>>())
            }
        });
        drop(decided);
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
        let outcomes = tally::renew_outcomes(&per_node, holds.len());
        verdict.send_replace(Some(
            outcomes
                .iter()
                .map(|o| *o == Some(RenewOutcome::Renewed))
                .collect(),
        ));
        finish_in_background(answers);
        let undecided: Vec<&str> = holds
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| o.is_none())
            .map(|((g, _), _)| &*g.key.name)
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
        Ok(outcomes.into_iter().flatten().collect())
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
                match tokio::time::timeout(t, b.quorum_inspect(name)).await {
                    Ok(Ok(i)) => Ok(i),
                    Ok(Err(e)) => Err(format!("{}: {e}", node.endpoint)),
                    Err(_) => Err(format!("{}: no answer within {t:?}", node.endpoint)),
                }
            }
        }))
        .await;
        let mut ok = Vec::new();
        let mut problems = Vec::new();
        for i in infos {
            match i {
                Ok(i) => ok.push(i),
                Err(p) => problems.push(p),
            }
        }
        let q = self.q();
        if ok.len() < q {
            return Err(self.no_quorum(ok.len(), &problems));
        }
        Ok(merge_infos(name, &ok, q))
    }
}

/// One node's view of a lock, as [`RedisBackend::quorum_inspect`] returns it.
type NodeView = (Option<(String, String, Option<Duration>)>, u64);

/// One view of a lock from the nodes' views: a holder is an attempt seen on at least `q`
/// nodes, with the lease a majority still has; the token is the largest counter (an upper
/// bound of the last token handed out: failed attempts also count).
fn merge_infos(name: &str, infos: &[NodeView], q: usize) -> LockInfo {
    let mut seen: HashMap<&str, Vec<(&str, Option<Duration>)>> = HashMap::new();
    for (hold, _) in infos {
        if let Some((attempt, owner, left)) = hold {
            // Foreign data (no attempt) is no holder of ours.
            if !attempt.is_empty() {
                seen.entry(attempt).or_default().push((owner, *left));
            }
        }
    }
    let mut holders: Vec<HolderInfo> = seen
        .into_values()
        .filter(|hs| hs.len() >= q)
        .map(|hs| {
            let mut leases: Vec<Option<Duration>> = hs.iter().map(|h| h.1).collect();
            // Longest first (None: no expiry, longest of all); the q-th is how long a majority
            // still has the hold.
            leases.sort_by_key(|l| std::cmp::Reverse((l.is_none(), *l)));
            HolderInfo {
                owner: hs[0].0.to_owned(),
                count: 1,
                lease_left: leases.get(q - 1).copied().flatten(),
                ..HolderInfo::default()
            }
        })
        .collect();
    holders.sort_by(|a, b| a.owner.cmp(&b.owner));
    LockInfo {
        name: name.to_owned(),
        holders,
        fencing_token: infos.iter().map(|i| i.1).max().unwrap_or(0),
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

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.shared.watch(req).await
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.shared.give_up(req).await
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.shared.release(grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
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

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.shared.watch(req).await
    }

    /// Releases whatever the attempt holds on any node; see [`Backend::give_up`].
    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.shared.give_up(req).await
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
        let res = distlock_core::wait::watch_and_retry(&rec, req, deadline, cancel).await;
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

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.shared.release(grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.shared.renew(holds).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.shared.inspect(name, kind).await
    }

    /// Every mutex a node has state for, merged by name: a holder is an attempt on a
    /// majority of nodes (see `docs/redlock.md`, "Operator commands").
    async fn list(&self, prefix: &str) -> Result<Vec<distlock_core::ListedLock>> {
        ops::list(&self.shared, prefix).await
    }

    /// Removes the hold on every reachable node and raises every counter past every token
    /// seen; done only when a majority of nodes did both.
    async fn force_release(
        &self,
        name: &str,
        kind: LockKind,
    ) -> Result<distlock_core::ForceReleased> {
        ops::force_release(&self.shared, name, kind).await
    }

    /// Each node's Redis checks, its quarantine, the node count and the clock spread.
    async fn diagnose(&self) -> Result<Vec<distlock_core::Finding>> {
        ops::diagnose(&self.shared).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(owner: &str, ms: u64) -> HolderInfo {
        HolderInfo {
            owner: owner.into(),
            count: 1,
            lease_left: Some(Duration::from_millis(ms)),
            ..HolderInfo::default()
        }
    }

    #[test]
    fn merged_inspect() {
        let node = |hold: Option<(&str, &str, u64)>, fence| -> NodeView {
            (
                hold.map(|(a, o, ms)| (a.into(), o.into(), Some(Duration::from_millis(ms)))),
                fence,
            )
        };
        let infos = [
            node(Some(("a1", "x", 900)), 9),
            node(Some(("a1", "x", 700)), 9),
            node(Some(("b1", "y", 500)), 11),
            node(Some(("a1", "x", 300)), 9),
            node(None, 3),
        ];
        let m = merge_infos("n", &infos, 3);
        assert_eq!(m.holders, vec![holder("x", 300)]);
        assert_eq!(m.fencing_token, 11);
        let m = merge_infos("n", &infos[2..], 2);
        assert!(!m.held());
        // Two attempts of one owner, each on a minority: nobody holds the lock.
        let infos = [
            node(Some(("a1", "x", 900)), 9),
            node(Some(("a2", "x", 900)), 9),
            node(Some(("a1", "x", 900)), 9),
            node(Some(("a2", "x", 900)), 9),
            node(Some(("", "", 900)), 9),
        ];
        assert!(!merge_infos("n", &infos, 3).held());
    }
}
