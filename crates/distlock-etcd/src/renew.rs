//! Renewing grants (keep-alives, moving a key to a longer lease), releasing them, giving attempts up.

use crate::error::{shape, KIND};
use crate::kv::{first_of, firsts, put_hold, reads, revision_of, Keys, Record, CAS_ATTEMPTS};
use crate::lease::{ttl_secs, Lease};
use crate::EtcdBackend;
use distlock_core::backend::{AcquireRequest, AttemptId, GrantRef, RenewOutcome};
use distlock_core::{Error, ReleaseOutcome, Result};
use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp};
use std::time::Duration;

/// etcd's default limit of operations in one transaction is 128; stay well below it.
pub(crate) const MAX_OPS_PER_TXN: usize = 64;

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
    /// The state of the hold whose key `mine` has create revision `rev`, `None` if that key is
    /// gone. A lock's key already read as `known` is not read again; an election candidate's
    /// key is read again with its metadata key, at one revision.
    pub(crate) async fn hold_state(
        &self,
        keys: &Keys,
        mine: &[u8],
        rev: i64,
        known: Option<KeyValue>,
    ) -> Result<Option<HoldState>> {
        let meta_key = keys.meta_of(mine);
        let (kv, m) = match (known, &meta_key) {
            (Some(kv), None) => (Some(kv), None),
            _ => {
                let both = [Some(mine), meta_key.as_deref()].into_iter().flatten();
                let ops: Vec<_> = both.map(|k| TxnOp::get(k, None)).collect();
                let resp = self.txn("read", Txn::new().and_then(ops)).await?;
                let mut found = firsts(&resp).into_iter();
                (found.next().flatten(), found.next().flatten())
            }
        };
        let Some(kv) = kv.filter(|kv| kv.create_revision() == rev) else {
            return Ok(None);
        };
        if meta_key.is_none() {
            let rec = Record::decode(kv.key(), kv.value(), false)?;
            return Ok(Some(HoldState {
                kv,
                rec,
                meta: None,
            }));
        }
        let (m, rec) = keys.record_of(mine, m)?;
        Ok(Some(HoldState {
            kv,
            rec,
            meta: Some(m),
        }))
    }

    /// Makes the lease of `kv` — the key `mine` of `attempt`, read with the create revision
    /// of its grant — run at least `want` from when etcd applies this, never shortening it.
    ///
    /// If the key's lease has a TTL of at least `want`, a keep-alive: it restarts the full
    /// TTL, and a lease never has more than its TTL left, so nothing is shortened. Else the key
    /// moves to a new lease of `want` (`fresh` if given and long enough), by a put guarded by
    /// the key's create revision (which a put keeps: the token survives) *and* its current
    /// lease, so two renewals racing cannot orphan a lease; only once that committed is the
    /// old lease revoked, which then carries nothing. A new lease whose put has an unknown
    /// outcome is kept until the attempt ends ([`doubt`](Self::doubt)). An election
    /// candidate's metadata key moves with it, in the same transaction, guarded by both keys'
    /// mod revisions (so a proclamation in between is never overwritten with the old value).
    pub(crate) async fn cover(
        &self,
        keys: &Keys,
        attempt: &AttemptId,
        mine: &[u8],
        kv: KeyValue,
        want: Duration,
        fresh: Option<Lease>,
    ) -> Result<Cover> {
        let rev = kv.create_revision();
        let mut known = Some(kv);
        for _ in 0..CAS_ATTEMPTS {
            let Some(h) = self.hold_state(keys, mine, rev, known.take()).await? else {
                return Ok(Cover::Gone);
            };
            let (id, ttl) = (h.kv.lease(), h.rec.ttl);
            if ttl >= ttl_secs(want) {
                if self.keep_alive(id).await? {
                    self.remember(attempt, Lease { id, ttl });
                    return Ok(Cover::Done { moved_to: None });
                }
                // etcd no longer knows the lease ("lease not found", TTL 0): the key went
                // with it — unless a concurrent renewal moved it to a new lease meanwhile.
            } else if let Some(done) = self.move_hold(keys, attempt, mine, &h, want, fresh).await? {
                return Ok(done);
            }
        }
        Err(self.contended(mine))
    }

    /// [`cover`](Self::cover)'s move of hold `h` (key `mine` of `attempt`) to a new lease of
    /// `want`: `None` if the transaction found the key changed (look again).
    async fn move_hold(
        &self,
        keys: &Keys,
        attempt: &AttemptId,
        mine: &[u8],
        h: &HoldState,
        want: Duration,
        fresh: Option<Lease>,
    ) -> Result<Option<Cover>> {
        let (rev, lease) = (h.kv.create_revision(), h.kv.lease());
        let (new, ours) = match fresh {
            Some(l) if l.ttl >= ttl_secs(want) => (l, false),
            _ => (self.grant(want).await?, true),
        };
        let mut when = vec![
            Compare::create_revision(mine.to_vec(), CompareOp::Equal, rev),
            Compare::lease(mine.to_vec(), CompareOp::Equal, lease),
        ];
        if let Some(m) = &h.meta {
            for kv in [&h.kv, m] {
                let (key, rev) = (kv.key(), kv.mod_revision());
                when.push(Compare::mod_revision(key, CompareOp::Equal, rev));
            }
        }
        let ops = put_hold(keys, mine, &h.rec.owner, h.kv.value(), new, h.rec.seq);
        let txn = Txn::new().when(when).and_then(ops);
        let sent = self.txn("renew", txn);
        // After an error, perhaps applied: the key may be on the new lease now.
        let resp = if ours {
            self.doubting(attempt, new, sent).await?
        } else {
            sent.await?
        };
        if !resp.succeeded() {
            // Not applied (the key changed or is gone): the new lease carries nothing.
            if ours {
                self.revoke_in_background(new.id);
            }
            return Ok(None);
        }
        self.remember(attempt, new);
        if lease != 0 {
            self.revoke_in_background(lease);
        }
        let moved_to = Some(new.id);
        Ok(Some(Cover::Done { moved_to }))
    }

    /// `early`: a keep-alive sent alongside the read, of the lease the key was known to be on,
    /// with its answer.
    pub(crate) async fn renew_one(
        &self,
        keys: &Keys,
        grant: &GrantRef,
        mine: &[u8],
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
        let cover = self.cover(keys, &grant.attempt, mine, kv, lease, None);
        Ok(match cover.await? {
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
        let mines: Vec<_> = (holds.iter())
            .map(|(g, _)| self.keys_of(&g.key, &g.attempt))
            .collect();
        // Read every hold's key, in chunks of one transaction each, all at once, and at the
        // same time keep alive the lease each key is known to be on when that lease is long
        // enough: one round trip per tick in the common case (a renewal must fit in a third of
        // the lease on a loaded machine). The read decides whether that keep-alive counts.
        let reads = mines.chunks(MAX_OPS_PER_TXN).map(|chunk| async move {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(_, m)| TxnOp::get(m.clone(), None))
                .collect();
            let found = firsts(&self.txn("renew", Txn::new().and_then(ops)).await?);
            match found.len() == chunk.len() {
                true => Ok(found),
                false => Err(shape(format!(
                    "renewal read {} keys for {} holds",
                    found.len(),
                    chunk.len()
                ))),
            }
        });
        let early = holds.iter().map(|(g, want)| async move {
            match self.known_lease(&g.attempt) {
                Some(l) if l.ttl >= ttl_secs(*want) => Some((l.id, self.keep_alive(l.id).await)),
                _ => None,
            }
        });
        let (read, early) = tokio::join!(
            futures_util::future::join_all(reads),
            futures_util::future::join_all(early)
        );
        // A chunk whose read failed leaves its holds unconfirmed, not the others; if every
        // read failed, that is the batch's error.
        if read.iter().all(|r| r.is_err()) {
            if let Some(Err(e)) = read.into_iter().next() {
                return Err(e);
            }
            return Ok(Vec::new());
        }
        let found = read
            .iter()
            .zip(mines.chunks(MAX_OPS_PER_TXN))
            .flat_map(|(r, chunk)| {
                (0..chunk.len()).map(move |i| match r {
                    Ok(found) => Ok(found[i].clone()),
                    Err(e) => {
                        let why = format!("reading the keys of its renewal batch: {e}");
                        Err(Error::connection(KIND, self.endpoint.clone(), why))
                    }
                })
            });
        let each = (holds.iter().zip(&mines).zip(found).zip(early)).map(
            |((((g, lease), (keys, mine)), kv), early)| async move {
                self.renew_one(keys, g, mine, *lease, kv?, early).await
            },
        );
        let results = futures_util::future::join_all(each).await;
        RenewOutcome::each(KIND, holds, results)
    }

    /// Releases one grant by a compare-and-delete addressed by attempt and token (`Backend::release`).
    pub(crate) async fn release_grant(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        let (keys, mine) = self.keys_of(&grant.key, &grant.attempt);
        let Some(rev) = revision_of(grant.token) else {
            return Ok(ReleaseOutcome::Expired);
        };
        // One compare-and-delete, addressed by attempt and token: a retry after a lost reply
        // finds nothing to delete and says so; it can never delete a newer grant.
        let guard = Compare::create_revision(mine.clone(), CompareOp::Equal, rev);
        let txn = (Txn::new().when([guard]))
            .and_then(keys.read_and_delete(&mine))
            .or_else([first_of(&keys.queue)]);
        let resp = self.txn("release", txn).await?;
        let [first] = reads(&resp)?;
        let out = if resp.succeeded() {
            if let Some(kv) = first {
                self.revoke_in_background(kv.lease());
            }
            ReleaseOutcome::Released
        } else {
            match first {
                Some(f) if f.key() != mine.as_slice() => ReleaseOutcome::TakenByOther,
                _ => ReleaseOutcome::Expired,
            }
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
        let (keys, mine) = self.keys_of(&req.key, &req.attempt);
        // The key is this attempt's, whatever it is now (queued, or first: a grant whose
        // reply was lost): delete it unconditionally. No other attempt's key is named.
        let txn = Txn::new().and_then(keys.read_and_delete(&mine));
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
