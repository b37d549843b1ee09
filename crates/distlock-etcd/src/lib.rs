//! etcd backend for dlock.
//!
//! Locks follow etcd's own mutex recipe (`client/v3/concurrency/mutex.go`): every acquisition
//! attempt that wants the lock puts one key under the lock's prefix, attached to a lease; the
//! key with the lowest create revision holds the lock; each waiter watches only the key just
//! before its own (FIFO, no thundering herd). The key's **create revision is the fencing
//! token**: etcd revisions are cluster-wide and strictly increasing, and survive leader changes
//! and restarts. Because the prefix and the ordering are the Go recipe's, `etcdctl lock
//! PREFIX/NAME` (and any Go program using `concurrency.Mutex` on that prefix) and dlock
//! exclude each other, both ways.
//!
//! | key | lease | value |
//! |---|---|---|
//! | `PREFIX/NAME/ATTEMPT` | the attempt's own lease | `TTL OWNER` |
//! | `PREFIX/NAME` | none | empty; touched whenever a queue key is created (for `inspect`) |
//!
//! **One key per attempt** (the core's `AttemptId`), so every request is addressed: a retried
//! acquire finds its own key and answers with the same token, a release or renewal compares the
//! key's create revision with the grant's token, and nothing one attempt does can touch another
//! attempt's key — not even one of the same owner (re-entry is counted in the client).
//!
//! **One etcd lease per attempt**, granted with the hold's lease rounded up to whole seconds
//! (and at least etcd's minimum TTL), never shared with another attempt: revoking it can only
//! ever remove that attempt's own key. The core's watchdog renews it: every tick,
//! [`Backend::renew`] reads the holds' keys in one transaction and sends one `LeaseKeepAlive`
//! per hold. A key that is gone (or has another create revision), or a lease etcd no longer
//! knows, is [`RenewOutcome::NotHeld`], which fires the lost signal. A renewal to a longer lease
//! than the key's lease's TTL moves the key to a new, longer lease (etcd cannot change a
//! lease's TTL). A fixed lease is simply never kept alive: etcd deletes the key when it
//! expires, which hands the lock to the next waiter.
//!
//! A request whose outcome is unknown (timed out, connection lost) may still have attached its
//! lease to the attempt's key, so that lease is never revoked on the spot: the attempt's next
//! request finds the key and uses it, and the lease is revoked when the attempt ends (release or
//! give-up), when only the attempt's own key can be on it.
//!
//! URL: `etcd://[user:password@]host:port[,host:port…][/prefix]`. The prefix defaults to the
//! client's namespace (`dlock`). See `docs/etcd.md` for the safety argument and the costs.
#![warn(missing_docs)]

mod error;
mod keys;
mod ops;
mod wait;

use crate::error::{is_lease_not_found, map, shape, timed_out, KIND};
use crate::keys::{Entry, Keys};
use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, AttemptId, Backend, ClientOptions, Error, GrantRef,
    Granted, HolderInfo, LockInfo, LockKind, ReleaseOutcome, ReleaseWatch, RenewOutcome, Result,
    Wake,
};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
    WatchStream,
};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Default client port of etcd.
const DEFAULT_PORT: u16 = 2379;
/// etcd's default limit of operations in one transaction is 128; stay well below it.
const MAX_OPS_PER_TXN: usize = 64;
/// Compare-and-swap retries before giving up on a key that keeps changing under us.
const CAS_ATTEMPTS: usize = 8;
/// How long after its TTL a lease of unknown fate is still remembered: etcd extends every
/// lease by an election timeout when a new leader takes over, so a lease can outlive its TTL
/// by a little; a minute covers that with room to spare.
const DOUBT_MARGIN: Duration = Duration::from_secs(60);

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

