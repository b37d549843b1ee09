//! The backend's protocol methods: the vote (`crate::acquire`), waiting for a release, giving an
//! attempt up, releasing and renewing a grant, and inspecting a lock; each asks every node and
//! returns as soon as a majority decided.

use crate::node::View;
use crate::{ops, tally, watch, RedlockBackend, KIND};
use distlock_core::backend::{
    async_trait, AcquireReply, AcquireRequest, Capabilities, GrantRef, Granted, ReleaseWatch,
    RenewOutcome,
};
use distlock_core::{Backend, Error, LockInfo, LockKind, ReleaseOutcome, Result};
use distlock_redis::RedisNode;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// One node's answer in a fan-out: `(node, None)` for a timeout, `(node, Some(result))`.
type Answer<'a, T> = Pin<Box<dyn Future<Output = (usize, Option<Result<T>>)> + Send + 'a>>;
pub(crate) type Answers<'a, T> = FuturesUnordered<Answer<'a, T>>;

/// Lets the requests still running finish in a task of their own.
fn finish_in_background<T: Send + 'static>(mut rest: Answers<'static, T>) {
    if !rest.is_empty() {
        tokio::spawn(async move { while rest.next().await.is_some() {} });
    }
}

impl RedlockBackend {
    /// Runs `op` on every connected node of `views`, each bounded by `t`, polled by the caller
    /// as they finish: `(node, None)` for a timeout, `(node, Some(result))` otherwise. A caller
    /// that has its majority hands the rest to [`finish_in_background`], so a slow node's
    /// request still completes (in order on its connection) without keeping the caller waiting.
    pub(crate) fn fan_out<'a, T, Fut>(
        &self,
        views: &[View],
        t: Duration,
        op: impl Fn(Arc<RedisNode>) -> Fut,
    ) -> Answers<'a, T>
    where
        Fut: Future<Output = Result<T>> + Send + 'a,
    {
        let answers = views.iter().enumerate().filter_map(|(i, v)| {
            let fut = op(v.backend.clone()?);
            let answer = async move { (i, tokio::time::timeout(t, fut).await.ok()) };
            Some(Box::pin(answer) as Answer<'a, T>)
        });
        answers.collect()
    }

    /// `watch` on every reachable node, each bounded by the watch timeout, merged (see
    /// [`watch::QuorumWatch`]): a release watch, wake-ups spread by a random pause of up to
    /// `spread`; or election `election`'s observe watch, which needs a majority of
    /// subscriptions. Too few subscriptions are a retryable error.
    pub(crate) async fn quorum_watch<'a, Fut>(
        &self,
        election: Option<&str>,
        spread: Duration,
        watch: impl Fn(Arc<RedisNode>) -> Fut,
    ) -> Result<Box<dyn ReleaseWatch>>
    where
        Fut: Future<Output = Result<Box<dyn ReleaseWatch>>> + Send + 'a,
    {
        let (n, q) = (self.node_count(), self.quorum());
        let answers = self.fan_out(&self.health.views(), self.watch_timeout(), watch);
        let got: Vec<_> = answers
            .filter_map(|(_, w)| async { w?.ok() })
            .collect()
            .await;
        let all = got.len();
        let (need, wake, keep) = match election {
            Some(_) => (q, 1, q),
            None => (1, tally::wake_threshold(n, all), all),
        };
        if all < need {
            let what = election.map_or("release messages".into(), |e| format!("election `{e}`"));
            return Err(self.unavailable(format!(
                "could subscribe to {what} on only {all} of {n} redlock nodes (need {need})"
            )));
        }
        Ok(Box::new(watch::QuorumWatch::new(got, wake, keep, spread)))
    }

    /// The nodes' answers as they come in (`None`: none), until `done` says those in decide,
    /// every node answered, or `budget` (if given) passed; and the problems seen.
    async fn gather<T>(
        &self,
        answers: &mut Answers<'_, T>,
        budget: Option<Duration>,
        done: impl Fn(&[Option<T>]) -> bool,
    ) -> (Vec<Option<T>>, Vec<String>) {
        let mut outs: Vec<Option<T>> = (0..self.node_count()).map(|_| None).collect();
        let mut problems = Vec::new();
        let until = budget.map(|b| tokio::time::Instant::now() + b);
        while !done(&outs) {
            let next = match until {
                Some(u) => tokio::time::timeout_at(u, answers.next()).await,
                None => Ok(answers.next().await),
            };
            let Ok(Some((i, r))) = next else {
                if let (Err(_), Some(b)) = (next, budget) {
                    problems.push(format!("the other nodes: no answer within {b:?}"));
                }
                break;
            };
            let node = &self.health.nodes[i];
            let problem = match r {
                Some(Ok(v)) => {
                    outs[i] = Some(v);
                    continue;
                }
                // A retryable error also makes the node suspect.
                Some(Err(e)) if e.is_retryable() => {
                    node.suspect(format!("an error ({e})"));
                    e.to_string()
                }
                Some(Err(e)) => e.to_string(),
                None => format!("no answer within {:?}", self.call_timeout()),
            };
            problems.push(format!("{}: {problem}", node.endpoint));
        }
        (outs, problems)
    }

    /// Why each connected node of `views` that does not count does not, for messages.
    fn uncounted<'v>(&'v self, views: &'v [View]) -> impl Iterator<Item = String> + 'v {
        views.iter().zip(&self.health.nodes).filter_map(|(v, n)| {
            let why = v.why_not.as_ref().filter(|_| v.backend.is_some());
            why.map(|w| format!("{}: {w}", n.endpoint))
        })
    }
}

