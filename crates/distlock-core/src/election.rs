//! Leader election: [`Election`], [`Leadership`], [`Leader`] and [`Observer`], written once
//! over the backend's [`LockKind::Election`] grants.

use crate::backend::{LockInfo, LockKind, ReleaseWatch, RenewOutcome};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lock::Lock;
use crate::lost::{LostReason, LostSignal};
use crate::ReleaseOutcome;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Longest value a candidate may advertise, in bytes.
pub const MAX_VALUE_LEN: usize = 4096;

/// A handle on election `name` for one candidate (see [`Client::election`](crate::Client::election)).
///
/// Leadership is a grant like a lock's: one leader at a time, a **fencing token** strictly
/// greater than every earlier leader's (pass it with the leader's writes), a **lost signal**
/// that fires as soon as leadership is gone, and a lease the watchdog keeps alive while the
/// [`Leadership`] lives. Waiting candidates are woken by the server, never by polling.
///
/// ```no_run
/// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
/// let election = client.election("scheduler")?;
/// let leader = election.campaign("10.0.0.7:8080").await?;
/// println!("leading with token {}", leader.fencing_token());
/// tokio::select! {
///     reason = leader.lost() => eprintln!("leadership lost: {reason}"),
///     _ = run_the_scheduler(leader.fencing_token()) => { leader.resign().await?; }
/// }
/// # Ok(()) }
/// # async fn run_the_scheduler(_: u64) {}
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    lock: Lock,
}

/// Who leads an election, as the server sees it now ([`Election::leader`], [`Observer::next`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's owner id (for a candidate of the service's own recipe, e.g.
    /// `etcdctl elect`, a description marked `(not dlock)`).
    pub owner: String,
    /// The value it advertises (empty if it advertises none).
    pub value: String,
    /// The leader's fencing token.
    pub fencing_token: u64,
    /// How long its lease still runs, when the server tells.
    pub lease_left: Option<Duration>,
}

impl Leader {
    /// The leader in an election's state, if there is one.
    pub fn of(info: &LockInfo) -> Option<Leader> {
        let h = info.holders.first()?;
        Some(Leader {
            owner: h.owner.clone(),
            value: h.value.clone().unwrap_or_default(),
            fencing_token: info.fencing_token,
            lease_left: h.lease_left,
        })
    }

    /// The same leadership term with the same value (the lease left aside).
    fn same_as(&self, other: &Leader) -> bool {
        self.owner == other.owner
            && self.value == other.value
            && self.fencing_token == other.fencing_token
    }
}

fn check_value(value: &str) -> Result<()> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::invalid(format!(
            "the election value is {} bytes long; the limit is {MAX_VALUE_LEN} bytes \
             (advertise a key to the data, not the data)",
            value.len()
        )));
    }
    if value.contains('\0') {
        return Err(Error::invalid(
            "the election value contains a NUL character; use printable text",
        ));
    }
    Ok(())
}

impl Election {
    pub(crate) fn new(lock: Lock) -> Self {
        Election { lock }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The owner id this candidate campaigns with.
    pub fn owner(&self) -> &str {
        self.lock.owner()
    }

    /// The same candidate with owner id `owner` (e.g. the host name, so that `leader()`
    /// tells operators who leads).
    pub fn with_owner(self, owner: impl Into<String>) -> Result<Election> {
        Ok(Election {
            lock: self.lock.with_owner(owner)?,
        })
    }

    fn candidate(&self, value: String) -> Result<Lock> {
        check_value(&value)?;
        Ok(self.lock.clone().with_value(Arc::from(value)))
    }

    /// Waits until this candidate leads, advertising `value`. Campaigning again through a
    /// handle that already leads returns another handle on the same leadership (same token,
    /// the value it advertises unchanged: use [`Leadership::proclaim`]).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future withdraws the candidacy; a leadership that raced with
    /// the drop is resigned in the background.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a value over [`MAX_VALUE_LEN`] bytes or with a NUL;
    /// [`Error::Unsupported`] if the backend has no elections; otherwise as
    /// [`Lock::acquire`].
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        let guard = self.candidate(value.into())?.acquire().await?;
        Ok(Leadership::new(guard))
    }

