//! `redis+sentinel://`: finding the master through the sentinels, and following it when they
//! fail it over (docs/redis-sentinel.md, "Following a failover"): proactively, listening to
//! one sentinel's `+switch-master` at a time; reactively, on a call that fails with a
//! connection error or `READONLY`. A check asks the sentinels for the master's address and,
//! if it changed, moves there only after `ROLE` **on the new address** says master: lock
//! writes never go to a node that says it is a replica. Then the command connection is
//! replaced and the subscriber moved (its waiters' watches end with a connection error and
//! they subscribe again, on the new master); calls that fail meanwhile return the retryable
//! [`Error::Connection`].

use crate::conn::Con;
use crate::error::KIND;
use crate::pubsub::Subscriber;
use distlock_core::conn::{ConnectionString, Credentials, Host, Password};
use distlock_core::{Error, Result};
use futures_util::StreamExt;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::task::AbortHandle;

/// The channel sentinels announce a completed failover on:
/// `MASTER OLD_IP OLD_PORT NEW_IP NEW_PORT`.
const SWITCH_CHANNEL: &str = "+switch-master";
/// How often a check may start on errors (a burst of failed calls makes one check).
const CHECK_GAP: Duration = Duration::from_millis(100);
/// After `+switch-master`: how long to keep checking until the new master confirms its role.
const CONFIRM_FOR: Duration = Duration::from_secs(5);
/// How often the sentinel listened to is asked to answer (a silent one may be dead).
const PING_EVERY: Duration = Duration::from_secs(5);

/// The sentinels of one master, and how to reach them.
#[derive(Clone, Debug)]
pub(crate) struct Sentinels {
    /// The URL as parsed (for errors, with its secrets scrubbed).
    pub(crate) conn: ConnectionString,
    /// `host:port` of each sentinel.
    pub(crate) hosts: Vec<String>,
    /// The master's name.
    pub(crate) master: String,
    /// The sentinels' own password (`?sentinel_password=`), not the master's.
    pub(crate) password: Option<Password>,
    /// Each sentinel is given this long to answer.
    pub(crate) timeout: Duration,
}

impl Sentinels {
    /// The backend's endpoint in messages (stable across failovers).
    pub(crate) fn endpoint(&self) -> String {
        format!("master `{}` of {}", self.master, self.describe())
    }

    /// A client for the sentinel at `host`, with the sentinels' password.
    fn client(&self, host: &str) -> Result<redis::Client> {
        let creds = Credentials {
            user: None,
            password: self.password.clone(),
        };
        self.node(host, &creds)
    }

    /// A client for the node at `at` (`redis://`: no TLS yet) with `creds`.
    fn node(&self, at: &str, creds: &Credentials) -> Result<redis::Client> {
        crate::address::open_client(&self.conn, &format!("redis://{at}"), None, creds)
    }

    /// For messages: `sentinels s1,s2,s3`.
    pub(crate) fn describe(&self) -> String {
        format!("sentinels {}", self.hosts.join(","))
    }

    /// The master's `host:port` as the first sentinel that knows it says.
    ///
    /// # Errors
    /// [`Error::Auth`] if every sentinel refused the sentinel password (or wanted one);
    /// [`Error::Connection`] if none named the master.
    pub(crate) async fn discover(&self) -> Result<String> {
        let mut why = Vec::new();
        let mut auth = 0;
        for s in &self.hosts {
            let ask = async {
                let mut con = self
                    .client(s)?
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| crate::error::map(s, e))?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query_async::<Option<(String, u16)>>(&mut con)
                    .await
                    .map_err(|e| crate::error::map(s, e))
            };
            match tokio::time::timeout(self.timeout, ask).await {
                Ok(Ok(Some((host, port)))) => return Ok(Host::new(host, Some(port)).to_string()),
                Ok(Ok(None)) => why.push(format!("{s}: does not know master `{}`", self.master)),
                Ok(Err(e)) => {
                    if matches!(e, Error::Auth { .. }) {
                        auth += 1;
                    }
                    why.push(format!("{s}: {}", self.conn.scrub(&e.to_string())));
                }
                Err(_) => why.push(format!("{s}: no answer within {:?}", self.timeout)),
            }
        }
        let why = why.join("; ");
        if auth == self.hosts.len() {
            return Err(Error::auth(
                KIND,
                self.describe(),
                format!(
                    "every sentinel refused the sentinel credentials ({why}); give the sentinels' \
                     password with ?sentinel_password=, RedisBuilder::sentinel_password or {}",
                    crate::builder::SENTINEL_PASSWORD_ENV
                ),
            ));
        }
        Err(Error::connection(
            KIND,
            self.describe(),
            format!(
                "no sentinel named the master `{}` ({why}); check the sentinel addresses and the master name",
                self.master
            ),
        ))
    }
}

