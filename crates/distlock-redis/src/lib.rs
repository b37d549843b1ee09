#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod address;
mod builder;
mod cluster;
mod conn;
mod contended;
mod dialect;
mod ended;
mod error;
mod inspect;
mod ops;
mod pubsub;
mod quorum;
mod renew;
mod requests;
mod scripts;
mod sentinel;

use crate::cluster::Link;
use crate::error::{map, shape, KIND};
pub use crate::quorum::{
    NodeHold, QuorumReply, QuorumVote, RedisNode, ServerInfo, QUORUM_FLOOR_STEP,
};
use crate::scripts::SCRIPTS;
use distlock_core::backend::{
    async_trait, AcquireReply, AcquireRequest, AttemptId, Capabilities, GrantRef, HoldKey,
    ReleaseWatch, RenewOutcome,
};
use distlock_core::{Backend, ClientOptions, Error, LockInfo, LockKind, ReleaseOutcome, Result};
use redis::aio::ConnectionManager;
use redis::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Redis backend. Build it with [`RedisBackend::connect`] (or through `distlock::connect`).
pub struct RedisBackend {
    con: Arc<conn::Con>,
    /// `redis+sentinel://`: moves `con` and `subscriber` to the master after a failover.
    follower: Option<Arc<sentinel::Follower>>,
    subscriber: Arc<pubsub::Subscriber>,
    endpoint: String,
    namespace: String,
    wait_replicas: Option<(u32, Duration)>,
    /// The attempts with a request that may still reach the server (see [`ended`]).
    unanswered: ended::Unanswered,
    /// `?dialect=`: the locks are another library's keys (see [`dialect`]); `None`: dlock's.
    dialect: Option<dialect::Layout>,
    /// `?handoff_after=`, or the adaptive default: the plain mutex's contended mode (see
    /// [`contended`]).
    handoff_after: contended::HandoffAfter,
    /// The waiting mutex attempts' latest requests, which make a handoff notice a grant
    /// (see `requests`).
    requests: Arc<requests::Requests>,
}

pub use crate::builder::{
    RedisBuilder, RedisBuilderExt, RedisSettings, PASSWORD_ENV, PASSWORD_FILE_ENV,
    SENTINEL_PASSWORD_ENV, USER_ENV,
};
pub use crate::contended::{
    DEFAULT_HANDOFF_AFTER, HOLD_MULTIPLE, MAX_HANDOFF_AFTER, MIN_HANDOFF_AFTER,
};
/// The URL with its password (and any secret parameter) replaced by `***` (the core's).
pub use distlock_core::conn::redact;
/// How long a fencing counter (`NS:{NAME}:fence`) outlives the lease of the last grant made
/// from it: one hour. After that the key expires, and the next grant's token comes from the
/// server clock alone (every token is at least the server's `TIME` in µs when it is granted; a
/// Redlock vote's in [`QUORUM_FLOOR_STEP`]s), which is above every token issued before as long
/// as the clocks of the servers that issued them agree within this margin (see
/// docs/redis-lock.md, "Fencing tokens").
pub const FENCE_MARGIN: Duration = Duration::from_millis(scripts::fence_margin_ms!());

/// The TLS error of `rediss://` (the core's, shared by every backend): the source of an
/// [`Error::Connection`].
pub use distlock_core::conn::{TlsError, TlsErrorKind};

/// Keys are `NS:{NAME}…`: the namespace may not hold the hash tag's braces.
fn namespace_ok(namespace: &str) -> bool {
    !namespace.is_empty() && !namespace.contains(['{', '}'])
}

const BAD_NAMESPACE: &str = "namespace must be non-empty and free of `{` and `}`";

/// `WAIT` blocks for up to the replica wait on a connection whose replies are bounded by the
/// operation timeout: a longer wait would be cut off and the grant retried.
fn check_wait(wait_replicas: Option<(u32, Duration)>, opts: &ClientOptions) -> Result<()> {
    if let Some((_, wait)) = wait_replicas {
        if wait >= opts.get_op_timeout() {
            return Err(Error::InvalidArgument(format!(
                "wait_timeout={wait:?} is not below the client's operation timeout ({:?}): \
                 the replica wait would be cut off; lower wait_timeout or raise op_timeout",
                opts.get_op_timeout()
            )));
        }
    }
    Ok(())
}