    /// Waits at most `wait` to lead; [`Error::Timeout`] after that.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Election::campaign`].
    ///
    /// # Errors
    /// As [`Election::campaign`], and [`Error::Timeout`] when another candidate led until the
    /// end of the wait.
    pub async fn campaign_timeout(
        &self,
        value: impl Into<String>,
        wait: Duration,
    ) -> Result<Leadership> {
        let guard = self.candidate(value.into())?.acquire_timeout(wait).await?;
        Ok(Leadership::new(guard))
    }

    /// Leads if nobody does; never waits. `Ok(None)` means another candidate leads.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Lock::try_acquire`].
    ///
    /// # Errors
    /// As [`Election::campaign`].
    pub async fn try_campaign(&self, value: impl Into<String>) -> Result<Option<Leadership>> {
        let guard = self.candidate(value.into())?.try_acquire().await?;
        Ok(guard.map(Leadership::new))
    }

    /// Who leads now, and the value it advertises; `None` when nobody does.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    /// As [`Client::inspect_kind`](crate::Client::inspect_kind).
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let info = self
            .lock
            .client()
            .inspect_kind(self.name(), LockKind::Election)
            .await?;
        Ok(Leader::of(&info))
    }

    /// The changes of leadership from now on: the first [`Observer::next`] answers the
    /// current state, each later one the next change (a new leader, none, or a new value).
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// let mut changes = client.election("scheduler")?.observe();
    /// loop {
    ///     match changes.next().await? {
    ///         Some(l) => println!("{} leads (token {}), at {}", l.owner, l.fencing_token, l.value),
    ///         None => println!("nobody leads"),
    ///     }
    /// }
    /// # }
    /// ```
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            watch: None,
            last: None,
        }
    }
}