/// Whether the node of `client` says it is a master (`ROLE`), within `timeout`.
///
/// # Errors
/// As a call to the node ([`Error::Connection`], [`Error::Auth`]).
pub(crate) async fn is_master(
    client: &redis::Client,
    endpoint: &str,
    timeout: Duration,
) -> Result<bool> {
    let ask = async {
        let mut con = client.get_multiplexed_async_connection().await?;
        redis::cmd("ROLE")
            .query_async::<redis::Value>(&mut con)
            .await
    };
    let role = tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| Error::call_timeout(KIND, endpoint, "ROLE", timeout))?
        .map_err(|e| crate::error::map(endpoint, e))?;
    let redis::Value::Array(items) = &role else {
        return Ok(false);
    };
    let master = |r| redis::from_redis_value_ref::<String>(r).is_ok_and(|r| r == "master");
    Ok(items.first().is_some_and(master))
}

/// Keeps a backend's connections on the master the sentinels name.
pub(crate) struct Follower {
    sentinels: Sentinels,
    /// The master's ACL user and password.
    creds: Credentials,
    con: Arc<Con>,
    subscriber: Arc<Subscriber>,
    /// The master's `host:port` the connections go to now.
    current: Mutex<String>,
    /// Whether a check runs (at most one at a time), and a check asked for (how long it
    /// should wait for the new master's role).
    checks: Mutex<(bool, Option<Duration>)>,
    last_check: Mutex<Option<Instant>>,
    /// The `+switch-master` listener, stopped with the follower.
    listener: Mutex<Option<AbortHandle>>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        if let Some(h) = crate::lock(&self.listener).take() {
            h.abort();
        }
    }
}

impl Follower {
    /// A follower of `sentinels`' master (reached with `creds`: user, password), now at
    /// `current`, moving `con` and `subscriber`; `listen`: subscribe to `+switch-master`
    /// (else only errors start a check).
    pub(crate) fn start(
        sentinels: Sentinels,
        creds: Credentials,
        current: String,
        (con, subscriber): (Arc<Con>, Arc<Subscriber>),
        listen: bool,
    ) -> Arc<Self> {
        let me = Arc::new(Follower {
            sentinels,
            creds,
            con,
            subscriber,
            current: Mutex::new(current),
            checks: Mutex::new((false, None)),
            last_check: Mutex::new(None),
            listener: Mutex::new(None),
        });
        if listen {
            let task = tokio::spawn(listen_for_switches(Arc::downgrade(&me)));
            *crate::lock(&me.listener) = Some(task.abort_handle());
        }
        me
    }

    /// The master's `host:port` the connections go to now.
    pub(crate) fn current(&self) -> String {
        crate::lock(&self.current).clone()
    }

    /// A call failed with `e`: start a check if it may mean a failover. Returns the error to
    /// give the caller instead of the usual mapping, for a `READONLY` reply (the node is a
    /// replica now: nothing was written, the call can be retried on the new master).
    pub(crate) fn on_error(
        self: &Arc<Self>,
        e: &redis::RedisError,
        endpoint: &str,
    ) -> Option<Error> {
        let readonly = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
            || e.to_string().contains("READONLY");
        if readonly || crate::error::connection_lost(e) {
            self.check_soon();
        }
        readonly.then(|| {
            Error::connection(
                KIND,
                endpoint.to_owned(),
                format!(
                    "{} says it is a replica now (READONLY): the master was failed over; \
                     nothing was written, the backend moves to the master the sentinels name",
                    self.current()
                ),
            )
        })
    }

    /// Starts a check in a task, unless one runs or one started within [`CHECK_GAP`].
    fn check_soon(self: &Arc<Self>) {
        let rt = tokio::runtime::Handle::try_current();
        if let (true, Ok(rt)) = (crate::once_per(&self.last_check, CHECK_GAP), rt) {
            let me = self.clone();
            rt.spawn(async move { me.check(Duration::ZERO).await });
        }
    }

