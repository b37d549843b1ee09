//! Connecting to the cluster, and calling it: per-call timeouts, retries of requests that never left.

use crate::builder::Target;
use crate::error::{map, KIND};
use crate::tls;
use crate::EtcdBackend;
use distlock_core::conn::{ClientCert, TlsError, TlsErrorKind};
use distlock_core::{ClientOptions, Error, Result};
use etcd_client::{Client, ConnectOptions, GetOptions, Txn, TxnResponse};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

/// True if the request provably never reached etcd (the connection to a member was refused),
/// so sending it again cannot apply it twice.
pub(crate) fn never_sent(e: &etcd_client::Error) -> bool {
    unavailable(e, |m| !m.starts_with("etcdserver") && m.contains("connect"))
}

/// True if `e` is gRPC's `Unavailable` with a message that `says`.
fn unavailable(e: &etcd_client::Error, says: impl Fn(&str) -> bool) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::Unavailable && says(s.message()))
}

impl EtcdBackend {
    /// Connects to the cluster `target` describes (`url` is only for messages, redacted) and
    /// checks that it answers (a linearizable read, so a cluster without a quorum fails here).
    pub(crate) async fn open(url: &str, target: Target, opts: &ClientOptions) -> Result<Self> {
        let endpoint = target.hosts.join(",");
        // etcd refuses HTTP/2 pings more often than every 5 s by default.
        let ping_timeout = opts.get_op_timeout().max(Duration::from_secs(1));
        let mut co = ConnectOptions::new()
            .with_connect_timeout(opts.get_connect_timeout())
            .with_keep_alive(Duration::from_secs(10), ping_timeout)
            .with_require_leader(true);
        if let (Some(u), Some(p)) = (&target.user, &target.password) {
            co = co.with_user(u.clone(), p.expose().to_owned());
        }
        let scheme = match &target.tls {
            None => "http",
            Some(files) => {
                co = co.with_tls(crate::tls::options(files)?);
                "https"
            }
        };
        let endpoints: Vec<_> = target
            .hosts
            .iter()
            .map(|h| format!("{scheme}://{h}"))
            .collect();
        let limit = opts.get_connect_timeout() * 2;
        let client = tokio::time::timeout(limit, Client::connect(&endpoints, Some(co.clone())))
            .await
            .map_err(|_| no_answer(&endpoint, limit))?
            .map_err(|e| match e {
                etcd_client::Error::InvalidArgs(m) => Error::invalid_url(url, m),
                etcd_client::Error::InvalidUri(m) => Error::invalid_url(url, m.to_string()),
                e => map(&endpoint, e),
            })?;
        let mut backend = Self::new(client, endpoint, target.prefix.clone(), opts);
        backend.connect_opts = Some(co);
        backend.transport = tls::transport(&target.hosts, target.tls.as_ref());
        let cert = (target.tls.as_ref()).map(|t| match t.client() {
            Some(_) => ClientCert::Given(""),
            None => ClientCert::None,
        });
        backend.probed(cert, &target.hosts).await
    }

    /// The backend on `client` (keys under `prefix`, else the namespace), not yet probed;
    /// `transport` says it runs on an application's client until [`open`](Self::open) replaces it.
    pub(crate) fn new(
        client: Client,
        endpoint: String,
        prefix: Option<String>,
        opts: &ClientOptions,
    ) -> Self {
        let closed = tokio_util::sync::CancellationToken::new();
        EtcdBackend {
            client,
            endpoint,
            prefix: prefix.unwrap_or_else(|| opts.get_namespace().to_owned()),
            op_timeout: opts.get_op_timeout(),
            connect_opts: None,
            connect_timeout: opts.get_connect_timeout(),
            watchdog_lease: opts.get_watchdog_lease(),
            doubtful: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
            transport: distlock_core::Finding::new(
                distlock_core::Severity::Ok,
                "tls",
                "not known: the backend runs on the application's etcd client",
            ),
            closed: closed.clone(),
            _closing: closed.drop_guard(),
        }
    }

    /// This backend, once a linearizable read got through within twice the connect timeout;
    /// an election in progress ("leader changed", "no leader") is retried until then (it takes
    /// about one election timeout). `cert`: with TLS, the client certificate given or not (to
    /// explain a connection the server closed right after the handshake); `hosts`: the members
    /// dialled (none for an application's client), asked in plain HTTP/2 when a TLS connection
    /// was closed.
    pub(crate) async fn probed(
        self,
        cert: Option<ClientCert<'_>>,
        hosts: &[String],
    ) -> Result<Self> {
        let limit = self.connect_timeout * 2;
        let (mut kv, key) = (self.client.kv_client(), self.prefix.clone().into_bytes());
        let deadline = tokio::time::Instant::now() + limit;
        let probe = async {
            loop {
                let opts = GetOptions::new().with_keys_only().with_limit(1);
                match kv.get(key.clone(), Some(opts)).await {
                    Err(e)
                        if electing(&e)
                            && tokio::time::Instant::now() + ELECTION_POLL < deadline =>
                    {
                        tokio::time::sleep(ELECTION_POLL).await
                    }
                    r => return r,
                }
            }
        };
        let probed = tokio::time::timeout(limit, probe).await;
        let Err(e) = probed.map_err(|_| no_answer(&self.endpoint, limit))? else {
            return Ok(self);
        };
        let closed = tls::closed_under_request(&e);
        let t = match (cert, tls::classify(&e, cert.unwrap_or(ClientCert::Unknown))) {
            (_, Some(t)) => t,
            // A TLS connection the server closed: a member that refused the client's
            // certificate after the handshake (with TLS 1.3, how etcd's `--client-cert-auth`
            // refuses a client without one, or with one it does not trust), or (when the
            // hello's EOF surfaces only as a closed connection) a plain-http member. The
            // second answers HTTP/2 in the clear.
            (Some(cert), None) if closed => {
                let (kind, why) = match hosts.first() {
                    Some(host) if tls::speaks_plain_http2(host, self.connect_timeout).await => (
                        TlsErrorKind::NotSupportedByServer,
                        "the server closed the TLS connection and answers plain HTTP/2",
                    ),
                    _ => (
                        TlsErrorKind::ClientCertRejected,
                        "the server closed the connection right after the TLS handshake, as \
                         etcd does with a client certificate it does not accept, or none",
                    ),
                };
                TlsError::worded(kind, why, &tls::WORDS, cert)
            }
            (None, None) if self.connect_opts.is_some() && closed => {
                let hint = "the server closed the connection: if its members serve https, \
                            connect with etcds://";
                let why = format!("{e} ({hint})");
                return Err(Error::connection(KIND, self.endpoint.clone(), why));
            }
            _ => return Err(map(&self.endpoint, e)),
        };
        Err(Error::connection(KIND, self.endpoint.clone(), t))
    }
}

/// How often the connect probe asks again during an election.
const ELECTION_POLL: Duration = Duration::from_millis(50);

/// True if etcd says it is electing a leader (an answer, not a lost request).
fn electing(e: &etcd_client::Error) -> bool {
    unavailable(e, |m| {
        m.contains("leader changed") || m.contains("no leader")
    })
}

/// The connect timeout was exceeded twice over.
fn no_answer(endpoint: &str, limit: Duration) -> Error {
    Error::connection(
        KIND,
        endpoint.to_owned(),
        format!("no answer within {limit:?} (is the cluster down or without a quorum?)"),
    )
}

impl EtcdBackend {
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
            .map_err(|_| Error::call_timeout(KIND, &self.endpoint, what, self.op_timeout))
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
}
