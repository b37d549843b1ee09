//! Taking the lock in one transaction (etcd's `concurrency.Mutex` try-lock), and `inspect`.

use crate::error::{shape, KIND};
use crate::kv::{
    first_of, header_revision, put_hold, reads, token_of, value_of, Keys, CAS_ATTEMPTS,
};
use crate::lease::Lease;
use crate::renew::Cover;
use crate::EtcdBackend;
use distlock_core::backend::{AcquireReply, AcquireRequest};
use distlock_core::{Error, LockInfo, Result};
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};

impl EtcdBackend {
    pub(crate) fn contended(&self, key: &[u8]) -> Error {
        Error::connection(
            KIND,
            self.endpoint.clone(),
            format!(
                "key `{}` kept changing during {CAS_ATTEMPTS} compare-and-swap attempts",
                String::from_utf8_lossy(key)
            ),
        )
    }

    /// One try of `req`, with this request's own fresh `lease`: takes the lock if nobody is
    /// queued; finds the attempt's own key if it holds the lock already (a retry of a request
    /// whose reply was lost: same key, same token); else reports who holds it, writing nothing.
    /// The flag tells whether `lease` ended up carrying the key (else it carries nothing).
    pub(crate) async fn take(
        &self,
        keys: &Keys,
        mine: &[u8],
        req: &AcquireRequest,
        lease: Lease,
    ) -> Result<(AcquireReply, bool)> {
        for _ in 0..CAS_ATTEMPTS {
            let txn = Txn::new()
                .when([
                    Compare::create_revision(keys.queue.clone(), CompareOp::Equal, 0).with_prefix(),
                ])
                .and_then(
                    put_hold(keys, mine, &req.key.owner, value_of(req), lease, 0)
                        .into_iter()
                        .chain([TxnOp::put(keys.fence.clone(), "", None)])
                        .collect::<Vec<_>>(),
                )
                .or_else([TxnOp::get(mine.to_vec(), None), first_of(&keys.queue)]);
            let resp = self.txn("acquire", txn).await?;
            if resp.succeeded() {
                let token = token_of(header_revision(&resp)?)?;
                self.remember(&req.attempt, lease);
                return Ok((AcquireReply::Granted { token }, true));
            }
            let [m, first] = reads(&resp)?;
            let first = first.ok_or_else(|| {
                shape("etcd said the queue was not empty but returned no key of it")
            })?;
            match m {
                Some(m) if m.key() == first.key() => {
                    let token = token_of(m.create_revision())?;
                    match self
                        .cover(keys, &req.attempt, mine, m, req.lease, Some(lease))
                        .await?
                    {
                        Cover::Done { moved_to } => {
                            return Ok((
                                AcquireReply::Granted { token },
                                moved_to == Some(lease.id),
                            ))
                        }
                        // Its lease ran out meanwhile: the key is gone; try afresh.
                        Cover::Gone => continue,
                    }
                }
                // Someone else is first: another attempt of dlock (of any owner, this one's
                // too) or a foreign `concurrency.Mutex` key. A key of this attempt behind it
                // is its place in the queue of a wait, which this try leaves alone.
                _ => {
                    let ttl = self.lease_left(first.lease()).await?;
                    return Ok((AcquireReply::Held { ttl }, false));
                }
            }
        }
        Err(self.contended(mine))
    }

    /// One try at the lock (`Backend::acquire`).
    pub(crate) async fn acquire_once(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        let keys = self.keys_of(&req.key);
        let mine = keys.attempt(&req.attempt);
        // A lease of this request's own. A grant whose reply is lost leaves a lease with
        // nothing on it, which expires by itself.
        let lease = self.grant(req.lease).await?;
        match self.take(&keys, &mine, req, lease).await {
            Ok((reply, used)) => {
                if !used {
                    // etcd answered that nothing was put with it.
                    self.revoke_in_background(lease.id);
                }
                Ok(reply)
            }
            Err(e) => {
                // Unknown outcome: the key may be on this lease now. The retry (or the
                // give-up) of this attempt finds it; revoking the lease here could delete a
                // grant the retry then returns.
                self.doubt(&req.attempt, lease);
                Err(e)
            }
        }
    }