    /// Asks the sentinels where the master is and moves there if it moved (after `ROLE`
    /// says master), trying again for up to `confirm_for` while the new node is not a master
    /// yet. One check runs at a time: one asked for meanwhile runs right after it (the
    /// running one may have asked the sentinels before they switched).
    async fn check(&self, confirm_for: Duration) {
        {
            let mut c = crate::lock(&self.checks);
            c.1 = Some(c.1.map_or(confirm_for, |d| d.max(confirm_for)));
            if std::mem::replace(&mut c.0, true) {
                return;
            }
        }
        // The request taken and the running flag cleared under one lock: a request that
        // comes after is either taken here or starts a check of its own.
        loop {
            let next = {
                let mut c = crate::lock(&self.checks);
                c.0 = c.1.is_some();
                c.1.take()
            };
            let Some(confirm_for) = next else { return };
            self.run_check(confirm_for).await;
        }
    }

    async fn run_check(&self, confirm_for: Duration) {
        let t = Instant::now();
        loop {
            match self.try_switch().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::debug!(error = %e, "sentinel check failed"),
            }
            if t.elapsed() >= confirm_for {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// One check: `Ok(true)` when the connections go to the master the sentinels name (moved
    /// now or already there), `Ok(false)` when the named node is not a master yet.
    async fn try_switch(&self) -> Result<bool> {
        let at = self.sentinels.discover().await?;
        if at == self.current() {
            return Ok(true);
        }
        let client = self.sentinels.node(&at, &self.creds)?;
        if !is_master(&client, &at, self.sentinels.timeout).await? {
            tracing::debug!(candidate = %at, "the sentinels name a node that is not a master yet");
            return Ok(false);
        }
        let old = std::mem::replace(&mut *crate::lock(&self.current), at.clone());
        self.con.switch(client.clone());
        self.subscriber.switch(client, at.clone()).await;
        tracing::info!(master = %self.sentinels.master, from = %old, to = %at, "redis master failed over: following it");
        Ok(true)
    }
}

/// Listens for `+switch-master` on one sentinel at a time (the next when it fails) for as
/// long as the follower lives.
async fn listen_for_switches(follower: Weak<Follower>) {
    let mut next = 0usize;
    loop {
        let Some(sentinels) = follower.upgrade().map(|f| f.sentinels.clone()) else {
            return;
        };
        let host = sentinels.hosts[next % sentinels.hosts.len()].clone();
        next = next.wrapping_add(1);
        let subscribe = async {
            let mut ps = sentinels
                .client(&host)?
                .get_async_pubsub()
                .await
                .map_err(|e| crate::error::map(&host, e))?;
            ps.subscribe(SWITCH_CHANNEL)
                .await
                .map_err(|e| crate::error::map(&host, e))?;
            Ok::<_, Error>(ps.split())
        };
        match tokio::time::timeout(sentinels.timeout, subscribe).await {
            Ok(Ok((mut sink, mut stream))) => {
                // A switch may have happened while no sentinel was listened to.
                if let Some(f) = follower.upgrade() {
                    f.check(Duration::ZERO).await;
                }
                let mut ping = tokio::time::interval(PING_EVERY);
                ping.tick().await;
                loop {
                    let msg = tokio::select! {
                        m = stream.next() => m,
                        _ = ping.tick() => {
                            // A paused or cut-off sentinel sends nothing, as a healthy one
                            // between failovers does: ask it to answer.
                            let pong = tokio::time::timeout(sentinels.timeout, sink.ping::<redis::Value>()).await;
                            if matches!(pong, Ok(Ok(_))) {
                                continue;
                            }
                            None
                        }
                    };
                    let Some(msg) = msg else { break };
                    let payload = String::from_utf8_lossy(msg.get_payload_bytes()).into_owned();
                    if payload.split(' ').next() != Some(sentinels.master.as_str()) {
                        continue;
                    }
                    let Some(f) = follower.upgrade() else { return };
                    tracing::debug!(%payload, sentinel = %host, "sentinel announced a failover");
                    f.check(CONFIRM_FOR).await;
                }
                tracing::debug!(sentinel = %host, "lost the sentinel subscription; trying the next sentinel");
            }
            Ok(Err(e)) => {
                tracing::debug!(sentinel = %host, error = %e, "cannot subscribe to +switch-master")
            }
            Err(_) => tracing::debug!(sentinel = %host, "no answer subscribing to +switch-master"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
