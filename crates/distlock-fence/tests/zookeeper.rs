//! ZooKeeper multi-ops checking the holder's lock node, on a real ensemble, with real dlock locks.
#![cfg(feature = "zookeeper")]

mod common;

use common::Tally;
use distlock_fence::zookeeper::ZkFence;
use distlock_fence::Error;
use distlock_testkit::{DelayProxy, ZkEnsemble};
use std::time::Duration;
use zookeeper_client as zk;

const PATH: &str = "/fence-test";

async fn value(client: &zk::Client) -> i64 {
    let (data, _) = client.get_data(PATH).await.expect("get");
    String::from_utf8_lossy(&data).parse().expect("a number")
}

async fn setup(client: &zk::Client) {
    let opts = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    match client.create(PATH, b"0", &opts).await {
        Ok(_) | Err(zk::Error::NodeExists) => {}
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_holder_whose_grant_ended_is_rejected() {
    let ensemble = ZkEnsemble::start().expect("zookeeper");
    let locks = distlock::connect(&ensemble.url()).await.expect("dlock");
    let client = zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("zk client");
    setup(&client).await;
    let fence = ZkFence::new("dlock", "v").expect("fence");

    let first = locks
        .lock("v")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let old = first.fencing_token();
    let stale_holder = fence.holder(&client, old).await.expect("holder");
    assert!(stale_holder.path().starts_with(fence.dir()));
    stale_holder
        .multi(&client, |w| w.add_set_data(PATH, b"1", None))
        .await
        .expect("the holder writes");
    first.release().await.expect("release");
    // Nobody holds the lock, yet the ended grant cannot write.
    let e = stale_holder
        .multi(&client, |w| w.add_set_data(PATH, b"99", None))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Stale { token, newer } if token == old && newer > old),
        "{e}"
    );

    let second = locks
        .lock("v")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let new = second.fencing_token();
    let holder = fence.holder(&client, new).await.expect("holder");
    holder
        .multi(&client, |w| w.add_set_data(PATH, b"2", None))
        .await
        .expect("the new holder writes");
    let e = stale_holder
        .multi(&client, |w| w.add_set_data(PATH, b"99", None))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        Error::Stale {
            token: old,
            newer: new
        }
    );
    assert_eq!(value(&client).await, 2);
    // An operation of the multi that fails: nothing applied, a store error (not stale).
    let e = holder
        .multi(&client, |w| {
            w.add_set_data(PATH, b"3", None)?;
            w.add_delete("/no-such-node", None)
        })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "{e}");
    assert_eq!(value(&client).await, 2);
    second.release().await.expect("release");
}

/// Holders behind a delay proxy: some release their grant before their write, and the next
/// holder runs meanwhile. Every write after its grant ended is rejected, every other one lands,
/// and no increment is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_behind_a_delay_proxy_lose_no_update() {
    let ensemble = ZkEnsemble::start().expect("zookeeper");
    let proxy = DelayProxy::start(ensemble.addr(0), Duration::from_millis(15)).expect("proxy");
    let via = format!("127.0.0.1:{}", proxy.port());
    let locks = distlock::connect(&format!("zk://{via}"))
        .await
        .expect("dlock");
    let admin = zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("zk client");
    setup(&admin).await;
    let fence = ZkFence::new("dlock", "v").expect("fence");
    let tasks: Vec<_> = (0..4u64)
        .map(|t| {
            let (locks, fence, via) = (locks.clone(), fence.clone(), via.clone());
            tokio::spawn(async move {
                let client = zk::Client::connect(&via).await.expect("client");
                let mut tally = Tally::default();
                for i in 0..5u64 {
                    let guard = locks
                        .lock("v")
                        .expect("lock")
                        .acquire_timeout(Duration::from_secs(60))
                        .await
                        .expect("acquire");
                    let holder = fence
                        .holder(&client, guard.fencing_token())
                        .await
                        .expect("holder");
                    client.sync(PATH).await.expect("sync");
                    let n = value(&client).await;
                    if (t + i) % 3 == 0 {
                        guard.release().await.expect("release");
                        tally.late += 1;
                        tokio::time::sleep(Duration::from_millis(30)).await;
                    }
                    let next = (n + 1).to_string();
                    tally.record(
                        holder
                            .multi(&client, |w| w.add_set_data(PATH, next.as_bytes(), None))
                            .await,
                    );
                }
                tally
            })
        })
        .collect();
    let Tally {
        applied,
        stale: rejected,
        late,
    } = Tally::sum(tasks).await;
    admin.sync(PATH).await.expect("sync");
    let n = value(&admin).await;
    eprintln!(
        "{applied} writes applied, {rejected} rejected ({late} after the grant ended), value {n}"
    );
    assert_eq!(
        rejected, late,
        "exactly the writes after their grant ended are rejected"
    );
    assert_eq!(n as u64, applied);
}
