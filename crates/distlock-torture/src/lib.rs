//! `dlock torture`: check a lock deployment for double grants the way Jepsen would.
//!
//! Workers (separate processes) loop acquire → read-modify-write on a fenced register the
//! coordinator serves on loopback → release, recording every event; nemeses pause, kill and
//! cut off workers; the [`checker`] then looks at the whole [`history`] for overlapping
//! critical sections, bad fencing tokens and lost updates. See docs/torture.md.

pub mod broken;
pub mod checker;
pub mod draw;
pub mod history;
pub mod register;
pub mod run;
pub mod selftest;
pub mod server;
pub mod timeline;
pub mod worker;

pub use run::{Config, Nemesis, Report, WorkerCommand};
pub use worker::{Target, WorkerConfig};
