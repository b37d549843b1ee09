//! The shared conformance suite of `dlock-testkit`, run against the `file://` backend.

use dlock_core::{Client, ClientOptions};
use dlock_file::FileBackend;
use dlock_testkit::conformance::{Caps, Harness};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// One lock directory per case; every client gets its own backend, as a separate process would.
struct FileHarness {
    dir: PathBuf,
}

impl FileHarness {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "dlock-file-conformance-{}-{}",
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

#[dlock_core::async_trait]
impl Harness for FileHarness {
    async fn client(&self, opts: ClientOptions) -> Client {
        let backend = FileBackend::open(&self.dir, &opts).expect("open backend");
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

dlock_testkit::conformance_suite!(FileHarness::new());