    /// One consistent read of a queue (a lock's or an election's): how many entries it holds,
    /// its first entry (the holder) and the fence key.
    pub(crate) async fn queue_state(
        &self,
        keys: &Keys,
    ) -> Result<(i64, Option<KeyValue>, Option<KeyValue>)> {
        let txn = Txn::new().and_then([
            first_of(&keys.queue),
            TxnOp::get(keys.fence.clone(), None),
            TxnOp::get(
                keys.queue.clone(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        ]);
        let resp = self.txn("inspect", txn).await?;
        let queued = match resp.op_responses().get(2) {
            Some(TxnOpResponse::Get(g)) => g.count(),
            _ => return Err(shape("inspect: the transaction returned too few reads")),
        };
        let [first, fence] = reads(&resp)?;
        Ok((queued, first, fence))
    }

    /// The holder, the waiters and the last fencing token of lock or election `name` (keys
    /// `keys`; `Backend::inspect`). An election's leader (the candidate key with the smallest
    /// create revision) comes with its value, from its metadata key read only if the leader is
    /// still the same key (else it changed: look again). A leader that is not dlock's
    /// (`etcdctl elect`, Go's `concurrency.Election`: no metadata key) is reported with owner
    /// `(not dlock) KEY` and its create revision as token, which is the token a dlock candidate
    /// in its place would have had.
    pub(crate) async fn inspect_queue(&self, keys: &Keys, name: &str) -> Result<LockInfo> {
        for _ in 0..CAS_ATTEMPTS {
            let (queued, first, fence) = self.queue_state(keys).await?;
            let (first, fence) = (first.as_ref(), fence.as_ref());
            let (Some(leader), Some(meta_key)) = (first, first.and_then(|f| keys.meta_of(f.key())))
            else {
                return (self.lock_info(keys, name, queued, first, fence, None)).await;
            };
            let txn = Txn::new()
                .when([Compare::create_revision(
                    leader.key().to_vec(),
                    CompareOp::Equal,
                    leader.create_revision(),
                )])
                .and_then([TxnOp::get(meta_key, None)]);
            let resp = self.txn("inspect", txn).await?;
            if !resp.succeeded() {
                continue;
            }
            let [meta] = reads(&resp)?;
            return (self.lock_info(keys, name, queued, first, fence, meta.as_ref())).await;
        }
        Err(self.contended(&keys.queue))
    }

    /// What `inspect` and `list` report of lock or election `name` (keys `keys`): `queued`
    /// keys in its queue, the `first` of them (the holder, with an election candidate's
    /// metadata key `meta`; its create revision is the token) and the fence key (a free lock's
    /// token is its mod revision).
    pub(crate) async fn lock_info(
        &self,
        keys: &Keys,
        name: &str,
        queued: i64,
        first: Option<&KeyValue>,
        fence: Option<&KeyValue>,
        meta: Option<&KeyValue>,
    ) -> Result<LockInfo> {
        let (holders, fencing_token) = match first {
            Some(f) => {
                let holder =
                    (keys.holder_info(f, meta)?).with_lease_left(self.lease_left(f.lease()).await?);
                (vec![holder], token_of(f.create_revision())?)
            }
            None => (
                Vec::new(),
                fence.map_or(0, |f| u64::try_from(f.mod_revision()).unwrap_or(0)),
            ),
        };
        let waiters =
            u32::try_from(queued.saturating_sub(holders.len() as i64).max(0)).unwrap_or(u32::MAX);
        Ok(LockInfo::new(name)
            .with_holders(holders)
            .with_fencing_token(fencing_token)
            .with_waiters(Some(waiters)))
    }
}
