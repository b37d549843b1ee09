//! Read-write locks of the `file://` backend in one process: sharing, exclusion, retries,
//! downgrades, refused upgrades, owner ids that are not holders, and a hammer.

mod common;

use common::*;
use distlock_core::{Backend, Client, Error, GrantRef, LockKind, ReleaseOutcome, RenewOutcome};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_backend_grants_share_exclude_retry_downgrade() {
    let dir = TempDir::new("one");
    let b = backend(dir.path());
    let n = "one/backend";
    use LockKind::{Read, Write};
    // Readers of one backend share; each grant has a new token; a retry of an attempt is the
    // same grant, never a second one.
    let r1 = rw_req(n, "r1", Read);
    let g1 = granted(&b, &r1).await;
    let g2 = rw_granted(&b, n, "r2", Read).await;
    assert!(g2.token > g1.token);
    assert_eq!(granted(&b, &r1).await, g1, "a retry got another grant");
    // Another attempt of the same owner id is another holder (re-entry is the client's).
    let g1b = rw_granted(&b, n, "r1", Read).await;
    assert!(g1b.token > g2.token);
    held(&b, n, "w", Write).await;
    assert_eq!(
        holders(&b, n).await,
        [
            hv("read", "r1", 1),
            hv("read", "r1", 1),
            hv("read", "r2", 1)
        ]
    );
    // An upgrade is refused at once.
    let e = b.acquire(&rw_req(n, "r2", Write)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("upgrade"), "{e}");
    // Each release frees its own grant only; a repeated release is reported, not repeated.
    assert_eq!(release(&b, &g1).await, ReleaseOutcome::Released);
    assert_eq!(release(&b, &g1).await, ReleaseOutcome::Expired);
    assert_eq!(
        holders(&b, n).await,
        [hv("read", "r1", 1), hv("read", "r2", 1)]
    );
    assert_eq!(release(&b, &g1b).await, ReleaseOutcome::Released);
    assert_eq!(release(&b, &g2).await, ReleaseOutcome::Released);
    assert_eq!(release(&b, &g2).await, ReleaseOutcome::Expired);
    // A writer excludes the other attempts of its backend, on both sides, its own owner id's
    // included.
    let wq = rw_req(n, "w", Write);
    let gw = granted(&b, &wq).await;
    assert!(gw.token > g2.token);
    held(&b, n, "r1", Read).await;
    held(&b, n, "w2", Write).await;
    held(&b, n, "w", Write).await;
    assert_eq!(release(&b, &g1).await, ReleaseOutcome::TakenByOther);
    // The read side beside the write grant only for a request that names that grant: not
    // for the owner id alone, nor for a wrong token or attempt.
    held(&b, n, "w", Read).await;
    for wrong in [
        GrantRef {
            token: gw.token + 1,
            ..gw.clone()
        },
        GrantRef {
            attempt: distlock_core::AttemptId::new(),
            ..gw.clone()
        },
    ] {
        let mut r = rw_req(n, "w", Read);
        r.write_grant = Some(wrong);
        held_to(&b, &r).await;
    }
    // Downgrade: the writer reads too (new token), and keeps reading without the write side.
    let mut dq = rw_req(n, "w", Read);
    dq.write_grant = Some(gw.clone());
    let gr = granted(&b, &dq).await;
    assert!(gr.token > gw.token);
    assert_eq!(granted(&b, &wq).await, gw, "write retry");
    assert_eq!(granted(&b, &dq).await, gr, "read retry");
    assert_eq!(
        holders(&b, n).await,
        [hv("read", "w", 1), hv("write", "w", 1)]
    );
    assert_eq!(release(&b, &gw).await, ReleaseOutcome::Released);
    assert_eq!(release(&b, &gw).await, ReleaseOutcome::Expired);
    assert_eq!(holders(&b, n).await, [hv("read", "w", 1)]);
    // Now other readers may join, writers may not.
    let g1 = rw_granted(&b, n, "r1", Read).await;
    held(&b, n, "w2", Write).await;
    let other = backend(dir.path());
    held(&other, n, "x", Write).await;
    let gy = rw_granted(&other, n, "y", Read).await;
    assert_eq!(
        holders(&other, n).await,
        [hv("read", "r1", 1), hv("read", "w", 1), hv("read", "y", 1)]
    );
    // Renewals: only the backend's own live grants.
    let renew = [
        (gr.clone(), Duration::from_secs(1)),
        (gw.clone(), Duration::from_secs(1)),
        (gy.clone(), Duration::from_secs(1)),
    ];
    assert_eq!(
        b.renew(&renew).await.expect("renew"),
        [
            RenewOutcome::Renewed,
            RenewOutcome::NotHeld,
            RenewOutcome::NotHeld
        ]
    );
    for (be, g) in [(&b, &gr), (&b, &g1), (&other, &gy)] {
        assert_eq!(release(be, g).await, ReleaseOutcome::Released);
    }
    assert!(holders(&b, n).await.is_empty());
    let info = other.inspect(n, LockKind::Write).await.expect("inspect");
    assert!(!info.held());
    assert!(info.fencing_token > gr.token);
    let gx = rw_granted(&other, n, "x", Write).await;
    assert!(gx.token > info.fencing_token);
    assert_eq!(release(&other, &gx).await, ReleaseOutcome::Released);
}

