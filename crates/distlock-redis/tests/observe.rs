//! What operators see (`dlock list`, `dlock top`, `dlock serve`): the queue of waiters in
//! order with their waits, and a listing of many locks read in pipelines, not one round trip
//! per lock.

mod common;

use common::client_for;
use distlock_core::{ClientOptions, LockKind};
use distlock_testkit::{DelayProxy, RedisServer};
use std::time::Duration;

/// Polls `inspect` until `done` holds (or fails after 10 s), returning the last state.
async fn inspect_until(
    client: &distlock_core::Client,
    name: &str,
    kind: LockKind,
    done: impl Fn(&distlock_core::LockInfo) -> bool,
) -> distlock_core::LockInfo {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info = client.inspect_kind(name, kind).await.expect("inspect");
        if done(&info) || tokio::time::Instant::now() > deadline {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inspect_names_the_queued_waiters_in_arrival_order() {
    let redis = RedisServer::start().expect("redis");
    let (client, _) = client_for(&redis.url(), ClientOptions::default()).await;
    let holder = client
        .lock("q")
        .unwrap()
        .with_owner("holder")
        .unwrap()
        .acquire()
        .await
        .expect("acquire");
    let mut waits = Vec::new();
    for who in ["first", "second"] {
        let lock = client.lock("q").unwrap().with_owner(who).unwrap();
        waits.push(tokio::spawn(async move {
            lock.acquire_timeout(Duration::from_secs(30)).await
        }));
        // The second waiter queues only after the first is in line.
        let n = waits.len();
        inspect_until(&client, "q", LockKind::Mutex, |i| i.queue.len() == n).await;
    }
    let info = inspect_until(&client, "q", LockKind::Mutex, |i| i.queue.len() == 2).await;
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].owner, "holder");
    let owners: Vec<&str> = info.queue.iter().map(|w| w.owner.as_str()).collect();
    assert_eq!(owners, ["first", "second"], "{info:?}");
    assert_eq!(info.waiters, Some(2));
    let waited: Vec<Duration> = info
        .queue
        .iter()
        .map(|w| w.waited.expect("waited"))
        .collect();
    assert!(
        waited[0] >= waited[1],
        "the first waited longer: {waited:?}"
    );
    assert_eq!(info.oldest_wait(), Some(waited[0]));

    holder.release().await.expect("release");
    let first = waits.remove(0).await.unwrap().expect("first gets it");
    let info = inspect_until(&client, "q", LockKind::Mutex, |i| i.queue.len() == 1).await;
    assert_eq!(info.holders[0].owner, "first", "{info:?}");
    assert_eq!(info.queue[0].owner, "second", "{info:?}");
    first.release().await.expect("release");
    waits
        .remove(0)
        .await
        .unwrap()
        .expect("second gets it")
        .release()
        .await
        .unwrap();
    let info = inspect_until(&client, "q", LockKind::Mutex, |i| !i.held()).await;
    assert!(info.queue.is_empty(), "{info:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inspect_names_the_side_each_rw_waiter_wants() {
    let redis = RedisServer::start().expect("redis");
    let (client, _) = client_for(&redis.url(), ClientOptions::default()).await;
    let rw = client.rw_lock("doc").unwrap();
    let writer = rw.write().acquire().await.expect("write");
    let reader = client.rw_lock("doc").unwrap().with_owner("reader").unwrap();
    let wait =
        tokio::spawn(async move { reader.read().acquire_timeout(Duration::from_secs(30)).await });
    let info = inspect_until(&client, "doc", LockKind::Write, |i| i.queue.len() == 1).await;
    assert_eq!(info.queue.len(), 1, "{info:?}");
    assert_eq!(info.queue[0].owner, "reader");
    assert_eq!(info.queue[0].side, Some(LockKind::Read));
    writer.release().await.unwrap();
    wait.await.unwrap().expect("read").release().await.unwrap();
}

/// A refresh of `dlock top` lists every lock: on Redis 10,000 locks must not cost 10,000
/// round trips. The client talks through a proxy that counts the request chunks it reads:
/// each round trip is at least one, and a pipeline of 500 locks a few (16 KiB reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listing_ten_thousand_locks_takes_a_few_round_trips() {
    const N: usize = 10_000;
    let redis = RedisServer::start().expect("redis");
    let (client, _) = client_for(&redis.url(), ClientOptions::default()).await;
    let mut guards = Vec::with_capacity(N);
    for chunk in (0..N).collect::<Vec<_>>().chunks(500) {
        let mut set = tokio::task::JoinSet::new();
        for &i in chunk {
            let lock = client
                .lock(&format!("many:{i:05}"))
                .unwrap()
                .lease(Duration::from_secs(120))
                .unwrap();
            set.spawn(async move { lock.try_acquire().await });
        }
        while let Some(r) = set.join_next().await {
            guards.push(r.unwrap().expect("acquire").expect("free"));
        }
    }
    let proxy = DelayProxy::start(redis.addr(), Duration::ZERO).expect("proxy");
    let url = format!("redis://{}", proxy.addr());
    let (watcher, _) = client_for(&url, ClientOptions::default()).await;
    let before = proxy.stats().requests.chunks_read;
    let listed = watcher.list("many:").await.expect("list");
    let chunks = proxy.stats().requests.chunks_read - before;
    assert_eq!(listed.len(), N);
    assert!(
        listed.iter().all(|l| l.info.holders.len() == 1),
        "every lock is listed with its holder"
    );
    println!("{N} locks listed in {chunks} request chunks");
    assert!(
        chunks < N as u64 / 4,
        "listing {N} locks took {chunks} request chunks: a round trip per lock"
    );
}
