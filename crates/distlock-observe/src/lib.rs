//! See your locks: who holds what and who waits, on any dlock backend.
//!
//! - [`Monitor`] looks at every lock under a prefix ([`Client::list`]), again and again, and
//!   makes a [`Snapshot`]: per lock its holders (owner, host and pid of an owner id the
//!   library made, how long it has held, lease left), the last fencing token, the waiters
//!   and the oldest wait, the queue in order where the backend names it. Between two looks it
//!   tells what changed: [`Event`]s granted, released, lost (a lease ran out) and waiting.
//! - [`frame`] renders a snapshot as the plain text of `dlock top --once`; [`term::run`] is the
//!   live terminal view.
//! - [`server::serve`] is `dlock serve`: `/api/locks`, `/api/locks/{name}`, `/api/events`
//!   (server-sent events), `/api/history`, `/metrics` (Prometheus text: [`prom::SERIES`] and
//!   the process's client metrics) and one page with the live table and a timeline.
//!
//! How long a holder has held is what the monitor saw: a hold already there at its first
//! look is shown as a lower bound (`≥5s`). Waits come from the server where it records
//! arrivals (Redis), else from when the monitor first saw waiters (again a lower bound).
//!
//! ```
//! use distlock_core::{HolderInfo, ListedLock, LockInfo, LockKind};
//! use distlock_observe::{frame, Snapshot, Tracker};
//! use std::time::{Instant, SystemTime};
//!
//! let listed = [ListedLock::new(
//!     LockKind::Mutex,
//!     LockInfo::new("orders:42")
//!         .with_holders(vec![HolderInfo::new("web-1:4242:0a1b2c3d:1", 1)])
//!         .with_waiters(Some(2))
//!         .with_fencing_token(17),
//! )];
//! let now = Instant::now();
//! let (locks, _events) = Tracker::new().observe(now, now, SystemTime::now(), &listed);
//! let snap = Snapshot { backend: "redis".into(), endpoint: "127.0.0.1:6379".into(), taken_at_ms: 0, locks };
//! let text = frame(&snap, 200);
//! assert!(text.contains("orders:42"));
//! assert!(text.contains("web-1"));
//! ```
//!
//! [`Client::list`]: distlock_core::Client::list
#![warn(missing_docs)]

mod model;
mod monitor;
pub mod prom;
pub mod server;
pub mod term;
mod text;

pub use model::{
    kind_name, parse_kind, Change, Event, HolderRow, LockRow, Snapshot, Sort, Tracker, WaiterRow,
};
pub use monitor::{Monitor, RefreshStats};
pub use server::ServeOptions;
pub use term::TopOptions;
pub use text::{detail, frame, frame_sorted, short, table, title};
