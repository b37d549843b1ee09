#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod engine;
mod grants;
mod holds;
pub mod lease;
mod pool;
pub mod url;

pub use engine::{Dialect, Sessions};
pub use grants::ConnGrants;
pub use holds::{Hold, HoldMap, HoldState};
pub use pool::IdlePool;
