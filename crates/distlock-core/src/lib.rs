//! Backend-independent machinery of [dlock](https://docs.rs/dlock): lock handles, guards, the
//! watchdog, waiting, fencing tokens, errors and name checks. Backends implement the narrow
//! [`Backend`] trait; users normally depend on the `dlock` facade crate instead of this one.
#![warn(missing_docs)]

pub mod backend;
pub mod backoff;
pub mod blocking;
mod caps;
mod client;
pub mod clock;
pub mod conn;
pub mod registry;
mod deadline;
mod duration;
mod error;
mod guard;
mod hold;
mod lock;
mod lost;
mod lost_registry;
mod name;
mod options;
mod semaphore;
mod subscriptions;
pub mod wait;

pub use backend::{
    AcquireReply, AcquireRequest, AttemptId, Backend, Finding, ForceReleased, GrantRef, Granted,
    HoldKey, HolderInfo, ListedLock, LockInfo, LockKind, ReleaseOutcome, ReleaseWatch,
    RenewOutcome, Severity, Wake,
};
pub use backoff::RetryPolicy;
pub use client::{Client, RwLock};
pub use duration::parse_duration;
pub use error::{BoxError, Error, Result};
pub use guard::LockGuard;
pub use hold::drift;
pub use lock::Lock;
pub use lost::{LostReason, LostSignal};
pub use name::{validate_name, validate_owner, MAX_NAME_LEN, MAX_OWNER_LEN};
pub use options::{
    check_lease, check_watchdog_lease, ClientOptions, MAX_LEASE, MIN_WATCHDOG_LEASE,
};
pub use semaphore::{MultiGuard, MultiLock, Semaphore, MAX_PERMITS};

/// `async_trait`, re-exported for backend implementations.
pub use async_trait::async_trait;
