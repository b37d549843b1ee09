//! The blocking API, for code without an async runtime: a nightly job that must run once.
//!
//! `cargo run -p distlock --example blocking`

use std::time::Duration;

fn main() -> distlock::Result<()> {
    let url = std::env::var("DLOCK_BACKEND").unwrap_or_else(|_| distlock::DEFAULT_BACKEND.into());
    let client = distlock::blocking::connect(&url)?;
    match client.lock("example:nightly-report")?.try_acquire()? {
        Some(guard) => {
            println!("running the report (token {})", guard.fencing_token());
            std::thread::sleep(Duration::from_millis(100));
            guard.release()?;
        }
        None => println!("another process is running the report; nothing to do"),
    }
    Ok(())
}
