//! Lease mode (`?mode=lease`): a lease table, one row per lock name, server time for expiry;
//! docs/postgres.md (*Lease mode in detail*) has the protocol in full.
//!
//! Every operation is one autocommit statement on a shared connection (PgBouncer's
//! transaction pooling is fine). A grant is the row's (`attempt`, `token`): a retry of the
//! attempt that holds the row gets the same token and only ever extends the lease; renewals
//! and releases name attempt *and* token, so a late statement of an old grant never touches a
//! newer one. A new token is above the sequence, the row's last token and the server clock in
//! µs. An attempt with an unanswered request is recorded in its row's `ended` when it ends
//! ([`END`]), so a late copy of its acquire never grants it ([`distlock_sql::ended`]).
//! Elections have rows of their own (`dlock_lease_elections`).

use crate::common::params;
use crate::common::{
    channel, cols, election_key, key_of, lease_left, one, token_i64, token_u64, Common,
};
use crate::error::{shape, KIND};
use crate::listen::Listener;
use distlock_core::async_trait;
use distlock_core::backend::{Backend, Capabilities};
use distlock_core::{
    AcquireReply, AcquireRequest, AttemptId, GrantRef, HolderInfo, LockInfo, LockKind,
    ReleaseOutcome, ReleaseWatch, RenewOutcome, Result,
};
use distlock_sql::ended::{Unanswered, ENDED_KEEP, ENDED_MAX_PER_LOCK};
use distlock_sql::lease::millis_f64;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

pub(crate) const DDL: &str = concat!(
    include_str!("../sql/lease_schema.sql"),
    include_str!("../sql/lease_election_schema.sql")
);

pub(crate) const TABLES: &[&str] = &["dlock_fence_seq", "dlock_leases", "dlock_lease_elections"];

/// Columns this version needs (a table of an older version lacks them: the DDL adds them).
pub(crate) const COLUMNS: &[(&str, &str)] = &[
    ("dlock_leases", "attempt"),
    ("dlock_leases", "ended"),
    ("dlock_lease_elections", "ended"),
];

// The statements; each file's header says what it does and its parameters. A grant draws its
// token on the locked, latest row version and checks the row's `ended` on that same version
// (docs/postgres.md, *Lease mode in detail*, says why). The election statements are the
// lock's, on `dlock_lease_elections`.
const ACQUIRE: &str = include_str!("../sql/lease_acquire.sql");
const RELEASE: &str = include_str!("../sql/lease_release.sql");
const END: &str = include_str!("../sql/lease_end.sql");
const RENEW: &str = include_str!("../sql/lease_renew.sql");
const INSPECT: &str = include_str!("../sql/lease_inspect.sql");
const ELECTION_ACQUIRE: &str = include_str!("../sql/lease_election_acquire.sql");
const ELECTION_RELEASE: &str = include_str!("../sql/lease_election_release.sql");
const ELECTION_END: &str = include_str!("../sql/lease_election_end.sql");
const ELECTION_RENEW: &str = include_str!("../sql/lease_election_renew.sql");
const ELECTION_INSPECT: &str = include_str!("../sql/lease_election_inspect.sql");
const ELECTION_PROCLAIM: &str = include_str!("../sql/lease_election_proclaim.sql");

pub(crate) struct LeaseMode {
    common: Arc<Common>,
    listener: Arc<Listener>,
    /// Attempts with a request that got no answer: their end is recorded in their row.
    unanswered: Unanswered,
}

/// Lease mode does mutexes and elections.
pub(crate) fn capabilities() -> Capabilities {
    Capabilities::kinds(&[LockKind::Mutex, LockKind::Election]).note(
        "lease mode does mutexes and elections only; use the default session mode for \
         read-write locks",
    )
}

impl LeaseMode {
    pub(crate) fn new(common: Arc<Common>, listener: Arc<Listener>) -> Self {
        LeaseMode {
            common,
            listener,
            unanswered: Unanswered::default(),
        }
    }

    /// Frees the row of `attempt`'s grant (with `token`, or any token of the attempt). An
    /// attempt that had a request without an answer is ended for good: recorded in its row,
    /// so that a late copy of that request never grants it.
    async fn free(
        &self,
        name: &str,
        kind: LockKind,
        attempt: &AttemptId,
        token: Option<i64>,
    ) -> Result<ReleaseOutcome> {
        let ns = self.common.namespace.as_str();
        let chan = channel(key_of(ns, name, kind));
        let a = attempt.as_str();
        let record = self.unanswered.pending(attempt);
        let sql = match (kind, record) {
            (LockKind::Election, false) => ELECTION_RELEASE,
            (LockKind::Election, true) => ELECTION_END,
            (_, false) => RELEASE,
            (_, true) => END,
        };
        let keep = ENDED_KEEP.as_secs_f64();
        let most = ENDED_MAX_PER_LOCK as i64;
        let mut params = params![ns, name, a, token, chan].to_vec();
        if record {
            params.extend(params![keep, most]);
        }
        let rows = self.common.query("releasing", sql, &params).await?;
        if record {
            self.unanswered.recorded(attempt);
        }
        Ok(match one(&rows, "release")? {
            (true, _) => ReleaseOutcome::Released,
            (false, Some(true)) => ReleaseOutcome::TakenByOther,
            (false, _) => ReleaseOutcome::Expired,
        })
    }

