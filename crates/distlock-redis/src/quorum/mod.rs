//! One node's part in Redlock (`distlock-redlock`, several independent Redis masters): the
//! single-node steps the quorum logic there is built from, each one round trip, in
//! `scripts/quorum_*.lua` (docs/redlock.md, "Acquire", "Waiting" and "Node health").
//!
//! Every per-node hold is addressed by the attempt id that won it (unique forever), so retried
//! and late requests have the effect of one and never touch another attempt's hold; re-entry
//! is counted in the client (docs/redlock.md, "Safety argument", *Addressing*). The keys, and
//! what a vote and a release are sent: docs/redlock.md, "Design"; an election's (the same
//! layout under `NS:{NAME}:election`, every change of its hold published on its observe
//! channel): docs/election-redlock.md, "Layout".

use crate::error::{shape, KIND};
use crate::inspect::time_ms;
use crate::renew::PER_SCRIPT;
use crate::scripts;
use crate::RedisBackend;
use crate::{family, int, lease_ms};
use distlock_core::backend::{
    AcquireRequest, AttemptId, Capabilities, GrantRef, HoldKey, ReleaseWatch, RenewOutcome,
};
use distlock_core::{ClientOptions, Error, LockKind, ReleaseOutcome, Result};
use redis::Value;

mod replies;
use replies::*;
pub use replies::{NodeHold, QuorumReply, QuorumVote, ServerInfo};
use std::time::Duration;

/// The step of a Redlock vote's clock floor, in µs: 100 ms ([`QUORUM_FLOOR_STEP`]). A literal,
/// so that it can go into the vote script too.
macro_rules! quorum_floor_step_us {
    () => {
        100000
    };
}

/// A Redlock vote floors its token by the node's clock rounded down to this step (100 ms), not
/// by the µs: nodes whose counters agree then hand out the same token (no raise round), as
/// they did before the clock floor; the µs of five clocks never agree. A token is therefore
/// above every earlier one across a node's rollback once the rollback is a step old — which a
/// node that lost its data or restarted is, by its restart quarantine (docs/redlock.md,
/// "Fencing tokens strictly increase").
pub const QUORUM_FLOOR_STEP: Duration = Duration::from_micros(quorum_floor_step_us!());

/// Counters raised per script call ([`RedisNode::raise_fences`]).
const SEED_BATCH: usize = 256;

scripts::script_set! {
    /// The Redlock node's scripts.
    static QUORUM: QuorumScripts {
        // The uncontended vote runs before the prelude functions it does not call are made
        // (a Lua closure per function per call: docs/redis-lock.md, "Costs").
        acquire: concat!(
            "local QUORUM_FLOOR_STEP_US = ",
            quorum_floor_step_us!(),
            "\n",
            scripts::fence_margin_line!(),
            scripts::lua!(
                "fence.lua",
                "quorum_acquire.lua",
                "fence_next.lua",
                "quorum_acquire_wait.lua"
            )
        ),
        raise: scripts::fenced!("quorum_raise.lua"),
        release: scripts::lua!("quorum_release.lua"),
        renew: scripts::lua!("quorum_renew.lua", "quorum_renew_many.lua"),
        epoch: scripts::lua!("quorum_epoch.lua"),
        raise_fences: scripts::fenced!("quorum_raise_fences.lua"),
        proclaim: scripts::lua!("quorum_proclaim.lua"),
    }
}

/// The keys of one Redlock lock or election on a node that a request names (the scripts name
/// the others after the hold's key).
struct QuorumKeys {
    lock: String,
    fence: String,
    /// An election's observe channel (`None`: a lock).
    observe: Option<String>,
}

/// One Redis server as a Redlock node: its connection, scripts and subscriber (those of a
/// [`RedisBackend`], whose operator commands it shares) and the per-node lock protocol above,
/// each step one round trip. `distlock-redlock` is built from these; the quorum logic is there.
///
/// # Errors
/// Every step that reaches the node: [`Error::Connection`] if the node cannot be reached or
/// does not answer within the operation timeout; [`Error::Auth`] if the ACL user may not run
/// it; [`Error::Unsupported`] for a lock kind other than the mutex and the election (other
/// than the election, for [`proclaim`](Self::proclaim)); [`Error::UnexpectedReply`] for a reply
/// of another shape, or the lock's keys (a counter) holding data of another shape.
pub struct RedisNode {
    b: RedisBackend,
    /// `NS:redlock:epoch` and `NS:redlock:horizon` (docs/redlock.md, "Design").
    epoch_key: String,
    horizon_key: String,
}

