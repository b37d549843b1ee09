//! Acquire: one vote per node, in parallel, decided by the tally (see `docs/redlock.md`,
//! "Acquire").

use crate::node::{Health, View};
use crate::tally::{self, Ballot, Decision};
use crate::RedlockBackend;
use distlock_core::backend::{AcquireReply, AcquireRequest};
use distlock_core::{Error, Result};
use distlock_redis::{QuorumReply, QuorumVote};
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// The votes of one attempt, each run to its end (never dropped half-way).
type Votes = FuturesUnordered<Pin<Box<dyn Future<Output = (usize, Result<QuorumVote>)> + Send>>>;

/// The votes of one round as they come in.
struct Count {
    /// Per node (a vote not in yet: unknown, may have granted).
    ballots: Vec<Ballot>,
    /// Nodes asked whose vote is not in yet.
    asked: Vec<bool>,
    problems: Vec<String>,
    /// The first non-retryable error.
    hard: Option<Error>,
    /// Counted nodes on which the attempt is the first waiter.
    first: usize,
}

impl Health {
    /// Raises the counter to `token` and records it with the attempt's hold on the listed
    /// nodes, in parallel, each bounded by `t`. Per node: `Some(true)` confirmed, `Some(false)` not, `None` not
    /// asked.
    pub(crate) async fn raise(
        &self,
        views: &[View],
        req: &AcquireRequest,
        token: u64,
        list: &[usize],
        t: Duration,
    ) -> Vec<Option<bool>> {
        let key = &req.key;
        join_all(views.iter().enumerate().map(|(i, v)| async move {
            if !list.contains(&i) {
                return None;
            }
            let Some(b) = &v.backend else {
                return Some(false);
            };
            let raise = b.raise_fence(&key.name, key.kind, &req.attempt, token);
            Some(match tokio::time::timeout(t, raise).await {
                Ok(Ok(Some(c))) => c >= token,
                Ok(Err(e)) if e.is_retryable() => {
                    self.nodes[i].suspect(format!("an error ({e})"));
                    false
                }
                _ => false,
            })
        }))
        .await
    }
}

impl RedlockBackend {
    /// Node `i`'s ballot from its answer (`None`: none within the node timeout) into `count`,
    /// with what the answer tells about the node (suspect, its quarantine), its problem, and a
    /// non-retryable error.
    fn vote(&self, count: &mut Count, i: usize, view: &View, answer: Option<Result<QuorumVote>>) {
        let node = &self.health.nodes[i];
        let (ballot, why) = match answer {
            None => {
                let why = format!("no answer within {:?}", self.node_timeout());
                (Ballot::unknown(), Some(why))
            }
            Some(Err(e)) if e.is_retryable() => {
                node.suspect(format!("an error ({e})"));
                (Ballot::unknown(), Some(e.to_string()))
            }
            Some(Err(e)) => {
                let why = e.to_string();
                count.hard.get_or_insert(e);
                (Ballot::default(), Some(why))
            }
            Some(Ok(v)) if v.reply == QuorumReply::EpochMismatch => {
                node.suspect("an epoch change (lost data or initialised again)");
                let why =
                    "lost its data or was initialised again since the last check; re-checking";
                (Ballot::default(), Some(why.to_owned()))
            }
            Some(Ok(v)) => {
                count.first += usize::from(v.first && view.counts);
                if v.scripts_reloaded {
                    node.suspect("it had forgotten its scripts (restarted?)");
                }
                if let Some(left) = v.quarantine {
                    // The node's own record, by its own clock, whatever this client thought:
                    // it lost its data and whoever initialised it set the end.
                    node.note_quarantine(left);
                }
                let ballot = Ballot::of(&v, view.counts);
                let why = (!ballot.counted).then(|| match (&view.why_not, v.quarantine) {
                    (Some(w), _) => w.clone(),
                    (None, Some(left)) => {
                        format!("in restart quarantine for {left:?} more by its own clock")
                    }
                    (None, None) => "had forgotten its scripts (restarted?); re-checking".into(),
                });
                (ballot, why)
            }
        };
        count.ballots[i] = ballot;
        count
            .problems
            .extend(why.map(|w| format!("{}: {w}", node.endpoint)));
    }

