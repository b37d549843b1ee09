//! The shared conformance suite of `distlock-testkit`, run against the `file://` backend.

use distlock_core::{Client, ClientOptions};
use distlock_file::FileBackend;
use distlock_testkit::conformance::{Caps, Harness};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// How long [`FileHarness::client`] takes, like a connect to a server on the same host.
const CONNECT_DELAY: Duration = Duration::from_millis(20);

/// One lock directory per case; every client gets its own backend, as a separate process would.
struct FileHarness {
    dir: PathBuf,
}

impl FileHarness {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "distlock-file-conformance-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        FileHarness { dir }
    }
}

impl Drop for FileHarness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[distlock_core::async_trait]
impl Harness for FileHarness {
    /// Opening a backend does blocking file-system calls, so it runs on the blocking pool, as
    /// an application should do it; then the harness waits [`CONNECT_DELAY`], as a network
    /// backend's connect would.
    ///
    /// The delay matters to `rw_readers_share_writer_excludes`: it spawns three readers, then
    /// three writers, each right after making its client, and needs the readers to have asked
    /// first. With a network backend, the connect of the next client gives the task just
    /// spawned the time to send its request; opening a `FileBackend` takes microseconds, so
    /// without the delay the six first attempts race on the two worker threads, and a writer
    /// that starts waiting between two readers rightly holds the later reader back (new
    /// readers do not pass a waiting writer) while the first reader waits at the case's
    /// barrier for it: the case then times out although the backend behaves as specified.
    async fn client(&self, opts: ClientOptions) -> Client {
        let (dir, o) = (self.dir.clone(), opts.clone());
        let backend = tokio::task::spawn_blocking(move || FileBackend::open(&dir, &o))
            .await
            .expect("join")
            .expect("open backend");
        tokio::time::sleep(CONNECT_DELAY).await;
        Client::new(Arc::new(backend), opts).expect("client")
    }

    fn caps(&self) -> Caps {
        Caps {
            // The lease is the holder process's lifetime (see the crate docs); the kill test in
            // file_backend.rs covers crashed holders.
            lease_expiry: false,
            // Deleting the lock file: the next renewal reports the lock lost.
            break_lock: true,
        }
    }

    /// Deletes the lock file, as an operator or a `/tmp` cleaner might.
    async fn break_lock(&self, name: &str) {
        let backend =
            FileBackend::open(&self.dir, &ClientOptions::default()).expect("open backend");
        std::fs::remove_file(backend.lock_file(name)).expect("remove lock file");
    }
}

distlock_testkit::conformance_suite!(FileHarness::new());
// No network, so no proxied client: the proxy cases skip, saying so.
distlock_testkit::adversarial_suite!(FileHarness::new());
