//! etcd transactions guarded on the holder's lock key, on a real etcd, with real dlock locks.
#![cfg(feature = "etcd")]

mod common;

use common::Tally;
use distlock_fence::etcd::EtcdFence;
use distlock_fence::Error;
use distlock_testkit::{DelayProxy, EtcdCluster};
use etcd_client::{Client, KvClient, TxnOp};
use std::time::Duration;

async fn value(client: &mut KvClient) -> i64 {
    let resp = client.get("fence-test/v", None).await.expect("get");
    resp.kvs().first().map_or(0, |kv| {
        kv.value_str().expect("utf-8").parse().expect("a number")
    })
}

/// The holder's grant ended (its key is gone) and the next holder wrote: the old holder's
/// transaction does nothing, with the typed error. Even with nobody holding the lock, a
/// grant whose key is gone cannot write: stronger than a token comparison.
#[tokio::test]
async fn a_holder_whose_grant_ended_is_rejected() {
    let cluster = EtcdCluster::start().expect("etcd");
    let locks = distlock::connect(&cluster.url()).await.expect("dlock");
    let mut client = Client::connect(cluster.endpoints(), None)
        .await
        .expect("etcd client")
        .kv_client();
    let fence = EtcdFence::new("dlock", "v");

    let first = locks
        .lock("v")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let old = first.fencing_token();
    let stale_holder = fence.holder(&mut client, old).await.expect("holder");
    assert_eq!(stale_holder.token(), old);
    stale_holder
        .txn(&mut client, vec![TxnOp::put("fence-test/v", "1", None)])
        .await
        .expect("the holder writes");
    // Its grant ends (as at the end of its lease); nobody holds the lock: still rejected.
    first.release().await.expect("release");
    let e = stale_holder
        .txn(&mut client, vec![TxnOp::put("fence-test/v", "stale", None)])
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Stale { token, newer } if token == old && newer > old),
        "{e}"
    );
    assert!(fence.holder(&mut client, old).await.unwrap_err().is_stale());

    let second = locks
        .lock("v")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let new = second.fencing_token();
    let holder = fence.holder(&mut client, new).await.expect("holder");
    holder
        .txn(&mut client, vec![TxnOp::put("fence-test/v", "2", None)])
        .await
        .expect("the new holder writes");
    let e = stale_holder
        .txn(&mut client, vec![TxnOp::put("fence-test/v", "stale", None)])
        .await
        .unwrap_err();
    assert_eq!(
        e,
        Error::Stale {
            token: old,
            newer: new
        }
    );
    assert_eq!(value(&mut client).await, 2);
    // The current holder's retried transaction goes through again (puts are idempotent).
    holder
        .txn(&mut client, vec![TxnOp::put("fence-test/v", "2", None)])
        .await
        .expect("retry");
    assert_eq!(value(&mut client).await, 2);
    second.release().await.expect("release");
}

/// Holders behind a delay proxy: some release their grant before their write (as a lease that
/// ends during the work), and the next holder runs meanwhile. Every write after its grant ended
/// is rejected, every other one lands, and no increment is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_behind_a_delay_proxy_lose_no_update() {
    let cluster = EtcdCluster::start().expect("etcd");
    let proxy =
        DelayProxy::start(cluster.client_addr(0), Duration::from_millis(15)).expect("proxy");
    let via = format!("127.0.0.1:{}", proxy.port());
    let locks = distlock::connect(&format!("etcd://{via}"))
        .await
        .expect("dlock");
    let fence = EtcdFence::new("dlock", "v");
    let tasks: Vec<_> = (0..4u64)
        .map(|t| {
            let (locks, fence, via) = (locks.clone(), fence.clone(), via.clone());
            tokio::spawn(async move {
                let mut client = Client::connect([format!("http://{via}")], None)
                    .await
                    .expect("client")
                    .kv_client();
                let mut tally = Tally::default();
                for i in 0..5u64 {
                    let guard = locks
                        .lock("v")
                        .expect("lock")
                        .acquire_timeout(Duration::from_secs(60))
                        .await
                        .expect("acquire");
                    let holder = fence
                        .holder(&mut client, guard.fencing_token())
                        .await
                        .expect("holder");
                    let n = value(&mut client).await;
                    let ended = (t + i) % 3 == 0;
                    if ended {
                        // The grant ends before the write; the next holder may run now.
                        guard.release().await.expect("release");
                        tally.late += 1;
                        tokio::time::sleep(Duration::from_millis(30)).await;
                    }
                    tally.record(
                        holder
                            .txn(
                                &mut client,
                                vec![TxnOp::put("fence-test/v", (n + 1).to_string(), None)],
                            )
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
    let mut client = Client::connect(cluster.endpoints(), None)
        .await
        .expect("client")
        .kv_client();
    let n = value(&mut client).await;
    eprintln!(
        "{applied} writes applied, {rejected} rejected ({late} after the grant ended), value {n}"
    );
    assert_eq!(
        rejected, late,
        "exactly the writes after their grant ended are rejected"
    );
    assert_eq!(n as u64, applied);
}