    /// Renews the holds `part` (index in the caller's list, grant, lease: all locks, or all
    /// elections) with `sql`; the indices of those renewed.
    async fn renew_batch(
        &self,
        sql: &str,
        part: &[(usize, &GrantRef, Duration)],
    ) -> Result<Vec<usize>> {
        let names: Vec<&str> = part.iter().map(|(_, g, _)| &*g.key.name).collect();
        let attempts: Vec<&str> = part.iter().map(|(_, g, _)| g.attempt.as_str()).collect();
        let tokens = part
            .iter()
            .map(|(_, g, _)| token_i64(g.token))
            .collect::<Result<Vec<i64>>>()?;
        let leases: Vec<f64> = part.iter().map(|(_, _, l)| millis_f64(*l)).collect();
        let ns = self.common.namespace.as_str();
        let rows = self
            .common
            .query(
                "renewing",
                sql,
                &params![ns, names, attempts, tokens, leases],
            )
            .await?;
        let renewed: HashSet<(String, String, i64)> = rows
            .iter()
            .map(|r| cols(r, "renew"))
            .collect::<Result<_>>()?;
        let held =
            |g: &GrantRef, t| renewed.contains(&(g.key.name.to_string(), g.attempt.to_string(), t));
        let part = part.iter().zip(tokens);
        Ok(part
            .filter(|((_, g, _), t)| held(g, *t))
            .map(|((i, ..), _)| *i)
            .collect())
    }
}

#[async_trait]
impl Backend for LeaseMode {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.common.endpoint.clone()
    }

    fn capabilities(&self) -> Capabilities {
        capabilities()
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.listener.lock_watch(req).await
    }

    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        self.listener.election_watch(name).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        capabilities().check(KIND, req.key.kind)?;
        let (ns, name) = (self.common.namespace.as_str(), &*req.key.name);
        let (owner, attempt) = (&*req.key.owner, req.attempt.as_str());
        let lease = millis_f64(req.lease);
        let value: &str = req.value.as_deref().unwrap_or("");
        let chan: String;
        let mut params = params![ns, name, owner, attempt, lease].to_vec();
        let (what, sql) = match req.key.kind {
            LockKind::Election => {
                chan = channel(election_key(ns, name));
                params.extend(params![value, chan]);
                ("campaigning", ELECTION_ACQUIRE)
            }
            _ => ("acquiring", ACQUIRE),
        };
        // A request without an answer may still reach the server after the attempt ended:
        // remembered, so that its end is recorded (see `free`).
        let rows = self
            .unanswered
            .track(&req.attempt, self.common.query(what, sql, &params))
            .await?;
        Ok(match one(&rows, "acquire")? {
            (Some(t), _) => AcquireReply::Granted {
                token: token_u64(t)?,
            },
            (None, left) => AcquireReply::Held {
                ttl: lease_left(left),
            },
        })
    }

    /// Releases exactly the grant `grant` names: a repeated release finds the row freed (or
    /// another grant's) and reports it, never freeing anything else.
    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        capabilities().check(KIND, grant.key.kind)?;
        let token = token_i64(grant.token)?;
        self.free(&grant.key.name, grant.key.kind, &grant.attempt, Some(token))
            .await
    }

    /// Gives back whatever grant the attempt holds (one whose reply was lost); there is no
    /// server-side queue to leave. The attempt id is unique, so nothing else is touched.
    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        capabilities().check(KIND, req.key.kind)?;
        self.free(&req.key.name, req.key.kind, &req.attempt, None)
            .await
            .map(|_| ())
    }

    /// Locks and elections are renewed in one statement each (their rows are apart); the
    /// outcomes come back in the order of `holds`.
    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        for (g, _) in holds {
            capabilities().check(KIND, g.key.kind)?;
        }
        let mut out = vec![RenewOutcome::NotHeld; holds.len()];
        for (sql, election) in [(RENEW, false), (ELECTION_RENEW, true)] {
            let part: Vec<_> = (holds.iter().enumerate())
                .filter(|(_, (g, _))| (g.key.kind == LockKind::Election) == election)
                .map(|(i, (g, lease))| (i, g, *lease))
                .collect();
            if !part.is_empty() {
                for i in self.renew_batch(sql, &part).await? {
                    out[i] = RenewOutcome::Renewed;
                }
            }
        }
        Ok(out)
    }

    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        capabilities().check(KIND, grant.key.kind)?;
        let sql = ELECTION_PROCLAIM;
        self.common.proclaim(sql, grant, (seq, value), &[]).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        capabilities().check(KIND, kind)?;
        let ns = self.common.namespace.as_str();
        let election = kind == LockKind::Election;
        let sql = if election { ELECTION_INSPECT } else { INSPECT };
        let rows = self
            .common
            .query("inspecting", sql, &params![ns, name])
            .await?;
        let mut info = LockInfo::new(name);
        if let Some(r) = rows.first() {
            let (owner, granted, token, left): (Option<String>, bool, i64, f64) =
                cols(r, "inspect")?;
            info.fencing_token = token_u64(token)?;
            if let Some(owner) = owner.filter(|_| granted && left.is_finite() && left > 0.0) {
                // One grant; re-entrant guards are counted in the holder's client.
                let value = election.then(|| r.try_get::<_, String>(4));
                let value = value.transpose().map_err(|e| shape("inspect", e))?;
                info.holders.push(
                    HolderInfo::new(owner, 1)
                        .with_lease_left(Some(Duration::from_secs_f64(left / 1000.0)))
                        .with_value(value),
                );
            }
        }
        Ok(info)
    }
}
