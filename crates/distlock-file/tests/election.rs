//! Elections of the `file://` backend: a leader process killed (the test binary re-executed
//! as a child candidate), observers woken by another process's changes and by a leader's
//! death, numbered proclamations, cancelled campaigns, and the election kept apart from the
//! mutex of the same name.

mod common;

use common::*;
use distlock_core::{Backend, Leader, LockKind, ReleaseOutcome, RenewOutcome};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "DLOCK_FILE_ELECTION_CHILD";
const ELECTION: &str = "scheduler";

/// Helper of the tests below, run in a child process; does nothing otherwise. Campaigns in
/// election `scheduler` with value `child-value`, prints `HELD <token> <owner>` once it leads,
/// then `PROCLAIMED` after proclaiming `child-proclaimed`, and leads until killed.
#[test]
fn child_leader() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    child_runtime(async {
        let c = client(Path::new(&dir));
        let e = c.election(ELECTION).expect("election");
        let l = e.campaign("child-value").await.expect("campaign");
        println!("HELD {} {}", l.fencing_token(), l.owner());
        if std::env::var_os("DLOCK_FILE_ELECTION_PROCLAIM").is_some() {
            l.proclaim("child-proclaimed").await.expect("proclaim");
            println!("PROCLAIMED");
        }
        // Killed by the parent long before this ends.
        tokio::time::sleep(CHILD_HOLD).await;
        drop(l);
    });
}

async fn spawn_leader(dir: &Path, proclaim: bool) -> (ChildProc, u64, String) {
    let mut env = vec![(CHILD_ENV, Some(dir.as_os_str()))];
    if proclaim {
        env.push(("DLOCK_FILE_ELECTION_PROCLAIM", Some("1".as_ref())));
    }
    ChildProc::spawn("child_leader", &env).held().await
}