impl RedisBackend {
    /// Connects to the Redis server at `url`, checks credentials and loads the scripts.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL this backend does not accept (the password is
    /// redacted in the message), also for `redis://` at a Redis Cluster node (the message
    /// names `redis+cluster://`); [`Error::InvalidArgument`] for a `wait_timeout` not below the
    /// operation timeout; [`Error::Auth`] if the server refuses the credentials or the ACL user
    /// lacks a command; [`Error::Connection`] if the server cannot be reached within the
    /// connect timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-made connection and leaves nothing
    /// behind on the server (scripts loaded are harmless).
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        RedisBuilder::new(url).options(opts.clone()).connect().await
    }

    /// A [`RedisBuilder`] for `url`: the password (or a file holding it), the ACL user, the
    /// CA and a client certificate given in code instead of in the URL.
    pub fn builder(url: impl Into<String>) -> RedisBuilder {
        RedisBuilder::new(url)
    }

    /// Connects as the builder resolved: the deployment by the connection layer
    /// ([`conn::open`]: one server, Sentinel or Cluster), then the lock protocol's state on it.
    async fn open(resolved: builder::Resolved, opts: &ClientOptions) -> Result<Self> {
        let builder::Resolved {
            address: a,
            credentials,
            follow_switches,
        } = resolved;
        check_wait(a.wait_replicas, opts)?;
        let namespace = (a.namespace.clone()).unwrap_or_else(|| opts.get_namespace().to_owned());
        if !namespace_ok(&namespace) {
            return Err(a.conn.invalid(BAD_NAMESPACE));
        }
        let cluster = matches!(a.route, address::Route::Cluster(_));
        if cluster && a.dialect == Some(dialect::Dialect::PythonRedisLock) {
            return Err(a.conn.invalid(
                "dialect=python-redis-lock is not built for redis+cluster://: python-redis-lock's own scripts touch lock:NAME and lock-signal:NAME, which a cluster keeps in different slots; use one server (redis:// or redis+sentinel://)",
            ));
        }
        let mut opened = conn::open(&a, &credentials, opts).await?;
        let sentinel = opened.sentinel.take();
        let mut backend = Self::finish(opened, namespace, a.wait_replicas, opts).await?;
        backend.dialect = a
            .dialect
            .map(|d| dialect::Layout::new(d, &backend.namespace));
        backend.handoff_after = a.handoff_after;
        if let Some((sentinels, at)) = sentinel {
            let moved = (backend.con.clone(), backend.subscriber.clone());
            backend.follower = Some(sentinel::Follower::start(
                sentinels,
                credentials,
                at,
                moved,
                follow_switches,
            ));
        }
        Ok(backend)
    }

    /// A backend over the application's own connections: `con` for the lock scripts (it is
    /// cloned for every call, as `ConnectionManager` is meant to be) and `pubsub`, from which
    /// the backend opens **one more connection of its own**, a subscriber for release
    /// notifications (a `ConnectionManager` cannot subscribe). Both must reach the same
    /// server (a master; not a cluster) with the credentials they were made with. After a
    /// reply that timed out, the backend goes on with a connection it opens from `pubsub`
    /// (a multiplexed connection that lost a request or reply inside its stream never
    /// recovers by itself).
    ///
    /// The namespace is [`ClientOptions::namespace`]; `wait_replicas` is
    /// [`with_wait_replicas`](Self::with_wait_replicas). The scripts are loaded and checked
    /// here, as by [`connect`](Self::connect).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use distlock_redis::RedisBackend;
    /// // The application's client and connection manager, made as it likes.
    /// let client = redis::Client::open("redis://:app-secret@10.0.0.5:6379/0")?;
    /// let manager = client.get_connection_manager().await?;
    /// let opts = distlock_core::ClientOptions::default().namespace("shop");
    /// let backend = RedisBackend::from_connection_manager(manager, client, &opts).await?;
    /// let locks = distlock_core::Client::new(std::sync::Arc::new(backend), opts)?;
    /// # let _ = locks; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a namespace that is empty or holds `{` or `}`, or a
    /// connection to a Redis Cluster node;
    /// [`Error::Auth`] if the server refuses the scripts to the connection's user;
    /// [`Error::Connection`] if the server cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`connect`](Self::connect).
    pub async fn from_connection_manager(
        mut con: ConnectionManager,
        pubsub: redis::Client,
        opts: &ClientOptions,
    ) -> Result<Self> {
        let namespace = opts.get_namespace().to_owned();
        if !namespace_ok(&namespace) {
            return Err(Error::invalid(BAD_NAMESPACE));
        }
        if cluster::is_cluster_node(&mut con).await {
            return Err(Error::invalid(cluster::NOT_STANDALONE));
        }
        let opened = conn::Opened {
            con: conn::Con::single(con, pubsub.clone(), opts),
            endpoint: pubsub.get_connection_info().addr().to_string(),
            nodes: vec![pubsub],
            cert_given: None,
            sentinel: None,
        };
        Self::finish(opened, namespace, None, opts).await
    }

    /// Waits for `n` replicas to confirm each grant (within `timeout`), as `?wait_replicas=N&
    /// wait_timeout=T` in the URL: for backends made by
    /// [`from_connection_manager`](Self::from_connection_manager).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero `timeout`, or one not below the operation timeout
    /// of `opts`.
    pub fn with_wait_replicas(
        mut self,
        n: u32,
        timeout: Duration,
        opts: &ClientOptions,
    ) -> Result<Self> {
        if n == 0 {
            self.wait_replicas = None;
            return Ok(self);
        }
        if timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "a zero replica wait would wait forever; give a bound such as 200ms".into(),
            ));
        }
        check_wait(Some((n, timeout)), opts)?;
        self.wait_replicas = Some((n, timeout));
        self.subscriber = pubsub::Subscriber::over(
            vec![self.subscriber.client()],
            self.endpoint.clone(),
            opts.get_connect_timeout(),
            true,
            self.subscriber.wake().to_owned(),
        );
        Ok(self)
    }

    /// The part of connecting common to [`open`](Self::open) and
    /// [`from_connection_manager`](Self::from_connection_manager).
    async fn finish(
        opened: conn::Opened,
        namespace: String,
        wait_replicas: Option<(u32, Duration)>,
        opts: &ClientOptions,
    ) -> Result<Self> {
        let conn::Opened {
            con,
            nodes,
            endpoint,
            cert_given,
            ..
        } = opened;
        let mut link = con.get();
        scripts::load(&mut link, &SCRIPTS.all())
            .await
            .map_err(|e| error::map_tls(&endpoint, e, cert_given))?;
        if let cluster::Link::Single(c) = &mut link {
            ops::check_eviction(c, &endpoint).await;
        }
        Ok(RedisBackend {
            con: Arc::new(con),
            follower: None,
            subscriber: pubsub::Subscriber::over(
                nodes,
                endpoint.clone(),
                opts.get_connect_timeout(),
                // A handoff is written by the releasing client's connection: with replicas to
                // wait for, the waiter confirms it with its own attempt (and WAIT) first.
                wait_replicas.is_some(),
                pubsub::wake_channel(&namespace),
            ),
            endpoint,
            namespace,
            wait_replicas,
            unanswered: ended::Unanswered::new(ended::record_lifetime(opts.get_op_timeout())),
            dialect: None,
            handoff_after: contended::HandoffAfter::default(),
            requests: Arc::default(),
        })
    }

    /// A mutex waiter's watch `inner`, with the handoffs this client vouches for as grants
    /// (see `requests`).
    fn vouching(
        &self,
        req: &AcquireRequest,
        inner: Box<dyn ReleaseWatch>,
    ) -> Box<dyn ReleaseWatch> {
        Box::new(requests::Vouching {
            inner,
            requests: self.requests.clone(),
            attempt: req.attempt.clone(),
            lease: req.lease,
            kind: req.key.kind,
            handoff_after: self.handoff_after.clone(),
        })
    }

    /// `NS:{NAME}` and `parts` after it: every key of lock `name` (the hash tag keeps them in
    /// one slot), concatenated without the formatting machinery (keys are built on every
    /// request: profiled at ~1,000 instructions per `format!`).
    fn key_of(&self, name: &str, parts: &[&str]) -> String {
        let len =
            self.namespace.len() + name.len() + 3 + parts.iter().map(|p| p.len()).sum::<usize>();
        let mut key = String::with_capacity(len);
        key.push_str(&self.namespace);
        key.push_str(":{");
        key.push_str(name);
        key.push('}');
        for p in parts {
            key.push_str(p);
        }
        key
    }

    fn fence_key(&self, name: &str) -> String {
        self.key_of(name, &[":fence"])
    }

    /// `NS:{NAME}:ended:ATTEMPT`: the end record of `attempt` on lock `name` (any kind:
    /// attempt ids are unique), in the lock's slot (see [`ended`]).
    fn ended_key(&self, name: &str, attempt: &AttemptId) -> String {
        self.key_of(name, &[":ended:", attempt.as_str()])
    }

    fn channel(&self, name: &str) -> String {
        self.key_of(name, &[":released"])
    }

    /// The release channel of a lock of family `fam`: a mutex-family lock's (waiters'
    /// wake-ups; handoffs go to `CHANNEL:ATTEMPT`), or the name's for the other families.
    fn release_channel(&self, name: &str, fam: &Family) -> String {
        match fam {
            Family::Mutex { .. } => self.key_of(name, &[fam.base(), ":released"]),
            _ => self.channel(name),
        }
    }

    /// The channel every change of election `name` is published on (grant, handoff,
    /// release, proclamation): what `observe` subscribes to. Locks never publish there.
    fn observe_channel(&self, name: &str) -> String {
        self.key_of(name, &[ELECTION, ":observe"])
    }

    /// The fencing counter of `name` from its stored value (`None`: never issued, 0).
    fn counter(&self, name: &str, stored: Option<String>) -> Result<u64> {
        counter(&self.fence_key(name), stored)
    }

    /// The keys of lock `name` of family `fam` (see [`LockKeys`]).
    fn keys(&self, name: &str, fam: &Family) -> LockKeys {
        let base = fam.base();
        let key = |suffix: &str| self.key_of(name, &[base, suffix]);
        let mutex = matches!(fam, Family::Mutex { .. });
        LockKeys {
            holds: key(""),
            // A mutex-family lock's counter goes with its grant hash (an election's is its
            // own); a read-write lock and a semaphore count on the name's (`NS:{NAME}:fence`).
            fence: if mutex {
                key(":fence")
            } else {
                self.fence_key(name)
            },
            queue: key(":queue"),
            waiters: key(":waiters"),
            exp: (!mutex).then(|| key(":exp")),
            limit: matches!(fam, Family::Sem { .. }).then(|| key(":limit")),
        }
    }

    /// Runs the release-side script of `key`'s family for grant `attempt`/`token` in `mode`
    /// (`release` or `giveup`; a give-up names no token: any grant of the attempt goes back).
    /// The attempt ends: if a request of it may still reach the server, its end record is
    /// written first, in the same round trip (see [`ended`]).
    async fn run_release(
        &self,
        key: &HoldKey,
        attempt_id: &AttemptId,
        token: &str,
        mode: &str,
    ) -> Result<ReleaseOutcome> {
        let attempt = attempt_id.as_str();
        let channel = self.channel(&key.name);
        let args = [attempt, token, channel.as_str(), mode];
        let fam = family(key.kind)?;
        let cmd = match fam {
            Family::Mutex { fair, election } => {
                // release.lua: the lock hash (its counter, queue, waiter data and channel are
                // named after it in the script); a give-up names no token.
                let hash = self.key_of(&key.name, &[fam.base()]);
                let barge = self.handoff_after.barge_arg(fair, election);
                let observe;
                let mut args = vec![attempt, token, &barge];
                if election {
                    observe = self.observe_channel(&key.name);
                    args.push(&observe);
                }
                SCRIPTS.release.cmd(&[&hash], &args)
            }
            Family::Rw { .. } => SCRIPTS
                .rw_release
                .cmd(&self.keys(&key.name, &fam).list(), &args),
            Family::Sem { .. } => SCRIPTS
                .sem_release
                .cmd(&self.keys(&key.name, &fam).list(), &args),
        };
        let record = self.end_record(attempt_id, || Ok(self.ended_key(&key.name, attempt_id)))?;
        let (v, _) = (self.eval_ending(&SCRIPTS.all(), &cmd, record.as_ref(), None)).await?;
        let n = match fam {
            // The mutex scripts answer the outcome alone, the others `{outcome, 0}`.
            Family::Mutex { .. } => int(&v).ok_or_else(|| shape(mode, &v))?,
            _ => pair(mode, &v)?.0,
        };
        release_outcome(mode, n)
    }

    /// The end record to write for `attempt` as it ends (the key `key` makes and its lifetime
    /// in ms), if a request of it may still reach the server.
    fn end_record(
        &self,
        attempt: &AttemptId,
        key: impl FnOnce() -> Result<String>,
    ) -> Result<Option<(String, String)>> {
        let keep = self.unanswered.end_record(attempt);
        keep.map(|keep| Ok((key()?, lease_ms(keep)))).transpose()
    }

    /// Runs `cmd`, one of the scripts of `set`, in one round trip with what must go with it:
    /// with `record` (an end record's key and lifetime in ms) the record is set first, so a
    /// late request of the attempt that runs after it is refused, and one that ran before is
    /// undone by `cmd`; with `wait` (`?wait_replicas=N` of an acquire or a forced release) a
    /// `WAIT` pipelined right behind the script waits until N replicas have every write this
    /// connection made up to it, which includes the grant (a fresh grant, or the rewrite of a
    /// retried or handed-over grant that the acquire script makes for this purpose;
    /// replication is in order, so it covers the handoff written by another client before it)
    /// or the forced release's removal. Returns the script's reply and,
    /// with `wait`, how many replicas confirmed. An error of either (the grant, if one was
    /// made, is then not reported: the core retries the same attempt, which finds it, or gives
    /// the attempt up) is an error.
    async fn eval_ending(
        &self,
        set: &[&scripts::Script],
        cmd: &redis::Cmd,
        record: Option<&(String, String)>,
        wait: Option<(u32, Duration)>,
    ) -> Result<(Value, Option<i64>)> {
        if record.is_none() && wait.is_none() {
            return Ok((self.eval_in(set, cmd).await?.0, None));
        }
        let mut pipe = redis::pipe();
        if let Some((key, ms)) = record {
            pipe.cmd("SET").arg(key).arg("1").arg("PX").arg(ms).ignore();
        }
        pipe.add_command(cmd.clone());
        if let Some((n, timeout)) = wait {
            pipe.cmd("WAIT").arg(n).arg(timeout.as_millis() as u64);
        }
        let vals = self.eval_pipe(set, &pipe).await?;
        let acked = |n: &Value| int(n).ok_or_else(|| shape("WAIT", n));
        match (vals.as_slice(), wait) {
            ([v], None) => Ok((v.clone(), None)),
            ([v, n], Some(_)) => Ok((v.clone(), Some(acked(n)?))),
            _ => Err(shape(
                "a script with its end record or WAIT",
                &Value::Array(vals),
            )),
        }
    }

    fn err(&self, e: redis::RedisError) -> Error {
        if e.is_timeout() {
            self.con.timed_out();
        }
        if let Some(f) = &self.follower {
            if let Some(moved) = f.on_error(&e, &self.endpoint) {
                return moved;
            }
        }
        map(&self.endpoint, e)
    }

    /// Runs `cmd`, one of the scripts of `set` ([`scripts::eval`]: reloading them on
    /// NOSCRIPT); also says whether it had to reload.
    async fn eval_in(&self, set: &[&scripts::Script], cmd: &redis::Cmd) -> Result<(Value, bool)> {
        let mut con = self.con.get();
        scripts::eval(&mut con, set, cmd)
            .await
            .map_err(|e| self.err(e))
    }

    /// A pipeline of the scripts of `set` ([`scripts::eval_pipe`]).
    async fn eval_pipe(
        &self,
        set: &[&scripts::Script],
        pipe: &redis::Pipeline,
    ) -> Result<Vec<Value>> {
        let mut con = self.con.get();
        scripts::eval_pipe(&mut con, set, pipe)
            .await
            .map_err(|e| self.err(e))
    }

    /// Sends `cmd` on this backend's connection, its error mapped as every call's.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        self.query_on(&mut self.con.get(), cmd).await
    }

    /// [`query`](Self::query) on `con` (one master of a cluster).
    async fn query_on<T: redis::FromRedisValue>(
        &self,
        con: &mut Link,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        cmd.query_async(con).await.map_err(|e| self.err(e))
    }

    /// [`query`](Self::query) of a pipeline.
    async fn query_pipe<T: redis::FromRedisValue>(&self, pipe: &redis::Pipeline) -> Result<T> {
        let mut con = self.con.get();
        pipe.query_async(&mut con).await.map_err(|e| self.err(e))
    }

    /// Runs one of the lock scripts (reloading them on NOSCRIPT).
    async fn eval(&self, cmd: &redis::Cmd) -> Result<Value> {
        Ok(self.eval_ending(&SCRIPTS.all(), cmd, None, None).await?.0)
    }

    /// Number of release channels this client is subscribed to right now. A channel is
    /// subscribed only while a caller of this client waits on that lock: the lock's channel,
    /// and for a mutex each waiting attempt's own channel (where handoffs go).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads this client's state.
    pub async fn subscribed_channels(&self) -> usize {
        self.subscriber.subscribed().await
    }

    /// With `redis+sentinel://`: the `host:port` of the master this backend sends its calls
    /// to now (it moves after a failover); `None` for other URLs.
    pub fn sentinel_master(&self) -> Option<String> {
        self.follower.as_ref().map(|f| f.current())
    }

    /// A round trip to the server (PING), for benchmarks that compare against it.
    ///
    /// # Errors
    /// [`Error::Connection`] if the node cannot be reached or does not answer within the
    /// operation timeout; [`Error::Auth`] if the ACL user may not run it.
    ///
    /// # Cancel safety
    /// Cancel safe: PING changes nothing.
    pub async fn ping(&self) -> Result<()> {
        self.query(&redis::cmd("PING")).await
    }

    /// The native acquire script of `req`'s family, with its keys and arguments.
    /// `seq`: the request's number (see `requests`), for a mutex-family attempt that queues.
    fn acquire_cmd(&self, req: &AcquireRequest, seq: u64) -> Result<redis::Cmd> {
        let waiter_ttl = req.waiter_ttl.map_or_else(|| "0".to_owned(), lease_ms);
        let lease = lease_ms(req.lease);
        let attempt = req.attempt.as_str();
        let owner: &str = &req.key.owner;
        // Every acquire script refuses an attempt whose end record exists (see `ended`).
        let ended = self.ended_key(&req.key.name, &req.attempt);
        let fam = family(req.key.kind)?;
        let (script, x, y, z) = match fam {
            Family::Mutex { fair, election } => {
                // acquire.lua: the lock hash and the attempt's end record (its counter, queue
                // and waiter data are named after the hash in the script); the queueing paths'
                // arguments packed as TTL:FAIR:SEQ:WAKE.
                let hash = self.key_of(&req.key.name, &[fam.base()]);
                let seq = seq.to_string();
                // The wake channel the queue entry names, where the release that hands the
                // lock over tells the waiter ('' for a single try, which never queues).
                let wake = if req.waiter_ttl.is_some() {
                    self.subscriber.wake()
                } else {
                    ""
                };
                let waits = [
                    waiter_ttl.as_str(),
                    if fair { ":1:" } else { ":0:" },
                    &seq,
                    ":",
                    wake,
                ]
                .concat();
                let mut args = vec![attempt, owner, &lease, &waits];
                let observe;
                if election {
                    observe = self.observe_channel(&req.key.name);
                    args.extend([req.value.as_deref().unwrap_or_default(), &observe]);
                }
                return Ok(SCRIPTS.acquire.cmd(&[&hash, &ended], &args));
            }
            Family::Rw { side } => {
                // The downgrade is addressed by the write grant itself, not by owner equality.
                let (w_attempt, w_token) = match (&req.write_grant, side) {
                    (Some(g), "r") => (g.attempt.as_str().to_owned(), g.token.to_string()),
                    _ => Default::default(),
                };
                (&SCRIPTS.rw_acquire, side.to_owned(), w_attempt, w_token)
            }
            Family::Sem { permits, limit } => (
                &SCRIPTS.sem_acquire,
                permits.to_string(),
                limit.to_string(),
                self.channel(&req.key.name),
            ),
        };
        let keys = self.keys(&req.key.name, &fam);
        let mut keys = keys.list();
        keys.push(&ended);
        Ok(script.cmd(&keys, &[attempt, owner, &lease, &waiter_ttl, &x, &y, &z]))
    }

    /// With `?wait_replicas=N`: a grant that fewer than N replicas confirmed (`acked`, from
    /// [`eval_ending`](Self::eval_ending)) is given back and reported as an error.
    async fn confirm_replicas(&self, grant: &GrantRef, acked: Option<i64>) -> Result<()> {
        let (Some((n, timeout)), Some(acked)) = (self.wait_replicas, acked) else {
            return Ok(());
        };
        if acked >= i64::from(n) {
            return Ok(());
        }
        // Unconfirmed: give the grant back (it names this attempt's grant only).
        let _ = self.release(grant).await;
        Err(Error::unexpected(KIND, format!(
                "lock `{}` was granted but only {acked} of the {n} required replicas confirmed it within {timeout:?}; \
                 it was given back (a failover could have lost it). Check replication or lower wait_replicas",
                grant.key.name
            )))
    }
}