/// Two clients with one owner id sharing one backend are two holders of a read-write lock:
/// the writer's owner id does not let the other client read beside it (no downgrade without
/// the write grant), nor write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_id_in_two_clients_is_two_holders() {
    let dir = TempDir::new("rwowner");
    let be = backend(dir.path());
    let (c1, c2) = (
        Client::new(be.clone(), opts()).expect("client"),
        Client::new(be.clone(), opts()).expect("client"),
    );
    let n = "rw/owner";
    let rw1 = c1
        .rw_lock(n)
        .expect("rw")
        .with_owner("same")
        .expect("owner");
    let rw2 = c2
        .rw_lock(n)
        .expect("rw")
        .with_owner("same")
        .expect("owner");
    let w = rw1.write().acquire().await.expect("write");
    assert!(
        rw2.read().try_acquire().await.expect("try").is_none(),
        "read beside another client's write"
    );
    assert!(
        rw2.write().try_acquire().await.expect("try").is_none(),
        "two writers"
    );
    // The writer's own client downgrades (it names its grant).
    let r = rw1
        .read()
        .try_acquire()
        .await
        .expect("try")
        .expect("downgrade");
    assert!(r.fencing_token() > w.fencing_token());
    released(w).await;
    // Now only read: the other client reads too.
    let r2 = rw2
        .read()
        .try_acquire()
        .await
        .expect("try")
        .expect("readers share");
    for g in [r, r2] {
        released(g).await;
    }
}

/// Writers of several backends and processes-in-spirit never overlap anything; readers do
/// overlap; every grant's token is new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hammer_readers_and_writers() {
    let dir = TempDir::new("hammer");
    let clients: Vec<Client> = (0..3).map(|_| client(dir.path())).collect();
    let n = "hammer";
    let readers = Arc::new(AtomicU64::new(0));
    let writers = Arc::new(AtomicU64::new(0));
    let max_readers = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..12 {
        let rw = clients[i % 3].rw_lock(n).expect("rw");
        let (readers, writers, max_readers, tokens) = (
            readers.clone(),
            writers.clone(),
            max_readers.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..6 {
                if (i + round) % 4 == 0 {
                    let g = rw
                        .write()
                        .acquire_timeout(Duration::from_secs(30))
                        .await
                        .expect("w");
                    tokens.lock().expect("tokens").push(g.fencing_token());
                    assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "writer with readers");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    writers.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                } else {
                    let g = rw
                        .read()
                        .acquire_timeout(Duration::from_secs(30))
                        .await
                        .expect("r");
                    tokens.lock().expect("tokens").push(g.fencing_token());
                    let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    max_readers.fetch_max(now, Ordering::SeqCst);
                    assert_eq!(writers.load(Ordering::SeqCst), 0, "reader with a writer");
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let mut tokens = tokens.lock().expect("tokens").clone();
    let total = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), total, "a token was granted twice");
    assert!(
        max_readers.load(Ordering::SeqCst) >= 2,
        "readers never shared"
    );
    assert!(holders(&backend(dir.path()), n).await.is_empty());
}
