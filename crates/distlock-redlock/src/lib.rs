#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod acquire;
mod config;
mod holds;
mod node;
mod ops;
mod queue;
mod tally;
mod watch;

pub use config::{redact, DEFAULT_CHECK_INTERVAL, DEFAULT_NODE_TIMEOUT, MIN_NODES};
pub use node::NodeStatus;

use crate::node::Health;
use distlock_core::backend::{
    async_trait, AcquireReply, AcquireRequest, Backend, Capabilities, GrantRef, ReleaseWatch,
    RenewOutcome,
};
use distlock_core::{ClientOptions, Error, LockInfo, LockKind, ReleaseOutcome, Result};
use futures_util::future::join_all;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

pub(crate) const KIND: &str = "redlock";

/// The Redlock backend. Build it with [`RedlockBackend::connect`] (or through
/// `distlock::connect("redlock://…")`).
pub struct RedlockBackend {
    shared: Arc<Shared>,
}

/// State shared by the backend and its helpers.
struct Shared {
    health: Arc<Health>,
    endpoint: String,
    /// Stops the node checks when the backend goes away.
    _stop: DropGuard,
}

impl RedlockBackend {
    /// Connects to every node of `url` in parallel, checks them, and starts a background check
    /// per node. Fails if fewer than a majority of nodes can be reached, or if any node refuses
    /// the credentials.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL this backend does not accept (the password is redacted
    /// in the message), or one a node refuses; [`Error::Auth`] if any node refuses the
    /// credentials; [`Error::Connection`] if fewer than a majority of nodes can be reached
    /// within the connect timeout (the message names each node's problem).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections made so far, and the node checks
    /// start only once it returns. A node it was initialising keeps no epoch or the whole one
    /// (its quarantine set): the epoch is its one write.
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        opts.validate()?;
        let cfg = config::parse(url, opts)?;
        let endpoint = cfg
            .nodes
            .iter()
            .map(|a| a.endpoint.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let health = Arc::new(Health {
            nodes: cfg.nodes.iter().map(node::Node::new).collect(),
            cfg,
            opts: opts.clone(),
            max_lease_ms: Default::default(),
        });
        let (n, q) = (health.nodes.len(), health.q());
        let conns = join_all((0..n).map(|i| health.connect_node(i))).await;
        let mut problems = Vec::new();
        for (node, c) in health.nodes.iter().zip(conns) {
            match c {
                Ok(_) => {}
                Err(e @ (Error::Auth { .. } | Error::InvalidUrl { .. })) => return Err(e),
                Err(e) => {
                    node.set_error(e.to_string());
                    problems.push(format!("{}: {e}", node.endpoint));
                }
            }
        }
        let connected = n - problems.len();
        if connected < q {
            return Err(Error::connection(
                KIND,
                endpoint,
                format!(
                    "only {connected} of {n} redlock nodes could be reached (need {q}): {}",
                    problems.join("; ")
                ),
            ));
        }
        health.initialize().await;
        let stop = CancellationToken::new();
        for i in 0..n {
            tokio::spawn(node::node_task(health.clone(), i, stop.clone()));
        }
        Ok(RedlockBackend {
            shared: Arc::new(Shared {
                health,
                endpoint,
                _stop: stop.drop_guard(),
            }),
        })
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.shared.health.nodes.len()
    }

    /// Nodes needed for a majority.
    pub fn quorum(&self) -> usize {
        self.shared.health.q()
    }

    /// What this client knows about each node right now.
    pub fn node_status(&self) -> Vec<NodeStatus> {
        let now = Instant::now();
        self.shared
            .health
            .nodes
            .iter()
            .map(|n| n.status(now))
            .collect()
    }

    /// The per-node timeout in use.
    pub fn node_timeout(&self) -> Duration {
        self.shared.health.cfg.node_timeout
    }

    /// How long a restarted node stays out of majorities right now.
    pub fn quarantine(&self) -> Duration {
        self.shared.health.quarantine_len()
    }
}

impl Shared {
    fn n(&self) -> usize {
        self.health.nodes.len()
    }

    fn q(&self) -> usize {
        self.health.q()
    }

    fn nt(&self) -> Duration {
        self.health.cfg.node_timeout
    }

    /// A retryable [`Error::Connection`] of the whole Redlock (`message`: what failed).
    fn unavailable(&self, message: impl Into<String>) -> Error {
        Error::connection(KIND, self.endpoint.clone(), message.into())
    }

    fn no_quorum(&self, answered: usize, problems: &[String]) -> Error {
        self.unavailable(format!(
            "only {answered} of {} redlock nodes answered (need {}): {}",
            self.n(),
            self.q(),
            if problems.is_empty() {
                "no details".to_owned()
            } else {
                problems.join("; ")
            }
        ))
    }

    /// Per-node bound of releases and renewals: they need not fit the node timeout (a grant's
    /// validity does not depend on them: the core measures a renewal from its send time), and
    /// they return as soon as a majority decided.
    fn call_timeout(&self) -> Duration {
        self.health.opts.get_op_timeout().max(self.nt())
    }

    fn watch_timeout(&self) -> Duration {
        (self.nt() * 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }
}

#[async_trait]
impl Backend for RedlockBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.shared.endpoint.clone()
    }

    /// The mutex and the election (`docs/election-redlock.md`): the core refuses every other
    /// kind before it calls the backend.
    fn capabilities(&self) -> Capabilities {
        Capabilities::kinds(&[LockKind::Mutex]).with(LockKind::Election)
    }

    /// One attempt on every node in parallel; see the crate docs. "Held by another owner" is
    /// `Ok(Held)`; "fewer than a majority of nodes answered" is [`Error::Connection`].
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.shared.acquire(req).await
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.shared.watch(req).await
    }

    /// Waits in the nodes' wait queues, woken by the nodes where this waiter is first (see
    /// `docs/redlock.md`, "Waiting"); with `wait=retry` in the URL, the core's retry loop
    /// instead.
    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<distlock_core::backend::Granted>> {
        match self.shared.health.cfg.wait {
            config::WaitMode::Queue => self.shared.queued_wait(req, deadline, cancel).await,
            config::WaitMode::Retry => {
                distlock_core::wait::watch_and_retry(self, req, deadline, cancel).await
            }
        }
    }

    /// Releases whatever the attempt holds on any node; see [`Backend::give_up`].
    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.shared.give_up(req).await
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.shared.release(grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.shared.renew(holds).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.shared.inspect(name, kind).await
    }

    /// Numbered per node; decided by a majority (see `docs/election-redlock.md`).
    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        self.shared.proclaim(grant, seq, value).await
    }

    /// The election's observe channel on every node, merged: a message from any node wakes
    /// it; broken subscriptions on a majority end it with an error.
    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        self.shared.observe(name).await
    }

    fn operator(&self) -> Option<&dyn distlock_core::Operator> {
        Some(self)
    }
}
