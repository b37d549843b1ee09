//! Mutexes of the `file://` backend in one process: exclusion within and between backends,
//! re-entry, grants addressed by attempt and token, fencing tokens.

mod common;

use common::*;
use distlock_core::{
    AcquireReply, AttemptId, Backend, Client, GrantRef, LockKind, ReleaseOutcome, RenewOutcome,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A grant address nobody was given: another attempt of `owner`, with `token`.
fn foreign(name: &str, owner: &str, token: u64) -> GrantRef {
    GrantRef {
        key: key(name, owner, LockKind::Mutex),
        attempt: AttemptId::new(),
        token,
    }
}

/// `tasks` tasks spread over `clients`, each with its own handle, increment a deliberately
/// non-atomic counter `rounds` times under the lock.
async fn hammer(clients: &[Client], tasks: usize, rounds: usize) {
    let name = "counter";
    let counter = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut joins = Vec::new();
    for i in 0..tasks {
        let client = clients[i % clients.len()].clone();
        let (counter, tokens) = (counter.clone(), tokens.clone());
        joins.push(tokio::spawn(async move {
            let lock = client.lock(name).expect("lock");
            for _ in 0..rounds {
                let g = lock
                    .acquire_timeout(Duration::from_secs(30))
                    .await
                    .expect("acquire");
                let v = counter.load(Ordering::SeqCst);
                tokens.lock().expect("tokens").push(g.fencing_token());
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                counter.store(v + 1, Ordering::SeqCst);
                released(g).await;
            }
        }));
    }
    for j in joins {
        j.await.expect("task");
    }
    let n = (tasks * rounds) as u64;
    assert_eq!(
        counter.load(Ordering::SeqCst),
        n,
        "lost updates: mutual exclusion broken"
    );
    let tokens = tokens.lock().expect("tokens").clone();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in grant order: {tokens:?}"
    );
    let info = clients[0].inspect(name).await.expect("inspect");
    assert!(!info.held());
    assert_eq!(info.fencing_token, *tokens.last().expect("tokens"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_in_one_backend() {
    let dir = TempDir::new("mutex");
    hammer(&[client(dir.path())], 32, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_across_backends() {
    let dir = TempDir::new("mutex2");
    // Two backends on one directory: they only exclude each other through the kernel.
    hammer(&[client(dir.path()), client(dir.path())], 32, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrancy_is_one_grant() {
    let dir = TempDir::new("reentry");
    let (a, b) = (client(dir.path()), client(dir.path()));
    let lock = a.lock("re/entry").expect("lock");
    let g1 = lock.acquire().await.expect("first");
    let first = g1.fencing_token();
    let g2 = lock.try_acquire().await.expect("try").expect("re-entry");
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    // The client counts the guards: the backend has one grant.
    let info = a.inspect("re/entry").await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, lock.owner());
    assert_eq!(info.holders[0].count, 1);
    assert_eq!(info.holders[0].lease_left, None);
    // Another backend (process) sees the holder recorded in the file.
    let info_b = b.inspect("re/entry").await.expect("inspect");
    assert_eq!(info_b.holders.len(), 1);
    assert_eq!(info_b.holders[0].owner, lock.owner());
    assert_eq!(info_b.holders[0].count, 1);
    assert_eq!(info_b.fencing_token, g1.fencing_token());
    // Another owner of the same backend, and another backend, are refused.
    assert!(a
        .lock("re/entry")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert!(b
        .lock("re/entry")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    assert!(b.inspect("re/entry").await.expect("inspect").held());
    assert!(b
        .lock("re/entry")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    released(g1).await;
    assert!(!a.inspect("re/entry").await.expect("inspect").held());
    assert!(!b.inspect("re/entry").await.expect("inspect").held());
    let g = b
        .lock("re/entry")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    assert!(g.fencing_token() > first);
    released(g).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_owner_release_and_renew() {
    let dir = TempDir::new("nonowner");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let name = "n";
    let g = granted(&a, &req(name, "owner")).await;
    assert!(g.token > 0);
    // Another owner in the same backend, another attempt of the same owner, the right attempt
    // with a wrong token, and the right grant sent to another backend: none is the grant.
    let stale = GrantRef {
        token: g.token - 1,
        ..g.clone()
    };
    for wrong in [
        foreign(name, "intruder", g.token),
        foreign(name, "owner", g.token),
        stale,
    ] {
        assert_eq!(
            a.release(&wrong).await.expect("release"),
            ReleaseOutcome::TakenByOther
        );
        assert_eq!(
            a.renew(&[(wrong, Duration::from_secs(1))])
                .await
                .expect("renew"),
            [RenewOutcome::NotHeld]
        );
    }
    assert_eq!(
        b.release(&g).await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    let renew = [
        (g.clone(), Duration::from_secs(1)),
        (foreign("other", "owner", 1), Duration::from_secs(1)),
    ];
    assert_eq!(
        a.renew(&renew).await.expect("renew"),
        [RenewOutcome::Renewed, RenewOutcome::NotHeld]
    );
    assert_eq!(
        b.renew(&renew[..1]).await.expect("renew"),
        [RenewOutcome::NotHeld]
    );
    // The lock is untouched.
    assert!(matches!(
        b.acquire(&req(name, "b")).await.expect("acquire"),
        AcquireReply::Held { ttl: None }
    ));
    assert_eq!(
        a.release(&g).await.expect("release"),
        ReleaseOutcome::Released
    );
    // Nobody holds it now: a repeated release is reported, not repeated.
    for be in [&a, &b] {
        assert_eq!(
            be.release(&g).await.expect("release"),
            ReleaseOutcome::Expired
        );
    }
    assert_eq!(
        a.renew(&renew[..1]).await.expect("renew"),
        [RenewOutcome::NotHeld]
    );
    assert_eq!(
        a.release(&foreign("never-used", "x", 1))
            .await
            .expect("release"),
        ReleaseOutcome::Expired
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_backends_and_restarts() {
    let dir = TempDir::new("fence");
    // Two backends (processes) at a time, and new ones after a restart, alternate.
    let mut tokens = Vec::new();
    for _restart in 0..2 {
        let clients = [client(dir.path()), client(dir.path())];
        for i in 0..10 {
            let lock = clients[i % 2].lock("fence").expect("lock");
            tokens.push(acquire_and_release(&lock, WAITER_DEADLINE, "a free lock").await);
        }
        let info = clients[1].inspect("fence").await.expect("inspect");
        assert_eq!(Some(&info.fencing_token), tokens.last());
        assert!(!info.held());
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {tokens:?}"
    );
    let last = *tokens.last().expect("tokens");
    // Tokens are at least the wall clock in microseconds (so that they go on increasing when
    // the file is lost), and the counter increases by one per grant beyond that.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64;
    assert!(
        last <= now + 20 && last > now - 600_000_000,
        "token {last}, clock {now}"
    );
}

/// A retried acquire of one attempt (a caller that did not hear the answer) is the same grant:
/// the same token, the counter not incremented twice, one release frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_acquire_is_one_grant() {
    let dir = TempDir::new("retry");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let r = req("retry", "o");
    let g = granted(&a, &r).await;
    for _ in 0..3 {
        assert_eq!(granted(&a, &r).await, g, "a retry got another grant");
    }
    let info = b.inspect("retry", LockKind::Mutex).await.expect("inspect");
    assert_eq!(
        info.fencing_token, g.token,
        "a retry incremented the counter"
    );
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].count, 1);
    let text = std::fs::read_to_string(a.lock_file("retry")).expect("lock file");
    assert!(
        text.contains(&format!("holder {} 1 o\n", std::process::id())),
        "{text}"
    );
    // The same request sent to another backend (another process) is another attempt there:
    // the kernel keeps it out.
    assert!(matches!(
        b.acquire(&r).await.expect("acquire"),
        AcquireReply::Held { .. }
    ));
    assert_eq!(
        a.release(&g).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        a.release(&g).await.expect("release"),
        ReleaseOutcome::Expired
    );
    // One release was enough: the lock is free, and the next grant's token follows.
    let next = granted(&b, &req("retry", "o")).await;
    assert!(next.token > g.token);
    assert_eq!(
        b.release(&next).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Two attempts with one owner id are two holders: in one backend (the table tells them
/// apart by attempt), in two backends of one process, and through the client API with two
/// clients sharing one backend or each with its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_of_one_owner_exclude_each_other_in_one_process() {
    let dir = TempDir::new("sameowner");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let n = "same/owner";
    let first = req(n, "shared-owner");
    let g = granted(&a, &first).await;
    for be in [&a, &b] {
        let second = req(n, "shared-owner");
        assert!(
            matches!(
                be.acquire(&second).await.expect("acquire"),
                AcquireReply::Held { .. }
            ),
            "a second attempt of the same owner id got a held lock"
        );
        // Its giving up leaves the first attempt's grant alone.
        be.give_up(&second).await.expect("give up");
        assert_eq!(
            a.renew(&[(g.clone(), Duration::from_secs(1))])
                .await
                .expect("renew"),
            [RenewOutcome::Renewed]
        );
    }
    assert_eq!(
        a.release(&g).await.expect("release"),
        ReleaseOutcome::Released
    );

    let shared = backend(dir.path());
    let pairs = [
        (
            Client::new(shared.clone(), opts()).expect("client"),
            Client::new(shared.clone(), opts()).expect("client"),
        ),
        (client(dir.path()), client(dir.path())),
    ];
    for (c1, c2) in &pairs {
        let l1 = c1
            .lock(n)
            .expect("lock")
            .with_owner("shared-owner")
            .expect("owner");
        let l2 = c2
            .lock(n)
            .expect("lock")
            .with_owner("shared-owner")
            .expect("owner");
        let g1 = l1.acquire().await.expect("acquire");
        assert!(
            l2.try_acquire().await.expect("try").is_none(),
            "two clients with one owner id held the lock at once"
        );
        let waiter = Waiter::spawn(l2);
        let what = "the other client's waiter got a held lock";
        waiter.still_waiting(Duration::from_millis(100), what).await;
        let at = Instant::now();
        let t1 = g1.fencing_token();
        released(g1).await;
        let g2 = waiter.woken_after(at, "the waiter after the release").await;
        assert!(g2.fencing_token() > t1);
        released(g2).await;
    }
}
