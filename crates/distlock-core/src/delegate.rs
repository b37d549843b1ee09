//! [`Delegate`]: a backend whose lock operations are another backend's.

use crate::backend::{
    async_trait, AcquireReply, AcquireRequest, Backend, Capabilities, GrantRef, Granted, LockInfo,
    LockKind, Operator, ReleaseOutcome, ReleaseWatch, RenewOutcome,
};
use crate::error::Result;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// For backend authors: a backend whose lock operations are another backend's.
///
/// A backend with modes (PostgreSQL's session and lease modes, MySQL's session and table
/// modes) keeps one [`Backend`] per mode and hands every lock operation to the one in use.
/// It implements `Delegate` — which backend does the work, and whose operator commands to
/// offer — and the blanket `impl<T: Delegate> Backend for T` forwards every method of
/// [`Backend`] to [`Delegate::target`], so a method added to the trait later cannot be
/// forgotten in one of them. The invariants of the [module docs](crate::backend) are the
/// target's to keep.
///
/// ```
/// use distlock_core::backend::{Backend, Delegate};
///
/// /// Two ways to keep locks; the one in use does the work.
/// enum Moded {
///     Fast(Box<dyn Backend>),
///     Safe(Box<dyn Backend>),
/// }
///
/// impl Delegate for Moded {
///     fn target(&self) -> &dyn Backend {
///         match self {
///             Moded::Fast(b) | Moded::Safe(b) => b.as_ref(),
///         }
///     }
/// }
///
/// fn usable(b: std::sync::Arc<dyn Backend>) {}
/// # fn f(m: Moded) { usable(std::sync::Arc::new(m)) }
/// ```
pub trait Delegate: Send + Sync + 'static {
    /// The backend that does the work now: cheap and without I/O (it is asked on every
    /// call), and of the same kind, endpoint and capabilities for the life of the value.
    fn target(&self) -> &dyn Backend;

    /// The operator commands to offer as [`Backend::operator`]. The default is the
    /// target's; a backend whose commands span its modes returns `Some(self)` with an
    /// [`Operator`] impl of its own.
    fn delegate_operator(&self) -> Option<&dyn Operator> {
        self.target().operator()
    }
}

/// Every method is the target's, except [`Backend::operator`], which is
/// [`Delegate::delegate_operator`].
#[async_trait]
impl<T: Delegate> Backend for T {
    fn kind(&self) -> &'static str {
        self.target().kind()
    }

    fn endpoint(&self) -> String {
        self.target().endpoint()
    }

    fn capabilities(&self) -> Capabilities {
        self.target().capabilities()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.target().acquire(req).await
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.target().watch(req).await
    }

    fn watch_ready(&self, req: &AcquireRequest) -> Option<Box<dyn ReleaseWatch>> {
        self.target().watch_ready(req)
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.target().give_up(req).await
    }

    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        self.target().acquire_wait(req, deadline, cancel).await
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.target().release(grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.target().renew(holds).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.target().inspect(name, kind).await
    }

    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        self.target().proclaim(grant, seq, value).await
    }

    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        self.target().observe(name).await
    }

    async fn set_permits(&self, name: &str, permits: u32) -> Result<()> {
        self.target().set_permits(name, permits).await
    }

    fn operator(&self) -> Option<&dyn Operator> {
        self.delegate_operator()
    }
}

#[cfg(test)]
mod tests;
