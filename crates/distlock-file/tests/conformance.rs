//! The shared conformance suite of `distlock-testkit`, run against the `file://` backend: one
//! lock directory per case; every client gets its own backend, as a separate process would.
//! No network, so no proxied client: the proxy cases skip, saying so.

use distlock_core::ClientOptions;
use distlock_file::FileBackend;
use distlock_testkit::{conformance::ServerHarness, TempDir};
use std::time::Duration;

/// How long a connect takes, like a connect to a server on the same host.
///
/// It matters to `rw_readers_share_writer_excludes`: it spawns three readers, then three
/// writers, each right after making its client, and needs the readers to have asked first.
/// With a network backend, the connect of the next client gives the task just spawned the
/// time to send its request; opening a `FileBackend` takes microseconds, so without the delay
/// the six first attempts race on the two worker threads, and a writer that starts waiting
/// between two readers rightly holds the later reader back (new readers do not pass a waiting
/// writer) while the first reader waits at the case's barrier for it: the case then times out
/// although the backend behaves as specified.
const CONNECT_DELAY: Duration = Duration::from_millis(20);

fn file() -> ServerHarness<TempDir> {
    let dir = TempDir::with_prefix("distlock-file-conformance").expect("temp dir");
    let url = |d: &TempDir| d.path().display().to_string();
    // Opening does blocking file-system calls: on the blocking pool, as an application should.
    ServerHarness::new(dir, url, |dir, o| async move {
        let opened = tokio::task::spawn_blocking(move || FileBackend::open(&dir, &o));
        let backend = opened.await.expect("join");
        tokio::time::sleep(CONNECT_DELAY).await;
        backend
    })
    // The lease is the holder process's lifetime (see the crate docs); the kill test in
    // file_backend.rs covers crashed holders.
    .no_lease_expiry()
    // Deletes the lock file, as an operator or a `/tmp` cleaner might: the next renewal
    // reports the lock lost.
    .break_lock(|d, name| async move {
        let backend = FileBackend::open(d.path(), &ClientOptions::default()).expect("open");
        std::fs::remove_file(backend.lock_file(&name)).expect("remove lock file");
    })
}

distlock_testkit::conformance_suite!(file());
distlock_testkit::adversarial_suite!(file());
distlock_testkit::election_suite!(file());