/// Locks `m`, going on after a panic elsewhere: every mutex of this crate guards data that a
/// panicking holder leaves whole (a value replaced at once, a few map operations).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `gap` has passed since the last yes (kept in `last`): a burst of calls gets one yes
/// per `gap`.
fn once_per(last: &std::sync::Mutex<Option<Instant>>, gap: Duration) -> bool {
    let mut last = lock(last);
    let due = last.is_none_or(|t| t.elapsed() >= gap);
    if due {
        *last = Some(Instant::now());
    }
    due
}

/// Key suffix of an election, after `NS:{NAME}`.
const ELECTION: &str = ":election";

/// Which scripts and keys a lock kind uses.
#[derive(Clone, Copy)]
enum Family {
    /// A mutex, plain or fair, or an election (a mutex under its own keys whose grant
    /// carries the leader's value).
    Mutex {
        fair: bool,
        election: bool,
    },
    Rw {
        side: &'static str,
    },
    Sem {
        permits: u32,
        limit: u32,
    },
}

impl Family {
    /// The suffix of the family's hash after `NS:{NAME}`, which its other keys extend: ``
    /// (a mutex, plain or fair), `:election` (apart from the lock of the same name: its own
    /// grant, counter, queue and channels), `:rw`, `:sem`.
    fn base(&self) -> &'static str {
        match self {
            Family::Mutex { election: true, .. } => ELECTION,
            Family::Mutex { .. } => "",
            Family::Rw { .. } => ":rw",
            Family::Sem { .. } => ":sem",
        }
    }
}

