//! What every mode of an SQL backend does (session mode is [`Sessions`]; lease and table modes
//! are the backends' own), and the `Backend` impl that forwards to the mode in use.

use crate::engine::{Dialect, Sessions};
use distlock_core::backend::{AcquireReply, AcquireRequest, Backend, GrantRef, Granted};
use distlock_core::{async_trait, LockInfo, LockKind, ReleaseOutcome, RenewOutcome, Result};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// One mode of an SQL backend: the lock operations of `Backend` that depend on the mode. The
/// backend forwards to its mode with [`sql_backend!`](crate::sql_backend).
#[async_trait]
pub trait ModeOps: Send + Sync {
    /// As [`Backend::acquire`].
    ///
    /// # Errors
    /// As [`Backend::acquire`].
    ///
    /// # Cancel safety
    /// As [`Backend::acquire`].
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply>;

    /// As [`Backend::acquire_wait`] (`outer`: the backend). The default waits for wake-ups
    /// and retries (the core's `watch_and_retry`).
    ///
    /// # Errors
    /// As [`Backend::acquire_wait`].
    ///
    /// # Cancel safety
    /// As [`Backend::acquire_wait`]: stop it with `cancel`.
    async fn acquire_wait(
        &self,
        outer: &dyn Backend,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        distlock_core::wait::watch_and_retry(outer, req, deadline, cancel).await
    }

    /// As [`Backend::give_up`].
    ///
    /// # Errors
    /// As [`Backend::give_up`].
    ///
    /// # Cancel safety
    /// As [`Backend::give_up`].
    async fn give_up(&self, req: &AcquireRequest) -> Result<()>;

    /// As [`Backend::release`].
    ///
    /// # Errors
    /// As [`Backend::release`].
    ///
    /// # Cancel safety
    /// As [`Backend::release`].
    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome>;

    /// As [`Backend::renew`].
    ///
    /// # Errors
    /// As [`Backend::renew`].
    ///
    /// # Cancel safety
    /// As [`Backend::renew`].
    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>>;

    /// As [`Backend::inspect`].
    ///
    /// # Errors
    /// As [`Backend::inspect`].
    ///
    /// # Cancel safety
    /// As [`Backend::inspect`].
    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo>;

    /// As [`Backend::proclaim`]. The default: this mode has no elections (never called
    /// through a client when the mode does not declare [`LockKind::Election`]).
    ///
    /// # Errors
    /// As [`Backend::proclaim`].
    ///
    /// # Cancel safety
    /// As [`Backend::proclaim`].
    async fn proclaim(&self, _grant: &GrantRef, _seq: u64, _value: &str) -> Result<RenewOutcome> {
        Err(distlock_core::Error::unsupported(
            "sql",
            "elections in this mode",
        ))
    }
}

#[async_trait]
impl<D: Dialect> ModeOps for Sessions<D> {
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        Sessions::acquire(self, req).await
    }

    async fn acquire_wait(
        &self,
        outer: &dyn Backend,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        Sessions::acquire_wait(self, outer, req, deadline, cancel).await
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        Sessions::give_up(self, req).await
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        Sessions::release(self, grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        Sessions::renew(self, holds).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        Sessions::inspect(self, name, kind).await
    }

    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        Sessions::proclaim(self, grant, seq, value).await
    }
}

/// Implements `distlock_core::Backend` for an SQL backend type whose private
/// `fn ops(&self) -> &dyn ModeOps` returns the mode in use: the lock operations forward to
/// the mode, `kind` is `$kind`, `endpoint` the field path `$endpoint` of `self`, the operator
/// commands are the type's own `Operator` impl, `proclaim` forwards to the mode too; the items in
/// braces (`capabilities`, `watch`, `observe`) are the backend's own.
#[macro_export]
macro_rules! sql_backend {
    (
        $ty:ty,
        kind: $kind:expr,
        endpoint: $($endpoint:ident).+,
        { $($own:tt)* }
    ) => {
        #[$crate::__private::async_trait]
        impl $crate::__private::Backend for $ty {
            fn kind(&self) -> &'static str {
                $kind
            }

            fn endpoint(&self) -> ::std::string::String {
                self.$($endpoint).+.clone()
            }

            fn operator(&self) -> ::std::option::Option<&dyn $crate::__private::Operator> {
                ::std::option::Option::Some(self)
            }

            async fn acquire(
                &self,
                req: &$crate::__private::AcquireRequest,
            ) -> $crate::__private::Result<$crate::__private::AcquireReply> {
                $crate::ModeOps::acquire(self.ops(), req).await
            }

            async fn acquire_wait(
                &self,
                req: &$crate::__private::AcquireRequest,
                deadline: ::std::option::Option<::std::time::Instant>,
                cancel: &$crate::__private::CancellationToken,
            ) -> $crate::__private::Result<::std::option::Option<$crate::__private::Granted>> {
                $crate::ModeOps::acquire_wait(self.ops(), self, req, deadline, cancel).await
            }

            async fn give_up(
                &self,
                req: &$crate::__private::AcquireRequest,
            ) -> $crate::__private::Result<()> {
                $crate::ModeOps::give_up(self.ops(), req).await
            }

            async fn release(
                &self,
                grant: &$crate::__private::GrantRef,
            ) -> $crate::__private::Result<$crate::__private::ReleaseOutcome> {
                $crate::ModeOps::release(self.ops(), grant).await
            }

            async fn renew(
                &self,
                holds: &[($crate::__private::GrantRef, ::std::time::Duration)],
            ) -> $crate::__private::Result<::std::vec::Vec<$crate::__private::RenewOutcome>> {
                $crate::ModeOps::renew(self.ops(), holds).await
            }

            async fn inspect(
                &self,
                name: &str,
                kind: $crate::__private::LockKind,
            ) -> $crate::__private::Result<$crate::__private::LockInfo> {
                $crate::ModeOps::inspect(self.ops(), name, kind).await
            }

            async fn proclaim(
                &self,
                grant: &$crate::__private::GrantRef,
                seq: u64,
                value: &str,
            ) -> $crate::__private::Result<$crate::__private::RenewOutcome> {
                $crate::ModeOps::proclaim(self.ops(), grant, seq, value).await
            }

            $($own)*
        }
    };
}
