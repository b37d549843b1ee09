//! ZooKeeper: a multi-op whose first operation checks the holder's lock node.
//!
//! A dlock grant on ZooKeeper is an ephemeral sequential node in the lock's directory whose
//! creation zxid is the fencing token; it lives as long as the holder's session. Operations
//! written with [`ZkHolder::multi`] commit, all or none, only while that node exists
//! (`check` of its version first): once the session expired (or the lock was released) they do
//! nothing, whether or not another holder came since — stronger than a token comparison, and
//! with no fence stored beside your data. The cost: listing the directory and reading the
//! children's stats once per grant ([`ZkFence::holder`]), then one multi per write.
//!
//! ```no_run
//! # async fn f(zk: &zookeeper_client::Client, guard: &distlock_core::LockGuard) -> distlock_fence::Result<()> {
//! use distlock_fence::zookeeper::ZkFence;
//!
//! // The lock `stock:42` of a backend with namespace `dlock` (the default) on the same chroot.
//! let holder = ZkFence::new("dlock", "stock:42")?.holder(zk, guard.fencing_token()).await?;
//! holder.multi(zk, |w| w.add_set_data("/shop/stock-42", b"9", None)).await?;
//! # Ok(()) }
//! ```

use crate::{Error, Result};
use zookeeper_client::{Client, MultiWriteError, MultiWriteResult, MultiWriter};

/// The directory of one dlock lock on ZooKeeper, where its holders' nodes are.
#[derive(Debug, Clone)]
pub struct ZkFence {
    dir: String,
}

/// The node of one grant: what [`ZkHolder::multi`] checks first.
#[derive(Debug, Clone)]
pub struct ZkHolder {
    dir: String,
    path: String,
    version: i32,
    token: u64,
}

impl ZkFence {
    /// The mutex `lock_name` of a dlock ZooKeeper backend with namespace `namespace` (`dlock`
    /// by default), seen by a client on the same chroot.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the name cannot be a lock name.
    pub fn new(namespace: &str, lock_name: &str) -> Result<ZkFence> {
        let dir =
            distlock_zookeeper::lock_dir(namespace, lock_name, distlock_core::LockKind::Mutex)
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        Ok(ZkFence { dir })
    }

    /// The same lock for a client that is not on the backend's chroot: `chroot` (`/app`, as
    /// in the backend's URL `zk://host:port/app`) put before the directory.
    #[must_use]
    pub fn in_chroot(mut self, chroot: &str) -> ZkFence {
        let chroot = chroot.trim_end_matches('/');
        if !chroot.is_empty() {
            self.dir = format!("{chroot}{}", self.dir);
        }
        self
    }

    /// The lock's directory.
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// Finds the node of the grant whose fencing token is `token`.
    ///
    /// # Errors
    /// [`Error::Stale`] when that grant's node is gone already (its session ended, or it was
    /// released); [`Error::Store`] when ZooKeeper fails.
    pub async fn holder(&self, client: &Client, token: u64) -> Result<ZkHolder> {
        let (children, dir_stat) = match client.get_children(&self.dir).await {
            Ok(c) => c,
            Err(zookeeper_client::Error::NoNode) => {
                return Err(Error::Stale {
                    token,
                    newer: token.saturating_add(1),
                })
            }
            Err(e) => return Err(zk_err("listing the lock's nodes", e)),
        };
        let mut head: Option<i64> = None;
        for child in children {
            let path = format!("{}/{child}", self.dir);
            let Some(stat) = client
                .check_stat(&path)
                .await
                .map_err(|e| zk_err("reading a lock node", e))?
            else {
                continue;
            };
            if u64::try_from(stat.czxid).ok() == Some(token) {
                return Ok(ZkHolder {
                    dir: self.dir.clone(),
                    path,
                    version: stat.version,
                    token,
                });
            }
            head = Some(head.map_or(stat.czxid, |h| h.min(stat.czxid)));
        }
        Err(crate::grant_gone(token, head, dir_stat.pzxid))
    }
}

impl ZkHolder {
    /// The grant's node.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The grant's fencing token (the node's creation zxid).
    pub fn token(&self) -> u64 {
        self.token
    }

    /// One multi-op: the check of the grant's node, then what `ops` adds to the writer; all
    /// of it commits only while the node exists. The results of `ops` (the check's removed).
    ///
    /// # Errors
    /// [`Error::Stale`] when the node is gone (nothing applied): `newer` is the current
    /// holder's token, or the zxid of the directory's last change; [`Error::Store`] when
    /// ZooKeeper fails or one of `ops` fails (nothing applied either).
    pub async fn multi(
        &self,
        client: &Client,
        ops: impl FnOnce(&mut MultiWriter<'_>) -> std::result::Result<(), zookeeper_client::Error>,
    ) -> Result<Vec<MultiWriteResult>> {
        let mut writer = client.new_multi_writer();
        writer
            .add_check_version(&self.path, self.version)
            .map_err(|e| zk_err("the fence check", e))?;
        ops(&mut writer).map_err(|e| zk_err("adding the fenced operations", e))?;
        match writer.commit().await {
            Ok(mut results) => {
                if !results.is_empty() {
                    results.remove(0);
                }
                Ok(results)
            }
            Err(MultiWriteError::OperationFailed {
                index: 0,
                source: zookeeper_client::Error::NoNode | zookeeper_client::Error::BadVersion,
            }) => {
                let (children, dir_stat) = client
                    .get_children(&self.dir)
                    .await
                    .map_err(|e| zk_err("listing the lock's nodes", e))?;
                let mut head = None;
                for child in children {
                    if let Ok(Some(stat)) =
                        client.check_stat(&format!("{}/{child}", self.dir)).await
                    {
                        head = Some(head.map_or(stat.czxid, |h: i64| h.min(stat.czxid)));
                    }
                }
                Err(crate::grant_gone(self.token, head, dir_stat.pzxid))
            }
            Err(e) => Err(Error::store(
                "zookeeper",
                format!("a fenced multi failed: {e}"),
                e,
            )),
        }
    }
}

fn zk_err(what: &str, e: zookeeper_client::Error) -> Error {
    Error::store("zookeeper", format!("{what} failed: {e}"), e)
}
