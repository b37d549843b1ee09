//! Take a lock, use its fencing token, stop work if the lock is lost, release it.
//!
//! `cargo run -p distlock --example basic` (embedded file backend), or
//! `DLOCK_BACKEND=redis://127.0.0.1:6379 cargo run -p distlock --example basic`.

use std::time::Duration;

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = std::env::var("DLOCK_BACKEND").unwrap_or_else(|_| distlock::DEFAULT_BACKEND.into());
    // Messages show the URL with its password as `***`.
    println!("connecting to {}", distlock::conn::redact(&url));
    let client = distlock::connect(&url).await?;

    let lock = client.lock("example:stock:sku-42")?;
    let guard = lock.acquire_timeout(Duration::from_secs(10)).await?;
    println!(
        "holding `{}` with fencing token {}",
        guard.name(),
        guard.fencing_token()
    );

    tokio::select! {
        reason = guard.lost() => {
            // The watchdog could not keep the lock: stop touching the resource.
            eprintln!("lost the lock: {reason}");
            return Ok(());
        }
        _ = tokio::time::sleep(Duration::from_millis(200)) => {
            // ... the critical section: read, check, write (passing the token along) ...
        }
    }

    let outcome = guard.release().await?;
    println!("released: {outcome:?}");
    Ok(())
}