impl RedisNode {
    /// Connects to the Redis server at `url` as [`RedisBackend::connect`] does (the Redlock
    /// scripts load on demand, or with [`load_scripts`](Self::load_scripts)).
    ///
    /// # Errors
    /// As [`RedisBackend::connect`].
    ///
    /// # Cancel safety
    /// As [`RedisBackend::connect`].
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        let b = RedisBackend::connect(url, opts).await?;
        Ok(RedisNode {
            epoch_key: format!("{}:redlock:epoch", b.namespace),
            horizon_key: format!("{}:redlock:horizon", b.namespace),
            b,
        })
    }

    /// The single-server backend on this node's connection: the operator commands (`list`,
    /// forced release, `doctor`) and the election's `observe`, which a node shares with it.
    pub fn backend(&self) -> &RedisBackend {
        &self.b
    }

    /// A watch for a Redlock waiter that does not queue (`wait=retry`) on this node: the
    /// lock's channel, where a release with nobody queued says `r`; unsubscribed when the last
    /// waiter of this client on it goes.
    ///
    /// # Errors
    /// [`Error::Connection`] if the subscriber cannot connect or subscribe in time.
    pub async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        let channel = self
            .b
            .release_channel(&req.key.name, &family(req.key.kind)?);
        self.b.subscriber.watch(channel, &req.attempt).await
    }

    /// A watch for the queued Redlock waiter `attempt` on this node: its client's wake channel,
    /// which every queue entry of the attempt names ([`vote`](Self::vote)), where the node
    /// tells the attempt alone that it is its turn. With the subscriber connection up this is
    /// a table entry (the channel stays subscribed), made before the attempt's first vote;
    /// otherwise it connects (and subscribes the channel) first.
    ///
    /// # Errors
    /// [`Error::Connection`] if the subscriber cannot connect or subscribe in time.
    pub async fn wake_watch(&self, attempt: &AttemptId) -> Result<Box<dyn ReleaseWatch>> {
        let s = &self.b.subscriber;
        match s.ready(attempt) {
            Some(w) => Ok(w),
            None => s.watch(s.wake().to_owned(), attempt).await,
        }
    }

    /// Redlock's kinds: the mutex and the election (the same message as the core's check of
    /// Redlock's capabilities).
    fn check_kind(kind: LockKind) -> Result<()> {
        Capabilities::kinds(&[LockKind::Mutex])
            .with(LockKind::Election)
            .check("redlock", kind)
    }

    /// The keys of `name` as a Redlock lock or election (`kind` checked).
    fn quorum_keys(&self, name: &str, kind: LockKind) -> Result<QuorumKeys> {
        Self::check_kind(kind)?;
        let election = kind == LockKind::Election;
        let base = family(kind)?.base();
        // Each key in one allocation (built on every request; see `RedisBackend::key_of`).
        let key = |suffix: &str| self.b.key_of(name, &[base, suffix]);
        Ok(QuorumKeys {
            lock: key(""),
            fence: key(":fence"),
            observe: election.then(|| key(":observe")),
        })
    }

    /// Loads the Redlock scripts (one pipelined round trip). They are also loaded on demand.
    ///
    /// # Errors
    /// [`Error::Connection`] if the node cannot be reached; [`Error::Auth`] if the ACL user may
    /// not load scripts.
    ///
    /// # Cancel safety
    /// Cancel safe: loading a script twice does no harm.
    pub async fn load_scripts(&self) -> Result<()> {
        let mut con = self.b.con.get();
        scripts::load(&mut con, &QUORUM.all())
            .await
            .map_err(|e| self.b.err(e))
    }

    /// Runs one quorum script (reloading them on NOSCRIPT); also says whether it had to reload.
    async fn run_quorum(&self, cmd: redis::Cmd) -> Result<(Value, bool)> {
        self.b.eval_in(&QUORUM.all(), &cmd).await
    }

    /// This node's vote on attempt `attempt` of `key` with `lease`, if the node's epoch is
    /// `epoch` (docs/redlock.md, "Acquire", step 1): granted, the same hold, held by another
    /// attempt, or behind the first live waiter of the node's queue; each answer with the
    /// node's fencing counter and restart quarantine. An election's `value` (`None`: empty) is
    /// stored with a fresh grant and told on its observe channel; a lock ignores `value`.
    ///
    /// `queue`: `None` votes as a try; `Some((waiter_ttl, place))` as a waiter at `place` in
    /// the node's queue, alive for `waiter_ttl`, naming this client's wake channel (arm
    /// [`wake_watch`](Self::wake_watch) first; docs/redlock.md, "Waiting", step 3). The entry
    /// is removed by the attempt's release or give-up, never by its grant.
    ///
    /// # Cancel safety
    /// A vote dropped after it was sent may still grant the hold; it is addressed to `attempt`,
    /// so [`give_back`](Self::give_back) (or `give_up`) removes it, and a retry of the same
    /// attempt returns the same hold. A vote without an answer makes the attempt's `give_up`
    /// and `release` here set its end record first, so the vote, should it arrive after them,
    /// is refused (docs/redlock.md, "Ended attempts stay ended"). A queue entry left behind
    /// drops out after `waiter_ttl`, and `give_up` removes it.
    pub async fn vote(
        &self,
        key: &HoldKey,
        attempt: &AttemptId,
        lease: Duration,
        epoch: &str,
        value: Option<&str>,
        queue: Option<(Duration, u64)>,
    ) -> Result<QuorumVote> {
        let k = self.quorum_keys(&key.name, key.kind)?;
        // A waiter's ttl, place and wake channel in one argument (`TTL:PLACE:WAKE`); a try
        // passes none (an election passes it empty, before its value).
        let waiter = queue.map(|(ttl, place)| {
            let place = place.to_string();
            [&*lease_ms(ttl), ":", &place, ":", self.b.subscriber.wake()].concat()
        });
        let lease = lease_ms(lease);
        let mut args = vec![attempt.as_str(), &lease, epoch, &key.owner];
        if let Some(w) = &waiter {
            args.push(w);
        }
        // An election's value; a lock passes none.
        if k.observe.is_some() {
            if waiter.is_none() {
                args.push("");
            }
            args.push(value.unwrap_or(""));
        }
        // The vote is refused to an attempt whose end record exists (see `crate::ended`).
        let ended = self.b.ended_key(&key.name, attempt);
        let sent = self.b.unanswered.sent(attempt);
        let (v, reloaded) = self
            .run_quorum(
                QUORUM
                    .acquire
                    .cmd(&[&k.lock, &ended, &self.epoch_key], &args),
            )
            .await?;
        sent.answered();
        Ok(QuorumVote {
            scripts_reloaded: reloaded,
            ..vote_reply(&v)?
        })
    }

    /// Raises this node's fencing counter of `name` (a lock or an election, by `kind`) to at
    /// least `token` and records `token` with the hold of `attempt` — only where that attempt
    /// still holds the lock. Returns the counter afterwards (`>= token`), or `None` if the
    /// attempt does not hold the lock here (nothing changed). An election's observers are told
    /// when the hold's token changed.
    ///
    /// # Cancel safety
    /// Dropping it may leave the counter raised or not; it only ever raises, so calling it
    /// again has the effect of one call.
    pub async fn raise_fence(
        &self,
        name: &str,
        kind: LockKind,
        attempt: &AttemptId,
        token: u64,
    ) -> Result<Option<u64>> {
        let k = self.quorum_keys(name, kind)?;
        let token = token.to_string();
        let mut args = vec![attempt.as_str(), &token];
        args.extend(k.observe.as_deref());
        let (v, _) = self
            .run_quorum(QUORUM.raise.cmd(&[&k.lock, &k.fence], &args))
            .await?;
        match crate::pair("raise fence", &v)? {
            (1, c) if c >= 0 => Ok(Some(c as u64)),
            (0, _) => Ok(None),
            _ => Err(shape("raise fence", &v)),
        }
    }

    /// Deletes this node's hold of `attempt` on `name` (a lock or an election, by `kind`; an
    /// election's observers are told) if it has token `token` (`None`: whatever token), and
    /// only that one: a grant's release. The attempt also leaves the node's wait queue, and a
    /// lock left free here wakes its first live waiter (docs/redlock.md, "Waiting", step 6).
    /// `Ok(Released)` if it was held here, `Ok(Expired)` if nothing is, `Ok(TakenByOther)` if
    /// another attempt holds it; `Err(stored)` if this attempt holds it here with another
    /// token (nothing changed).
    ///
    /// # Cancel safety
    /// Dropping it may leave the hold removed or not; calling it again has the effect of one
    /// call (it touches only `attempt`'s hold and queue entry).
    pub async fn release(
        &self,
        name: &str,
        kind: LockKind,
        attempt: &AttemptId,
        token: Option<u64>,
    ) -> Result<std::result::Result<ReleaseOutcome, u64>> {
        self.drop_hold(name, kind, attempt, token, "release").await
    }

    /// Gives back whatever `attempt` holds on this node, quietly for the queue: the attempt
    /// keeps its place (the minority grants of a round that failed). The first live waiter is
    /// woken if it is another attempt and the lock is free here afterwards. Outcomes as
    /// [`RedisNode::release`] with no token.
    ///
    /// # Cancel safety
    /// As [`RedisNode::release`].
    pub async fn give_back(
        &self,
        name: &str,
        kind: LockKind,
        attempt: &AttemptId,
    ) -> Result<std::result::Result<ReleaseOutcome, u64>> {
        self.drop_hold(name, kind, attempt, None, "giveback").await
    }

    /// The attempt stops: it leaves this node's wait queue and gives back whatever it holds
    /// here; the next waiter is woken if the lock is free here afterwards. Idempotent. If a
    /// vote of the attempt is still unanswered here, its end record is set first (same round
    /// trip): no vote of it holds or queues here afterwards (as with `release`).
    /// Outcomes as [`RedisNode::release`] with no token.
    ///
    /// # Cancel safety
    /// As [`RedisNode::release`].
    pub async fn give_up(
        &self,
        name: &str,
        kind: LockKind,
        attempt: &AttemptId,
    ) -> Result<std::result::Result<ReleaseOutcome, u64>> {
        self.drop_hold(name, kind, attempt, None, "giveup").await
    }

    async fn drop_hold(
        &self,
        name: &str,
        kind: LockKind,
        attempt: &AttemptId,
        token: Option<u64>,
        mode: &str,
    ) -> Result<std::result::Result<ReleaseOutcome, u64>> {
        let k = self.quorum_keys(name, kind)?;
        let token = token.map(|t| t.to_string()).unwrap_or_default();
        let mut args = vec![attempt.as_str(), &token];
        // A grant's release passes no mode (the script's default); an election's observe
        // channel comes after the mode.
        if mode != "release" || k.observe.is_some() {
            args.push(mode);
        }
        args.extend(k.observe.as_deref());
        let s = &*QUORUM;
        let cmd = s.release.cmd(&[&k.lock], &args);
        // A release or a give-up ends the attempt on this node: its end record first, if a
        // vote of it may still arrive here (a give-back keeps the attempt going).
        let record = match mode {
            "giveback" => None,
            _ => (self.b).end_record(attempt, || Ok(self.b.ended_key(name, attempt)))?,
        };
        let (v, _) = (self.b.eval_ending(&s.all(), &cmd, record.as_ref(), None)).await?;
        release_reply(&v)
    }

    /// An election leader's numbered proclamation on this node (`quorum_proclaim.lua`):
    /// stores `value` with the hold of `grant`'s attempt if `seq` is above the number stored
    /// (so a retry or a late duplicate changes nothing) and tells the observe channel.
    /// `Renewed` if the grant (attempt and token) holds it here, `NotHeld` if not (also a
    /// hold of the attempt under another token: the quorum's token has not reached this node
    /// yet; nothing is changed there).
    ///
    /// # Cancel safety
    /// Dropping it may leave the value stored or not; a retry with the same `seq` has the
    /// effect of one call.
    pub async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        if grant.key.kind != LockKind::Election {
            return Err(Error::unsupported("redlock", "proclaim on a lock"));
        }
        let k = self.quorum_keys(&grant.key.name, grant.key.kind)?;
        let observe = k.observe.unwrap_or_default();
        let (token, seq) = (grant.token.to_string(), seq.to_string());
        let (v, _) = self
            .run_quorum(QUORUM.proclaim.cmd(
                &[&k.lock],
                &[grant.attempt.as_str(), &token, &seq, value, &observe],
            ))
            .await?;
        crate::proclaimed("quorum proclaim", &v)
    }

    /// Renews each grant's hold on this node, never shortening a lease, in one pipelined round
    /// trip (docs/redlock.md, "Renew, release, give up, inspect"). Per grant: `Ok(Renewed)`,
    /// `Ok(NotHeld)` if its attempt does not hold the lock here, or `Err(stored)` if its
    /// attempt holds it here with another token (nothing changed; the others are renewed).
    ///
    /// # Cancel safety
    /// Dropping it may leave some leases extended; a renewal never shortens a lease, so
    /// calling it again has the effect of one call.
    pub async fn renew(
        &self,
        holds: &[(GrantRef, Duration)],
    ) -> Result<Vec<std::result::Result<RenewOutcome, u64>>> {
        if holds.is_empty() {
            return Ok(Vec::new());
        }
        let s = &*QUORUM;
        let mut pipe = redis::pipe();
        for chunk in holds.chunks(PER_SCRIPT) {
            let mut cmd = s.renew.head(1 + chunk.len());
            cmd.arg(&self.horizon_key);
            for (g, _) in chunk {
                Self::check_kind(g.key.kind)?;
                cmd.arg(self.b.key_of(&g.key.name, &[family(g.key.kind)?.base()]));
            }
            for (g, lease) in chunk {
                cmd.arg(g.attempt.as_str())
                    .arg(g.token)
                    .arg(lease_ms(*lease));
            }
            pipe.add_command(cmd);
        }
        let vals = self.b.eval_pipe(&s.all(), &pipe).await?;
        let scripts = holds.len().div_ceil(PER_SCRIPT);
        if vals.len() != scripts {
            let why = format!("quorum renew: {} replies to {scripts} scripts", vals.len());
            return Err(Error::unexpected(KIND, why));
        }
        let mut out = Vec::with_capacity(holds.len());
        for (v, chunk) in vals.iter().zip(holds.chunks(PER_SCRIPT)) {
            out.extend(renew_reply(v, chunk.len())?);
        }
        Ok(out)
    }

    /// This node's view of the Redlock lock or election `name` (by `kind`): its hold, if any
    /// (a hash of another shape, foreign data, is a hold with an empty attempt id), with the
    /// token stored with it (and an election's value and proclamation number), and the node's
    /// fencing counter. One round trip.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn hold(&self, name: &str, kind: LockKind) -> Result<(Option<NodeHold>, u64)> {
        let k = self.quorum_keys(name, kind)?;
        let (lock, election) = (k.lock, k.observe.is_some());
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL").arg(&lock).cmd("PTTL").arg(&lock);
        let (fields, pttl, fence): (Value, i64, Option<String>) =
            self.b.query_pipe(pipe.cmd("GET").arg(&k.fence)).await?;
        let fields: Vec<(String, String)> = redis::from_redis_value(fields.clone())
            .map_err(|_| shape("inspect holders", &fields))?;
        let get = |f: &str| fields.iter().find(|(k, _)| k == f).map(|(_, v)| v.clone());
        let hold = (!fields.is_empty()).then(|| NodeHold {
            attempt: get("attempt").unwrap_or_default(),
            owner: get("owner").unwrap_or_default(),
            token: get("token").and_then(|t| t.parse().ok()),
            lease_left: crate::inspect::ms(pttl),
            // An election's value (empty if none) and its number (0 if none or foreign).
            value: election.then(|| {
                let seq = get("seq").and_then(|s| s.parse().ok()).unwrap_or(0);
                (get("value").unwrap_or_default(), seq)
            }),
        });
        Ok((hold, self.b.counter(name, fence)?))
    }

    /// The server's run id, uptime and clock, and the node epoch if it exists, in one round
    /// trip.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn node_epoch(&self) -> Result<(ServerInfo, Option<String>)> {
        let mut pipe = redis::pipe();
        pipe.cmd("INFO")
            .arg("server")
            .cmd("GET")
            .arg(&self.epoch_key);
        let (text, epoch, (secs, micros)): (String, Option<String>, (String, String)) =
            self.b.query_pipe(pipe.cmd("TIME")).await?;
        let now_ms = time_ms(&secs, &micros)
            .ok_or_else(|| Error::unexpected(KIND, format!("TIME answered `{secs} {micros}`")))?;
        Ok((parse_info(&text, now_ms)?, epoch))
    }

    /// How much longer the longest lease granted or renewed on this node may still run
    /// (`None`: none may).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn lease_horizon(&self) -> Result<Option<Duration>> {
        let pttl = self
            .b
            .query(redis::cmd("PTTL").arg(&self.horizon_key))
            .await?;
        Ok(positive_ms(pttl))
    }

    /// Creates the node epoch `PREFIX:UNTIL_MS:RUN_ID` unless it exists, its quarantine ending
    /// `quarantine` after now by the server's clock, provided the server process still has run
    /// id `run_id` (docs/redlock.md, "Node health: epochs, quarantine on the node"). Returns
    /// `Ok((epoch, server time in ms))` with the epoch now in place (ours or an earlier one),
    /// or `Err(run_id)` with the run id the server has now.
    ///
    /// # Cancel safety
    /// Dropping it may leave the epoch created; calling it again returns the epoch in place
    /// (an existing epoch is never replaced).
    pub async fn create_epoch(
        &self,
        prefix: &str,
        run_id: &str,
        quarantine: Duration,
    ) -> Result<std::result::Result<(String, u64), String>> {
        let ek = &self.epoch_key;
        let q = quarantine.as_millis().to_string();
        let (v, _) = self
            .run_quorum(QUORUM.epoch.cmd(&[ek], &["create", prefix, run_id, &q]))
            .await?;
        let bad = || shape("create epoch", &v);
        let Value::Array(items) = &v else {
            return Err(bad());
        };
        let text =
            |v: &Value| -> Result<String> { redis::from_redis_value(v.clone()).map_err(|_| bad()) };
        match items.as_slice() {
            [ok, current, now] if int(ok) == Some(1) => match text(current)? {
                current if current.is_empty() => Err(bad()),
                current => Ok(Ok((current, uint("create epoch", now)?))),
            },
            [ok, current] if int(ok) == Some(0) => Ok(Err(text(current)?)),
            _ => Err(bad()),
        }
    }

    /// Deletes the node epoch if it still has `value` (its process restarted since it was
    /// created, so it must be initialised again).
    ///
    /// # Cancel safety
    /// Dropping it may leave the epoch deleted or not; calling it again has the effect of
    /// one call (it deletes only the epoch with `value`).
    pub async fn drop_epoch(&self, value: &str) -> Result<()> {
        let ek = &self.epoch_key;
        self.run_quorum(QUORUM.epoch.cmd(&[ek], &["drop", value, "", "0"]))
            .await
            .map(|_| ())
    }

    /// Raises this node's fencing counters (`(name, kind, value)`: a Redlock lock's or an
    /// election's counter of `name`) to at least the given values (never lowers one), each
    /// living [`FENCE_MARGIN`](crate::FENCE_MARGIN) from now; a forced release raises every
    /// node past every token it saw. Returns how many were raised.
    ///
    /// # Cancel safety
    /// Dropping it may leave some batches raised; it only ever raises a counter, so calling it
    /// again has the effect of one call.
    pub async fn raise_fences(&self, counters: &[(String, LockKind, u64)]) -> Result<u64> {
        let s = &*QUORUM;
        let mut raised = 0;
        for batch in counters.chunks(SEED_BATCH) {
            let mut cmd = s.raise_fences.head(batch.len());
            for (name, kind, _) in batch {
                cmd.arg(self.quorum_keys(name, *kind)?.fence);
            }
            for (_, _, value) in batch {
                cmd.arg(*value);
            }
            let (v, _) = self.run_quorum(cmd).await?;
            raised += uint("raise fences", &v)?;
        }
        Ok(raised)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::glob_escape;

    #[test]
    fn info_and_glob() {
        let info = parse_info("# Server\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n", 7).unwrap();
        assert_eq!(info.run_id, "abc123");
        assert_eq!(info.uptime, Duration::from_secs(42));
        assert_eq!(info.now_ms, 7);
        assert!(parse_info("uptime_in_seconds:1\r\n", 0).is_err());
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(time_ms("1700000000", "123456"), Some(1_700_000_000_123));
        assert_eq!(positive_ms(0), None);
        assert_eq!(positive_ms(-2), None);
    }

    #[test]
    fn vote_and_release_replies() {
        let arr = |n: &[i64]| Value::Array(n.iter().map(|i| Value::Int(*i)).collect());
        // The uncontended grant: the counter alone (no quarantine, not first).
        let counter = 1_700_000_000_100_000;
        let v = vote_reply(&Value::Int(counter as i64)).unwrap();
        assert_eq!(v, QuorumVote::new(QuorumReply::Granted { counter }));
        // A grant in quarantine, first in the queue: the table.
        let v = vote_reply(&arr(&[1, 9, 9, 250, 1])).unwrap();
        assert_eq!(v.reply, QuorumReply::Granted { counter: 9 });
        assert_eq!(v.quarantine, Some(Duration::from_millis(250)));
        assert!(v.first);
        for (v, want) in [
            (Value::Int(-1), QuorumReply::EpochMismatch),
            (
                arr(&[2, 9, 7, 0, 0]),
                QuorumReply::Holds {
                    counter: 9,
                    token: 7,
                },
            ),
            (
                arr(&[0, 9, -1, 0, 0]),
                QuorumReply::Held {
                    counter: 9,
                    ttl: None,
                },
            ),
            (arr(&[3, 9, 0, 0, 0]), QuorumReply::Behind { counter: 9 }),
        ] {
            assert_eq!(vote_reply(&v).unwrap().reply, want, "{v:?}");
        }
        // Nothing else: a zero, other integers, short or foreign tables.
        let mut foreign = arr(&[0, 0, 0, 0, 0]);
        if let Value::Array(items) = &mut foreign {
            items[1] = Value::Nil;
        }
        for bad in [
            Value::Int(0),
            Value::Int(-2),
            arr(&[1, 0, 0, 0, 0]),
            arr(&[0, 9, 1]),
            foreign,
            Value::Nil,
        ] {
            assert!(vote_reply(&bad).is_err(), "{bad:?}");
        }
        for (n, want) in [
            (1, Ok(ReleaseOutcome::Released)),
            (0, Ok(ReleaseOutcome::Expired)),
            (3, Ok(ReleaseOutcome::TakenByOther)),
            (-8, Err(7)),
            (-1, Err(0)),
        ] {
            assert_eq!(release_reply(&Value::Int(n)).unwrap(), want, "{n}");
        }
        assert!(release_reply(&Value::Int(2)).is_err());
        assert!(release_reply(&arr(&[1, 0])).is_err());
    }

    #[test]
    fn renew_replies() {
        let reply = |flags: &str, tokens: &[i64]| {
            let mut v = vec![Value::BulkString(flags.as_bytes().to_vec())];
            v.extend(tokens.iter().map(|t| Value::Int(*t)));
            Value::Array(v)
        };
        let got = renew_reply(&reply("1020", &[7]), 4).unwrap();
        assert_eq!(
            got,
            vec![
                Ok(RenewOutcome::Renewed),
                Ok(RenewOutcome::NotHeld),
                Err(7),
                Ok(RenewOutcome::NotHeld)
            ]
        );
        // Wrong count of flags or tokens, an unknown flag, another shape: refused.
        assert!(renew_reply(&reply("10", &[]), 3).is_err());
        assert!(renew_reply(&reply("12", &[]), 2).is_err());
        assert!(renew_reply(&reply("11", &[3]), 2).is_err());
        assert!(renew_reply(&reply("1x", &[]), 2).is_err());
        assert!(renew_reply(&Value::Int(1), 1).is_err());
    }
}