/// Proof of leading an election: the fencing token, the lost signal, the advertised value.
/// Resign with [`Leadership::resign`]; dropping it resigns in the background.
#[must_use = "dropping the leadership resigns at once"]
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    fn new(guard: LockGuard) -> Self {
        Leadership { guard }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.guard.name()
    }

    /// The owner id that leads.
    pub fn owner(&self) -> &str {
        self.guard.owner()
    }

    /// The fencing token of this leadership: strictly greater than every earlier leader's.
    pub fn fencing_token(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// The value this leader advertises (the last one the server confirmed).
    pub fn value(&self) -> String {
        let value = self.guard.hold().proclaimed.value.lock();
        let value = value.unwrap_or_else(|p| p.into_inner());
        value.as_deref().unwrap_or_default().to_owned()
    }

    /// True once leadership is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when leadership is lost (see [`LockGuard::lost`]).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.guard.lost().await
    }

    /// A handle to the lost signal that outlives this borrow.
    pub fn lost_signal(&self) -> LostSignal {
        self.guard.lost_signal()
    }

    /// How long the confirmed lease has left (see [`LockGuard::lease_left`]).
    pub fn lease_left(&self) -> Duration {
        self.guard.lease_left()
    }

    /// The lease deadline (see [`LockGuard::lease_deadline`]).
    pub fn lease_deadline(&self) -> crate::clock::Instant {
        self.guard.lease_deadline()
    }

    /// Advertises `value` instead of the current one. Observers see the change. A retry
    /// after a lost reply has the effect of one proclamation, and a late duplicate never
    /// overwrites a newer value (each proclamation is numbered).
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the server may or may not advertise `value`;
    /// [`Leadership::value`] keeps the last confirmed one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad value; [`Error::NotOwner`] (and the lost signal
    /// fires) when this leadership is gone; [`Error::Connection`] after the client's retries.
    pub async fn proclaim(&self, value: impl Into<String>) -> Result<()> {
        let value = value.into();
        check_value(&value)?;
        let client = self.guard.client();
        let hold = self.guard.hold();
        let _one = hold.proclaimed.one.lock().await;
        let seq = hold.proclaimed.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let backend = client.backend();
        let leads = crate::backoff::retry(client.options().retry, || async {
            match backend.proclaim(&hold.grant, seq, &value).await? {
                RenewOutcome::Renewed => Ok(true),
                RenewOutcome::NotHeld => Ok(false),
                // Neither confirmed nor refused: retried like an unknown outcome.
                RenewOutcome::Unconfirmed => Err(Error::connection(
                    backend.kind(),
                    backend.endpoint(),
                    "the proclamation was neither confirmed nor refused",
                )),
            }
        })
        .await?;
        if !leads {
            client.shared.forget(hold);
            hold.lost.fire(LostReason::NotHeld);
            return Err(Error::NotOwner {
                name: self.name().to_owned(),
                owner: self.owner().to_owned(),
            });
        }
        let mut now = hold
            .proclaimed
            .value
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *now = Some(Arc::from(value));
        Ok(())
    }

    /// Steps down: the next candidate may lead.
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`]: the resignation completes in the background.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub async fn resign(self) -> Result<ReleaseOutcome> {
        self.guard.release().await
    }

    /// The lock guard behind this leadership.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }
}

/// The changes of one election's leadership, from [`Election::observe`].
pub struct Observer {
    election: Election,
    watch: Option<Box<dyn ReleaseWatch>>,
    /// What the last `next` answered (`None` before the first).
    last: Option<Option<Leader>>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election.name())
            .field("last", &self.last)
            .finish()
    }
}

/// Slack after a leader's lease end before the observer looks again.
const LEASE_END_SLACK: Duration = Duration::from_millis(20);

impl Observer {
    /// The current leader on the first call; then waits for the next change and answers it.
    /// Woken by the server (its watch or pub/sub) and, for a leader that stops renewing, at
    /// its lease end.
    ///
    /// # Cancel safety
    /// Cancel safe: a change that arrived stays for the next call.
    ///
    /// # Errors
    /// [`Error::Unsupported`] if the backend has no elections; [`Error::Connection`] when the
    /// server cannot be reached after the client's retries (call `next` again to go on).
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        let client = self.election.lock.client().clone();
        client.shared.check_kind(LockKind::Election)?;
        let backend = client.backend().clone();
        let retry = client.options().retry;
        let name = self.election.name().to_owned();
        loop {
            if self.watch.is_none() {
                // Subscribe before reading, so no change between the two is missed.
                self.watch = Some(crate::backoff::retry(retry, || backend.observe(&name)).await?);
            }
            let now = self.election.leader().await?;
            let changed = match &self.last {
                None => true,
                Some(None) => now.is_some(),
                Some(Some(prev)) => now.as_ref().is_none_or(|n| !n.same_as(prev)),
            };
            if changed {
                self.last = Some(now.clone());
                return Ok(now);
            }
            let lease_end = now.as_ref().and_then(|l| l.lease_left);
            let Some(watch) = self.watch.as_mut() else {
                continue;
            };
            let woke = match lease_end {
                Some(left) => {
                    match tokio::time::timeout(left + LEASE_END_SLACK, watch.changed()).await {
                        Ok(r) => r.map(|_| ()),
                        Err(_) => Ok(()),
                    }
                }
                None => watch.changed().await.map(|_| ()),
            };
            if let Err(e) = woke {
                tracing::debug!(election = %name, error = %e, "election watch broke; subscribing again");
                self.watch = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked() {
        assert!(check_value("").is_ok());
        assert!(check_value("10.0.0.7:8080 {\"zone\":\"b\"}").is_ok());
        assert!(check_value(&"x".repeat(MAX_VALUE_LEN)).is_ok());
        let e = check_value(&"x".repeat(MAX_VALUE_LEN + 1)).unwrap_err();
        assert!(e.to_string().contains("limit is 4096"), "{e}");
        assert!(check_value("a\0b").is_err());
    }

    #[test]
    fn leader_of_state() {
        use crate::HolderInfo;
        assert_eq!(Leader::of(&LockInfo::new("e")), None);
        let info = LockInfo::new("e")
            .with_holders(vec![
                HolderInfo::new("me", 1).with_value(Some("here".into()))
            ])
            .with_fencing_token(9);
        let l = Leader::of(&info).expect("a leader");
        assert_eq!(
            (l.owner.as_str(), l.value.as_str(), l.fencing_token),
            ("me", "here", 9)
        );
        let mut later = l.clone();
        later.lease_left = Some(Duration::from_secs(1));
        assert!(l.same_as(&later));
        later.value = "there".into();
        assert!(!l.same_as(&later));
    }
}
