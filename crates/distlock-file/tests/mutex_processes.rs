//! Mutexes of the `file://` backend between real processes: the test binary re-executes
//! itself as a child holder, which is killed.

mod common;

use common::*;
use distlock_core::{AcquireReply, Backend, Client};
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "DLOCK_FILE_CHILD";

/// The owner id the child uses, if set (else its handle's own).
const CHILD_OWNER_ENV: &str = "DLOCK_FILE_CHILD_OWNER";

/// Re-executes this test binary as `child_holder`, which takes lock `xproc` in `dir` (as
/// `owner` if given) and holds it until killed; returns it with its token and owner.
async fn spawn_holder(dir: &Path, owner: Option<&str>) -> (ChildProc, u64, String) {
    let env = [
        (CHILD_ENV, Some(dir.as_os_str())),
        (CHILD_OWNER_ENV, owner.map(OsStr::new)),
    ];
    ChildProc::spawn("child_holder", &env).held().await
}

/// Helper of `crashed_process_releases_lock`, run in a child process; does nothing otherwise.
#[test]
fn child_holder() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    child_runtime(async {
        let c = client(Path::new(&dir));
        let mut lock = c.lock("xproc").expect("lock");
        if let Some(owner) = std::env::var_os(CHILD_OWNER_ENV) {
            let owner = owner.into_string().expect("owner is UTF-8");
            lock = lock.with_owner(owner).expect("owner");
        }
        let g = lock.acquire().await.expect("acquire");
        println!("HELD {} {}", g.fencing_token(), g.owner());
        // Killed by the parent long before this ends.
        tokio::time::sleep(CHILD_HOLD).await;
        drop(g);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_process_releases_lock() {
    let dir = TempDir::new("xproc");
    let (mut child, child_token, child_owner) = spawn_holder(dir.path(), None).await;

    let c = client(dir.path());
    let lock = c.lock("xproc").expect("lock");
    assert!(
        lock.try_acquire().await.expect("try").is_none(),
        "child's lock not exclusive"
    );
    let info = c.inspect("xproc").await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, child_owner);
    assert_eq!(info.fencing_token, child_token);

    let waiter = Waiter::spawn(lock);
    let what = "waiter got the child's lock";
    waiter.still_waiting(Duration::from_millis(200), what).await;
    let killed_at = Instant::now();
    child.kill();
    // Freed by the kernel when the child died: the child would only release after its
    // `CHILD_HOLD`, long after the waiter's deadline.
    let g = waiter
        .woken_after(killed_at, "the waiter after the holder's death")
        .await;
    assert!(g.fencing_token() > child_token);
    released(g).await;
}

/// An owner id used by a process does not let another process in under the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_id_in_two_processes_excludes() {
    let dir = TempDir::new("xowner");
    let owner = "owner shared by two processes";
    let (mut child, child_token, child_owner) = spawn_holder(dir.path(), Some(owner)).await;
    assert_eq!(child_owner, owner);
    let be = backend(dir.path());
    assert!(matches!(
        be.acquire(&req("xproc", owner)).await.expect("acquire"),
        AcquireReply::Held { .. }
    ));
    let c = Client::new(be.clone(), opts()).expect("client");
    let lock = c
        .lock("xproc")
        .expect("lock")
        .with_owner(owner)
        .expect("owner");
    assert!(
        lock.try_acquire().await.expect("try").is_none(),
        "the same owner id in another process got the lock"
    );
    let waiter = tokio::spawn(async move { lock.acquire_timeout(WAITER_DEADLINE).await });
    // Time for the waiter to start waiting; it cannot get in while the child lives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter got the child's lock");
    child.kill();
    let g = waiter
        .await
        .expect("waiter")
        .expect("lock after the child died");
    assert!(g.fencing_token() > child_token);
    released(g).await;
}
