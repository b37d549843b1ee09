//! The connection layer: opening the deployment a URL names (one server, the master the
//! sentinels name, a cluster: [`open`]) and the command connection the lock protocol sends
//! its calls on, replaced after a reply that never came.
//!
//! A `ConnectionManager` multiplexes requests on one connection and matches replies to
//! requests in order. If a request or a reply is lost inside the stream (a middlebox that
//! drops data, a proxy that blackholes and heals), the timed-out requests stay in flight
//! forever and every later reply is matched to one of them: each later call times out too,
//! and the manager never reconnects (it does so only when the connection drops). So after a
//! response timeout this backend moves on to a fresh connection (opened lazily, at the next
//! call); calls already in flight finish on the old one.

use crate::address::{self, Address, Route};
use crate::cluster::{self, Cluster, Link};
use crate::error::{self, KIND};
use crate::sentinel::{self, Sentinels};
use distlock_core::conn::Credentials;
use distlock_core::{ClientOptions, Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// A deployment connected, as the lock protocol needs it.
pub(crate) struct Opened {
    pub(crate) con: Con,
    /// A client for every node the subscriber may use.
    pub(crate) nodes: Vec<redis::Client>,
    /// What messages call the deployment (stable across failovers).
    pub(crate) endpoint: String,
    /// Whether a client certificate was given (`None`: not known here), for the words of a
    /// refused one.
    pub(crate) cert_given: Option<bool>,
    /// `redis+sentinel://`: the sentinels, and the master's `host:port` now (for the
    /// [`Follower`](sentinel::Follower)).
    pub(crate) sentinel: Option<(Sentinels, String)>,
}

/// Connects to the deployment of `a` with `creds`.
///
/// # Errors
/// As [`RedisBackend::connect`](crate::RedisBackend::connect).
pub(crate) async fn open(a: &Address, creds: &Credentials, opts: &ClientOptions) -> Result<Opened> {
    let tls = a.tls.as_ref();
    let (con, nodes, endpoint, sentinel) = match &a.route {
        Route::Cluster(seeds) => {
            let (con, nodes) = cluster::open(&a.conn, seeds, tls, creds, &a.endpoint, opts).await?;
            (con, nodes, a.endpoint.clone(), None)
        }
        Route::Single(url) => {
            let (con, client) = single(a, url, &a.endpoint, None, creds, opts).await?;
            (con, vec![client], a.endpoint.clone(), None)
        }
        Route::Sentinel(named) => {
            let sentinels = Sentinels {
                timeout: opts.get_connect_timeout(),
                ..(**named).clone()
            };
            let at = sentinels.discover().await?;
            let endpoint = sentinels.endpoint();
            let url = format!("redis://{at}");
            let (con, client) = single(a, &url, &endpoint, Some(&at), creds, opts).await?;
            (con, vec![client], endpoint, Some((sentinels, at)))
        }
    };
    let cluster = matches!(a.route, Route::Cluster(_));
    let cert_given = (!cluster).then(|| tls.is_some_and(|t| t.client().is_some()));
    Ok(Opened {
        con,
        nodes,
        endpoint,
        cert_given,
        sentinel,
    })
}

/// The connection to the one server at `driver_url` (`at`: the master the sentinels named
/// there, which must say it is one), with the URL's TLS files.
async fn single(
    a: &Address,
    driver_url: &str,
    endpoint: &str,
    at: Option<&str>,
    creds: &Credentials,
    opts: &ClientOptions,
) -> Result<(Con, redis::Client)> {
    let tls = a.tls.as_ref();
    let client = address::open_client(&a.conn, driver_url, tls, creds)?;
    let cert_given = Some(tls.is_some_and(|t| t.client().is_some()));
    // Lock writes never go to a node that says it is a replica (the sentinels may name one
    // that is still being promoted, or hold an old view): a retryable error.
    if let Some(at) = at {
        if !sentinel::is_master(&client, at, opts.get_connect_timeout()).await? {
            return Err(Error::connection(
                KIND,
                endpoint.to_owned(),
                format!("the sentinels name {at}, but it says it is not a master (a failover in progress?); try again"),
            ));
        }
    }
    let connecting = ConnectionManager::new_with_config(client.clone(), config(opts));
    let mut con = match in_time(opts, endpoint, "the server", connecting).await? {
        Ok(c) => c,
        Err(e)
            if e.kind() == redis::ErrorKind::AuthenticationFailed
                && needs_no_password(&client, opts.get_connect_timeout()).await =>
        {
            return Err(error::superfluous_password(endpoint));
        }
        Err(e) => return Err(error::map_tls(endpoint, e, cert_given)),
    };
    if cluster::is_cluster_node(&mut con).await {
        return Err(a.conn.invalid(cluster::NOT_STANDALONE));
    }
    Ok((Con::single(con, client.clone(), opts), client))
}

/// `connecting` (to `who`) within twice the connect timeout, else a connection error.
pub(crate) async fn in_time<T>(
    opts: &ClientOptions,
    endpoint: &str,
    who: &str,
    connecting: impl std::future::Future<Output = T>,
) -> Result<T> {
    let limit = opts.get_connect_timeout() * 2;
    tokio::time::timeout(limit, connecting).await.map_err(|_| {
        let why = format!("no answer from {who} within {limit:?} (paused, or behind a firewall?)");
        Error::connection(KIND, endpoint.to_owned(), why)
    })
}

/// True when the server behind `client` (whose credentials it refused) answers `PING` on a
/// connection without any: the password given is one it does not need.
async fn needs_no_password(client: &redis::Client, limit: Duration) -> bool {
    let info = client.get_connection_info();
    if info.redis_settings().password().is_none() {
        return false;
    }
    let bare = info.clone().set_redis_settings(
        redis::RedisConnectionInfo::default()
            .set_db(info.redis_settings().db())
            .set_protocol(info.redis_settings().protocol()),
    );
    let Ok(bare) = redis::Client::open(bare) else {
        return false;
    };
    let ping = async {
        let mut con = bare.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut con).await
    };
    matches!(tokio::time::timeout(limit, ping).await, Ok(Ok(_)))
}

