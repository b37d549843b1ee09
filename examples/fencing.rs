//! Why fencing tokens: a storage that rejects writes carrying an older token than one it has
//! seen stays consistent even when a holder stalls past its lease.
//!
//! `cargo run -p distlock --example fencing`

use std::sync::Mutex;
use std::time::Duration;

/// A toy storage that remembers the highest token it accepted.
#[derive(Default)]
struct Storage {
    highest_token: Mutex<u64>,
    value: Mutex<String>,
}

impl Storage {
    fn write(&self, token: u64, value: &str) -> Result<(), String> {
        let mut highest = self.highest_token.lock().map_err(|e| e.to_string())?;
        if token < *highest {
            return Err(format!(
                "rejected write with stale token {token} (seen {highest})"
            ));
        }
        *highest = token;
        *self.value.lock().map_err(|e| e.to_string())? = value.to_owned();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = std::env::var("DLOCK_BACKEND").unwrap_or_else(|_| distlock::DEFAULT_BACKEND.into());
    let client = distlock::connect(&url).await?;
    let storage = Storage::default();

    let first = client.lock("example:fencing")?.acquire().await?;
    let old_token = first.fencing_token();
    first.release().await?;

    // Someone else takes the lock and writes.
    let second = client
        .lock("example:fencing")?
        .acquire_timeout(Duration::from_secs(5))
        .await?;
    storage
        .write(second.fencing_token(), "written by the current holder")
        .map_err(distlock::Error::invalid)?;

    // The first holder, waking from a long pause, tries to write with its old token.
    match storage.write(old_token, "written by a stale holder") {
        Ok(()) => println!("stale write accepted?!"),
        Err(e) => println!("{e}"),
    }
    second.release().await?;
    Ok(())
}