/// The keys of one lock of dlock's layout ([`RedisBackend::keys`]).
struct LockKeys {
    /// The grant hash of a mutex-family lock, the holds of a read-write lock or semaphore.
    holds: String,
    fence: String,
    queue: String,
    waiters: String,
    /// The hold expiries of a read-write lock or semaphore.
    exp: Option<String>,
    /// A semaphore's permit count.
    limit: Option<String>,
}

impl LockKeys {
    /// The keys in the scripts' KEYS order: holds, fence, queue, waiter data, expiries, limit.
    fn list(&self) -> Vec<&str> {
        let mut keys = vec![&*self.holds, &self.fence, &self.queue, &self.waiters];
        keys.extend(self.exp.as_deref());
        keys.extend(self.limit.as_deref());
        keys
    }
}

fn family(kind: LockKind) -> Result<Family> {
    let mutex = |fair, election| Family::Mutex { fair, election };
    Ok(match kind {
        LockKind::Mutex => mutex(false, false),
        LockKind::Fair => mutex(true, false),
        LockKind::Election => mutex(false, true),
        LockKind::Read => Family::Rw { side: "r" },
        LockKind::Write => Family::Rw { side: "w" },
        LockKind::Semaphore { permits, limit } => Family::Sem { permits, limit },
        #[allow(unreachable_patterns)]
        other => {
            return Err(Error::unsupported(
                KIND,
                format!("lock kind {}", other.as_str()),
            ))
        }
    })
}

