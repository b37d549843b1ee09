//! A real PostgreSQL server (`postgres`) child process for tests.
//!
//! The cluster is made with `initdb` in a fresh temp dir, the server listens on a free
//! `127.0.0.1` port and on a unix socket inside that dir, and everything runs as the
//! `postgres` OS user when the tests run as root (PostgreSQL refuses to run as root).
//! Local (unix socket) connections are trusted; TCP connections need a password, so tests
//! of wrong passwords are real.
//!
//! Also home to small helpers shared with [`MariaDbServer`](crate::MariaDbServer).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::{spawn, try_free_port, Error, Result, TempDir};

/// Environment variable naming the directory holding `initdb`, `postgres` and `psql`
/// (e.g. `/usr/lib/postgresql/16/bin`). Unset: `PATH`, then the newest
/// `/usr/lib/postgresql/*/bin`.
pub const POSTGRES_BIN_DIR_ENV: &str = "DLOCK_POSTGRES_BIN_DIR";

const PACKAGE: &str = "postgresql";
/// The login role tests use (over TCP, with a password).
const USER: &str = "dlock";
const PASSWORD: &str = "dlock-test-pw";
const DATABASE: &str = "dlock";
/// The superuser's password over TCP (locally it is trusted).
const ADMIN_PASSWORD: &str = "dlock-admin-pw";
const START_ATTEMPTS: usize = 5;
const RESTART_ATTEMPTS: usize = 20;
const RESTART_BACKOFF: Duration = Duration::from_millis(100);
const READY_TIMEOUT: Duration = Duration::from_secs(20);
const READY_POLL: Duration = Duration::from_millis(10);
const LOG_TAIL_LINES: usize = 20;

/// A PostgreSQL server on a free `127.0.0.1` port, in its own temp dir.
///
/// Made for speed: `fsync=off` (commits survive a killed server, not a crashed OS), small
/// shared buffers. It has a login role
/// [`user`](Self::user) with password [`password`](Self::password) owning the database
/// [`database`](Self::database); [`url`](Self::url) connects as that role.
///
/// [`kill`](Self::kill) SIGKILLs the postmaster and all its backends;
/// [`restart`](Self::restart) starts it again on the same port **with the same data**
/// (PostgreSQL is durable; a killed server recovers from its WAL), so fencing counters
/// survive. Killed and its dir removed on drop.
#[derive(Debug)]
pub struct PostgresServer {
    bins: PgBins,
    run_as: Option<(u32, u32)>,
    port: u16,
    child: Mutex<Option<Child>>,
    dir: TempDir,
}

#[derive(Debug, Clone)]
struct PgBins {
    postgres: PathBuf,
    initdb: PathBuf,
    psql: PathBuf,
}