/// The command connection: one server's (replaced after a timeout), or a cluster's.
pub(crate) enum Con {
    Single(Box<Single>),
    Cluster(Cluster),
}

impl Con {
    /// One server's connection `con`, replaced when needed by connections of `client`.
    pub(crate) fn single(
        con: ConnectionManager,
        client: redis::Client,
        opts: &ClientOptions,
    ) -> Self {
        Con::Single(Box::new(Single::new(con, client, opts)))
    }

    /// The connection to send the next call on (a cheap clone).
    pub(crate) fn get(&self) -> Link {
        match self {
            Con::Single(s) => Link::Single(s.get()),
            Con::Cluster(c) => c.link(),
        }
    }

    /// A call on the connection timed out: go on with a fresh one (the cluster client keeps
    /// one connection per node and replaces a broken one itself).
    pub(crate) fn timed_out(&self) {
        match self {
            Con::Single(s) => s.timed_out(),
            Con::Cluster(c) => c.forget(),
        }
    }

    /// The master moved (Sentinel): the next calls go to `client`'s node (see
    /// [`Single::switch`]). A cluster's connection follows its failovers itself.
    pub(crate) fn switch(&self, client: redis::Client) {
        if let Con::Single(s) = self {
            s.switch(client);
        }
    }

    /// A connection to every master, with its address (`None`: the one server); a cluster's
    /// masters as read now.
    pub(crate) async fn masters(&self) -> redis::RedisResult<Vec<(Link, Option<String>)>> {
        let c = match self {
            Con::Single(s) => return Ok(vec![(Link::Single(s.get()), None)]),
            Con::Cluster(c) => c,
        };
        c.forget();
        let masters = c.masters().await?;
        Ok(masters.iter().map(|m| (c.at(m), Some(m.addr()))).collect())
    }

    /// The cluster, for `redis+cluster://`.
    pub(crate) fn cluster(&self) -> Option<&Cluster> {
        match self {
            Con::Single(_) => None,
            Con::Cluster(c) => Some(c),
        }
    }
}

/// One server's connection.
pub(crate) struct Single {
    current: RwLock<ConnectionManager>,
    /// Where fresh connections go (replaced when a Sentinel failover moves the master).
    client: RwLock<redis::Client>,
    config: ConnectionManagerConfig,
    /// When the connection was last replaced: at most one replacement per operation timeout
    /// (a burst of timeouts from one stall replaces it once).
    replaced: Mutex<Option<Instant>>,
    gap: Duration,
}

/// The manager's settings for this client's options.
pub(crate) fn config(opts: &ClientOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(opts.get_connect_timeout()))
        .set_response_timeout(Some(opts.get_op_timeout()))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200))
}

impl Single {
    /// `con`, replaced when needed by connections of `client` with `opts`' settings.
    pub(crate) fn new(con: ConnectionManager, client: redis::Client, opts: &ClientOptions) -> Self {
        Single {
            current: RwLock::new(con),
            client: RwLock::new(client),
            // A replacement is made after a timeout, maybe to a stalled server: it gets the
            // time of one operation to connect, once (the core's retries try again), so a
            // paused server costs each retry what it cost before.
            config: config(opts)
                .set_connection_timeout(Some(opts.get_op_timeout().min(opts.get_connect_timeout())))
                .set_number_of_retries(0),
            replaced: Mutex::new(None),
            gap: opts.get_op_timeout(),
        }
    }

    /// The connection to send the next call on (a cheap clone).
    pub(crate) fn get(&self) -> ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A call on the connection timed out: go on with a fresh one.
    pub(crate) fn timed_out(&self) {
        if !crate::once_per(&self.replaced, self.gap) {
            return;
        }
        // The client is read-locked until the fresh connection is in place, so that a
        // concurrent `switch` (a failover) cannot be undone by a connection to the old node.
        let client = self.client.read().unwrap_or_else(PoisonError::into_inner);
        match ConnectionManager::new_lazy_with_config(client.clone(), self.config.clone()) {
            Ok(fresh) => {
                tracing::debug!("a redis reply timed out; the next calls use a fresh connection");
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
            }
            Err(e) => tracing::debug!(error = %e, "cannot make a fresh redis connection"),
        }
    }

    /// The master moved (Sentinel): the next calls go to `client`'s node, on a connection
    /// opened lazily; calls in flight finish (or fail) on the old one.
    pub(crate) fn switch(&self, client: redis::Client) {
        match ConnectionManager::new_lazy_with_config(client.clone(), self.config.clone()) {
            Ok(fresh) => {
                let mut at = self.client.write().unwrap_or_else(PoisonError::into_inner);
                *at = client;
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a connection to the new redis master")
            }
        }
    }
}
