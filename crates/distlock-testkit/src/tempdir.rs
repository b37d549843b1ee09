//! A minimal self-deleting temporary directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Result;

/// A uniquely named directory under [`std::env::temp_dir()`], removed
/// (recursively) when dropped.
///
/// The name is `<prefix>-<pid>-<counter>-<nanos>`, so concurrent tests and
/// concurrent test processes never collide.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a new temporary directory with the prefix `distlock-testkit`.
    pub fn new() -> Result<Self> {
        Self::with_prefix("distlock-testkit")
    }

    /// Creates a new temporary directory whose name starts with `prefix`.
    pub fn with_prefix(prefix: &str) -> Result<Self> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let pid = std::process::id();
        let mut last_err = None;
        for _ in 0..100 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let path = base.join(format!("{prefix}-{pid}-{n}-{nanos}"));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last_err = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(last_err
            .unwrap_or_else(|| std::io::Error::other("could not create a temp dir"))
            .into())
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_unique_and_removed() {
        let a = TempDir::new().expect("tempdir");
        let b = TempDir::new().expect("tempdir");
        assert_ne!(a.path(), b.path());
        assert!(a.path().is_dir());
        std::fs::write(a.path().join("f"), b"x").expect("write");
        let p = a.path().to_path_buf();
        drop(a);
        assert!(!p.exists());
    }
}