/// The next change an observer reports, within `PROMPT` (a missed wake-up would hang).
async fn next_change(o: &mut distlock_core::Observer, what: &str) -> Option<Leader> {
    tokio::time::timeout(PROMPT, o.next())
        .await
        .unwrap_or_else(|_| panic!("{what}: no change reported within {PROMPT:?}"))
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// An observer waiting (in a task) for the next change, so that what the test does next
/// happens while it sleeps: it must be woken, not find the change when it looks.
struct Pending(tokio::task::JoinHandle<(distlock_core::Observer, Option<Leader>, Instant)>);

impl Pending {
    /// Starts `o.next()` in a task and gives it `SETTLE` to go to sleep (on a machine so slow
    /// that it has not, the test still passes: it finds the change when it looks).
    async fn start(mut o: distlock_core::Observer, what: &'static str) -> Pending {
        const SETTLE: Duration = Duration::from_millis(200);
        let task = tokio::spawn(async move {
            // Bounded by the caller's `woken_after`; this only keeps a lost wake-up from
            // hanging the test (a child process may take long to start).
            let l = tokio::time::timeout(CHILD_PATIENCE, o.next())
                .await
                .unwrap_or_else(|_| panic!("{what}: no change within {CHILD_PATIENCE:?}"))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            (o, l, Instant::now())
        });
        tokio::time::sleep(SETTLE).await;
        assert!(!task.is_finished(), "{what}: a change reported too early");
        Pending(task)
    }

    /// The change it reported, within `PROMPT` of `since`.
    async fn woken_after(self, since: Instant) -> (distlock_core::Observer, Option<Leader>) {
        let (o, l, at) = self.0.await.expect("observer task");
        let latency = at.saturating_duration_since(since);
        assert!(latency < PROMPT, "the observer woke {latency:?} after");
        (o, l)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leader_process_hands_over_to_a_waiting_candidate() {
    let dir = TempDir::new("elect-kill");
    let (mut child, child_token, child_owner) = spawn_leader(dir.path(), false).await;

    let c = client(dir.path());
    let e = c.election(ELECTION).expect("election");
    let leader = e.leader().await.expect("leader").expect("the child leads");
    assert_eq!(
        (leader.owner.as_str(), leader.value.as_str()),
        (child_owner.as_str(), "child-value")
    );
    assert_eq!(leader.fencing_token, child_token);
    assert!(e.try_campaign("me").await.expect("try").is_none());

    let mut observer = e.observe();
    assert_eq!(
        next_change(&mut observer, "first state").await,
        Some(leader.clone())
    );
    let pending = Pending::start(observer, "after the kill").await;

    let candidate = {
        let e = e.clone();
        tokio::spawn(async move {
            let l = e.campaign_timeout("parent-value", WAITER_DEADLINE).await;
            (l, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!candidate.is_finished(), "a candidate led beside the child");

    let killed_at = Instant::now();
    child.kill();
    let (l, at) = candidate.await.expect("candidate task");
    let l = l.expect("the candidate leads after the leader's death");
    assert!(
        at.saturating_duration_since(killed_at) < PROMPT,
        "took over {:?} after the kill",
        at - killed_at
    );
    assert!(l.fencing_token() > child_token);
    assert_eq!(l.value(), "parent-value");

    // The observer hears of the change (through nobody leading, or straight to the new
    // leader), and ends on the new leader.
    let (mut observer, mut now) = pending.woken_after(killed_at).await;
    if now.is_none() {
        now = next_change(&mut observer, "the new leader").await;
    }
    let now = now.expect("a leader");
    assert_eq!(now.value, "parent-value");
    assert_eq!(now.fencing_token, l.fencing_token());

    let pending = Pending::start(observer, "resigned").await;
    let resigned_at = Instant::now();
    assert_eq!(l.resign().await.expect("resign"), ReleaseOutcome::Released);
    assert_eq!(pending.woken_after(resigned_at).await.1, None);
}

/// An observer of another backend (as another process) sees a leader's proclamation through
/// inotify, and a leader process's death through its blocked `flock`, with nobody campaigning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_sees_another_process_proclaim_and_die() {
    let dir = TempDir::new("elect-observe");
    let c = client(dir.path());
    let e = c.election(ELECTION).expect("election");
    let mut observer = e.observe();
    assert_eq!(next_change(&mut observer, "nobody yet").await, None);

    let pending = Pending::start(observer, "the child's grant").await;
    let (child, child_token, _) = spawn_leader(dir.path(), true).await;
    let (mut observer, first) = pending.woken_after(Instant::now()).await;
    let first = first.expect("the child leads");
    assert_eq!(first.fencing_token, child_token);
    let (mut child, _) = child.expect("PROCLAIMED").await;
    // Whatever the observer saw of the child's grant, it ends on the proclaimed value.
    let mut seen = vec![first.value];
    while seen.last().map(String::as_str) != Some("child-proclaimed") {
        let l = next_change(&mut observer, "the child's values")
            .await
            .expect("the child leads");
        assert_eq!(l.fencing_token, child_token);
        seen.push(l.value.clone());
    }
    // A value of the child's grant may have been overwritten before the observer read it.
    assert!(seen.len() <= 2, "{seen:?}");
    let pending = Pending::start(observer, "after the kill").await;
    let killed_at = Instant::now();
    child.kill();
    assert_eq!(pending.woken_after(killed_at).await.1, None);
    assert_eq!(e.leader().await.expect("leader"), None);
    let info = c
        .inspect_kind(ELECTION, LockKind::Election)
        .await
        .expect("inspect");
    assert_eq!(info.fencing_token, child_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclamations_are_numbered() {
    let dir = TempDir::new("elect-seq");
    let b = backend(dir.path());
    let other = backend(dir.path());
    let mut r = rw_req(ELECTION, "leader", LockKind::Election);
    r.value = Some(Arc::from("v0"));
    let g = granted(&b, &r).await;
    let value_seen = |b: Arc<distlock_file::FileBackend>| async move {
        let info = b
            .inspect(ELECTION, LockKind::Election)
            .await
            .expect("inspect");
        Leader::of(&info).expect("a leader").value
    };
    assert_eq!(value_seen(other.clone()).await, "v0");

    assert_eq!(
        b.proclaim(&g, 2, "v2").await.expect("proclaim"),
        RenewOutcome::Renewed
    );
    // A late proclamation (seq 1) and a duplicate of seq 2 are answered, and change nothing.
    assert_eq!(
        b.proclaim(&g, 1, "late").await.expect("late"),
        RenewOutcome::Renewed
    );
    assert_eq!(
        b.proclaim(&g, 2, "dup").await.expect("dup"),
        RenewOutcome::Renewed
    );
    assert_eq!(value_seen(b.clone()).await, "v2");
    assert_eq!(value_seen(other.clone()).await, "v2");
    // A value on several lines survives the record.
    let odd = "line 1\nline 2 \\n\r";
    assert_eq!(
        b.proclaim(&g, 3, odd).await.expect("proclaim"),
        RenewOutcome::Renewed
    );
    assert_eq!(value_seen(other.clone()).await, odd);

    // Another attempt of the same owner is not the leader.
    let stranger = rw_req(ELECTION, "leader", LockKind::Election).grant(g.token);
    assert_eq!(
        b.proclaim(&stranger, 9, "x").await.expect("stranger"),
        RenewOutcome::NotHeld
    );
    assert_eq!(release(&b, &g).await, ReleaseOutcome::Released);
    assert_eq!(
        b.proclaim(&g, 4, "gone").await.expect("after release"),
        RenewOutcome::NotHeld
    );
    let info = other
        .inspect(ELECTION, LockKind::Election)
        .await
        .expect("inspect");
    assert!(info.holders.is_empty(), "{info:?}");
    let text = std::fs::read_to_string(b.election_file(ELECTION)).expect("record");
    assert!(
        !text.contains("value"),
        "a resigned leader's value stays: {text}"
    );
}

/// Through the client: a retried proclamation keeps the newest value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_proclaims() {
    let dir = TempDir::new("elect-proclaim");
    let c = client(dir.path());
    let e = c.election(ELECTION).expect("election");
    let l = e.campaign("a").await.expect("campaign");
    l.proclaim("b").await.expect("proclaim");
    l.proclaim("c").await.expect("proclaim");
    assert_eq!(l.value(), "c");
    let seen = client(dir.path())
        .election(ELECTION)
        .expect("election")
        .leader()
        .await
        .expect("leader")
        .expect("a leader");
    assert_eq!(
        (seen.value.as_str(), seen.fencing_token),
        ("c", l.fencing_token())
    );
    assert_eq!(l.resign().await.expect("resign"), ReleaseOutcome::Released);
}

/// A campaign given up (timed out, or its future dropped) while another leads leaves nothing:
/// no lock, no leader, no thread holding the file once the leader goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_campaign_leaves_nothing() {
    let dir = TempDir::new("elect-cancel");
    let leader_client = client(dir.path());
    let leader = leader_client
        .election(ELECTION)
        .expect("election")
        .campaign("first")
        .await
        .expect("campaign");
    let c = client(dir.path());
    let e = c.election(ELECTION).expect("election");
    let timed_out = e
        .campaign_timeout("second", Duration::from_millis(200))
        .await;
    assert!(
        matches!(timed_out, Err(distlock_core::Error::Timeout { .. })),
        "{timed_out:?}"
    );
    let dropped = tokio::time::timeout(Duration::from_millis(200), e.campaign("third")).await;
    assert!(dropped.is_err(), "the campaign led beside the leader");

    let path = backend(dir.path()).election_file(ELECTION);
    assert_eq!(
        leader.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    stays_free(&path, "a cancelled campaign keeps the election locked").await;
    assert_eq!(e.leader().await.expect("leader"), None);
    let next = e.try_campaign("fourth").await.expect("try");
    let next = next.expect("the election is free");
    assert_eq!(next.value(), "fourth");
    assert_eq!(
        next.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
}

/// An election and the mutex of the same name are two locks, on two files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_is_apart_from_the_mutex_of_its_name() {
    let dir = TempDir::new("elect-apart");
    let c = client(dir.path());
    let other = client(dir.path());
    let guard = c
        .lock(ELECTION)
        .expect("lock")
        .acquire()
        .await
        .expect("mutex");
    let l = other
        .election(ELECTION)
        .expect("election")
        .try_campaign("v")
        .await
        .expect("try")
        .expect("the election is free while the mutex is held");
    let mutex_info = other.inspect(ELECTION).await.expect("inspect");
    assert_eq!(mutex_info.holders.len(), 1);
    assert_eq!(mutex_info.holders[0].value, None);
    let b = backend(dir.path());
    assert_ne!(b.lock_file(ELECTION), b.election_file(ELECTION));
    assert!(b
        .election_file(ELECTION)
        .to_string_lossy()
        .ends_with(".election"));
    let listed = c.list("").await.expect("list");
    let kinds: Vec<_> = listed.iter().map(|l| l.kind).collect();
    assert!(kinds.contains(&LockKind::Election), "{kinds:?}");
    assert!(kinds.contains(&LockKind::Mutex), "{kinds:?}");
    assert_eq!(l.resign().await.expect("resign"), ReleaseOutcome::Released);
    released(guard).await;
}

const RAW_CHILD_ENV: &str = "DLOCK_FILE_ELECTION_RAW";

/// Helper of `observer_sees_a_silent_leader_die`, run in a child process; does nothing
/// otherwise. Takes `flock(LOCK_EX)` on the election file it is given through a read-only
/// descriptor and writes nothing, so that its death makes no inotify event the observers
/// watch: only the lock going tells them.
#[test]
fn child_raw_locker() {
    use std::os::unix::io::AsRawFd;
    let Some(path) = std::env::var_os(RAW_CHILD_ENV) else {
        return;
    };
    let f = std::fs::File::open(path).expect("open the election file");
    // SAFETY: flock only reads the descriptor number, which `f` keeps open.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(r, 0, "flock");
    println!("HELD 0 raw");
    std::thread::sleep(CHILD_HOLD);
    drop(f);
}

/// A leader that dies without a write (nor a close of a writable descriptor) is seen by the
/// observer's thread blocked in `flock(LOCK_SH)`, not by inotify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_sees_a_silent_leader_die() {
    let dir = TempDir::new("elect-silent");
    let c = client(dir.path());
    let e = c.election(ELECTION).expect("election");
    let mut observer = e.observe();
    assert_eq!(next_change(&mut observer, "nobody yet").await, None);
    let path = backend(dir.path()).election_file(ELECTION);
    assert!(path.exists(), "observe creates the election file");
    let env = [(RAW_CHILD_ENV, Some(path.as_os_str()))];
    let (mut child, _, _) = ChildProc::spawn("child_raw_locker", &env).held().await;
    // The child wrote nothing: the observer learns of it when it next looks, e.g. after a
    // proclamation-free grant elsewhere; here, a second observer sees it at once.
    let mut second = e.observe();
    let unknown = next_change(&mut second, "the silent leader")
        .await
        .expect("somebody holds the election");
    assert!(unknown.owner.contains("unknown"), "{unknown:?}");
    let pending = Pending::start(second, "after the kill").await;
    let killed_at = Instant::now();
    child.kill();
    assert_eq!(pending.woken_after(killed_at).await.1, None);
    assert!(e.try_campaign("me").await.expect("try").is_some());
}

/// The threads of this process whose name starts with `prefix` (names are cut to 15 bytes).
fn threads_named(prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .count()
}

/// A dropped observer leaves no thread behind: its inotify thread ends, and its thread blocked
/// on the leader's lock ends when that leader goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_observers_leave_no_threads() {
    let dir = TempDir::new("elect-threads");
    let c = client(dir.path());
    let e = c.election(ELECTION).expect("election");
    let l = client(dir.path())
        .election(ELECTION)
        .expect("election")
        .campaign("v")
        .await
        .expect("campaign");
    let mut observers = Vec::new();
    for _ in 0..3 {
        let mut o = e.observe();
        assert!(next_change(&mut o, "the leader").await.is_some());
        observers.push(o);
    }
    // (A new thread names itself once it runs.)
    wait_until(
        "an inotify thread and a thread on the lock per observer",
        || async { threads_named("distlock-file-i") == 3 && threads_named("distlock-file-o") == 3 },
    )
    .await;
    drop(observers);
    wait_until("the inotify threads to end", || async {
        threads_named("distlock-file-i") == 0
    })
    .await;
    assert_eq!(l.resign().await.expect("resign"), ReleaseOutcome::Released);
    wait_until("the threads on the leader's lock to end", || async {
        threads_named("distlock-file-o") == 0
    })
    .await;
}