#[async_trait]
impl Backend for RedlockBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.health.cfg.endpoint.clone()
    }

    /// The mutex and the election (`docs/election-redlock.md`): the core refuses every other
    /// kind before it calls the backend.
    fn capabilities(&self) -> Capabilities {
        Capabilities::kinds(&[LockKind::Mutex]).with(LockKind::Election)
    }

    /// One attempt on every node in parallel; see the crate docs. "Held by another owner" is
    /// `Ok(Held)`; "fewer than a majority of nodes answered" is [`Error::Connection`].
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        Ok(self.round(req, None).await?.0)
    }

    /// Subscribes to the lock's channel on every reachable node, merged, wake-ups spread by a
    /// random pause (waiters that do not queue: `wait=retry`).
    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        let watch = |b: Arc<RedisNode>| async move { b.watch(req).await };
        self.quorum_watch(None, self.node_timeout(), watch).await
    }

    /// Waits in the nodes' wait queues, woken by the nodes where this waiter is first (see
    /// `docs/redlock.md`, "Waiting"); with `wait=retry` in the URL, the core's retry loop
    /// instead.
    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<std::time::Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        if self.health.cfg.queue {
            self.queued_wait(req, deadline, cancel).await
        } else {
            distlock_core::wait::watch_and_retry(self, req, deadline, cancel).await
        }
    }

    /// Takes the attempt out of every node's wait queue and releases whatever it holds on any
    /// node (a grant whose reply was lost, or votes that finished after the attempt stopped);
    /// a node left free wakes its next waiter. Idempotent; only that attempt's holds and queue
    /// entries are touched.
    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        let (name, kind, attempt) = (&req.key.name, req.key.kind, &req.attempt);
        let (views, t) = (self.health.views(), self.call_timeout());
        let mut answers = self.fan_out(&views, t, |b| async move {
            b.give_up(name, kind, attempt).await
        });
        let (outs, problems) = self.gather(&mut answers, None, |_| false).await;
        let answered = outs.iter().flatten().count();
        // Fewer than a majority reached: a grant this attempt may have got could still stand
        // (until its lease ends); say so.
        if answered < self.quorum() {
            return Err(self.no_quorum(answered, &problems));
        }
        Ok(())
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        let t = self.call_timeout();
        // The verdict, once a majority released this grant or not: see `release_node`.
        let (verdict, decided) = tokio::sync::watch::channel(None);
        let views = self.health.views();
        let mut answers = self.fan_out(&views, t, |b| {
            release_node(b, grant.clone(), t, decided.clone())
        });
        drop(decided);
        let released = |o: &[_]| tally::release_outcome(o) == Ok(ReleaseOutcome::Released);
        let (outcomes, problems) = self.gather(&mut answers, None, released).await;
        verdict.send_replace(Some(vec![released(&outcomes)]));
        // The slower nodes' releases are on their connections already: they finish in order.
        finish_in_background(answers);
        tally::release_outcome(&outcomes).map_err(|answered| self.no_quorum(answered, &problems))
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        if holds.is_empty() {
            return Ok(Vec::new());
        }
        holds.iter().for_each(|(_, l)| self.health.note_lease(*l));
        let t = self.call_timeout();
        // Set to which grants a majority renewed: see `renew_node`.
        let (verdict, decided) = tokio::sync::watch::channel(None);
        let views = self.health.views();
        let mut answers = self.fan_out(&views, t, |b| {
            renew_node(b, holds.to_vec(), t, decided.clone())
        });
        drop(decided);
        // A batch stops waiting before the watchdog drops the call, with what the nodes decided
        // by then: a silent node must not leave the holds the others decided unconfirmed. (One
        // hold, an `extend`, has nothing to keep apart: it waits for its nodes as any call.)
        let budget = (holds.len() > 1).then(|| self.health.opts.renew_timeout() * 3 / 4);
        let counts: Vec<bool> = views.iter().map(|v| v.counts).collect();
        let decided = |o: &[_]| {
            tally::renew_outcomes(&counts, o, holds.len())
                .iter()
                .all(Option::is_some)
        };
        let (per_node, mut problems) = self.gather(&mut answers, budget, decided).await;
        let outcomes = tally::renew_outcomes(&counts, &per_node, holds.len());
        let renewed = outcomes.iter().map(|o| *o == Some(RenewOutcome::Renewed));
        verdict.send_replace(Some(renewed.collect()));
        finish_in_background(answers);
        let (outcomes, undecided) = tally::renew_batch(&outcomes);
        if undecided.is_empty() {
            return Ok(outcomes);
        }
        problems.extend(self.uncounted(&views));
        let names = undecided
            .iter()
            .map(|&h| format!("`{}`", holds[h].0.key.name));
        let names = names.collect::<Vec<_>>().join(", ");
        let (q, n, problems) = (self.quorum(), self.node_count(), problems.join("; "));
        let err = self.unavailable(format!(
            "the renewal of {names} was neither confirmed nor refused by a majority ({q} of {n} nodes needed): {problems}"
        ));
        if undecided.len() == holds.len() {
            return Err(err);
        }
        // The holds a majority decided get their outcomes; only the undecided ones are
        // unconfirmed (retried by the watchdog, lost at their lease end if never confirmed).
        tracing::warn!(backend = KIND, error = %err, "some renewals of the batch were not decided; the others went on; retrying soon, a lock is lost if its lease runs out first");
        Ok(outcomes)
    }

    /// The lock or election as a majority of nodes sees it (the core checked the kind).
    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        ops::merged(self, name, kind, self.watch_timeout(), false).await
    }

    /// An election leader's numbered proclamation on every node: `Renewed` once a majority
    /// of counted nodes stored it (or had it: a retry), `NotHeld` once a majority says the
    /// grant is gone; a retryable error when neither is decided.
    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        let (grant2, value2): (GrantRef, Arc<str>) = (grant.clone(), Arc::from(value));
        let (views, t) = (self.health.views(), self.call_timeout());
        let mut answers = self.fan_out(&views, t, |b| {
            let (grant, value) = (grant2.clone(), value2.clone());
            async move { b.proclaim(&grant, seq, &value).await }
        });
        let q = self.quorum();
        // How many counted nodes stored the proclamation (`true`), or said the grant is gone.
        let counted = |outs: &[Option<RenewOutcome>], renewed: bool| {
            let outs = outs.iter().zip(&views).filter(|(_, v)| v.counts);
            let outs = outs.filter_map(|(o, _)| *o);
            outs.filter(|o| (*o == RenewOutcome::Renewed) == renewed)
                .count()
        };
        let decided = |o: &[_]| counted(o, true) >= q || counted(o, false) >= q;
        let (outs, mut problems) = self.gather(&mut answers, None, decided).await;
        finish_in_background(answers);
        let (renewed, gone) = (counted(&outs, true), counted(&outs, false));
        if renewed >= q || gone >= q {
            return Ok([RenewOutcome::NotHeld, RenewOutcome::Renewed][usize::from(renewed >= q)]);
        }
        problems.extend(self.uncounted(&views));
        let (name, n, problems) = (&grant.key.name, self.node_count(), problems.join("; "));
        Err(self.unavailable(format!(
            "the proclamation on `{name}` was neither confirmed nor refused by a majority \
             ({renewed} confirmed, {gone} refused, {q} of {n} nodes needed): {problems}"
        )))
    }

    /// Subscribes to election `name`'s observe channel on every reachable node (at least a
    /// majority, else a retryable error); see `watch::QuorumWatch`.
    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        let observe = |b: Arc<RedisNode>| async move { Backend::observe(b.backend(), name).await };
        self.quorum_watch(Some(name), Duration::ZERO, observe).await
    }

    fn operator(&self) -> Option<&dyn distlock_core::Operator> {
        Some(self)
    }
}

