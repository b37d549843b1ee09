//! Elections on etcd's `concurrency.Election` layout: proclaiming a new value. Everything else
//! is the mutex's code on the election's keys ([`Keys::of_kind`](crate::kv::Keys::of_kind));
//! docs/election-etcd.md says why that is etcd's recipe.

use crate::error::shape;
use crate::kv::{reads, revision_of, Record, CAS_ATTEMPTS};
use crate::EtcdBackend;
use distlock_core::backend::{GrantRef, RenewOutcome};
use distlock_core::Result;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

impl EtcdBackend {
    /// Replaces the value of the candidate key of `grant` with `value` if `seq` is newer than
    /// the proclamation its metadata records (`Backend::proclaim`; docs/election-etcd.md,
    /// *Proclaim*). Guarded by the key's create revision (the grant still leads) and by the
    /// metadata of proclamation `seq - 1` (the core sends one at a time); a recorded number of
    /// `seq` or more is a retry, a duplicate or a late arrival: `Renewed`, nothing written.
    /// The puts keep the keys' lease (`ignore_lease`).
    pub(crate) async fn proclaim_value(
        &self,
        grant: &GrantRef,
        seq: u64,
        value: &str,
    ) -> Result<RenewOutcome> {
        let s = self.slot(&grant.key, &grant.attempt);
        let mine = &s.mine;
        let Some(meta_key) = &s.meta else {
            return Err(shape("proclaim on a grant that is not an election's"));
        };
        let Some(rev) = revision_of(grant.token) else {
            return Ok(RenewOutcome::NotHeld);
        };
        // What the metadata holds if proclamation `seq - 1` was the last one applied and the
        // key is still on the lease it was last seen on (a guess: if wrong, the reads tell).
        let mut expect = self.known_lease(&grant.attempt).map(|l| Record {
            ttl: l.ttl,
            seq: seq.saturating_sub(1),
            owner: grant.key.owner.to_string(),
        });
        let keep = || Some(PutOptions::new().with_ignore_lease());
        let leads = Compare::create_revision(mine.clone(), CompareOp::Equal, rev);
        for _ in 0..CAS_ATTEMPTS {
            let (guard, then) = match &expect {
                Some(m) if m.seq < seq => {
                    let (now, next) = (m.encode(true), Record { seq, ..m.clone() }.encode(true));
                    let guard = Compare::value(meta_key.clone(), CompareOp::Equal, now);
                    let put_meta = TxnOp::put(meta_key.clone(), next, keep());
                    (
                        guard,
                        vec![TxnOp::put(mine.clone(), value, keep()), put_meta],
                    )
                }
                // Nothing to guess from: read first.
                _ => (
                    Compare::create_revision(meta_key.clone(), CompareOp::Less, 0),
                    vec![],
                ),
            };
            let txn = Txn::new()
                .when([leads.clone(), guard])
                .and_then(then)
                .or_else([
                    TxnOp::get(mine.clone(), None),
                    TxnOp::get(meta_key.clone(), None),
                ]);
            let resp = self.txn("proclaim", txn).await?;
            if resp.succeeded() {
                return Ok(RenewOutcome::Renewed);
            }
            let [kv, m] = reads(&resp)?;
            if kv.is_none_or(|kv| kv.create_revision() != rev) {
                return Ok(RenewOutcome::NotHeld);
            }
            let (_, rec) = s.record(m)?;
            if rec.seq >= seq {
                // Applied already (a retry or a duplicate), or a newer one was.
                return Ok(RenewOutcome::Renewed);
            }
            expect = Some(rec);
        }
        Err(self.contended(mine))
    }
}
