//! Renewing grants (keep-alives, moving a key to a longer lease), releasing them, giving attempts up.

use crate::error::{shape, KIND};
use crate::kv::{first_of, firsts, reads, revision_of, Record, Slot, CAS_ATTEMPTS};
use crate::lease::{ttl_secs, Lease};
use crate::EtcdBackend;
use distlock_core::backend::{AcquireRequest, GrantRef, RenewOutcome};
use distlock_core::{Error, ReleaseOutcome, Result};
use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp};
use std::time::Duration;

/// etcd's default limit of operations in one transaction is 128; stay well below it.
const MAX_OPS_PER_TXN: usize = 64;

/// What [`EtcdBackend::cover`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cover {
    /// The key's lease now runs at least the asked duration from when etcd applied the
    /// request. `moved_to`: the key was moved to this new lease.
    Done { moved_to: Option<i64> },
    /// The key (with that create revision) is gone.
    Gone,
}

/// What a hold's keys say now: its key, what dlock recorded of it, and for an election
/// candidate its metadata key (where that record is).
pub(crate) struct HoldState {
    pub(crate) kv: KeyValue,
    pub(crate) rec: Record,
    pub(crate) meta: Option<KeyValue>,
}

impl EtcdBackend {
    /// The state of the hold of slot `s` whose key has create revision `rev`, `None` if that
    /// key is gone. A lock's key already read as `known` is not read again; an election
    /// candidate's key is read again with its metadata key, at one revision.
    pub(crate) async fn hold_state(
        &self,
        s: &Slot,
        rev: i64,
        known: Option<KeyValue>,
    ) -> Result<Option<HoldState>> {
        let (kv, m) = match (known, &s.meta) {
            (Some(kv), None) => (Some(kv), None),
            _ => {
                let both = [Some(&s.mine), s.meta.as_ref()].into_iter().flatten();
                let ops: Vec<_> = both.map(|k| TxnOp::get(k.clone(), None)).collect();
                let resp = self.txn("read", Txn::new().and_then(ops)).await?;
                let mut found = firsts(&resp).into_iter();
                (found.next().flatten(), found.next().flatten())
            }
        };
        let Some(kv) = kv.filter(|kv| kv.create_revision() == rev) else {
            return Ok(None);
        };
        let (meta, rec) = match &s.meta {
            None => (None, Record::decode(kv.key(), kv.value(), false)?),
            Some(_) => s.record(m).map(|(m, rec)| (Some(m), rec))?,
        };
        Ok(Some(HoldState { kv, rec, meta }))
    }

    /// Makes the lease of `kv` — the key of slot `s`, read with the create revision of its
    /// grant — run at least `want` from when etcd applies this, never shortening it
    /// (docs/etcd.md, *Leases and the watchdog*): a keep-alive if the lease's TTL is at least
    /// `want`; else a move to a new lease of `want` (`fresh` if given and long enough) guarded by
    /// the key's create revision (the token) *and* its current lease, so two racing renewals
    /// cannot orphan a lease, an election candidate's metadata key with it, guarded by both
    /// keys' mod revisions. The old lease is revoked only once the move committed; a new lease
    /// whose put has an unknown outcome is kept until the attempt ends ([`doubt`](Self::doubt)).
    pub(crate) async fn cover(
        &self,
        s: &Slot,
        kv: KeyValue,
        want: Duration,
        fresh: Option<Lease>,
    ) -> Result<Cover> {
        let rev = kv.create_revision();
        let mut known = Some(kv);
        for _ in 0..CAS_ATTEMPTS {
            let Some(h) = self.hold_state(s, rev, known.take()).await? else {
                return Ok(Cover::Gone);
            };
            let (id, ttl) = (h.kv.lease(), h.rec.ttl);
            if ttl >= ttl_secs(want) {
                if self.keep_alive(id).await? {
                    self.remember(&s.attempt, Lease { id, ttl });
                    return Ok(Cover::Done { moved_to: None });
                }
                // etcd no longer knows the lease ("lease not found", TTL 0): the key went
                // with it — unless a concurrent renewal moved it to a new lease meanwhile.
                continue;
            }
            let (new, ours) = match fresh {
                Some(l) if l.ttl >= ttl_secs(want) => (l, false),
                _ => (self.grant(want).await?, true),
            };
            let mut when = vec![
                Compare::create_revision(s.mine.clone(), CompareOp::Equal, rev),
                Compare::lease(s.mine.clone(), CompareOp::Equal, id),
            ];
            if let Some(m) = &h.meta {
                for kv in [&h.kv, m] {
                    let (key, rev) = (kv.key(), kv.mod_revision());
                    when.push(Compare::mod_revision(key, CompareOp::Equal, rev));
                }
            }
            let ops = s.put(&h.rec.owner, h.kv.value(), new, h.rec.seq);
            let sent = self.txn("renew", Txn::new().when(when).and_then(ops));
            // After an error, perhaps applied: the key may be on the new lease now.
            let resp = if ours {
                self.doubting(&s.attempt, new, sent).await?
            } else {
                sent.await?
            };
            if !resp.succeeded() {
                // Not applied (the key changed or is gone): the new lease carries nothing.
                if ours {
                    self.revoke_in_background(new.id);
                }
                continue;
            }
            self.remember(&s.attempt, new);
            if id != 0 {
                self.revoke_in_background(id);
            }
            return Ok(Cover::Done {
                moved_to: Some(new.id),
            });
        }
        Err(self.contended(&s.mine))
    }