/// The majority's verdict per hold of a release or renewal (whether a majority released or
/// renewed it), once the call has it; the call drops the sender when it returns.
type Verdict = tokio::sync::watch::Receiver<Option<Vec<bool>>>;

/// The verdict `decided` carries, if within `t` (it ends as soon as the call does).
async fn verdict(mut decided: Verdict, t: Duration) -> Option<Vec<bool>> {
    let v = tokio::time::timeout(t, decided.wait_for(Option::is_some)).await;
    v.ok()?.ok()?.clone()
}

/// Node `b`'s release of `grant`. A hold of the grant's attempt under another token here (its
/// vote came in after the decision, before the raise reached it) is part of this very grant —
/// attempt ids are unique —: it counts as nothing to release for the majority, and is
/// released too once `decided` says a majority released the grant.
async fn release_node(
    b: Arc<RedisNode>,
    grant: GrantRef,
    t: Duration,
    decided: Verdict,
) -> Result<ReleaseOutcome> {
    let (name, kind, attempt) = (&grant.key.name, grant.key.kind, &grant.attempt);
    if let Ok(o) = b.release(name, kind, attempt, Some(grant.token)).await? {
        return Ok(o);
    }
    tokio::spawn(async move {
        if verdict(decided, t).await == Some(vec![true]) {
            let (name, kind, attempt) = (&grant.key.name, grant.key.kind, &grant.attempt);
            let _ = tokio::time::timeout(t, b.release(name, kind, attempt, None)).await;
        }
    });
    // Not this grant's address here (yet): as far as the majority goes, nothing to release.
    Ok(ReleaseOutcome::Expired)
}

