//! The conformance suite: written once, run against every backend on a real server.
//!
//! A backend's test file describes how to reach the backend, usually with a
//! [`ServerHarness`] (the server, its URL, a connect function, what the backend can do, how to
//! break a lock behind its holder's back; the proxied client is derived), or by implementing
//! [`Harness`] itself, and calls [`conformance_suite!`](crate::conformance_suite), which
//! expands to one `#[tokio::test]` per case, so cases run in parallel and fail one by one.
//!
//! Every case uses its own lock names, so cases may share a server.
//!
//! The adversarial cases ([`adversarial`], expanded by
//! [`adversarial_suite!`](crate::adversarial_suite)) try to break the lock: late, lost and
//! reset replies through a proxy the case controls ([`Harness::proxied_client`]),
//! cancellation at every await, re-entrant and sibling holds, data loss, and a soak checked on
//! a fenced register and an overlap recorder.

pub mod adversarial;
mod contract;
mod election;
mod harness;
mod kinds;
mod lease;
mod mutex;
mod prelude;
mod suite;

pub use contract::*;
pub use election::*;
pub use harness::{Caps, Harness, ServerHarness};
pub use kinds::*;
pub use lease::*;
pub use mutex::*;
pub use prelude::{
    fast_opts, others_renew_while_one_fails, poll_until, unique_name, wait_for_waiters, EVENTUALLY,
};
