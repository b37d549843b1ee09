//! One etcd lease per attempt: granted, kept alive, revoked once its attempt ended (never while
//! a request of unknown outcome may have put the key on it: docs/etcd.md, *Requests whose
//! outcome is unknown*).

use crate::error::{is_lease_not_found, map, shape};
use crate::EtcdBackend;
use distlock_core::backend::AttemptId;
use distlock_core::Result;
use etcd_client::Client;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long after its TTL a lease of unknown fate is still remembered: etcd extends every
/// lease by an election timeout when a new leader takes over, so a lease can outlive its TTL
/// by a little; a minute covers that with room to spare.
pub(crate) const DOUBT_MARGIN: Duration = Duration::from_secs(60);

/// Lease length in whole seconds, rounded up (etcd leases have a one-second granularity).
pub(crate) fn ttl_secs(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis().div_ceil(1000).max(1)).unwrap_or(i64::MAX)
}

/// The lease bookkeeping is plain maps: a panic elsewhere mid-update leaves them usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One lease granted for an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) id: i64,
    /// TTL the server granted (seconds; at least etcd's minimum TTL).
    pub(crate) ttl: i64,
}

/// A lease a request with an unknown outcome may have attached to its attempt's key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Doubt {
    lease: i64,
    /// After this, etcd has certainly expired the lease (nobody keeps it alive unless it
    /// carries the attempt's key, and then the attempt's release or give-up revokes it).
    until: Instant,
}

impl EtcdBackend {
    pub(crate) async fn grant(&self, lease: Duration) -> Result<Lease> {
        let ttl = ttl_secs(lease);
        let call = |c: Client| async move { c.lease_client().grant(ttl, None).await };
        let r = self.call("lease grant", call).await?;
        let (id, ttl, error) = (r.id(), r.ttl(), r.error());
        if !error.is_empty() || ttl <= 0 {
            return Err(shape(format!("lease grant failed: `{error}` (ttl {ttl})")));
        }
        Ok(Lease { id, ttl })
    }

    /// Revokes lease `id` once, in the background (if that fails it expires). Only for a lease
    /// that carries nothing, or only the key of an ended attempt: a lease of unknown fate is
    /// kept until its attempt ends ([`doubt`](Self::doubt)).
    pub(crate) fn revoke_in_background(&self, id: i64) {
        let until = Instant::now();
        self.revoke_until_answered(Doubt { lease: id, until });
    }

    /// One keep-alive of lease `id`: it runs its full TTL again from when etcd applies it.
    /// `Ok(false)`: etcd no longer knows the lease (the client reports "lease not found" for
    /// a reply with TTL 0, which is how etcd answers a keep-alive of an unknown lease), so
    /// whatever was attached to it is gone: never a success.
    pub(crate) async fn keep_alive(&self, id: i64) -> Result<bool> {
        let call = |c: Client| async move { c.lease_client().keep_alive(id).await };
        Ok(self.on_lease("lease keep-alive", id, call).await?.is_some())
    }

    /// Time left on lease `id`, or `None` if there is none.
    pub(crate) async fn lease_left(&self, id: i64) -> Result<Option<Duration>> {
        let call = |c: Client| async move { c.lease_client().time_to_live(id, None).await };
        let r = self.on_lease("lease time-to-live", id, call).await?;
        Ok(r.filter(|r| r.ttl() >= 0)
            .map(|r| Duration::from_secs(r.ttl().unsigned_abs())))
    }

    /// `call` on lease `id`: `None` when etcd does not know the lease (or for `id` 0, none).
    async fn on_lease<T, F, Fut>(&self, what: &str, id: i64, call: F) -> Result<Option<T>>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        if id == 0 {
            return Ok(None);
        }
        match self.raw(what, call).await? {
            Ok(r) => Ok(Some(r)),
            Err(e) if is_lease_not_found(&e) => Ok(None),
            Err(e) => Err(map(&self.endpoint, e)),
        }
    }

    /// Remembers that a request of `attempt` whose outcome is unknown may have attached `lease`
    /// to the attempt's key: it must not be revoked while the attempt goes on (the attempt's
    /// next request may find its key on it and use it), and it is revoked when the attempt
    /// ends ([`settle`](Self::settle)).
    pub(crate) fn doubt(&self, attempt: &AttemptId, lease: Lease) {
        let now = Instant::now();
        // Leases are at most 30 days (the core's limit); the clamp keeps the sum in range.
        let ttl = Duration::from_secs(lease.ttl.clamp(0, 31 * 24 * 3600).unsigned_abs());
        let (lease, until) = (lease.id, now + ttl + DOUBT_MARGIN);
        let mut map = lock(&self.doubtful);
        // A lease etcd has expired can no longer carry anything: forget it, so that attempts
        // that never end (a crashed caller) leave nothing behind here.
        map.retain(|_, v| {
            v.retain(|d| d.until > now);
            !v.is_empty()
        });
        map.entry(attempt.clone())
            .or_default()
            .push(Doubt { lease, until });
    }

    /// Runs `request`, which may put `attempt`'s key on `lease`: after an error its outcome is
    /// unknown, and the lease is [doubted](Self::doubt).
    pub(crate) async fn doubting<T>(
        &self,
        attempt: &AttemptId,
        lease: Lease,
        request: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let r = request.await;
        if r.is_err() {
            self.doubt(attempt, lease);
        }
        r
    }

    /// `attempt` has ended (released or given up): revokes its leases of unknown fate. They
    /// carry at most that attempt's key, of no use any more; each revoke is retried until etcd
    /// answers it, so a late create either came first, and the revoke deletes its key, or
    /// comes after and is refused (etcd refuses a put with a revoked lease).
    pub(crate) fn settle(&self, attempt: &AttemptId) {
        lock(&self.leases).remove(attempt);
        let doubts = lock(&self.doubtful).remove(attempt);
        for d in doubts.into_iter().flatten() {
            self.revoke_until_answered(d);
        }
    }

    /// Revokes the lease of an ended attempt in the background, again and again (pauses from
    /// 100 ms doubling to 5 s) until etcd answers, the lease has certainly expired (`until`),
    /// or the backend is dropped: a revoke that does not get through must not leave the
    /// attempt's key holding the lock for nobody for the lease's whole TTL.
    pub(crate) fn revoke_until_answered(&self, d: Doubt) {
        let client = self.client.clone();
        let timeout = self.op_timeout;
        let closed = self.closed.clone();
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let mut lc = client.lease_client();
                let error = match tokio::time::timeout(timeout, lc.revoke(d.lease)).await {
                    Ok(Ok(_)) => return,
                    Ok(Err(e)) if is_lease_not_found(&e) => return,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "timed out".to_owned(),
                };
                if Instant::now() + pause >= d.until {
                    tracing::debug!(lease = d.lease, %error, "lease revoke failed; it expires by itself");
                    return;
                }
                tracing::debug!(lease = d.lease, %error, "lease revoke failed; trying again");
                tokio::select! {
                    _ = closed.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        });
    }

    /// Notes that `attempt`'s key is on `lease` (so that renewals can keep it alive while they
    /// read the key, rather than after).
    pub(crate) fn remember(&self, attempt: &AttemptId, lease: Lease) {
        lock(&self.leases).insert(attempt.clone(), lease);
    }

    pub(crate) fn known_lease(&self, attempt: &AttemptId) -> Option<Lease> {
        lock(&self.leases).get(attempt).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_secs(Duration::from_secs(30)), 30);
    }
}