    /// `early`: a keep-alive sent alongside the read, of the lease the key was known to be on,
    /// with its answer.
    pub(crate) async fn renew_one(
        &self,
        s: &Slot,
        grant: &GrantRef,
        lease: Duration,
        kv: Option<KeyValue>,
        early: Option<(i64, Result<bool>)>,
    ) -> Result<RenewOutcome> {
        // Only the key of this attempt with this grant's create revision is this grant.
        let Some(kv) = kv.filter(|kv| Some(kv.create_revision()) == revision_of(grant.token))
        else {
            return Ok(RenewOutcome::NotHeld);
        };
        match early {
            // The key was on the lease kept alive, which is long enough: renewed. (Had the key
            // moved to another lease, or the lease been unknown, `cover` looks again.)
            Some((id, Ok(true))) if id == kv.lease() => return Ok(RenewOutcome::Renewed),
            Some((id, Err(e))) if id == kv.lease() => return Err(e),
            _ => {}
        }
        Ok(match self.cover(s, kv, lease, None).await? {
            Cover::Done { .. } => RenewOutcome::Renewed,
            Cover::Gone => RenewOutcome::NotHeld,
        })
    }

    /// Renews many holds at once (`Backend::renew`). A hold whose renewal fails on its own (its
    /// key's data overwritten, a compare-and-swap that kept losing) is `Unconfirmed`; the
    /// others of the batch still get their outcomes.
    pub(crate) async fn renew_holds(
        &self,
        holds: &[(GrantRef, Duration)],
    ) -> Result<Vec<RenewOutcome>> {
        // Per chunk of holds, one transaction reads every hold's key (all chunks at once), and
        // at the same time the lease each key is known to be on is kept alive when that lease
        // is long enough: one round trip per tick in the common case (a renewal must fit in a
        // third of the lease on a loaded machine). The read decides whether that keep-alive
        // counts.
        let chunks = holds.chunks(MAX_OPS_PER_TXN).map(|chunk| async move {
            let slots: Vec<_> = (chunk.iter())
                .map(|(g, _)| self.slot(&g.key, &g.attempt))
                .collect();
            let ops: Vec<_> = (slots.iter())
                .map(|s| TxnOp::get(s.mine.clone(), None))
                .collect();
            let early = chunk.iter().map(|(g, want)| async move {
                match self.known_lease(&g.attempt) {
                    Some(l) if l.ttl >= ttl_secs(*want) => {
                        Some((l.id, self.keep_alive(l.id).await))
                    }
                    _ => None,
                }
            });
            let (read, early) = tokio::join!(
                self.txn("renew", Txn::new().and_then(ops)),
                futures_util::future::join_all(early)
            );
            let found = firsts(&read?);
            if found.len() != chunk.len() {
                let (n, m) = (found.len(), chunk.len());
                return Err(shape(format!("renewal read {n} keys for {m} holds")));
            }
            let each = (chunk.iter().zip(&slots).zip(found).zip(early))
                .map(|((((g, want), s), kv), early)| self.renew_one(s, g, *want, kv, early));
            Ok(futures_util::future::join_all(each).await)
        });
        let done = futures_util::future::join_all(chunks).await;
        // A chunk whose read failed leaves its holds unconfirmed, not the others; if every
        // read failed, that is the batch's error.
        if done.iter().all(|r| r.is_err()) {
            return done
                .into_iter()
                .next()
                .map_or(Ok(Vec::new()), |r| r.map(|_| Vec::new()));
        }
        let results =
            (done.into_iter().zip(holds.chunks(MAX_OPS_PER_TXN))).flat_map(|(r, chunk)| {
                r.unwrap_or_else(|e| {
                    let why = format!("reading the keys of its renewal batch: {e}");
                    let failed =
                        || Err(Error::connection(KIND, self.endpoint.clone(), why.clone()));
                    chunk.iter().map(|_| failed()).collect()
                })
            });
        RenewOutcome::each(KIND, holds, results.collect())
    }

