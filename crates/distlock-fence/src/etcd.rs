//! etcd: a transaction guarded on the lock key itself.
//!
//! A dlock grant on etcd is a key `PREFIX/NAME/ATTEMPT` whose create revision is the fencing
//! token, attached to the holder's lease. [`EtcdHolder::txn`] runs your operations in one
//! transaction that commits only while that key still exists **with that create revision**:
//! once the lease expired (or the lock was released) the key is gone and the transaction does
//! nothing, whether or not another holder came since. That is stronger than a token
//! comparison, which rejects a stale holder only after a newer one wrote; it also needs no
//! fence stored beside your data — the lock key is the fence. The cost: one range read to find
//! the key ([`EtcdFence::holder`], once per grant), then one transaction per write, as without
//! the fence.
//!
//! ```no_run
//! # async fn f(client: &etcd_client::Client, guard: &distlock_core::LockGuard) -> distlock_fence::Result<()> {
//! use distlock_fence::etcd::EtcdFence;
//! use etcd_client::TxnOp;
//!
//! let mut kv = client.kv_client();
//! // The lock `stock:42` of a backend with key prefix `dlock` (the URL's path, else the namespace).
//! let holder = EtcdFence::new("dlock", "stock:42").holder(&mut kv, guard.fencing_token()).await?;
//! holder.txn(&mut kv, vec![TxnOp::put("stock/42", "9", None)]).await?;
//! # Ok(()) }
//! ```

use crate::{Error, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, KvClient, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};

/// The queue of one dlock lock on etcd, where its holders' keys are.
#[derive(Debug, Clone)]
pub struct EtcdFence {
    queue: Vec<u8>,
}

/// The key of one grant: what [`EtcdHolder::txn`] is guarded on.
#[derive(Debug, Clone)]
pub struct EtcdHolder {
    queue: Vec<u8>,
    key: Vec<u8>,
    token: u64,
}

impl EtcdFence {
    /// The lock `lock_name` of a dlock etcd backend whose key prefix is `prefix` (the path of
    /// its `etcd://` URL, else its client's namespace: `dlock` by default).
    pub fn new(prefix: &str, lock_name: &str) -> EtcdFence {
        EtcdFence {
            queue: distlock_etcd::lock_queue_prefix(prefix, lock_name),
        }
    }

    /// Finds the key of the grant whose fencing token is `token`.
    ///
    /// # Errors
    /// [`Error::Stale`] when that grant's key is gone already (its lease ended, or it was
    /// released); [`Error::Store`] when etcd fails.
    pub async fn holder(&self, client: &mut KvClient, token: u64) -> Result<EtcdHolder> {
        let resp = client
            .get(
                self.queue.clone(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend),
                ),
            )
            .await
            .map_err(|e| etcd_err("reading the lock's queue", e))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let keys = resp.kvs();
        match keys
            .iter()
            .find(|kv| u64::try_from(kv.create_revision()).ok() == Some(token))
        {
            Some(kv) => Ok(EtcdHolder {
                queue: self.queue.clone(),
                key: kv.key().to_vec(),
                token,
            }),
            None => Err(crate::grant_gone(
                token,
                keys.first().map(|kv| kv.create_revision()),
                revision,
            )),
        }
    }
}

impl EtcdHolder {
    /// The grant's key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The grant's fencing token (the key's create revision).
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Runs `ops` in one transaction guarded on the grant's key: they are applied only while
    /// the key exists with the grant's create revision. The transaction's answer (the
    /// responses of `ops`) when applied. A retry after an unknown outcome applies `ops` again
    /// if the grant still holds: use puts of values (idempotent), not read-modify-writes
    /// split over two transactions.
    ///
    /// # Errors
    /// [`Error::Stale`] when the grant's key is gone (nothing applied): `newer` is the current
    /// holder's token, or, when nobody holds the lock, the revision at which the key was found
    /// gone (above the grant's); [`Error::Store`] when etcd fails.
    pub async fn txn(&self, client: &mut KvClient, ops: Vec<TxnOp>) -> Result<TxnResponse> {
        let token = i64::try_from(self.token).map_err(|_| {
            Error::InvalidArgument(format!("token {} is not an etcd revision", self.token))
        })?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                token,
            )])
            .and_then(ops)
            .or_else([TxnOp::get(
                self.queue.clone(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1),
                ),
            )]);
        let resp = client
            .txn(txn)
            .await
            .map_err(|e| etcd_err("a fenced transaction", e))?;
        if resp.succeeded() {
            return Ok(resp);
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        let head = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.create_revision()),
            _ => None,
        });
        Err(crate::grant_gone(self.token, head, revision))
    }
}

fn etcd_err(what: &str, e: etcd_client::Error) -> Error {
    Error::store("etcd", format!("{what} failed: {e}"), e)
}
