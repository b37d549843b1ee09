//! Acquire: one vote per node, in parallel, decided by the tally (see `docs/redlock.md`,
//! "Acquire").

use crate::node::View;
use crate::tally::{self, Ballot, Decision};
use crate::{Shared, KIND};
use distlock_core::backend::{AcquireReply, AcquireRequest, AttemptId};
use distlock_core::{Error, LockKind, Result};
use distlock_redis::{QuorumReply, QuorumVote};
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    kind: LockKind,
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
                        let raise = b.raise_fence(&name, kind, &attempt, token);
                        let _ = tokio::time::timeout(t, raise).await;
                    }
                }),
        )
        .await;
    });
}

/// What one round of votes amounts to.
pub(crate) struct Round {
    /// The answer to the attempt.
    pub(crate) reply: AcquireReply,
    /// Counted nodes on which the attempt is the first waiter of the queue.
    pub(crate) first: usize,
}

impl Round {
    fn new(reply: AcquireReply, first: usize) -> Self {
        Round { reply, first }
    }
}

impl Shared {
    /// The random pause before the next attempt after a split vote (0 to the node timeout), so
    /// that clients that split the nodes do not collide again.
    fn jitter(&self) -> Duration {
        let max = u64::try_from(self.nt().as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(fastrand::u64(0..=max))
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
        Error::connection(
            KIND,
            self.endpoint.clone(),
            format!(
                "a majority voted for this attempt on `{name}` but only {confirmed} of the {q} \
                 nodes needed confirmed its token with validity left (after {took:?}; slow \
                 nodes?)"
            ),
        )
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
                    node.suspect("an epoch change (lost data or initialised again)");
                    (
                        Ballot::default(),
                        Some(format!(
                            "{ep}: lost its data or was initialised again since the last check; re-checking"
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
                        // thought: it lost its data and whoever initialised it set the end.
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
        (name, kind): (&str, LockKind),
        attempt: &AttemptId,
        token: u64,
        list: &[usize],
    ) -> Vec<Option<bool>> {
        let nt = self.nt();
        let done = join_all(list.iter().map(|&i| {
            let b = views[i].backend.clone();
            async move {
                let Some(b) = b else { return (i, false) };
                let raise = b.raise_fence(name, kind, attempt, token);
                let ok = match tokio::time::timeout(nt, raise).await {
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

    /// Takes back, in parallel, what an attempt that did not win may have been granted: on
    /// every node that voted for it or may have (no answer in time). The attempt keeps its
    /// place in the nodes' queues; a node that is free afterwards wakes its first waiter only
    /// (never the lock's channel: no herd). The request names the attempt, so it can only
    /// remove that attempt's holds; a vote still in flight on a node runs before it (one
    /// connection per node, in order).
    async fn abort(
        &self,
        views: &[View],
        (name, kind): (&str, LockKind),
        attempt: &AttemptId,
        ballots: &[Ballot],
    ) {
        let nt = self.nt();
        join_all(
            ballots
                .iter()
                .enumerate()
                .filter(|(_, b)| b.granted() || b.maybe_granted)
                .filter_map(|(i, _)| views[i].backend.clone())
                .map(|b| async move {
                    let give_back = b.give_back(name, kind, attempt);
                    let _ = tokio::time::timeout(nt, give_back).await;
                }),
        )
        .await;
    }

    /// One attempt on every node in parallel; see the crate docs. "Held by another owner" is
    /// `Ok(Held)`; "fewer than a majority of nodes answered" is [`Error::Connection`].
    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.round(req, None).await.map(|r| r.reply)
    }

    /// One attempt on every node in parallel, as a waiter at `queue` (its waiter ttl and its
    /// place) or not queued (`None`).
    pub(crate) async fn round(
        &self,
        req: &AcquireRequest,
        queue: Option<(Duration, u64)>,
    ) -> Result<Round> {
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
        // Counted nodes where this attempt is the first waiter.
        let mut first = 0;
        for (i, v) in views.iter().enumerate() {
            let (Some(b), Some(epoch)) = (v.backend.clone(), v.epoch.clone()) else {
                let why = v.why_not.clone().unwrap_or_default();
                ballots[i] = Ballot::default();
                problems.push(format!("{}: {why}", self.health.nodes[i].endpoint));
                continue;
            };
            let (key, attempt, lease) = (key.clone(), req.attempt.clone(), req.lease);
            let value = req.value.clone();
            asked[i] = true;
            votes.push(Box::pin(async move {
                let value = value.as_deref();
                let vote = b.vote(&key, &attempt, lease, &epoch, value, queue).await;
                (i, vote)
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
            if let Some(Ok(v)) = &answer {
                first += usize::from(v.first && views[i].counts);
            }
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
            key.kind,
            req.attempt.clone(),
            self.call_timeout(),
            token_rx,
        );
        let (name, attempt) = ((&*key.name, key.kind), &req.attempt);
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
                    return Ok(Round::new(AcquireReply::Granted { token }, first));
                }
                Err(self.unconfirmed(name.0, q, q, start.elapsed()))
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
                    return Ok(Round::new(AcquireReply::Granted { token }, first));
                }
                Err(self.unconfirmed(name.0, confirmed, q, start.elapsed()))
            }
            Decision::Held { ttl } => {
                self.abort(&views, name, attempt, &ballots).await;
                Ok(Round::new(AcquireReply::Held { ttl }, first))
            }
            Decision::Split => {
                self.abort(&views, name, attempt, &ballots).await;
                let ttl = Some(self.jitter());
                Ok(Round::new(AcquireReply::Held { ttl }, first))
            }
            Decision::NoQuorum { answered } => {
                self.abort(&views, name, attempt, &ballots).await;
                Err(hard.unwrap_or_else(|| self.no_quorum(answered, &problems)))
            }
        }
    }
}
