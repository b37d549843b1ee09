//! Taking the lock in one transaction (etcd's `concurrency.Mutex` try-lock), and `inspect`.

use crate::error::{shape, KIND};
use crate::kv::{first_of, header_revision, reads, token_of, Keys, Record, CAS_ATTEMPTS};
use crate::renew::Cover;
use crate::EtcdBackend;
use distlock_core::backend::{AcquireReply, AcquireRequest};
use distlock_core::{Error, HolderInfo, LockInfo, Result};
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};

impl EtcdBackend {
    pub(crate) fn contended(&self, key: &[u8]) -> Error {
        let key = String::from_utf8_lossy(key);
        let why =
            format!("key `{key}` kept changing during {CAS_ATTEMPTS} compare-and-swap attempts");
        Error::connection(KIND, self.endpoint.clone(), why)
    }

    /// One try at the lock (`Backend::acquire`), with a lease of this request's own (a grant
    /// whose reply is lost leaves a lease with nothing on it, which expires by itself): takes
    /// the lock if nobody is queued; finds the attempt's own key if it holds the lock already
    /// (a retry of a request whose reply was lost: same key, same token); else reports who
    /// holds it, writing nothing.
    pub(crate) async fn acquire_once(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        let s = self.slot(&req.key, &req.attempt);
        let lease = self.grant(req.lease).await?;
        // The reply, and whether `lease` ended up carrying the key (else it carries nothing).
        let take = async {
            for _ in 0..CAS_ATTEMPTS {
                let txn = s.enqueue(req, lease, true);
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
                // Someone else is first: another attempt of dlock (of any owner, this one's
                // too) or a foreign `concurrency.Mutex` key. A key of this attempt behind it is
                // its place in the queue of a wait, which this try leaves alone.
                let Some(m) = m.filter(|m| m.key() == first.key()) else {
                    let ttl = self.lease_left(first.lease()).await?;
                    return Ok((AcquireReply::Held { ttl }, false));
                };
                let token = token_of(m.create_revision())?;
                // Gone: its lease ran out meanwhile, and the key with it; try afresh.
                if let Cover::Done { moved_to } = self.cover(&s, m, req.lease, Some(lease)).await? {
                    return Ok((AcquireReply::Granted { token }, moved_to == Some(lease.id)));
                }
            }
            Err(self.contended(&s.mine))
        };
        // After an error the key may be on this lease: the retry (or the give-up) of this
        // attempt finds it; revoking the lease here could delete a grant the retry then returns.
        let (reply, used) = self.doubting(&req.attempt, lease, take).await?;
        if !used {
            // etcd answered that nothing was put with it.
            self.revoke_in_background(lease.id);
        }
        Ok(reply)
    }

    /// One consistent look at a queue (a lock's or an election's), for `inspect`, `list` and
    /// the forced release: its length, its first key and the fence key in one read, and an
    /// election leader's metadata key, read only if the leader is still the same key (else it
    /// changed: look again).
    pub(crate) async fn queue_state(&self, keys: &Keys, what: &str) -> Result<Queue> {
        for _ in 0..CAS_ATTEMPTS {
            let count = GetOptions::new().with_prefix().with_count_only();
            let txn = Txn::new().and_then([
                first_of(&keys.queue),
                TxnOp::get(keys.fence.clone(), None),
                TxnOp::get(keys.queue.clone(), Some(count)),
            ]);
            let resp = self.txn(what, txn).await?;
            let Some(TxnOpResponse::Get(g)) = resp.op_responses().get(2).cloned() else {
                return Err(shape("inspect: the transaction returned too few reads"));
            };
            let [first, fence] = reads(&resp)?;
            let mut q = Queue {
                queued: g.count(),
                first,
                fence,
                meta: None,
            };
            let meta_key = q.first.as_ref().and_then(|f| keys.meta_of(f.key()));
            let (Some(leader), Some(meta_key)) = (&q.first, meta_key) else {
                return Ok(q);
            };
            let rev = leader.create_revision();
            let guard = Compare::create_revision(leader.key(), CompareOp::Equal, rev);
            let txn = Txn::new()
                .when([guard])
                .and_then([TxnOp::get(meta_key, None)]);
            let resp = self.txn(what, txn).await?;
            if resp.succeeded() {
                [q.meta] = reads(&resp)?;
                return Ok(q);
            }
        }
        Err(self.contended(&keys.queue))
    }

    /// Who holds queue key `kv`, with its lease's time left, for `inspect`, `list` and the
    /// forced release: for a lock, [`Keys::holder_of`]; for an election candidate its value,
    /// and its owner from its metadata key `meta` (none: not dlock's, shown by its name).
    pub(crate) async fn holder(
        &self,
        keys: &Keys,
        kv: &KeyValue,
        meta: Option<&KeyValue>,
    ) -> Result<HolderInfo> {
        let left = self.lease_left(kv.lease()).await?;
        let owner = match (&keys.meta, meta) {
            (None, _) => keys.holder_of(kv.key(), kv.value()),
            (Some(_), Some(m)) => Record::decode(m.key(), m.value(), true)?.owner,
            (Some(_), None) => format!("(not dlock) {}", keys.segment(kv.key())),
        };
        let value = (keys.meta.as_ref()).map(|_| String::from_utf8_lossy(kv.value()).into_owned());
        Ok(HolderInfo::new(owner, 1)
            .with_value(value)
            .with_lease_left(left))
    }

    /// What `inspect` and `list` report of lock or election `name` (keys `keys`) whose queue
    /// is `q`: its first key is the holder and its create revision the token; a free lock's
    /// token is the fence key's mod revision. A leader that is not dlock's (`etcdctl elect`: no
    /// metadata key) is reported with owner `(not dlock) KEY` and its create revision as
    /// token, the token a dlock candidate in its place would have had.
    pub(crate) async fn lock_info(&self, keys: &Keys, name: &str, q: Queue) -> Result<LockInfo> {
        let (holders, fencing_token) = match &q.first {
            Some(f) => (
                vec![self.holder(keys, f, q.meta.as_ref()).await?],
                token_of(f.create_revision())?,
            ),
            None => (
                Vec::new(),
                q.fence
                    .map_or(0, |f| u64::try_from(f.mod_revision()).unwrap_or(0)),
            ),
        };
        let waiters = q.queued.saturating_sub(holders.len() as i64).max(0);
        Ok(LockInfo::new(name)
            .with_holders(holders)
            .with_fencing_token(fencing_token)
            .with_waiters(Some(u32::try_from(waiters).unwrap_or(u32::MAX))))
    }
}

/// One consistent look at a queue ([`EtcdBackend::queue_state`]).
#[derive(Default)]
pub(crate) struct Queue {
    /// How many keys it holds.
    pub(crate) queued: i64,
    /// Its first key (the holder), and an election candidate's metadata key.
    pub(crate) first: Option<KeyValue>,
    pub(crate) meta: Option<KeyValue>,
    /// The fence key.
    pub(crate) fence: Option<KeyValue>,
}