/// The fencing counter at `key` from its stored value (`None`: never issued, 0).
fn counter(key: &str, stored: Option<String>) -> Result<u64> {
    match stored {
        None => Ok(0),
        Some(s) => s.parse().map_err(|_| {
            let msg = format!("fencing counter `{key}` holds `{s}`, not a number");
            Error::unexpected(KIND, msg)
        }),
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// What an acquire script's reply `v`, read as `{granted, token or PTTL}` (`reply`), says
/// about `req`: granted (the token), held, or refused (an upgrade of a read grant, a permit
/// count changed by `set_permits`).
fn acquire_outcome(req: &AcquireRequest, v: &Value, reply: (i64, i64)) -> Result<AcquireReply> {
    match reply {
        (1, token) if token > 0 => Ok(AcquireReply::Granted {
            token: token as u64,
        }),
        (0, pttl) => Ok(AcquireReply::Held {
            ttl: inspect::ms(pttl),
        }),
        (-1, _) => Err(Error::invalid(format!(
            "owner `{}` holds the read side of `{}` and asked for the write side: an upgrade \
             would deadlock with other readers doing the same; release the read lock first",
            req.key.owner, req.key.name
        ))),
        (-2, server) => {
            let (permits, limit) = match req.key.kind {
                LockKind::Semaphore { permits, limit } => (permits, limit),
                _ => (0, 0),
            };
            Err(Error::invalid(format!(
                "cannot take {permits} permits of semaphore `{}`: the server's permit count \
                 is {server} (this handle was made with {limit}; the count was changed with \
                 set_permits)",
                req.key.name
            )))
        }
        _ => Err(shape("acquire", v)),
    }
}

/// A script's `{a, b}` reply.
fn pair(what: &str, v: &Value) -> Result<(i64, i64)> {
    redis::from_redis_value_ref(v).map_err(|_| shape(what, v))
}

/// A proclamation script's reply: `1` stored, `0` the grant does not hold the election.
fn proclaimed(what: &str, v: &Value) -> Result<RenewOutcome> {
    match int(v) {
        Some(1) => Ok(RenewOutcome::Renewed),
        Some(0) => Ok(RenewOutcome::NotHeld),
        _ => Err(shape(what, v)),
    }
}

/// A release script's (`mode`'s) outcome `n`: `1` released, `0` no lock, `3` another grant.
fn release_outcome(mode: &str, n: i64) -> Result<ReleaseOutcome> {
    match n {
        1 => Ok(ReleaseOutcome::Released),
        0 => Ok(ReleaseOutcome::Expired),
        3 => Ok(ReleaseOutcome::TakenByOther),
        n => Err(shape(mode, &Value::Int(n))),
    }
}

fn lease_ms(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

#[async_trait]
impl Backend for RedisBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    fn capabilities(&self) -> Capabilities {
        match &self.dialect {
            Some(l) => l.dialect.capabilities(),
            None => Capabilities::all().with(LockKind::Election),
        }
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        if let Some(l) = &self.dialect {
            return dialect::acquire(self, l, req).await;
        }
        // A queueing mutex attempt's requests are numbered (a handoff names the one it
        // followed); the others' are 0.
        let mutex = matches!(family(req.key.kind)?, Family::Mutex { .. });
        let numbered =
            (mutex && req.waiter_ttl.is_some()).then(|| self.requests.sent(&req.attempt));
        let cmd = self.acquire_cmd(req, numbered.map_or(0, |s| s.seq))?;
        let sent = self.unanswered.sent(&req.attempt);
        let (v, acked) = (self.eval_ending(&SCRIPTS.all(), &cmd, None, self.wait_replicas)).await?;
        sent.answered();
        // The mutex scripts answer alone what the others answer as a pair.
        let pair = match mutex {
            true => contended::acquire_reply(&v)?,
            false => pair("acquire", &v)?,
        };
        let reply = acquire_outcome(req, &v, pair)?;
        match &reply {
            AcquireReply::Granted { token } => {
                if numbered.is_some() {
                    self.requests.forget(&req.attempt);
                }
                self.confirm_replicas(&req.grant(*token), acked).await?;
                self.handoff_after.granted(req.key.kind, &req.attempt);
            }
            AcquireReply::Held { .. } => {
                if let Some(sent) = numbered {
                    self.requests.held(&req.attempt, sent);
                }
            }
        }
        Ok(reply)
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        if let Some(l) = &self.dialect {
            return dialect::watch(self, l, req).await;
        }
        // A mutex waiter hears everything for it (its handoff, the wake-up of its dead queue
        // entry, a forced release) on its client's wake channel; the read-write and semaphore
        // scripts publish on the lock's channel.
        match family(req.key.kind)? {
            Family::Mutex { .. } => {
                let wake = self.subscriber.wake().to_owned();
                Ok(self.vouching(req, self.subscriber.watch(wake, &req.attempt).await?))
            }
            _ => {
                let channel = self.channel(&req.key.name);
                self.subscriber.watch(channel, &req.attempt).await
            }
        }
    }

    fn watch_ready(&self, req: &AcquireRequest) -> Option<Box<dyn ReleaseWatch>> {
        if self.dialect.is_some() {
            return None;
        }
        match family(req.key.kind).ok()? {
            Family::Mutex { .. } => Some(self.vouching(req, self.subscriber.ready(&req.attempt)?)),
            _ => None,
        }
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        let given_up = match &self.dialect {
            Some(l) => dialect::release(self, l, &req.key, &req.attempt, None).await,
            None => {
                self.requests.forget(&req.attempt);
                self.run_release(&req.key, &req.attempt, "", "giveup").await
            }
        };
        given_up.map(|_| ())
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        if let Some(l) = &self.dialect {
            return dialect::release(self, l, &grant.key, &grant.attempt, Some(grant)).await;
        }
        self.handoff_after.released(grant.key.kind, &grant.attempt);
        let token = grant.token.to_string();
        (self.run_release(&grant.key, &grant.attempt, &token, "release")).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        renew::renew(self, holds).await
    }

    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        let name = &grant.key.name;
        let cmd = SCRIPTS.proclaim.cmd(
            &[&self.key_of(name, &[ELECTION])],
            &[
                grant.attempt.as_str(),
                &grant.token.to_string(),
                &seq.to_string(),
                value,
                &self.observe_channel(name),
            ],
        );
        proclaimed("proclaim", &self.eval(&cmd).await?)
    }

    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        // An attempt of its own: the channel carries no handoffs, every message wakes it.
        let me = AttemptId::new();
        self.subscriber.watch(self.observe_channel(name), &me).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        if let Some(l) = &self.dialect {
            l.dialect.capabilities().check(KIND, kind)?;
            return dialect::inspect(self, l, name).await;
        }
        inspect::inspect(self, name, kind).await
    }

    async fn set_permits(&self, name: &str, permits: u32) -> Result<()> {
        let keys = self.keys(
            name,
            &Family::Sem {
                permits: 0,
                limit: permits,
            },
        );
        let cmd = SCRIPTS.sem_release.cmd(
            &keys.list(),
            &["", "", &self.channel(name), "set", &permits.to_string()],
        );
        self.eval(&cmd).await.map(|_| ())
    }

    fn operator(&self) -> Option<&dyn distlock_core::Operator> {
        Some(self)
    }
}
