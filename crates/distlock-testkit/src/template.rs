//! Initialized data dirs built once per machine and copied by every server that needs one
//! (PostgreSQL clusters, MariaDB data dirs): copying is several times faster than
//! initializing.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Error, Result, TempDir};

/// The login the SQL servers' tests use (over TCP, with a password).
pub(crate) const USER: &str = "dlock";
/// The password of [`USER`].
pub(crate) const PASSWORD: &str = "dlock-test-pw";
/// The database [`USER`] may use.
pub(crate) const DATABASE: &str = "dlock";

/// A new temp dir (`prefix…`, owned by `owner` when given) holding `data/`: a copy of the
/// machine's template for `key_parts`, built once with `build(dir)` (which makes
/// `dir/data`), or built in place when the cache is off.
pub(crate) fn prepared_dir(
    prefix: &str,
    key_parts: &[&str],
    owner: Option<(u32, u32)>,
    build: impl Fn(&Path) -> Result<()>,
) -> Result<TempDir> {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
    let chown = |p: &Path| match owner {
        Some((uid, gid)) => std::os::unix::fs::chown(p, Some(uid), Some(gid)).map_err(Error::Io),
        None => Ok(()),
    };
    chown(dir.path())?;
    let built = template(&cache_key(prefix, key_parts), |tmp| {
        chown(tmp)?;
        build(tmp)
    })?;
    match built {
        Some(tpl) => copy_dir(&tpl.join("data"), &dir.path().join("data"))?,
        None => build(dir.path())?,
    }
    Ok(dir)
}

/// The account methods of a SQL server starter: `user`, `password`, `database`, `url` and
/// `url_with_password`, for URLs `SCHEME://dlock:PASSWORD@127.0.0.1:PORT/dlock`.
macro_rules! sql_account_methods {
    ($scheme:literal) => {
        /// The login tests connect as.
        pub fn user(&self) -> &'static str {
            $crate::template::USER
        }

        /// The password of [`user`](Self::user).
        pub fn password(&self) -> &'static str {
            $crate::template::PASSWORD
        }

        /// The database [`user`](Self::user) may use (and owns, where that applies).
        pub fn database(&self) -> &'static str {
            $crate::template::DATABASE
        }

        #[doc = concat!("`", $scheme, "://dlock:PASSWORD@127.0.0.1:PORT/dlock`.")]
        pub fn url(&self) -> String {
            self.url_with_password($crate::template::PASSWORD)
        }

        /// [`url`](Self::url) with another password (percent-encoded), e.g. a wrong one.
        pub fn url_with_password(&self, password: &str) -> String {
            format!(
                "{}://{}:{}@127.0.0.1:{}/{}",
                $scheme,
                $crate::template::USER,
                $crate::spawn::percent_encode(password),
                self.port(),
                $crate::template::DATABASE,
            )
        }
    };
}
pub(crate) use sql_account_methods;

/// Environment variable that turns the data-dir template cache off (any non-empty value).
const NO_CACHE_ENV: &str = "DLOCK_TESTKIT_NO_CACHE";
/// Bump when what a template contains changes.
const TEMPLATE_FORMAT: u32 = 2;

/// A cache key for a template: `prefix-<hash of parts>`.
pub(crate) fn cache_key(prefix: &str, parts: &[&str]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    TEMPLATE_FORMAT.hash(&mut h);
    parts.hash(&mut h);
    format!("{prefix}-{:016x}", h.finish())
}

/// The first line `binary --version` prints (part of a template's cache key).
pub(crate) fn version_of(binary: &Path) -> String {
    Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default()
}

/// An initialized data dir, built once per machine by `build` and shared by every test
/// process (servers start from a copy, which is several times faster than initializing).
///
/// Lives in `$TMPDIR/distlock-testkit-cache-UID/KEY`; built under an exclusive `flock`, in a side
/// directory renamed into place when complete, so a crashed build is never used. `None` when
/// the cache is turned off with `DLOCK_TESTKIT_NO_CACHE`.
pub(crate) fn template(
    key: &str,
    build: impl FnOnce(&Path) -> Result<()>,
) -> Result<Option<PathBuf>> {
    if std::env::var_os(NO_CACHE_ENV).is_some_and(|v| !v.is_empty()) {
        return Ok(None);
    }
    // Per user: another user's cache is not writable (nor trustworthy).
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let root = std::env::temp_dir().join(format!("distlock-testkit-cache-{euid}"));
    std::fs::create_dir_all(&root)?;
    let dest = root.join(key);
    let ready = |p: &Path| p.join("READY").exists();
    if ready(&dest) {
        return Ok(Some(dest));
    }
    let lock = File::create(root.join(format!("{key}.lock")))?;
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: plain syscall on a file we own; released when `lock` is dropped.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::Io(io::Error::last_os_error()));
        }
    }
    if ready(&dest) {
        return Ok(Some(dest));
    }
    let building = root.join(format!("{key}.building"));
    let _ = std::fs::remove_dir_all(&building);
    std::fs::create_dir(&building)?;
    if let Err(e) = build(&building) {
        let _ = std::fs::remove_dir_all(&building);
        return Err(e);
    }
    File::create(building.join("READY"))?;
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::rename(&building, &dest)?;
    drop(lock);
    Ok(Some(dest))
}

/// Copies a directory tree, keeping modes and (as root) owners: `cp -a SRC DST`.
pub(crate) fn copy_dir(src: &Path, dst: &Path) -> Result<()> {
    let out = Command::new("cp")
        .arg("-a")
        .arg(src)
        .arg(dst)
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(Error::Io(io::Error::other(format!(
            "cp -a {} {} failed: {}",
            src.display(),
            dst.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))));
    }
    Ok(())
}

/// A test of a SQL starter: it answers, a committed row survives a restart (a new pid),
/// failing SQL is an error, and a killed server no longer runs nor answers.
#[cfg(test)]
macro_rules! durable_sql_server_test {
    ($server:ty, $create:literal, $table:literal) => {
        #[test]
        fn starts_answers_restarts_and_keeps_data() {
            let mut db = match <$server>::start() {
                Err($crate::Error::BinaryMissing { .. }) => return,
                r => r.expect("start the server"),
            };
            assert_eq!(db.sql("SELECT 1 + 1").expect("sql"), "2");
            db.sql(concat!($create, "; INSERT INTO ", $table, " VALUES (7)"))
                .expect("sql");
            let pid = db.pid().expect("pid");
            db.restart().expect("restart");
            assert_ne!(db.pid(), Some(pid));
            assert_eq!(db.sql(concat!("SELECT x FROM ", $table)).expect("sql"), "7");
            assert!(db.sql("SELECT nope").is_err());
            db.kill();
            assert!(!db.is_running());
            assert!(db.sql("SELECT 1").is_err());
        }
    };
}
#[cfg(test)]
pub(crate) use durable_sql_server_test;