impl PostgresServer {
    /// Initializes a cluster and starts it on a free port.
    ///
    /// Returns [`Error::BinaryMissing`] (naming the Debian package `postgresql`) if the
    /// binaries cannot be found.
    pub fn start() -> Result<Self> {
        let bins = find_pg_bins()?;
        let run_as = run_as_postgres()?;
        let dir = TempDir::with_prefix("dlock-pg")?;
        if let Some((uid, gid)) = run_as {
            chown(dir.path(), uid, gid)?;
        }
        let key = cache_key(
            "pg",
            &[
                &bins.postgres.display().to_string(),
                &version_of(&bins.postgres),
                &format!("{run_as:?}"),
            ],
        );
        let built = template(&key, |tmp| {
            if let Some((uid, gid)) = run_as {
                chown(tmp, uid, gid)?;
            }
            fresh_cluster(&bins, run_as, tmp)
        })?;
        match built {
            Some(tpl) => copy_dir(&tpl.join("data"), &dir.path().join("data"))?,
            None => fresh_cluster(&bins, run_as, dir.path())?,
        }
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = try_free_port()?;
            match launch(&bins, run_as, dir.path(), port) {
                Ok(child) => {
                    let server = PostgresServer {
                        bins,
                        run_as,
                        port,
                        child: Mutex::new(Some(child)),
                        dir,
                    };
                    // Warm up: the first connection to a database loads its catalog caches.
                    server.sql("SELECT 1")?;
                    return Ok(server);
                }
                Err(Attempt::Retry(e)) => last = Some(e),
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Start {
            what: "postgres".into(),
            detail: "no start attempt was made".into(),
        }))
    }

    /// The TCP port (stable across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The login role tests connect as.
    pub fn user(&self) -> &'static str {
        USER
    }

    /// The password of [`user`](Self::user).
    pub fn password(&self) -> &'static str {
        PASSWORD
    }

    /// The database owned by [`user`](Self::user).
    pub fn database(&self) -> &'static str {
        DATABASE
    }

    /// `postgres://dlock:PASSWORD@127.0.0.1:PORT/dlock`.
    pub fn url(&self) -> String {
        self.url_with_password(PASSWORD)
    }

    /// [`url`](Self::url) with another password (percent-encoded), e.g. a wrong one.
    pub fn url_with_password(&self, password: &str) -> String {
        format!(
            "postgres://{USER}:{}@127.0.0.1:{}/{DATABASE}",
            percent_encode(password),
            self.port
        )
    }

    /// The superuser `postgres` over TCP, in the tests' database.
    pub fn admin_url(&self) -> String {
        format!(
            "postgres://postgres:{ADMIN_PASSWORD}@127.0.0.1:{}/{DATABASE}",
            self.port
        )
    }

    /// The temp dir: `data/` (the cluster), the unix socket, `postgres.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The directory of the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The postmaster's pid, or `None` after [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        lock(&self.child).as_ref().map(Child::id)
    }

    /// Whether the postmaster runs (a paused one counts).
    pub fn is_running(&self) -> bool {
        match lock(&self.child).as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILLs the postmaster and every backend (the whole process group) and reaps it.
    /// Idempotent. Clients see their connections reset.
    pub fn kill(&mut self) {
        if let Some(child) = self
            .child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            kill_group_and_reap(child);
        }
    }

    /// Freezes the postmaster and all backends (SIGSTOP to the group).
    pub fn pause(&mut self) {
        self.signal_group(libc::SIGSTOP);
    }

    /// Resumes a [paused](Self::pause) server.
    pub fn resume(&mut self) {
        self.signal_group(libc::SIGCONT);
    }

    /// Kills the server if running and starts it again on the same port with the same data
    /// (crash recovery replays the WAL). On error the server is left stopped.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        let mut last = None;
        for attempt in 0..RESTART_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(RESTART_BACKOFF);
            }
            match launch(&self.bins, self.run_as, self.dir.path(), self.port) {
                Ok(child) => {
                    *self.child.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(child);
                    return Ok(());
                }
                Err(Attempt::Retry(e)) => last = Some(e),
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Start {
            what: describe(self.port),
            detail: "no restart attempt was made".into(),
        }))
    }

    /// Runs SQL as the superuser in the tests' database (through `psql` on the unix socket)
    /// and returns the output unaligned, tuples only (`a|b` per row, one row per line,
    /// trimmed). A failing statement is an [`Error::Io`] carrying psql's message.
    pub fn sql(&self, sql: &str) -> Result<String> {
        self.psql(DATABASE, &[sql])
    }

    fn psql(&self, db: &str, commands: &[&str]) -> Result<String> {
        psql_at(&self.bins, self.dir.path(), self.port, db, commands)
    }

    fn signal_group(&mut self, sig: libc::c_int) {
        let child = self.child.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(child) = child.as_mut() {
            if matches!(child.try_wait(), Ok(None)) {
                if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                    // SAFETY: plain syscall; the group leader is our unreaped child.
                    unsafe {
                        libc::killpg(pid, sig);
                    }
                }
            }
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn describe(port: u16) -> String {
    format!("postgres on 127.0.0.1:{port}")
}

/// Makes a ready-to-copy cluster in `dir/data`: initdb, then the roles and the database of
/// the tests, then a clean shutdown.
fn fresh_cluster(bins: &PgBins, run_as: Option<(u32, u32)>, dir: &Path) -> Result<()> {
    initdb(bins, run_as, dir)?;
    let mut last = None;
    for _ in 0..START_ATTEMPTS {
        let port = try_free_port()?;
        match launch(bins, run_as, dir, port) {
            Ok(child) => {
                let r = psql_at(
                    bins,
                    dir,
                    port,
                    "postgres",
                    &[
                        "SET password_encryption = 'md5'",
                        &format!("ALTER ROLE postgres PASSWORD '{ADMIN_PASSWORD}'"),
                        &format!("CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'"),
                        &format!("CREATE DATABASE {DATABASE} OWNER {USER}"),
                    ],
                );
                // SIGINT: fast shutdown, leaving a clean cluster behind.
                stop_gracefully(child, libc::SIGINT);
                return r.map(|_| ());
            }
            Err(Attempt::Retry(e)) => last = Some(e),
            Err(Attempt::Fatal(e)) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::Start {
        what: "postgres".into(),
        detail: "no start attempt was made".into(),
    }))
}

fn psql_at(bins: &PgBins, dir: &Path, port: u16, db: &str, commands: &[&str]) -> Result<String> {
    let mut cmd = Command::new(&bins.psql);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LC_ALL", "C")
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
        .arg(dir)
        .arg("-p")
        .arg(port.to_string())
        .args(["-U", "postgres", "-d", db]);
    for c in commands {
        cmd.arg("-c").arg(c);
    }
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            Error::BinaryMissing {
                binary: bins.psql.display().to_string(),
                package: "postgresql-client".into(),
            }
        } else {
            Error::Io(e)
        }
    })?;
    if !out.status.success() {
        return Err(Error::Io(io::Error::other(format!(
            "psql failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

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

/// Sends `sig` (a shutdown request) to a server and waits up to 30 s for it to exit; kills
/// it if it does not.
pub(crate) fn stop_gracefully(mut child: Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: plain syscall; the child is not reaped yet.
        unsafe {
            libc::kill(pid, sig);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    kill_group_and_reap(child);
}

/// Why one launch attempt failed.
pub(crate) enum Attempt {
    /// Worth retrying (process exited early, port taken).
    Retry(Error),
    /// Not worth retrying.
    Fatal(Error),
}

fn find_pg_bins() -> Result<PgBins> {
    let missing = |binary: &str| Error::BinaryMissing {
        binary: binary.into(),
        package: PACKAGE.into(),
    };
    let dir = match std::env::var_os(POSTGRES_BIN_DIR_ENV) {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            if !is_executable(&d.join("postgres")) {
                return Err(missing(&d.join("postgres").display().to_string()));
            }
            d
        }
        _ => {
            // A directory that has all three, preferring PATH, then the newest Debian one.
            let mut candidates: Vec<PathBuf> = Vec::new();
            if let Some(p) = find_on_path("postgres") {
                if let Some(parent) = std::fs::canonicalize(&p)
                    .ok()
                    .and_then(|c| c.parent().map(Path::to_path_buf))
                {
                    candidates.push(parent);
                }
            }
            let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .filter_map(|e| {
                            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                            Some((v, e.path().join("bin")))
                        })
                        .collect()
                })
                .unwrap_or_default();
            debian.sort();
            candidates.extend(debian.into_iter().rev().map(|(_, p)| p));
            candidates
                .into_iter()
                .find(|d| is_executable(&d.join("postgres")) && is_executable(&d.join("initdb")))
                .ok_or_else(|| missing("postgres"))?
        }
    };
    let psql = if is_executable(&dir.join("psql")) {
        dir.join("psql")
    } else {
        find_on_path("psql").ok_or_else(|| Error::BinaryMissing {
            binary: "psql".into(),
            package: "postgresql-client".into(),
        })?
    };
    if !is_executable(&dir.join("initdb")) {
        return Err(missing(&dir.join("initdb").display().to_string()));
    }
    Ok(PgBins {
        postgres: dir.join("postgres"),
        initdb: dir.join("initdb"),
        psql,
    })
}

/// `Some((uid, gid))` of the `postgres` OS user when we run as root (PostgreSQL refuses
/// root), `None` otherwise.
fn run_as_postgres() -> Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = CString::new("postgres").map_err(|e| Error::Io(io::Error::other(e)))?;
    // SAFETY: getpwnam returns a pointer to static storage or null; we copy the two fields
    // out at once. Tests that start servers from several threads may race on that storage,
    // but they all ask for the same user.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(Error::Start {
            what: "postgres".into(),
            detail: "PostgreSQL refuses to run as root and there is no `postgres` OS user to run \
                     it as: install the Debian package `postgresql` (it creates the user) or run \
                     the tests as an ordinary user"
                .into(),
        });
    }
    // SAFETY: pw is non-null and points to a valid passwd struct.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok(Some((uid, gid)))
}

