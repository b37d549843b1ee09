#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod closewatch;
pub mod ended;
mod engine;
pub mod errors;
mod grants;
mod holds;
pub mod lease;
mod pool;
pub mod url;
pub mod waited;

pub use engine::{Dialect, Sessions};
pub use grants::ConnGrants;
pub use holds::{Hold, HoldMap, HoldState};
pub use pool::IdlePool;
