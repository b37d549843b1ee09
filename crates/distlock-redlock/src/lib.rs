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
use distlock_core::{ClientOptions, Error, Result};
use futures_util::future::join_all;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

pub(crate) const KIND: &str = "redlock";

/// The Redlock backend. Build it with [`RedlockBackend::connect`] (or through
/// `distlock::connect("redlock://…")`).
pub struct RedlockBackend {
    health: Arc<Health>,
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
        let (cfg, nodes) = config::parse(url, opts)?;
        let stop = CancellationToken::new();
        let b = RedlockBackend {
            health: Arc::new(Health {
                nodes,
                cfg,
                opts: opts.clone(),
                max_lease_ms: Default::default(),
            }),
            _stop: stop.clone().drop_guard(),
        };
        let (health, n, q) = (&b.health, b.node_count(), b.quorum());
        let conns = join_all((0..n).map(|i| health.connect_node(i))).await;
        let mut problems = Vec::new();
        for (node, c) in health.nodes.iter().zip(conns) {
            let Err(e) = c else { continue };
            if matches!(e, Error::Auth { .. } | Error::InvalidUrl { .. }) {
                return Err(e);
            }
            node.set_error(e.to_string());
            problems.push(format!("{}: {e}", node.endpoint));
        }
        let connected = n - problems.len();
        if connected < q {
            return Err(b.unavailable(format!(
                "only {connected} of {n} redlock nodes could be reached (need {q}): {}",
                problems.join("; ")
            )));
        }
        health.initialize().await;
        for i in 0..n {
            tokio::spawn(node::node_task(health.clone(), i, stop.clone()));
        }
        Ok(b)
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.health.nodes.len()
    }

    /// Nodes needed for a majority.
    pub fn quorum(&self) -> usize {
        self.health.q()
    }

    /// What this client knows about each node right now.
    pub fn node_status(&self) -> Vec<NodeStatus> {
        let now = Instant::now();
        self.health.nodes.iter().map(|n| n.status(now)).collect()
    }

    /// The per-node timeout in use.
    pub fn node_timeout(&self) -> Duration {
        self.health.cfg.node_timeout
    }

    /// How long a restarted node stays out of majorities right now.
    pub fn quarantine(&self) -> Duration {
        self.health.quarantine_len()
    }

    /// A retryable [`Error::Connection`] of the whole Redlock (`message`: what failed).
    fn unavailable(&self, message: impl Into<String>) -> Error {
        Error::connection(KIND, self.health.cfg.endpoint.clone(), message.into())
    }

    fn no_quorum(&self, answered: usize, problems: &[String]) -> Error {
        let (n, q) = (self.node_count(), self.quorum());
        let details = match problems {
            [] => "no details".to_owned(),
            p => p.join("; "),
        };
        self.unavailable(format!(
            "only {answered} of {n} redlock nodes answered (need {q}): {details}"
        ))
    }

    /// Per-node bound of releases and renewals: they need not fit the node timeout (a grant's
    /// validity does not depend on them: the core measures a renewal from its send time), and
    /// they return as soon as a majority decided.
    fn call_timeout(&self) -> Duration {
        self.health.opts.get_op_timeout().max(self.node_timeout())
    }

    fn watch_timeout(&self) -> Duration {
        (self.node_timeout() * 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }
}