pub(crate) fn chown(path: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(Error::Io)
}

fn initdb(bins: &PgBins, run_as: Option<(u32, u32)>, dir: &Path) -> Result<()> {
    let mut cmd = Command::new(&bins.initdb);
    cmd.arg("-D")
        .arg(dir.join("data"))
        .args([
            "-U",
            "postgres",
            "--auth-local=trust",
            // md5, not SCRAM: a SCRAM handshake runs 4096 PBKDF2 rounds, which in debug
            // builds dominates connection setup when a test opens dozens of sessions at once.
            // Passwords are still checked for real.
            "--auth-host=md5",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
            "--wal-segsize=1",
        ])
        .env("LC_ALL", "C")
        .env_remove("PGDATA")
        .current_dir(dir)
        .stdin(Stdio::null());
    if let Some((uid, gid)) = run_as {
        cmd.uid(uid).gid(gid);
    }
    let out = cmd.output().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            Error::BinaryMissing {
                binary: bins.initdb.display().to_string(),
                package: PACKAGE.into(),
            }
        } else {
            Error::Io(e)
        }
    })?;
    if !out.status.success() {
        return Err(Error::Start {
            what: "initdb".into(),
            detail: format!(
                "initdb failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}

/// Starts the postmaster on `port` and waits until `postmaster.pid` says it is ready.
fn launch(
    bins: &PgBins,
    run_as: Option<(u32, u32)>,
    dir: &Path,
    port: u16,
) -> std::result::Result<Child, Attempt> {
    let io_fatal = |e: io::Error| Attempt::Fatal(Error::Io(e));
    let log = File::options()
        .create(true)
        .append(true)
        .open(dir.join("postgres.log"))
        .map_err(io_fatal)?;
    let log2 = log.try_clone().map_err(io_fatal)?;
    let mut cmd = Command::new(&bins.postgres);
    cmd.arg("-D")
        .arg(dir.join("data"))
        .arg("-p")
        .arg(port.to_string())
        .arg("-k")
        .arg(dir)
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=on",
            "-c",
            "full_page_writes=off",
            "-c",
            "shared_buffers=16MB",
            "-c",
            "max_connections=200",
            "-c",
            "max_wal_size=64MB",
            "-c",
            "log_min_messages=warning",
            "-c",
            "log_line_prefix=%m [%p] ",
        ])
        .env("LC_ALL", "C")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // Own process group, so kill/pause reach every backend.
        .process_group(0);
    if let Some((uid, gid)) = run_as {
        cmd.uid(uid).gid(gid);
    }
    let mut child = match spawn::spawn(cmd) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Attempt::Fatal(Error::BinaryMissing {
                binary: bins.postgres.display().to_string(),
                package: PACKAGE.into(),
            }))
        }
        Err(e) => return Err(io_fatal(e)),
    };
    let pid_file = dir.join("data").join("postmaster.pid");
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => {
                // Backends of a half-started server, if any.
                kill_group_and_reap(child);
                return Err(Attempt::Retry(Error::Start {
                    what: describe(port),
                    detail: format!(
                        "process exited early ({status}){}",
                        log_tail(dir, &["postgres.log"])
                    ),
                }));
            }
            Err(e) => {
                kill_group_and_reap(child);
                return Err(io_fatal(e));
            }
        }
        if postmaster_ready(&pid_file, child.id()) {
            return Ok(child);
        }
        if start.elapsed() >= READY_TIMEOUT {
            kill_group_and_reap(child);
            return Err(Attempt::Fatal(Error::Start {
                what: describe(port),
                detail: format!(
                    "not ready after {READY_TIMEOUT:?}{}",
                    log_tail(dir, &["postgres.log"])
                ),
            }));
        }
        std::thread::sleep(READY_POLL);
    }
}

