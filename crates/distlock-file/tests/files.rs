//! The files of the `file://` backend: URLs, namespaces and modes, lock files and records,
//! corrupt, colliding and deleted files, unsupported kinds.

mod common;

use common::*;
use distlock_core::{AcquireReply, Backend, Client, Error, LockKind, ReleaseOutcome, RenewOutcome};
use distlock_file::FileBackend;
use distlock_testkit::grant::try_grant;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_namespaces_and_files() {
    let dir = TempDir::new("url");
    let url = format!("file://{}", dir.path().display());
    let be = FileBackend::from_url(&url, &opts()).expect("from_url");
    assert_eq!(be.dir(), dir.path().join("test"));
    assert_eq!(be.endpoint(), format!("{url}/test"));
    assert_eq!(be.kind(), "file");
    let lf = be.lock_file("a/b c");
    assert_eq!(lf.parent(), Some(dir.path().join("test").as_path()));
    assert_eq!(
        lf.file_name().and_then(|f| f.to_str()),
        Some(distlock_file::file_name("a/b c").as_str())
    );
    let mode = mode_of(dir.path()) & 0o777;
    assert_eq!(mode, 0o700);
    assert_eq!(mode_of(&dir.path().join("test")), 0o700);
    // A group-shared base directory gives a group-shared namespace directory, never a public one.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o2777)).expect("chmod");
    let sb = FileBackend::open(&shared, &opts()).expect("open shared");
    assert_eq!(mode_of(sb.dir()), 0o2770);

    let be = Arc::new(be);
    let a = Client::new(be, opts()).expect("client");
    let g = a
        .lock("a/b c")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let text = std::fs::read_to_string(&lf).expect("lock file");
    assert!(text.contains("name a/b c\n"), "{text}");
    assert!(text.contains(&format!("holder {} 1 {}\n", std::process::id(), g.owner())));
    // Another namespace is another set of locks.
    let other = Client::new(
        Arc::new(FileBackend::open(dir.path(), &opts().namespace("other/ns")).expect("open")),
        opts(),
    )
    .expect("client");
    let g2 = other
        .lock("a/b c")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(g2.is_some(), "namespaces share locks");
    assert!(dir.path().join("other%2Fns").is_dir());
    drop(g2);
    released(g).await;
    let text = std::fs::read_to_string(&lf).expect("lock file");
    assert!(!text.contains("holder"), "holder line not cleared: {text}");

    for bad in [
        "file://relative/dir",
        "file:/tmp/x",
        "redis://localhost",
        "file:///x?y=1",
    ] {
        match FileBackend::from_url(bad, &opts()) {
            Err(Error::InvalidUrl { url, reason }) => {
                assert_eq!(url, bad);
                assert!(reason.contains("file://"), "{reason}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    let e = FileBackend::open(dir.path(), &opts().namespace("")).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let not_dir = dir.path().join("file");
    std::fs::write(&not_dir, b"x").expect("write");
    let e = FileBackend::open(&not_dir, &opts()).unwrap_err();
    assert!(e.is_connection(), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_lock_file_is_reported() {
    let dir = TempDir::new("corrupt");
    let be = backend(dir.path());
    std::fs::write(be.lock_file("bad"), b"garbage\n").expect("write");
    let e = be.acquire(&req("bad", "o")).await.unwrap_err();
    match &e {
        Error::UnexpectedReply { backend, message } => {
            assert_eq!(*backend, "file");
            assert!(
                message.contains(&be.lock_file("bad").display().to_string()),
                "{message}"
            );
            assert!(message.contains("delete"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(be.inspect("bad", LockKind::Mutex).await.is_err());
    // The failed grant left the lock free: deleting the file as told fixes it.
    std::fs::remove_file(be.lock_file("bad")).expect("remove");
    assert!(matches!(
        be.acquire(&req("bad", "o")).await.expect("acquire"),
        AcquireReply::Granted { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_lock_file_is_detected_at_renewal() {
    let dir = TempDir::new("deleted");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let ga = granted(&a, &req("del", "a")).await;
    std::fs::remove_file(a.lock_file("del")).expect("remove");
    // A new file is a new lock: b gets it, so a must learn it lost its own.
    let gb = granted(&b, &req("del", "b")).await;
    let renew = [(ga.clone(), Duration::from_secs(1))];
    assert_eq!(
        a.renew(&renew).await.expect("renew"),
        [RenewOutcome::NotHeld]
    );
    assert_eq!(
        a.release(&ga).await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    assert_eq!(
        b.release(&gb).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_lock_file_fires_lost_signal() {
    let dir = TempDir::new("lost");
    // The lost signal must come from a renewal (every lease/3) finding the file gone
    // (`NotHeld`), not from the client's lease running out unconfirmed (`LeaseExpired`). That
    // takes over 2/3 of the lease without a renewal (e.g. a grant slow to reach the client on
    // a loaded machine): a 3 s lease makes that margin 2 s, and detection takes at most 1 s.
    let opts = opts().watchdog_lease(Duration::from_secs(3));
    let a = Client::new(
        Arc::new(FileBackend::open(dir.path(), &opts).expect("open")),
        opts.clone(),
    )
    .expect("client");
    let be = FileBackend::open(dir.path(), &opts).expect("open");
    let g = a
        .lock("lost")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    std::fs::remove_file(be.lock_file("lost")).expect("remove");
    let reason = tokio::time::timeout(PATIENCE, g.lost())
        .await
        .expect("lost signal never fired");
    assert_eq!(reason, distlock_core::LostReason::NotHeld);
    wait_until("client still tracks a lost hold", || async {
        a.held_count() == 0
    })
    .await;
    assert_eq!(g.release().await.expect("release"), ReleaseOutcome::Expired);
    // The lock works again on a new file.
    let g = a
        .lock("lost")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(g.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_lock_kinds_are_unsupported() {
    let dir = TempDir::new("kinds");
    let be = backend(dir.path());
    for kind in [
        LockKind::Fair,
        LockKind::Semaphore {
            permits: 1,
            limit: 2,
        },
    ] {
        let mut r = req("k", "o");
        r.key.kind = kind;
        let e = be.acquire(&r).await.unwrap_err();
        assert!(e.is_unsupported(), "{e:?}");
        assert!(e.to_string().contains(kind.as_str()), "{e}");
        assert!(be.inspect("k", kind).await.unwrap_err().is_unsupported());
        assert!(be.release(&r.grant(1)).await.unwrap_err().is_unsupported());
        assert!(be.give_up(&r).await.unwrap_err().is_unsupported());
        assert!(be.watch(&r).await.err().expect("watch").is_unsupported());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_record() {
    let dir = TempDir::new("files");
    let b = backend(dir.path());
    let n = "files";
    let [main, turnstile, record] = b.rw_lock_files(n);
    let hash = format!("{:032x}", distlock_file::fnv1a_128(n.as_bytes()));
    assert_eq!(main, b.dir().join(format!("{hash}.rw")));
    assert_eq!(turnstile, b.dir().join(format!("{hash}.rw-turnstile")));
    assert_eq!(record, b.dir().join(format!("{hash}.rw-record")));
    let g = rw_granted(&b, n, "reader one", LockKind::Read).await;
    let t = g.token;
    let text = std::fs::read_to_string(&record).expect("record");
    let pid = std::process::id();
    assert!(text.starts_with("distlock-file 1\n"), "{text}");
    assert!(text.contains(&format!("token {t}\n")), "{text}");
    assert!(text.contains(&format!("name {n}\n")), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("hold "))
        .expect("hold line");
    let parts: Vec<&str> = line.splitn(6, ' ').collect();
    assert_eq!(parts[1..3], ["r", pid.to_string().as_str()], "{line}");
    assert_eq!(parts[4..], ["1", "reader one"], "{line}");
    // The mutex of the same name is another lock, with its own file and counter.
    assert!(!b.lock_file(n).exists());
    assert_eq!(release(&b, &g).await, ReleaseOutcome::Released);
    let text = std::fs::read_to_string(&record).expect("record");
    assert!(!text.contains("hold "), "{text}");
    // A record naming another lock (an FNV collision, or a foreign file) is refused.
    std::fs::write(&record, "distlock-file 1\ntoken 3\nname other\nend\n").expect("write");
    let e = b
        .acquire(&rw_req(n, "o", LockKind::Write))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::UnexpectedReply { .. }), "{e:?}");
    assert!(e.to_string().contains("same FNV-1a-128 hash"), "{e}");
    // ... and left the lock free.
    // (A counter ahead of the clock floor: the next token is the counter's next.)
    let ahead = u64::MAX / 2;
    std::fs::write(
        &record,
        format!("distlock-file 1\ntoken {ahead}\nname files\nend\n"),
    )
    .expect("write");
    let g = rw_granted(&b, n, "o", LockKind::Write).await;
    assert_eq!(g.token, ahead + 1);
    assert_eq!(release(&b, &g).await, ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_rw_file_is_detected_at_renewal() {
    let dir = TempDir::new("deleted");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let n = "deleted";
    let gw = rw_granted(&a, n, "w", LockKind::Write).await;
    let mut dq = rw_req(n, "w", LockKind::Read);
    dq.write_grant = Some(gw.clone());
    let gr = granted(&a, &dq).await;
    let [main, _, _] = a.rw_lock_files(n);
    std::fs::remove_file(&main).expect("remove");
    // A new file is a new lock: b gets it, so a must learn that it lost both sides.
    let gx = rw_granted(&b, n, "x", LockKind::Write).await;
    let renew = [
        (gw.clone(), Duration::from_secs(1)),
        (gr.clone(), Duration::from_secs(1)),
    ];
    assert_eq!(
        a.renew(&renew).await.expect("renew"),
        [RenewOutcome::NotHeld, RenewOutcome::NotHeld]
    );
    assert_eq!(release(&a, &gw).await, ReleaseOutcome::TakenByOther);
    assert_eq!(release(&b, &gx).await, ReleaseOutcome::Released);
    assert_eq!(release(&a, &gr).await, ReleaseOutcome::Expired);
}

/// One grant of `name` of `kind` through `c`, released at once; its token.
async fn grant_once(c: &Client, name: &str, kind: LockKind) -> u64 {
    let g = try_grant(c, name, kind).await.expect("try").expect("free");
    let t = g.token();
    g.release().await;
    t
}

/// An older lock-file record restored (a backup copied back over it, a directory restored or
/// copied from before): the counter in it is behind, and the next token must still be above
/// every token handed out — the clock floor (at least CLOCK_REALTIME in µs) covers it. For
/// every file that keeps a counter: a mutex's, a read-write lock's record (both sides draw
/// from it), an election's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_lock_file_never_gives_a_token_again() {
    let dir = TempDir::new("restored");
    let b = backend(dir.path());
    let c = client(dir.path());
    for (kind, name) in [
        (LockKind::Mutex, "restored mutex"),
        (LockKind::Read, "restored rw"),
        (LockKind::Write, "restored rw"),
        (LockKind::Election, "restored election"),
    ] {
        let file = match kind {
            LockKind::Mutex => b.lock_file(name),
            LockKind::Election => b.election_file(name),
            _ => {
                let [_, _, record] = b.rw_lock_files(name);
                record
            }
        };
        let mut tokens = vec![grant_once(&c, name, kind).await];
        let backup = dir.path().join("backup");
        std::fs::copy(&file, &backup).expect("back up");
        for _ in 0..2 {
            tokens.push(grant_once(&c, name, kind).await);
        }
        std::fs::copy(&backup, &file).expect("restore");
        let next = grant_once(&c, name, kind).await;
        assert!(
            next > tokens[2],
            "{kind:?}: token {next} after {tokens:?} and the record of the first restored"
        );
    }
}
