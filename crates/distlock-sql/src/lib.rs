#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod closewatch;
pub mod ended;
mod engine;
pub mod errors;
mod grants;
mod holds;
pub mod lease;
mod modes;
mod pool;
pub mod url;
pub mod waited;

pub use engine::{Dialect, Sessions};
pub use grants::ConnGrants;
pub use holds::{Hold, HoldMap, HoldState};
pub use modes::ModeOps;

/// What [`sql_backend!`] expands to refers to (not an API).
#[doc(hidden)]
pub mod __private {
    pub use distlock_core::backend::{AcquireReply, AcquireRequest, Backend, GrantRef, Granted};
    pub use distlock_core::{
        async_trait, LockInfo, LockKind, Operator, ReleaseOutcome, RenewOutcome, Result,
    };
    pub use tokio_util::sync::CancellationToken;
}
pub use pool::IdlePool;