/// `postmaster.pid`: line 1 the pid, line 8 the status (`ready` once it accepts connections).
fn postmaster_ready(pid_file: &Path, pid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(pid_file) else {
        return false;
    };
    let lines: Vec<&str> = text.lines().collect();
    lines.first().map(|l| l.trim()) == Some(pid.to_string().as_str())
        && lines.get(7).map(|l| l.trim()) == Some("ready")
}

/// SIGKILLs a child's whole process group (and SIGCONTs it, harmlessly, for paused ones),
/// reaps the child, and waits briefly until no member of the group is left running.
pub(crate) fn kill_group_and_reap(mut child: Child) {
    let pid = libc::pid_t::try_from(child.id()).ok();
    if let Some(pid) = pid {
        // SAFETY: plain syscalls; the group was created for our (unreaped) child.
        unsafe {
            libc::killpg(pid, libc::SIGKILL);
            libc::killpg(pid, libc::SIGCONT);
        }
    } else {
        let _ = child.kill();
    }
    let _ = child.wait();
    if let Some(pid) = pid {
        let deadline = Instant::now() + Duration::from_secs(3);
        while group_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// True while some non-zombie process is in process group `pgid`.
fn group_alive(pgid: libc::pid_t) -> bool {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return false;
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .any(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some(close) = stat.rfind(')') else {
                return false;
            };
            let mut fields = stat[close + 1..].split_whitespace();
            let state = fields.next();
            let _ppid = fields.next();
            let pgrp = fields.next().and_then(|p| p.parse::<libc::pid_t>().ok());
            pgrp == Some(pgid) && state != Some("Z") && state != Some("X")
        })
}

pub(crate) fn lock(m: &Mutex<Option<Child>>) -> std::sync::MutexGuard<'_, Option<Child>> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn find_on_path(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|p| is_executable(p))
}