    /// Releases one grant by a compare-and-delete addressed by attempt and token
    /// (`Backend::release`): a retry after a lost reply finds nothing to delete and says so; it
    /// can never delete a newer grant.
    pub(crate) async fn release_grant(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        let s = self.slot(&grant.key, &grant.attempt);
        let Some(rev) = revision_of(grant.token) else {
            return Ok(ReleaseOutcome::Expired);
        };
        let guard = Compare::create_revision(s.mine.clone(), CompareOp::Equal, rev);
        let txn = (Txn::new().when([guard]))
            .and_then(s.keys.read_and_delete(&s.mine))
            .or_else([first_of(&s.keys.queue)]);
        let resp = self.txn("release", txn).await?;
        let [first] = reads(&resp)?;
        let out = match (resp.succeeded(), first) {
            (true, deleted) => {
                if let Some(kv) = deleted {
                    self.revoke_in_background(kv.lease());
                }
                ReleaseOutcome::Released
            }
            (false, Some(f)) if f.key() != s.mine => ReleaseOutcome::TakenByOther,
            (false, _) => ReleaseOutcome::Expired,
        };
        // Settled only now that the outcome is known: a lease of unknown fate may be the one
        // the key was on, and revoking it before the delete would turn Released into Expired.
        self.settle(&grant.attempt);
        Ok(out)
    }

    /// Gives attempt `req` up: deletes its key, whatever state it is in (`Backend::give_up`).
    /// `place`: the lease the key is known to be on (a waiter's place in the queue); if the
    /// delete does not get through, that lease is revoked as soon as etcd answers, with the
    /// leases of unknown fate (an ended attempt's key must not stay queued, and become a grant
    /// nobody uses, for the lease's whole TTL).
    pub(crate) async fn leave(&self, req: &AcquireRequest, place: Option<Lease>) -> Result<()> {
        let s = self.slot(&req.key, &req.attempt);
        // The key is this attempt's, whatever it is now (queued, or first: a grant whose
        // reply was lost): delete it unconditionally. No other attempt's key is named.
        let txn = Txn::new().and_then(s.keys.read_and_delete(&s.mine));
        let r = self.txn("give up", txn).await;
        if let (Err(_), Some(place)) = (&r, place) {
            self.doubt(&req.attempt, place);
        }
        // The attempt is over either way: its leases of unknown fate can go (they carry at most
        // this attempt's key).
        self.settle(&req.attempt);
        let resp = r?;
        if let [Some(kv)] = reads(&resp)? {
            // Deleted: its lease carries nothing now.
            self.revoke_in_background(kv.lease());
        }
        Ok(())
    }
}
