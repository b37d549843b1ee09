//! etcd backend for dlock.
//!
//! Locks follow etcd's own mutex recipe (`client/v3/concurrency/mutex.go`): every owner that
//! wants the lock puts one key under the lock's prefix, attached to a lease; the key with the
//! lowest create revision holds the lock; each waiter watches only the key just before its own
//! (FIFO, no thundering herd). The key's **create revision is the fencing token**: etcd
//! revisions are cluster-wide and strictly increasing, and survive leader changes and restarts.
//!
//! | key | lease | value |
//! |---|---|---|
//! | `PREFIX/NAME/OWNER` | the hold's own lease | `COUNT TTL` (`0 TTL` while waiting) |
//! | `PREFIX/NAME` | none | empty; touched whenever a queue key is created (for `inspect`) |
//!
//! **One etcd lease per hold**, granted with the hold's lease rounded up to whole seconds (and
//! at least etcd's minimum TTL). The core's watchdog renews it: every tick, [`Backend::renew`]
//! reads the holds' keys in one transaction and sends one `LeaseKeepAlive` per hold. A key that
//! is gone, or a lease etcd no longer knows (TTL 0), is [`RenewOutcome::NotHeld`], which fires
//! the lost signal. A renewal to a longer lease than the key's lease moves the key to a new
//! lease (etcd cannot change a lease's TTL). A fixed lease is simply never kept alive: etcd
//! deletes the key when it expires, which hands the lock to the next waiter.
//!
//! URL: `etcd://[user:password@]host:port[,host:port…][/prefix]`. The prefix defaults to the
//! client's namespace (`dlock`). See `docs/etcd.md` for the safety argument and the costs.
#![warn(missing_docs)]

mod error;
mod keys;
mod wait;

use crate::error::{is_lease_not_found, map, shape, timed_out, KIND};
use crate::keys::{Entry, Keys};
use dlock_core::{
    async_trait, AcquireReply, AcquireRequest, Backend, ClientOptions, Error, Granted, HoldKey,
    HolderInfo, LockInfo, LockKind, ReleaseOutcome, ReleaseWatch, RenewOutcome, Result, Wake,
};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
    WatchStream,
};
use std::future::Future;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Default client port of etcd.
const DEFAULT_PORT: u16 = 2379;
/// etcd's default limit of operations in one transaction is 128; stay well below it.
const MAX_OPS_PER_TXN: usize = 64;
/// Compare-and-swap retries before giving up on a key that keeps changing under us.
const CAS_ATTEMPTS: usize = 8;

/// What the URL says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// `http://host:port` for every member.
    endpoints: Vec<String>,
    /// `host:port,host:port` for messages.
    display: String,
    user: Option<(String, String)>,
    prefix: Option<String>,
}

/// The etcd backend. Build it with [`EtcdBackend::connect`] (or through `dlock::connect`).
pub struct EtcdBackend {
    client: Client,
    endpoint: String,
    prefix: String,
    op_timeout: Duration,
}

/// The URL with its password replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{hosts}{tail}")
            } else {
                format!("{scheme}://{user}@{hosts}{tail}")
            }
        }
        None => url.to_owned(),
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn parse_url(url: &str) -> Result<Target> {
    let bad = |reason: String| Error::InvalidUrl {
        url: redact(url),
        reason,
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("no scheme; write etcd://host:port".into()))?;
    match scheme {
        "etcd" => {}
        "etcds" => {
            return Err(bad(
                "etcds:// (TLS) is not supported by this version of the etcd backend; \
                 reach etcd over a TLS-terminating proxy or a trusted network with etcd://"
                    .into(),
            ))
        }
        s => return Err(bad(format!("scheme `{s}` is not etcd://"))),
    }
    if rest.contains('?') || rest.contains('#') {
        return Err(bad(
            "the etcd URL takes no parameters; write etcd://host:port[,host:port…][/prefix]".into(),
        ));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (u, p) = userinfo.split_once(':').ok_or_else(|| {
                bad("credentials need both parts: etcd://user:password@host:port".into())
            })?;
            let u =
                percent_decode(u).ok_or_else(|| bad("bad percent-encoding in the user".into()))?;
            let p = percent_decode(p)
                .ok_or_else(|| bad("bad percent-encoding in the password".into()))?;
            if u.is_empty() {
                return Err(bad("empty user name".into()));
            }
            (Some((u, p)), hosts)
        }
        None => (None, authority),
    };
    let mut endpoints = Vec::new();
    let mut shown = Vec::new();
    for h in hosts.split(',') {
        let (host, port) = split_host_port(h).map_err(bad)?;
        endpoints.push(format!("http://{host}:{port}"));
        shown.push(format!("{host}:{port}"));
    }
    let prefix = path.trim_matches('/');
    let prefix = if prefix.is_empty() {
        None
    } else {
        let p = percent_decode(prefix)
            .ok_or_else(|| bad("bad percent-encoding in the prefix".into()))?;
        if p.chars().any(char::is_control) {
            return Err(bad("the prefix must not contain control characters".into()));
        }
        Some(p)
    };
    Ok(Target {
        endpoints,
        display: shown.join(","),
        user,
        prefix,
    })
}