pub(crate) fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The last lines of the given log files in `dir`, formatted for an error.
pub(crate) fn log_tail(dir: &Path, names: &[&str]) -> String {
    let mut out = String::new();
    for name in names {
        let Ok(text) = std::fs::read_to_string(dir.join(name)) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.is_empty() {
            continue;
        }
        out.push_str(&format!("\n--- last lines of {name} ---"));
        for line in &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..] {
            out.push('\n');
            out.push_str(line);
        }
    }
    out
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_parsing() {
        let dir = TempDir::new().expect("tmp");
        let f = dir.path().join("postmaster.pid");
        std::fs::write(&f, "42\n/d\n1\n5432\n/s\n127.0.0.1\n 1 2\nstarting\n").expect("w");
        assert!(!postmaster_ready(&f, 42));
        std::fs::write(&f, "42\n/d\n1\n5432\n/s\n127.0.0.1\n 1 2\nready   \n").expect("w");
        assert!(postmaster_ready(&f, 42));
        assert!(!postmaster_ready(&f, 43));
    }

    #[test]
    fn starts_answers_restarts_and_keeps_data() {
        let mut pg = match PostgresServer::start() {
            Err(Error::BinaryMissing { .. }) => return,
            r => r.expect("start postgres"),
        };
        assert_eq!(pg.sql("SELECT 1 + 1").expect("sql"), "2");
        pg.sql("CREATE TABLE t (x int); INSERT INTO t VALUES (7)")
            .expect("sql");
        let pid = pg.pid().expect("pid");
        pg.restart().expect("restart");
        assert_ne!(pg.pid(), Some(pid));
        assert_eq!(pg.sql("SELECT x FROM t").expect("sql"), "7");
        assert!(pg.sql("SELECT nope").is_err());
        pg.kill();
        assert!(!pg.is_running());
        assert!(pg.sql("SELECT 1").is_err());
    }
}