/// The etcd backend. Build it with [`EtcdBackend::connect`] (or through `distlock::connect`).
pub struct EtcdBackend {
    client: Client,
    endpoint: String,
    prefix: String,
    op_timeout: Duration,
    /// For `diagnose`: how it connected (to reach each member on its own), and the
    /// client's watchdog lease (against etcd's minimum lease TTL).
    connect_opts: ConnectOptions,
    connect_timeout: Duration,
    watchdog_lease: Duration,
    /// Per attempt, the leases that a request with an unknown outcome may have attached to
    /// the attempt's key. Never revoked while the attempt goes on (its next request may find
    /// the key on one of them and use it); revoked when the attempt ends, so that a request
    /// still travelling cannot create the key after that (etcd refuses a put with a revoked
    /// lease).
    doubtful: Mutex<HashMap<AttemptId, Vec<Doubt>>>,
    /// Per granted attempt, the lease its key was last seen on (a hint for renewals; the read
    /// that goes with every renewal decides). Dropped when the attempt ends.
    leases: Mutex<HashMap<AttemptId, Lease>>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) id: i64,
    /// TTL the server granted (seconds; at least etcd's minimum TTL).
    pub(crate) ttl: i64,
}

/// A lease a request with an unknown outcome may have attached to its attempt's key.
#[derive(Debug, Clone, Copy)]
struct Doubt {
    lease: i64,
    /// After this, etcd has certainly expired the lease (nobody keeps it alive unless it
    /// carries the attempt's key, and then the attempt's release or give-up revokes it).
    until: Instant,
}

/// What [`EtcdBackend::cover`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cover {
    /// The key's lease now runs at least the asked duration from when etcd applied the
    /// request. `moved_to`: the key was moved to this new lease.
    Done { moved_to: Option<i64> },
    /// The key (with that create revision) is gone.
    Gone,
}

fn token_of(rev: i64) -> Result<u64> {
    u64::try_from(rev)
        .ok()
        .filter(|t| *t > 0)
        .ok_or_else(|| shape(format!("revision {rev} is not a valid fencing token")))
}

/// The create revision a grant's token stands for; `None` for a token no key can have.
fn revision_of(token: u64) -> Option<i64> {
    i64::try_from(token).ok().filter(|r| *r > 0)
}

/// The key-values of every Get in a transaction response, in order.
pub(crate) fn gets(resp: &TxnResponse) -> Vec<Vec<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(mut g) => Some(g.take_kvs()),
            _ => None,
        })
        .collect()
}

pub(crate) fn nth_first(all: &mut [Vec<KeyValue>], i: usize) -> Result<Option<KeyValue>> {
    let v = all
        .get_mut(i)
        .ok_or_else(|| shape("a transaction returned fewer reads than it made"))?;
    Ok(if v.is_empty() {
        None
    } else {
        Some(v.swap_remove(0))
    })
}

pub(crate) fn header_revision(resp: &TxnResponse) -> Result<i64> {
    resp.header()
        .map(|h| h.revision())
        .ok_or_else(|| shape("a transaction reply without a header"))
}