    /// One attempt on every node in parallel, as a waiter at `queue` (its waiter ttl and its
    /// place) or not queued (`None`): the reply, and on how many counted nodes the attempt is
    /// the first waiter of the queue.
    pub(crate) async fn round(
        &self,
        req: &AcquireRequest,
        queue: Option<(Duration, u64)>,
    ) -> Result<(AcquireReply, usize)> {
        self.health.note_lease(req.lease);
        let start = Instant::now();
        let views = self.health.views();
        // The vote goes to every node that has a connection and an epoch; the others count as
        // not granted, with their problem. A vote not in yet may still run on its node: counted
        // as unknown (given back on failure).
        let mut count = Count {
            ballots: vec![Ballot::unknown(); views.len()],
            asked: vec![false; views.len()],
            problems: Vec::new(),
            hard: None,
            first: 0,
        };
        let mut votes: Votes = FuturesUnordered::new();
        for (i, v) in views.iter().enumerate() {
            let (Some(b), Some(epoch)) = (v.backend.clone(), v.epoch.clone()) else {
                let why = v.why_not.as_deref().unwrap_or_default();
                count.ballots[i] = Ballot::default();
                let endpoint = &self.health.nodes[i].endpoint;
                count.problems.push(format!("{endpoint}: {why}"));
                continue;
            };
            let req = req.clone();
            count.asked[i] = true;
            votes.push(Box::pin(async move {
                let value = req.value.as_deref();
                let vote = b.vote(&req.key, &req.attempt, req.lease, &epoch, value, queue);
                (i, vote.await)
            }));
        }
        self.count_votes(&views, &mut votes, &mut count).await;
        // The votes still out finish in a task of their own; if the attempt wins with the token
        // sent on `won`, the nodes among them that voted for it are raised to that token (so
        // their hold carries the grant's address: renewals and the release name attempt and
        // token). A release that reaches such a node first still removes it (see `release`).
        let (won, token) = tokio::sync::oneshot::channel();
        if !votes.is_empty() {
            let (health, views, req) = (self.health.clone(), views.clone(), req.clone());
            let t = self.call_timeout();
            tokio::spawn(async move {
                let mut late = vec![Ballot::default(); views.len()];
                while let Some((i, answer)) = votes.next().await {
                    if let Ok(v) = answer {
                        late[i] = Ballot::of(&v, false);
                    }
                }
                let Ok(token) = token.await else { return };
                let list = tally::raises(&late, token);
                health.raise(&views, &req, token, &list, t).await;
            });
        }
        let first = count.first;
        let reply = self.conclude(req, &views, count, start).await?;
        if let AcquireReply::Granted { token } = reply {
            let _ = won.send(token);
        }
        Ok((reply, first))
    }

    /// Counts the votes as they come in, until the tally is settled, every vote is in, or
    /// the node timeout passed (the votes still out then count as unknown: their ballots say
    /// "may have granted" already).
    ///
    /// No vote future is ever dropped before it is done: a request whose caller is gone
    /// before it is written is never sent, and a vote that runs late must still run — before
    /// anything sent after it on its connection (the give-back of a failed attempt, a
    /// release), and so that it can be given the token. The caller lets the rest finish.
    async fn count_votes(&self, views: &[View], votes: &mut Votes, count: &mut Count) {
        let deadline = tokio::time::Instant::now() + self.node_timeout();
        // Once settled, the rest cannot change the outcome: they finish in the background, so
        // the slower nodes still get the hold — this attempt's, by its id — and anything given
        // back or released later is queued behind them.
        while !tally::settled(&count.ballots, votes.len()) {
            let Ok(next) = tokio::time::timeout_at(deadline, votes.next()).await else {
                let late: Vec<usize> = (0..views.len()).filter(|&i| count.asked[i]).collect();
                late.into_iter()
                    .for_each(|i| self.vote(count, i, &views[i], None));
                return;
            };
            let Some((i, answer)) = next else { return };
            count.asked[i] = false;
            self.vote(count, i, &views[i], Some(answer));
        }
    }

