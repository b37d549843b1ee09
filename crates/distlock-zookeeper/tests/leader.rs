//! Renewals are confirmed by the leader, not by the server the client talks to.
//!
//! A follower cut off from its leader goes on answering plain reads for up to `syncLimit`
//! ticks, from state that may be stale: the leader may have expired the holder's session (and
//! deleted its node) meanwhile. The test ensemble cannot cut one follower's link to the leader
//! alone, so the leader is frozen (`SIGSTOP`) instead: for the follower the effect is the same
//! (no leader answers, yet it serves reads for `syncLimit` = 2 s). A renewal that goes through
//! the leader (a `sync` before the read) gets no confirmation, so the holder's lease ends on
//! time; renewals by plain reads would be confirmed by the follower and keep the lock "held".

use distlock_core::{Client, ClientOptions};
use distlock_testkit::conformance::unique_name;
use distlock_testkit::ZkEnsemble;
use distlock_zookeeper::ZkBackend;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::hold_within;

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_without_leader_cannot_renew() {
    let mut ensemble = blocking(ZkEnsemble::start).expect("ensemble");
    let leader = ensemble.leader().expect("leader");
    let follower = (0..ensemble.len())
        .find(|&i| i != leader)
        .expect("a follower");
    // A 2 s lease in a 2 s session (a lease must fit in the session), talking to the follower
    // only.
    let lease = Duration::from_secs(2);
    let url = format!("zk://{}?session_timeout=2s", ensemble.addr(follower));
    let opts = ClientOptions::default()
        .watchdog_lease(lease)
        .op_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(3));
    let backend = ZkBackend::connect(&url, &opts).await.expect("connect");
    let client = Client::new(Arc::new(backend), opts).expect("client");
    let name = unique_name("no-leader");
    // Held, and renewed through the follower while the leader answers. A loaded machine may
    // stall renewals of so short a lease before the fault: then take the lock again.
    let mut tries = 0;
    let g = loop {
        tries += 1;
        let g = hold_within(&client, &name, Duration::from_secs(10), "acquire").await;
        tokio::time::sleep(lease / 2).await;
        if !g.is_lost() {
            break g;
        }
        assert!(
            tries < 5,
            "lost before the fault, {tries} times: {:?}",
            g.lost_signal().reason()
        );
        eprintln!(
            "lost before the fault ({:?}); again",
            g.lost_signal().reason()
        );
        drop(g);
    };

    blocking(|| ensemble.pause(leader));
    // Every renewal the leader confirmed was sent before it froze.
    let frozen = Instant::now();
    // Past the lease, but before the follower gives up on its leader (2 s) and drops us, after
    // which the session monitor would declare the loss anyway (0.8 s later).
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let lost = g.is_lost();
    let reason = g.lost_signal().reason();
    eprintln!(
        "{:?} after the leader froze: lost = {lost} ({reason:?})",
        frozen.elapsed()
    );
    assert!(
        lost,
        "the follower kept confirming renewals with no leader behind it: the lock looks held \
         {:?} after the last possible confirmation",
        frozen.elapsed()
    );
    blocking(|| ensemble.resume(leader));
    blocking(|| ensemble.wait_ready(Duration::from_secs(20))).expect("serving again");
    drop(g);
}
