//! Operator commands on etcd: `dlock list`, `dlock release --force`, `dlock doctor`
//! ([`crate::doctor`]); docs/etcd.md, *Operator commands*, has what each reads and writes.
//!
//! The forced release deletes the holder's key guarded by its create revision (a holder that
//! changed meanwhile is never the one removed) and rewrites `PREFIX/NAME`. The fencing token
//! needs no counter of its own: every later grant is a key created later, so its create
//! revision (its token) is higher than the removed holder's.

use crate::acquire::Queue;
use crate::builder::percent_decode;
use crate::kv::{header_revision, token_of, Keys, Record, CAS_ATTEMPTS};
use crate::EtcdBackend;
use distlock_core::{Finding, ForceReleased, ListedLock, LockKind, Operator, Result};
use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp};
use std::collections::BTreeMap;

/// Keys per page of the range read (a page must fit a gRPC message whatever the values).
const PAGE: i64 = 1000;

/// The lock name and, for a queue key, `true`, of key `key` under `PREFIX/` (`root`); `None`
/// for a key that is no lock's (an empty name).
fn parse_key(root: &[u8], key: &[u8]) -> Option<(String, bool)> {
    let mut parts = key.strip_prefix(root)?.splitn(2, |b| *b == b'/');
    let (name, queued) = (parts.next()?, parts.next().is_some());
    if name.is_empty() {
        return None;
    }
    let raw = String::from_utf8_lossy(name);
    // dlock escapes `%` and `/` in names; a foreign key may not decode: show it as it is.
    let name = percent_decode(&raw).unwrap_or_else(|| raw.into_owned());
    Some((name, queued))
}

#[distlock_core::async_trait]
impl Operator for EtcdBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let root = format!("{}/", self.prefix).into_bytes();
        let mut from = root.clone();
        from.extend_from_slice(crate::kv::escape(prefix).as_bytes());
        let end = prefix_end(&from);
        let mut names: BTreeMap<String, Queue> = BTreeMap::new();
        // Every page at the revision of the first (0: the newest, for the first).
        let mut at = 0;
        loop {
            let opts = GetOptions::new()
                .with_range(end.clone())
                .with_sort(SortTarget::Key, SortOrder::Ascend)
                .with_limit(PAGE)
                .with_revision(at);
            let mut resp = self
                .call("list", |c| {
                    let (key, opts) = (from.clone(), opts.clone());
                    async move { c.kv_client().get(key, Some(opts)).await }
                })
                .await?;
            if at == 0 {
                at = resp.header().map_or(0, |h| h.revision());
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            let Some(last) = kvs.last().map(|kv| kv.key().to_vec()) else {
                break;
            };
            for kv in kvs {
                let parsed = parse_key(&root, kv.key()).filter(|(n, _)| n.starts_with(prefix));
                let Some((name, queued)) = parsed else {
                    continue;
                };
                // Per name, the queue key with the lowest create revision is the holder.
                let q = names.entry(name).or_default();
                if !queued {
                    q.fence = Some(kv);
                    continue;
                }
                q.queued += 1;
                if (q.first.as_ref()).is_none_or(|f| kv.create_revision() < f.create_revision()) {
                    q.first = Some(kv);
                }
            }
            if !more {
                break;
            }
            // The next page starts just after the last key of this one.
            from = last;
            from.push(0);
        }
        let mut out = Vec::with_capacity(names.len());
        for (name, q) in names {
            let info = self
                .lock_info(&Keys::new(&self.prefix, &name), &name, q)
                .await?;
            out.push(ListedLock::new(LockKind::Mutex, info));
        }
        Ok(out)
    }

    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased> {
        let keys = Keys::of_kind(&self.prefix, name, kind);
        for _ in 0..CAS_ATTEMPTS {
            let q = self.queue_state(&keys, "forced release").await?;
            let fence = TxnOp::put(keys.fence.clone(), "", None);
            let (guard, ops, removed) = match &q.first {
                // The holder is the key read: delete exactly it (an election candidate's
                // metadata key with it), if it is still that key (same create revision);
                // rewriting PREFIX/NAME makes `inspect` of the then free lock report this
                // transaction's revision, above every token handed out.
                Some(h) => (
                    Compare::create_revision(h.key(), CompareOp::Equal, h.create_revision()),
                    keys.read_and_delete(h.key())
                        .into_iter()
                        .chain([fence])
                        .collect(),
                    Some(self.holder(&keys, h, q.meta.as_ref()).await?),
                ),
                // Free: nothing to remove; the counter still moves (the operator asked for it),
                // if nobody queued meanwhile.
                None => (
                    Compare::create_revision(keys.queue.clone(), CompareOp::Equal, 0).with_prefix(),
                    vec![fence],
                    None,
                ),
            };
            let resp = self
                .txn("forced release", Txn::new().when([guard]).and_then(ops))
                .await?;
            if !resp.succeeded() {
                // The holder changed between the read and the transaction: look again.
                continue;
            }
            let token = token_of(header_revision(&resp)?)?;
            if let Some(h) = &q.first {
                // A dlock key is alone on its attempt's lease: revoke it (it carries nothing now).
                // A foreign key (`etcdctl lock`, Go's session) may share its session's lease with
                // other keys of that program: leave the lease alone. (An election candidate's
                // value is the application's: never read as a lock's.)
                if keys.meta.is_none()
                    && Record::decode(h.key(), h.value(), false).is_ok()
                    && h.lease() != 0
                {
                    self.revoke_in_background(h.lease());
                }
            }
            return Ok(ForceReleased::new(removed.into_iter().collect(), token));
        }
        Err(self.contended(&keys.queue))
    }

    async fn diagnose(&self) -> Result<Vec<Finding>> {
        crate::doctor::diagnose(self).await
    }
}

/// The end of the range of every key starting with `p` (etcd's `GetPrefixRangeEnd`).
fn prefix_end(p: &[u8]) -> Vec<u8> {
    let mut end = p.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the key space.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_names() {
        let root = b"dlock/";
        assert_eq!(
            parse_key(root, b"dlock/a%2Fb%25c/0f"),
            Some(("a/b%c".into(), true))
        );
        assert_eq!(parse_key(root, b"dlock/a"), Some(("a".into(), false)));
        // `etcdctl lock dlock/a/b` queues under dlock's lock `a`, and blocks it.
        assert_eq!(
            parse_key(root, b"dlock/a/b/694d8f2a"),
            Some(("a".into(), true))
        );
        assert_eq!(parse_key(root, b"dlock//x"), None);
        assert_eq!(parse_key(root, b"other/x"), None);
        assert_eq!(prefix_end(b"ab"), b"ac");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }
}
