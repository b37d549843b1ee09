//! A hot standby with leader election: two replicas of a scheduler campaign in one election;
//! the leader advertises where it serves (`proclaim`), does its work with its fencing token and
//! watches its lost signal; the standby waits, and takes over with a higher token when the
//! leader resigns (or dies: the file backend frees a dead process's leadership at once). An
//! observer prints every change of leadership, as `dlock leader --watch` does.
//!
//! Runs without a server, on the embedded file backend:
//! `cargo run -p distlock --example election`

use distlock::{Client, Election, Leadership};
use std::time::Duration;

/// One replica: campaign, serve while leading, step down after `rounds` units of work.
async fn replica(
    client: Client,
    me: &'static str,
    addr: &str,
    rounds: u32,
) -> distlock::Result<()> {
    let election: Election = client.election("scheduler")?.with_owner(me)?;
    println!("{me}: campaigning");
    // Waits (woken by the backend, never polling) until this replica leads.
    let leader: Leadership = election.campaign(format!("{me}: starting")).await?;
    let token = leader.fencing_token();
    println!("{me}: leading with fencing token {token}");
    // Observers (and `dlock leader`) see the new value; a retry has the effect of one.
    leader.proclaim(format!("{me}: serving on {addr}")).await?;
    for round in 1..=rounds {
        tokio::select! {
            // Leadership can end without us: the lease ran out, the lock file was removed…
            // Stop at once: another replica may lead already.
            reason = leader.lost() => {
                println!("{me}: leadership lost ({reason}); stopping");
                return Ok(());
            }
            _ = do_work(me, token, round) => {}
        }
    }
    println!("{me}: resigning");
    leader.resign().await?;
    Ok(())
}

/// One unit of the scheduler's work. A real one passes `token` with every write, and the
/// store rejects writes with a token lower than the highest it has seen.
async fn do_work(me: &str, token: u64, round: u32) {
    println!("{me}: round {round}, writing with token {token}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let dir = std::env::temp_dir().join(format!("dlock-election-example-{}", std::process::id()));
    let url = format!("file://{}", dir.display());
    // Each replica has its own client (and backend), as separate processes would.
    let (a, b, watcher) = (
        distlock::connect(&url).await?,
        distlock::connect(&url).await?,
        distlock::connect(&url).await?,
    );

    // Prints each change: the current state first, then every new leader, value or vacancy.
    let mut changes = watcher.election("scheduler")?.observe();
    let observer = tokio::spawn(async move {
        let mut takeovers = 0;
        loop {
            match changes.next().await {
                Ok(Some(l)) => {
                    println!(
                        "  [observer] {} leads (token {}): {}",
                        l.owner, l.fencing_token, l.value
                    );
                    if l.owner == "replica-b" {
                        takeovers += 1;
                    }
                }
                Ok(None) => {
                    println!("  [observer] nobody leads");
                    if takeovers > 0 {
                        return;
                    }
                }
                Err(e) => {
                    eprintln!("  [observer] {e}");
                    return;
                }
            }
        }
    });

    let first = tokio::spawn(replica(a, "replica-a", "10.0.0.7:8080", 3));
    // Give replica-a a head start so that it leads first; replica-b is the standby.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tokio::spawn(replica(b, "replica-b", "10.0.0.8:8080", 2));
    first.await.expect("replica-a")?;
    second.await.expect("replica-b")?;
    // The observer ends once it has seen replica-b take over and step down.
    let _ = tokio::time::timeout(Duration::from_secs(5), observer).await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