fn split_host_port(h: &str) -> std::result::Result<(String, u16), String> {
    if h.is_empty() {
        return Err("empty host; write etcd://host:port[,host:port…]".into());
    }
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let (ip6, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{h}`: unclosed `[` in an IPv6 address"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("`{h}`: expected `:port` after `]`"))?,
            ),
        };
        (format!("[{ip6}]"), port)
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (h.to_owned(), None),
        }
    };
    if host.is_empty() || host.contains(['@', ' ']) {
        return Err(format!("`{h}` is not a valid host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{p}` in `{h}` is not a port number"))?,
    };
    Ok((host, port))
}

/// True if the request provably never reached etcd (the connection to a member was refused),
/// so sending it again cannot apply it twice.
fn never_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable
                && !s.message().starts_with("etcdserver")
                && s.message().contains("connect")
        }
        _ => false,
    }
}

/// Lease length in whole seconds, rounded up (etcd leases have a one-second granularity).
fn ttl_secs(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis().div_ceil(1000).max(1)).unwrap_or(i64::MAX)
}

/// One lease granted for an attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    pub(crate) id: i64,
    /// TTL the server granted (seconds; at least etcd's minimum TTL).
    pub(crate) ttl: i64,
}

/// The result of the first acquisition step.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// The lock was free: our key was created with the fresh lease.
    Granted { token: u64 },
    /// This owner held the lock already: one more hold. `used` tells whether the fresh lease
    /// was taken over by the key (a longer lease than the key had).
    Reentered { token: u64, used: bool },
    /// Another owner holds the lock (or the queue is not empty); we did not write anything.
    Held { first: KeyValue },
    /// This owner's key is already queued (another task of the same owner waits).
    Queued { mine: KeyValue },
}

fn token_of(rev: i64) -> Result<u64> {
    u64::try_from(rev)
        .ok()
        .filter(|t| *t > 0)
        .ok_or_else(|| shape(format!("revision {rev} is not a valid fencing token")))
}

/// The key-values of every Get in a transaction response, in order.
fn gets(resp: &TxnResponse) -> Vec<Vec<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(mut g) => Some(g.take_kvs()),
            _ => None,
        })
        .collect()
}

fn nth_first(all: &mut [Vec<KeyValue>], i: usize) -> Result<Option<KeyValue>> {
    let v = all
        .get_mut(i)
        .ok_or_else(|| shape("a transaction returned fewer reads than it made"))?;
    Ok(if v.is_empty() {
        None
    } else {
        Some(v.swap_remove(0))
    })
}

fn header_revision(resp: &TxnResponse) -> Result<i64> {
    resp.header()
        .map(|h| h.revision())
        .ok_or_else(|| shape("a transaction reply without a header"))
}

/// The first key of a queue: the holder.
fn first_of(queue: &[u8]) -> TxnOp {
    TxnOp::get(
        queue.to_vec(),
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        ),
    )
}