    /// The round's outcome from its tally: a grant once a majority confirms its token with
    /// validity left (raising the nodes that voted for the attempt under another counter),
    /// or, after what the attempt may hold was given back, `Held` or an error.
    async fn conclude(
        &self,
        req: &AcquireRequest,
        views: &[View],
        count: Count,
        start: Instant,
    ) -> Result<AcquireReply> {
        let ballots = &count.ballots;
        let decision = tally::decide(ballots);
        let (Decision::Again { token } | Decision::Fresh { token }) = decision else {
            // Takes back, in parallel, what the attempt may have been granted: on every node
            // that voted for it or may have (no answer in time). The attempt keeps its place in
            // the nodes' queues; a node that is free afterwards wakes its first waiter only
            // (never the lock's channel: no herd). The request names the attempt, so it can only
            // remove that attempt's holds; a vote still in flight on a node runs before it (one
            // connection per node, in order).
            let (key, nt) = (&req.key, self.node_timeout());
            let ours = ballots.iter().enumerate();
            let ours = ours.filter(|(_, b)| b.granted() || b.maybe_granted);
            join_all(
                ours.filter_map(|(i, _)| views[i].backend.clone())
                    .map(|b| async move {
                        let give_back = b.give_back(&key.name, key.kind, &req.attempt);
                        let _ = tokio::time::timeout(nt, give_back).await;
                    }),
            )
            .await;
            let ttl = match decision {
                Decision::Held { ttl } => ttl,
                Decision::NoQuorum { answered } => {
                    let no_quorum = || self.no_quorum(answered, &count.problems);
                    return Err(count.hard.unwrap_or_else(no_quorum));
                }
                // A split vote: a random pause (0 to the node timeout), so that clients that
                // split the nodes do not collide again.
                _ => {
                    let max = u64::try_from(self.node_timeout().as_micros()).unwrap_or(u64::MAX);
                    Some(Duration::from_micros(fastrand::u64(0..=max)))
                }
            };
            return Ok(AcquireReply::Held { ttl });
        };
        // Again: a retry of an attempt whose grant stands on a majority (its reply was lost):
        // the same token; the votes made every lease run at least `lease` from now. Nodes of
        // the attempt that store another token get this one (for a grant that stands, best
        // effort: a majority has it already).
        let list = tally::raises(ballots, token);
        let raised = self
            .health
            .raise(views, req, token, &list, self.node_timeout());
        let raised = raised.await;
        let confirmed = tally::confirmed(decision, ballots, &raised);
        let q = self.quorum();
        if confirmed >= q && tally::validity(req.lease, start.elapsed()).is_some() {
            return Ok(AcquireReply::Granted { token });
        }
        // Confirmed too late (a raise that did not arrive, or votes so slow that no validity is
        // left). Nobody else holds the lock, so this is not `Held`: a retryable error. The
        // attempt's holds stay (they are addressed to it): its retry finds and confirms them,
        // and an attempt that stops instead is given up by the core, which removes them.
        let (name, took) = (&req.key.name, start.elapsed());
        tracing::debug!(%name, confirmed, q, ?took, "redlock grant not confirmed in time");
        Err(self.unavailable(format!(
            "a majority voted for this attempt on `{name}` but only {confirmed} of the {q} \
                 nodes needed confirmed its token with validity left (after {took:?}; slow \
                 nodes?)"
        )))
    }
}
