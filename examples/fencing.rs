//! Why fencing tokens: a store that rejects writes carrying a lower token than one it has
//! accepted stays consistent even when a holder stalls past its lease.
//!
//! The rule (the same on every backend): a token issued for a lock name is above every token
//! issued for that name before. So the store keeps the highest token it accepted, rejects a
//! write with a **lower** token and accepts an **equal** one — no two grants share a token, so
//! an equal token is the same holder writing again. Compare tokens of one lock name only.
//!
//! `cargo run -p distlock --example fencing`

use std::sync::Mutex;
use std::time::Duration;

/// A toy store that remembers the highest token it accepted, checked and recorded with the
/// write under one lock (a real store does it in one conditional update or transaction).
#[derive(Default)]
struct Storage {
    state: Mutex<Fenced>,
}

#[derive(Default)]
struct Fenced {
    highest_token: u64,
    value: String,
}

impl Storage {
    fn write(&self, token: u64, value: &str) -> Result<(), String> {
        let mut st = self.state.lock().map_err(|e| e.to_string())?;
        if token < st.highest_token {
            return Err(format!(
                "rejected write with stale token {token} (seen {})",
                st.highest_token
            ));
        }
        // Equal: the same grant (the holder writing again, or one of its re-entrant guards).
        st.highest_token = token;
        st.value = value.to_owned();
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

    // Someone else takes the lock and writes, twice with the same token: both are accepted.
    let second = client
        .lock("example:fencing")?
        .acquire_timeout(Duration::from_secs(5))
        .await?;
    for value in ["written by the current holder", "and again, same holder"] {
        storage
            .write(second.fencing_token(), value)
            .map_err(distlock::Error::invalid)?;
    }

    // The first holder, waking from a long pause, tries to write with its old token.
    match storage.write(old_token, "written by a stale holder") {
        Ok(()) => println!("stale write accepted?!"),
        Err(e) => println!("{e}"),
    }
    second.release().await?;
    Ok(())
}