impl EtcdBackend {
    /// Connects to the etcd cluster at `url` and checks that it answers (a linearizable read,
    /// so a cluster without a quorum fails here).
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        let target = parse_url(url)?;
        let prefix = target
            .prefix
            .clone()
            .unwrap_or_else(|| opts.get_namespace().to_owned());
        let endpoint = target.display.clone();
        let mut co = ConnectOptions::new()
            .with_connect_timeout(opts.get_connect_timeout())
            // etcd refuses HTTP/2 pings more often than every 5 s by default.
            .with_keep_alive(
                Duration::from_secs(10),
                opts.get_op_timeout().max(Duration::from_secs(1)),
            )
            .with_require_leader(true);
        if let Some((u, p)) = &target.user {
            co = co.with_user(u.clone(), p.clone());
        }
        let limit = opts.get_connect_timeout() * 2;
        let no_answer = || Error::Connection {
            backend: KIND,
            endpoint: endpoint.clone(),
            source: format!(
                "no answer within {limit:?} (is the cluster down or without a quorum?)"
            )
            .into(),
        };
        let client = tokio::time::timeout(limit, Client::connect(&target.endpoints, Some(co)))
            .await
            .map_err(|_| no_answer())?
            .map_err(|e| match e {
                etcd_client::Error::InvalidArgs(m) => Error::InvalidUrl {
                    url: redact(url),
                    reason: m,
                },
                etcd_client::Error::InvalidUri(m) => Error::InvalidUrl {
                    url: redact(url),
                    reason: m.to_string(),
                },
                e => map(&endpoint, e),
            })?;
        let backend = EtcdBackend {
            client,
            endpoint: endpoint.clone(),
            prefix,
            op_timeout: opts.get_op_timeout(),
        };
        let mut kv = backend.client.kv_client();
        let probe = backend.prefix.clone().into_bytes();
        tokio::time::timeout(
            limit,
            kv.get(
                probe,
                Some(GetOptions::new().with_keys_only().with_limit(1)),
            ),
        )
        .await
        .map_err(|_| no_answer())?
        .map_err(|e| map(&endpoint, e))?;
        Ok(backend)
    }

    /// The key prefix every key of this backend starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The underlying etcd client (e.g. for tests that break locks behind a holder's back).
    pub fn etcd_client(&self) -> &Client {
        &self.client
    }

    /// The key of `owner`'s place in the queue of lock `name` (`PREFIX/NAME/OWNER`, escaped).
    pub fn owner_key(&self, name: &str, owner: &str) -> Vec<u8> {
        Keys::new(&self.prefix, name, owner).mine
    }

    /// The prefix of every queue key of lock `name` (`PREFIX/NAME/`).
    pub fn queue_prefix(&self, name: &str) -> Vec<u8> {
        Keys::new(&self.prefix, name, "").queue
    }

    pub(crate) fn keys(&self, key: &HoldKey) -> Keys {
        Keys::new(&self.prefix, &key.name, &key.owner)
    }

    fn check_kind(&self, kind: LockKind) -> Result<()> {
        match kind {
            // etcd's mutex recipe is first come, first served: every mutex is fair, and
            // `fair` names the same lock as `mutex`.
            LockKind::Mutex | LockKind::Fair => Ok(()),
            other => Err(Error::unsupported(
                KIND,
                format!("lock kind {}", other.as_str()),
            )),
        }
    }

    /// Runs one call with the per-call timeout, retrying at once (on another member, picked by
    /// the client's balancer) when the request provably never left: a member that is down
    /// refuses the connection. The outer error is the timeout; the inner one etcd's.
    pub(crate) async fn raw<T, F, Fut>(
        &self,
        what: &str,
        mut f: F,
    ) -> Result<std::result::Result<T, etcd_client::Error>>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let attempts = async {
            let mut n: u64 = 0;
            loop {
                match f(self.client.clone()).await {
                    Err(e) if never_sent(&e) && n < 6 => {
                        n += 1;
                        tokio::time::sleep(Duration::from_millis(5 * n)).await;
                    }
                    r => return r,
                }
            }
        };
        tokio::time::timeout(self.op_timeout, attempts)
            .await
            .map_err(|_| timed_out(&self.endpoint, what, self.op_timeout))
    }

    /// [`raw`](Self::raw) with etcd's errors mapped.
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.raw(what, f).await?.map_err(|e| map(&self.endpoint, e))
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.call(what, |c| {
            let txn = txn.clone();
            async move { c.kv_client().txn(txn).await }
        })
        .await
    }

    pub(crate) async fn get(&self, what: &str, key: &[u8]) -> Result<Option<KeyValue>> {
        let mut r = self
            .call(what, |c| {
                let key = key.to_vec();
                async move { c.kv_client().get(key, None).await }
            })
            .await?;
        let mut kvs = r.take_kvs();
        Ok(if kvs.is_empty() {
            None
        } else {
            Some(kvs.swap_remove(0))
        })
    }

    pub(crate) async fn grant(&self, lease: Duration) -> Result<Lease> {
        let ttl = ttl_secs(lease);
        let r = self
            .call("lease grant", |c| async move {
                c.lease_client().grant(ttl, None).await
            })
            .await?;
        if !r.error().is_empty() || r.ttl() <= 0 {
            return Err(shape(format!(
                "lease grant failed: `{}` (ttl {})",
                r.error(),
                r.ttl()
            )));
        }
        Ok(Lease {
            id: r.id(),
            ttl: r.ttl(),
        })
    }

    /// Revokes a lease (deleting whatever is attached to it) without waiting for the answer.
    /// If it fails the lease simply expires.
    pub(crate) fn revoke_in_background(&self, id: i64) {
        let client = self.client.clone();
        let timeout = self.op_timeout;
        tokio::spawn(async move {
            let mut lc = client.lease_client();
            match tokio::time::timeout(timeout, lc.revoke(id)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if is_lease_not_found(&e) => {}
                Ok(Err(e)) => {
                    tracing::debug!(lease = id, error = %e, "lease revoke failed; it expires by itself")
                }
                Err(_) => {
                    tracing::debug!(lease = id, "lease revoke timed out; it expires by itself")
                }
            }
        });
    }

    pub(crate) async fn revoke(&self, id: i64) -> Result<()> {
        match self
            .raw("lease revoke", |c| async move {
                c.lease_client().revoke(id).await
            })
            .await?
        {
            Ok(_) => Ok(()),
            Err(e) if is_lease_not_found(&e) => Ok(()),
            Err(e) => Err(map(&self.endpoint, e)),
        }
    }

    /// One keep-alive of lease `id`. `Ok(false)`: etcd no longer knows the lease.
    pub(crate) async fn keep_alive(&self, id: i64) -> Result<bool> {
        if id == 0 {
            return Ok(false);
        }
        match self
            .raw("lease keep-alive", |c| async move {
                c.lease_client().keep_alive(id).await
            })
            .await?
        {
            Ok(_) => Ok(true),
            Err(e) if is_lease_not_found(&e) => Ok(false),
            Err(e) => Err(map(&self.endpoint, e)),
        }
    }

    /// Time left on lease `id`, or `None` if there is none.
    async fn lease_left(&self, id: i64) -> Result<Option<Duration>> {
        if id == 0 {
            return Ok(None);
        }
        match self
            .raw("lease time-to-live", |c| async move {
                c.lease_client().time_to_live(id, None).await
            })
            .await?
        {
            Ok(r) if r.ttl() >= 0 => Ok(Some(Duration::from_secs(r.ttl().unsigned_abs()))),
            Ok(_) => Ok(None),
            Err(e) if is_lease_not_found(&e) => Ok(None),
            Err(e) => Err(map(&self.endpoint, e)),
        }
    }

    /// The first step of every acquisition: take the lock if nobody is queued, re-enter it if
    /// this owner holds it, else report who is first. Writes nothing in the last two cases.
    pub(crate) async fn attempt(&self, keys: &Keys, lease: Lease) -> Result<Attempt> {
        let mine_entry = Entry {
            count: 1,
            ttl: lease.ttl,
        };
        for _ in 0..CAS_ATTEMPTS {
            let txn = Txn::new()
                .when([
                    Compare::create_revision(keys.queue.clone(), CompareOp::Equal, 0).with_prefix(),
                ])
                .and_then([
                    TxnOp::put(
                        keys.mine.clone(),
                        mine_entry.encode(),
                        Some(PutOptions::new().with_lease(lease.id)),
                    ),
                    TxnOp::put(keys.fence.clone(), "", None),
                ])
                .or_else([TxnOp::get(keys.mine.clone(), None), first_of(&keys.queue)]);
            let resp = self.txn("acquire", txn).await?;
            if resp.succeeded() {
                return Ok(Attempt::Granted {
                    token: token_of(header_revision(&resp)?)?,
                });
            }
            let mut all = gets(&resp);
            let mine = nth_first(&mut all, 0)?;
            let first = nth_first(&mut all, 1)?;
            match (mine, first) {
                (Some(m), Some(f)) if f.key() == m.key() => {
                    if let Some(used) = self.reenter(keys, &m, lease).await? {
                        return Ok(Attempt::Reentered {
                            token: token_of(m.create_revision())?,
                            used,
                        });
                    }
                    // The key changed under us: read again.
                }
                (Some(m), _) => return Ok(Attempt::Queued { mine: m }),
                (None, Some(f)) => return Ok(Attempt::Held { first: f }),
                (None, None) => {
                    return Err(shape(
                        "etcd said the queue was not empty but returned no key of it",
                    ))
                }
            }
        }
        Err(self.contended(keys))
    }

    fn contended(&self, keys: &Keys) -> Error {
        Error::Connection {
            backend: KIND,
            endpoint: self.endpoint.clone(),
            source: format!(
                "key `{}` kept changing during {CAS_ATTEMPTS} compare-and-swap attempts",
                String::from_utf8_lossy(&keys.mine)
            )
            .into(),
        }
    }

    /// One more hold on `m` (the owner's key, first in the queue): count + 1, and a lease at
    /// least as long as `lease` (moving the key to `lease` if it is longer, else keeping the
    /// key's lease alive). `Ok(None)`: the key changed meanwhile. `Ok(Some(used))`: done;
    /// `used` tells whether `lease` now carries the key.
    async fn reenter(&self, keys: &Keys, m: &KeyValue, lease: Lease) -> Result<Option<bool>> {
        let e = Entry::decode(m.key(), m.value())?;
        let count = e.count.checked_add(1).ok_or_else(|| {
            shape(format!(
                "hold count of `{}` would overflow",
                String::from_utf8_lossy(m.key())
            ))
        })?;
        let cas = |value: Entry, put: PutOptions| {
            Txn::new()
                .when([Compare::mod_revision(
                    keys.mine.clone(),
                    CompareOp::Equal,
                    m.mod_revision(),
                )])
                .and_then([TxnOp::put(keys.mine.clone(), value.encode(), Some(put))])
        };
        if lease.ttl > e.ttl {
            let txn = cas(
                Entry {
                    count,
                    ttl: lease.ttl,
                },
                PutOptions::new().with_lease(lease.id),
            );
            if !self.txn("re-enter", txn).await?.succeeded() {
                return Ok(None);
            }
            self.revoke_in_background(m.lease());
            Ok(Some(true))
        } else {
            let txn = cas(
                Entry { count, ttl: e.ttl },
                PutOptions::new().with_ignore_lease(),
            );
            let (r, alive) = tokio::join!(self.txn("re-enter", txn), self.keep_alive(m.lease()));
            if !r?.succeeded() {
                return Ok(None);
            }
            alive?;
            Ok(Some(false))
        }
    }

    /// Moves the holder key `m` to a new lease of `lease` (etcd cannot lengthen a lease).
    async fn relocate(
        &self,
        keys: &Keys,
        m: &KeyValue,
        e: Entry,
        lease: Duration,
    ) -> Result<RenewOutcome> {
        let new = self.grant(lease).await?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                keys.mine.clone(),
                CompareOp::Equal,
                m.mod_revision(),
            )])
            .and_then([TxnOp::put(
                keys.mine.clone(),
                Entry {
                    count: e.count,
                    ttl: new.ttl,
                }
                .encode(),
                Some(PutOptions::new().with_lease(new.id)),
            )]);
        match self.txn("renew", txn).await {
            Ok(r) if r.succeeded() => {
                self.revoke_in_background(m.lease());
                Ok(RenewOutcome::Renewed)
            }
            Ok(_) => {
                self.revoke_in_background(new.id);
                // Changed meanwhile (a re-entry or a release): the next tick looks again,
                // unless it is gone.
                let now = self.get("renew", &keys.mine).await?;
                Ok(match now.as_ref() {
                    Some(kv) if Entry::decode(kv.key(), kv.value())?.count > 0 => {
                        RenewOutcome::Renewed
                    }
                    _ => RenewOutcome::NotHeld,
                })
            }
            Err(e) => {
                self.revoke_in_background(new.id);
                Err(e)
            }
        }
    }

    async fn renew_one(
        &self,
        key: &HoldKey,
        lease: Duration,
        kv: Option<KeyValue>,
    ) -> Result<RenewOutcome> {
        let Some(kv) = kv else {
            return Ok(RenewOutcome::NotHeld);
        };
        let e = Entry::decode(kv.key(), kv.value())?;
        if e.count == 0 {
            return Ok(RenewOutcome::NotHeld);
        }
        if ttl_secs(lease) > e.ttl {
            return self.relocate(&self.keys(key), &kv, e, lease).await;
        }
        Ok(if self.keep_alive(kv.lease()).await? {
            RenewOutcome::Renewed
        } else {
            RenewOutcome::NotHeld
        })
    }
}