/// Node `b`'s renewal of `holds`, as the majority counts it. A hold of a grant's attempt under
/// another token here is `NotHeld` for the majority, and part of that very grant (as in
/// [`release_node`]): once `decided` says a majority renewed the grant, it rejoins: raised to
/// its grant's token, then renewed with the others that rejoin (one script).
async fn renew_node(
    b: Arc<RedisNode>,
    holds: Vec<(GrantRef, Duration)>,
    t: Duration,
    decided: Verdict,
) -> Result<Vec<RenewOutcome>> {
    let outs = b.renew(&holds).await?;
    if outs.len() != holds.len() {
        return Err(Error::unexpected(KIND, "renewed a batch of the wrong size"));
    }
    let behind: Vec<usize> = (0..outs.len()).filter(|&h| outs[h].is_err()).collect();
    if !behind.is_empty() {
        tokio::spawn(async move {
            let Some(renewed) = verdict(decided, t).await else {
                return;
            };
            let mut rejoined = Vec::new();
            for h in behind
                .into_iter()
                .filter(|&h| renewed.get(h) == Some(&true))
            {
                let (g, _) = &holds[h];
                let raised = b.raise_fence(&g.key.name, g.key.kind, &g.attempt, g.token);
                if let Ok(Ok(Some(_))) = tokio::time::timeout(t, raised).await {
                    rejoined.push(holds[h].clone());
                }
            }
            if !rejoined.is_empty() {
                let _ = tokio::time::timeout(t, b.renew(&rejoined)).await;
            }
        });
    }
    Ok(outs
        .into_iter()
        .map(|o| o.unwrap_or(RenewOutcome::NotHeld))
        .collect())
}