/// The first key of a queue: the holder.
pub(crate) fn first_of(queue: &[u8]) -> TxnOp {
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

/// Puts the attempt's key `mine` for `owner` on `lease`.
pub(crate) fn put_mine(mine: &[u8], owner: &str, lease: Lease) -> TxnOp {
    TxnOp::put(
        mine.to_vec(),
        Entry {
            ttl: lease.ttl,
            owner: owner.to_owned(),
        }
        .encode(),
        Some(PutOptions::new().with_lease(lease.id)),
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
        let client =
            tokio::time::timeout(limit, Client::connect(&target.endpoints, Some(co.clone())))
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
            connect_opts: co,
            connect_timeout: opts.get_connect_timeout(),
            watchdog_lease: opts.get_watchdog_lease(),
            doubtful: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
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

    /// The key of attempt `attempt` in the queue of lock `name` (`PREFIX/NAME/ATTEMPT`,
    /// escaped): where that attempt waits and, once first, holds the lock.
    pub fn attempt_key(&self, name: &str, attempt: &str) -> Vec<u8> {
        self.keys(name).attempt(attempt)
    }

    /// The prefix of every queue key of lock `name` (`PREFIX/NAME/`). etcd's own
    /// `concurrency.Mutex` on the same prefix (`etcdctl lock PREFIX/NAME`) queues here too.
    pub fn queue_prefix(&self, name: &str) -> Vec<u8> {
        self.keys(name).queue
    }

    pub(crate) fn keys(&self, name: &str) -> Keys {
        Keys::new(&self.prefix, name)
    }

    pub(crate) fn check_kind(&self, kind: LockKind) -> Result<()> {
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
    /// If it fails the lease simply expires. Only ever called for a lease that carries
    /// nothing, or nothing but the key of an attempt that has ended: every lease belongs to
    /// one attempt, and one whose fate is unknown is kept until its attempt ends (see
    /// [`EtcdBackend::doubt`]).
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

    /// One keep-alive of lease `id`: it runs its full TTL again from when etcd applies it.
    /// `Ok(false)`: etcd no longer knows the lease (the client reports "lease not found" for
    /// a reply with TTL 0, which is how etcd answers a keep-alive of an unknown lease), so
    /// whatever was attached to it is gone: never a success.
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

    /// Remembers that a request of `attempt` whose outcome is unknown may have attached `lease`
    /// to the attempt's key: it must not be revoked while the attempt goes on (the attempt's
    /// next request may find its key on it and use it), and it is revoked when the attempt
    /// ends ([`settle`](Self::settle)).
    pub(crate) fn doubt(&self, attempt: &AttemptId, lease: Lease) {
        let now = Instant::now();
        // Leases are at most 30 days (the core's limit); the clamp keeps the sum in range.
        let ttl = Duration::from_secs(lease.ttl.clamp(0, 31 * 24 * 3600).unsigned_abs());
        let until = now + ttl + DOUBT_MARGIN;
        let mut map = self.doubtful.lock().unwrap_or_else(|p| p.into_inner());
        // A lease etcd has expired can no longer carry anything: forget it, so that attempts
        // that never end (a crashed caller) leave nothing behind here.
        map.retain(|_, v| {
            v.retain(|d| d.until > now);
            !v.is_empty()
        });
        map.entry(attempt.clone()).or_default().push(Doubt {
            lease: lease.id,
            until,
        });
    }

    /// `attempt` has ended (released or given up): revokes the leases a request of it with an
    /// unknown outcome may have attached to its key. They can carry only that attempt's key,
    /// which has no use any more; and a request still travelling that would create the key
    /// with one of them fails once it is revoked.
    pub(crate) fn settle(&self, attempt: &AttemptId) {
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(attempt);
        let doubts = self
            .doubtful
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(attempt);
        for d in doubts.into_iter().flatten() {
            self.revoke_in_background(d.lease);
        }
    }

    /// Notes that `attempt`'s key is on `lease` (so that renewals can keep it alive while they
    /// read the key, rather than after).
    pub(crate) fn remember(&self, attempt: &AttemptId, lease: Lease) {
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(attempt.clone(), lease);
    }

    fn known_lease(&self, attempt: &AttemptId) -> Option<Lease> {
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(attempt)
            .copied()
    }

    fn contended(&self, key: &[u8]) -> Error {
        Error::Connection {
            backend: KIND,
            endpoint: self.endpoint.clone(),
            source: format!(
                "key `{}` kept changing during {CAS_ATTEMPTS} compare-and-swap attempts",
                String::from_utf8_lossy(key)
            )
            .into(),
        }
    }

    /// One try of `req`, with this request's own fresh `lease`: takes the lock if nobody is
    /// queued; finds the attempt's own key if it holds the lock already (a retry of a request
    /// whose reply was lost: same key, same token); else reports who holds it, writing nothing.
    /// The flag tells whether `lease` ended up carrying the key (else it carries nothing).
    async fn take(
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
                .and_then([
                    put_mine(mine, &req.key.owner, lease),
                    TxnOp::put(keys.fence.clone(), "", None),
                ])
                .or_else([TxnOp::get(mine.to_vec(), None), first_of(&keys.queue)]);
            let resp = self.txn("acquire", txn).await?;
            if resp.succeeded() {
                let token = token_of(header_revision(&resp)?)?;
                self.remember(&req.attempt, lease);
                return Ok((AcquireReply::Granted { token }, true));
            }
            let mut all = gets(&resp);
            let m = nth_first(&mut all, 0)?;
            let first = nth_first(&mut all, 1)?.ok_or_else(|| {
                shape("etcd said the queue was not empty but returned no key of it")
            })?;
            match m {
                Some(m) if m.key() == first.key() => {
                    let token = token_of(m.create_revision())?;
                    match self
                        .cover(&req.attempt, mine, m, req.lease, Some(lease))
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

    /// Makes the lease of `kv` — the key `mine` of `attempt`, read with the create revision
    /// of its grant — run at least `want` from when etcd applies this, never shortening it.
    ///
    /// If the key's lease has a TTL of at least `want`, a keep-alive: it restarts the full
    /// TTL, and a lease never has more than its TTL left, so nothing is shortened. Else the key
    /// moves to a new lease of `want` (`fresh` if given and long enough), by a put guarded by
    /// the key's create revision (which a put keeps: the token survives) *and* its current
    /// lease, so two renewals racing cannot orphan a lease; only once that committed is the
    /// old lease revoked, which then carries nothing. A new lease whose put has an unknown
    /// outcome is kept until the attempt ends ([`doubt`](Self::doubt)).
    pub(crate) async fn cover(
        &self,
        attempt: &AttemptId,
        mine: &[u8],
        mut kv: KeyValue,
        want: Duration,
        fresh: Option<Lease>,
    ) -> Result<Cover> {
        let rev = kv.create_revision();
        for _ in 0..CAS_ATTEMPTS {
            let e = Entry::decode(kv.key(), kv.value())?;
            if e.ttl >= ttl_secs(want) {
                if self.keep_alive(kv.lease()).await? {
                    self.remember(
                        attempt,
                        Lease {
                            id: kv.lease(),
                            ttl: e.ttl,
                        },
                    );
                    return Ok(Cover::Done { moved_to: None });
                }
                // etcd no longer knows the lease ("lease not found", TTL 0): the key went
                // with it — unless a concurrent renewal moved it to a new lease meanwhile.
            } else {
                let (new, ours) = match fresh {
                    Some(l) if l.ttl >= ttl_secs(want) => (l, false),
                    _ => (self.grant(want).await?, true),
                };
                let txn = Txn::new()
                    .when([
                        Compare::create_revision(mine.to_vec(), CompareOp::Equal, rev),
                        Compare::lease(mine.to_vec(), CompareOp::Equal, kv.lease()),
                    ])
                    .and_then([put_mine(mine, &e.owner, new)]);
                match self.txn("renew", txn).await {
                    Ok(r) if r.succeeded() => {
                        self.remember(attempt, new);
                        if kv.lease() != 0 {
                            self.revoke_in_background(kv.lease());
                        }
                        return Ok(Cover::Done {
                            moved_to: Some(new.id),
                        });
                    }
                    // Not applied (the key changed or is gone): the new lease carries nothing.
                    Ok(_) if ours => self.revoke_in_background(new.id),
                    Ok(_) => {}
                    Err(err) => {
                        // Perhaps applied: the key may be on the new lease now.
                        if ours {
                            self.doubt(attempt, new);
                        }
                        return Err(err);
                    }
                }
            }
            match self.get("renew", mine).await? {
                Some(now) if now.create_revision() == rev => kv = now,
                _ => return Ok(Cover::Gone),
            }
        }
        Err(self.contended(mine))
    }

    /// `early`: a keep-alive sent alongside the read, of the lease the key was known to be on,
    /// with its answer.
    async fn renew_one(
        &self,
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
        Ok(
            match self.cover(&grant.attempt, mine, kv, lease, None).await? {
                Cover::Done { .. } => RenewOutcome::Renewed,
                Cover::Gone => RenewOutcome::NotHeld,
            },
        )
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
        let keys = self.keys(&req.key.name);
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

    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        wait::acquire_wait(self, req, deadline, cancel).await
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        let keys = self.keys(&req.key.name);
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

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.check_kind(req.key.kind)?;
        let mine = self.attempt_key(&req.key.name, &req.attempt);
        // The key is this attempt's, whatever it is now (queued, or first: a grant whose
        // reply was lost): delete it unconditionally. No other attempt's key is named.
        let txn = Txn::new().and_then([TxnOp::get(mine.clone(), None), TxnOp::delete(mine, None)]);
        let r = self.txn("give up", txn).await;
        // The attempt is over either way: its leases of unknown fate can go (they carry at most
        // this attempt's key).
        self.settle(&req.attempt);
        let resp = r?;
        if let Some(kv) = nth_first(&mut gets(&resp), 0)? {
            // Deleted: its lease carries nothing now.
            self.revoke_in_background(kv.lease());
        }
        Ok(())
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.check_kind(grant.key.kind)?;
        let keys = self.keys(&grant.key.name);
        let mine = keys.attempt(&grant.attempt);
        let Some(rev) = revision_of(grant.token) else {
            return Ok(ReleaseOutcome::Expired);
        };
        // One compare-and-delete, addressed by attempt and token: a retry after a lost reply
        // finds nothing to delete and says so; it can never delete a newer grant.
        let txn = Txn::new()
            .when([Compare::create_revision(
                mine.clone(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([
                TxnOp::get(mine.clone(), None),
                TxnOp::delete(mine.clone(), None),
            ])
            .or_else([first_of(&keys.queue)]);
        let resp = self.txn("release", txn).await?;
        let mut all = gets(&resp);
        let out = if resp.succeeded() {
            if let Some(kv) = nth_first(&mut all, 0)? {
                self.revoke_in_background(kv.lease());
            }
            ReleaseOutcome::Released
        } else {
            match nth_first(&mut all, 0)? {
                Some(f) if f.key() != mine.as_slice() => ReleaseOutcome::TakenByOther,
                _ => ReleaseOutcome::Expired,
            }
        };
        // Settled only now that the outcome is known: a lease of unknown fate may be the one
        // the key was on, and revoking it before the delete would turn Released into Expired.
        self.settle(&grant.attempt);
        Ok(out)
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        for (g, _) in holds {
            self.check_kind(g.key.kind)?;
        }
        let mines: Vec<Vec<u8>> = holds
            .iter()
            .map(|(g, _)| self.attempt_key(&g.key.name, &g.attempt))
            .collect();
        // Read every hold's key, in chunks of one transaction each, all at once, and at the
        // same time keep alive the lease each key is known to be on when that lease is long
        // enough: one round trip per tick in the common case (a renewal must fit in a third of
        // the lease on a loaded machine). The read decides whether that keep-alive counts.
        let reads = mines.chunks(MAX_OPS_PER_TXN).map(|chunk| {
            let ops: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
            self.txn("renew", Txn::new().and_then(ops))
        });
        let early = holds.iter().map(|(g, want)| async move {
            match self.known_lease(&g.attempt) {
                Some(l) if l.ttl >= ttl_secs(*want) => Some((l.id, self.keep_alive(l.id).await)),
                _ => None,
            }
        });
        let (read, early) = tokio::join!(
            futures_util::future::try_join_all(reads),
            futures_util::future::join_all(early)
        );
        let mut found = Vec::with_capacity(holds.len());
        for resp in read? {
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
        let each =
            holds.iter().zip(&mines).zip(found).zip(early).map(
                |((((g, lease), mine), kv), early)| self.renew_one(g, mine, *lease, kv, early),
            );
        futures_util::future::try_join_all(each).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<distlock_core::ListedLock>> {
        ops::list(self, prefix).await
    }

    async fn force_release(
        &self,
        name: &str,
        kind: LockKind,
    ) -> Result<distlock_core::ForceReleased> {
        ops::force_release(self, name, kind).await
    }

    async fn diagnose(&self) -> Result<Vec<distlock_core::Finding>> {
        ops::diagnose(self).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.check_kind(kind)?;
        let keys = self.keys(name);
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
                let holder = HolderInfo {
                    owner: keys.holder_of(f.key(), f.value()),
                    count: 1,
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