/// A subscription to the deletions under one lock's queue.
struct QueueWatch {
    stream: WatchStream,
    endpoint: String,
}

#[async_trait]
impl ReleaseWatch for QueueWatch {
    async fn changed(&mut self) -> Result<Wake> {
        loop {
            match self.stream.message().await {
                Ok(Some(resp)) => {
                    if resp.canceled() {
                        return Err(map(
                            &self.endpoint,
                            etcd_client::Error::WatchError(format!(
                                "watch canceled: {}",
                                resp.cancel_reason()
                            )),
                        ));
                    }
                    if resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(Wake::Released);
                    }
                }
                Ok(None) => {
                    return Err(map(
                        &self.endpoint,
                        etcd_client::Error::WatchError("watch stream ended".into()),
                    ))
                }
                Err(e) => return Err(map(&self.endpoint, e)),
            }
        }
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.check_kind(req.key.kind)?;
        let keys = self.keys(&req.key);
        let lease = self.grant(req.lease).await?;
        let attempt = match self.attempt(&keys, lease).await {
            Ok(a) => a,
            Err(e) => {
                // Whatever the attempt may have written is attached to this lease.
                self.revoke_in_background(lease.id);
                return Err(e);
            }
        };
        match attempt {
            Attempt::Granted { token } => Ok(AcquireReply::Granted { token }),
            Attempt::Reentered { token, used } => {
                if !used {
                    self.revoke_in_background(lease.id);
                }
                Ok(AcquireReply::Granted { token })
            }
            Attempt::Held { first } => {
                self.revoke_in_background(lease.id);
                Ok(AcquireReply::Held {
                    ttl: self.lease_left(first.lease()).await?,
                })
            }
            Attempt::Queued { .. } => {
                self.revoke_in_background(lease.id);
                Ok(AcquireReply::Held { ttl: None })
            }
        }
    }

    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        wait::acquire_wait(self, req, deadline, cancel).await
    }

    async fn watch(&self, key: &HoldKey) -> Result<Box<dyn ReleaseWatch>> {
        let keys = self.keys(key);
        let opts = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        let mut stream = self
            .call("watch", |c| {
                let (queue, opts) = (keys.queue.clone(), opts.clone());
                async move { c.watch_client().watch(queue, Some(opts)).await }
            })
            .await?;
        // Wait for the server to confirm the watch, so no release after this call is missed.
        let first = tokio::time::timeout(self.op_timeout, stream.message())
            .await
            .map_err(|_| timed_out(&self.endpoint, "watch", self.op_timeout))?
            .map_err(|e| map(&self.endpoint, e))?;
        match first {
            Some(r) if r.created() && !r.canceled() => {}
            _ => {
                return Err(map(
                    &self.endpoint,
                    etcd_client::Error::WatchError("the watch was not created".into()),
                ))
            }
        }
        Ok(Box::new(QueueWatch {
            stream,
            endpoint: self.endpoint.clone(),
        }))
    }

    async fn release(&self, key: &HoldKey) -> Result<ReleaseOutcome> {
        self.check_kind(key.kind)?;
        let keys = self.keys(key);
        for _ in 0..CAS_ATTEMPTS {
            let read =
                Txn::new().and_then([TxnOp::get(keys.mine.clone(), None), first_of(&keys.queue)]);
            let resp = self.txn("release", read).await?;
            let mut all = gets(&resp);
            let mine = nth_first(&mut all, 0)?;
            let first = nth_first(&mut all, 1)?;
            let m = match (mine, first) {
                (None, Some(_)) => return Ok(ReleaseOutcome::TakenByOther),
                (None, None) => return Ok(ReleaseOutcome::Expired),
                (Some(m), Some(f)) if f.key() == m.key() => m,
                // Our key waits behind another owner (another task of ours queued it).
                (Some(_), _) => return Ok(ReleaseOutcome::TakenByOther),
            };
            let e = Entry::decode(m.key(), m.value())?;
            let unchanged =
                Compare::mod_revision(keys.mine.clone(), CompareOp::Equal, m.mod_revision());
            match e.count {
                // Handed to a queued task of this owner that has not claimed it yet.
                0 => return Ok(ReleaseOutcome::Expired),
                1 => {
                    let txn = Txn::new()
                        .when([unchanged])
                        .and_then([TxnOp::delete(keys.mine.clone(), None)]);
                    if self.txn("release", txn).await?.succeeded() {
                        self.revoke_in_background(m.lease());
                        return Ok(ReleaseOutcome::Released);
                    }
                }
                n => {
                    let left = Entry {
                        count: n - 1,
                        ttl: e.ttl,
                    };
                    let txn = Txn::new().when([unchanged]).and_then([TxnOp::put(
                        keys.mine.clone(),
                        left.encode(),
                        Some(PutOptions::new().with_ignore_lease()),
                    )]);
                    if self.txn("release", txn).await?.succeeded() {
                        return Ok(ReleaseOutcome::StillHeld { remaining: n - 1 });
                    }
                }
            }
        }
        Err(self.contended(&keys))
    }

    async fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        for (key, _) in holds {
            self.check_kind(key.kind)?;
        }
        // Read every hold's key, in chunks of one transaction each, all at once.
        let reads = holds.chunks(MAX_OPS_PER_TXN).map(|chunk| {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(k, _)| TxnOp::get(self.keys(k).mine, None))
                .collect();
            self.txn("renew", Txn::new().and_then(ops))
        });
        let mut found = Vec::with_capacity(holds.len());
        for resp in futures_util::future::try_join_all(reads).await? {
            let mut all = gets(&resp);
            for i in 0..all.len() {
                found.push(nth_first(&mut all, i)?);
            }
        }
        if found.len() != holds.len() {
            return Err(shape(format!(
                "renewal read {} keys for {} holds",
                found.len(),
                holds.len()
            )));
        }
        let each = holds
            .iter()
            .zip(found)
            .map(|((key, lease), kv)| self.renew_one(key, *lease, kv));
        futures_util::future::try_join_all(each).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.check_kind(kind)?;
        let keys = Keys::new(&self.prefix, name, "");
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
        let mut all = gets(&resp);
        let first = nth_first(&mut all, 0)?;
        let fence = nth_first(&mut all, 1)?;
        let (holders, fencing_token) = match first {
            Some(f) => {
                let e = Entry::decode(f.key(), f.value())?;
                let holder = HolderInfo {
                    owner: keys.owner_of(f.key())?,
                    count: e.count,
                    lease_left: self.lease_left(f.lease()).await?,
                    side: None,
                };
                (vec![holder], token_of(f.create_revision())?)
            }
            None => (
                Vec::new(),
                fence.map_or(0, |f| u64::try_from(f.mod_revision()).unwrap_or(0)),
            ),
        };
        let waiters =
            u32::try_from(queued.saturating_sub(holders.len() as i64).max(0)).unwrap_or(u32::MAX);
        Ok(LockInfo {
            name: name.to_owned(),
            holders,
            fencing_token,
            waiters: Some(waiters),
            permits: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = parse_url("etcd://127.0.0.1:1,127.0.0.1:2/shop/a").unwrap();
        assert_eq!(t.endpoints, ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        assert_eq!(t.display, "127.0.0.1:1,127.0.0.1:2");
        assert_eq!(t.prefix.as_deref(), Some("shop/a"));
        assert_eq!(t.user, None);
        let t = parse_url("etcd://u:p%40ss@h").unwrap();
        assert_eq!(t.endpoints, ["http://h:2379"]);
        assert_eq!(t.user, Some(("u".into(), "p@ss".into())));
        assert_eq!(t.prefix, None);
        let t = parse_url("etcd://[::1]:5,[::1]/").unwrap();
        assert_eq!(t.endpoints, ["http://[::1]:5", "http://[::1]:2379"]);
        for bad in [
            "etcd://",
            "etcd://h:1,",
            "etcd://h:x",
            "etcd://h:0",
            "etcd://h?x=1",
            "etcd://u@h",
            "etcd://:p@h",
            "etcds://h",
            "http://h",
            "nothing",
            "etcd://[::1",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        let e = parse_url("etcd://u:secret@h:x").unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(redact("etcd://u:secret@h:1/p"), "etcd://u:***@h:1/p");
        assert_eq!(redact("etcd://h:1/p"), "etcd://h:1/p");
    }

    #[test]
    fn ttls() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_secs(Duration::from_secs(30)), 30);
    }
}
