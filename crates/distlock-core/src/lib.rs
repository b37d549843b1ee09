//! Backend-independent machinery of [dlock](https://docs.rs/dlock): lock handles, guards, the
//! watchdog, waiting, fencing tokens, errors and name checks. Users normally depend on the
//! `distlock` facade crate instead of this one.
//!
//! - **Using locks:** [`Client`], [`Lock`], [`LockGuard`], [`RwLock`], [`Semaphore`],
//!   [`MultiLock`], [`LostSignal`], [`Error`], [`ClientOptions`] and the values they report
//!   ([`LockInfo`], [`ReleaseOutcome`], …), at the crate root.
//! - **Writing a backend:** the [`backend`] module: the narrow [`Backend`] trait with the
//!   obligations of each method, the values that cross it, and the kit of generic parts
//!   (capabilities, deadlines, the retrying wait loop, lost-signal registry, wake-up
//!   subscriptions). The author-only items are also re-exported at the root, hidden from the
//!   docs, for older code.
#![warn(missing_docs)]

pub mod backend;
pub mod backoff;
pub mod blocking;
mod caps;
mod client;
pub mod clock;
pub mod conn;
mod deadline;
mod delegate;
mod duration;
mod election;
pub mod ended;
mod error;
mod fasthash;
mod guard;
mod hold;
mod lock;
mod lost;
mod lost_registry;
mod name;
pub mod operator;
mod options;
pub mod program;
pub mod registry;
mod semaphore;
mod subscriptions;
mod types;
pub mod wait;

pub use backend::Backend;
#[doc(hidden)]
pub use backend::{
    AcquireReply, AcquireRequest, AttemptId, GrantRef, Granted, HoldKey, ReleaseWatch,
    RenewOutcome, Wake,
};
pub use backoff::RetryPolicy;
pub use client::{Client, RwLock};
pub use duration::parse_duration;
pub use election::{Election, Leader, Leadership, Observer, MAX_VALUE_LEN};
pub use error::{BoxError, Error, Result};
pub use guard::LockGuard;
#[doc(hidden)]
pub use hold::drift;
pub use lock::Lock;
pub use lost::{LostReason, LostSignal};
pub use name::{validate_name, validate_owner, MAX_NAME_LEN, MAX_OWNER_LEN};
pub use operator::Operator;
pub use options::{
    check_lease, check_watchdog_lease, ClientOptions, MAX_LEASE, MIN_WATCHDOG_LEASE,
};
pub use semaphore::{MultiGuard, MultiLock, Semaphore, MAX_PERMITS};
pub use types::{
    Finding, ForceReleased, HolderInfo, ListedLock, LockInfo, LockKind, ReleaseOutcome, Severity,
    WaiterInfo,
};

/// `async_trait`, re-exported for backend implementations (also in [`backend`]).
#[doc(hidden)]
pub use async_trait::async_trait;

mod assert_traits;
