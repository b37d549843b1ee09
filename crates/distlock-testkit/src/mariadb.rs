//! A real MariaDB server (`mariadbd`) child process for tests.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::postgres::{
    cache_key, copy_dir, find_on_path, is_executable, kill_group_and_reap, lock, log_tail,
    percent_encode, stop_gracefully, template, version_of, Attempt,
};
use crate::{spawn, try_free_port, Error, Result, TempDir};

/// Environment variable naming the `mariadbd` (or `mysqld`) binary to run: a name looked up
/// on `PATH` or a path. Unset: `mariadbd` from `PATH`, then `/usr/sbin`.
pub const MARIADB_SERVER_ENV: &str = "DLOCK_MARIADB_SERVER";

const PACKAGE: &str = "mariadb-server";
const USER: &str = "dlock";
const PASSWORD: &str = "dlock-test-pw";
const DATABASE: &str = "dlock";
const START_ATTEMPTS: usize = 5;
const RESTART_ATTEMPTS: usize = 20;
const RESTART_BACKOFF: Duration = Duration::from_millis(100);
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const READY_POLL: Duration = Duration::from_millis(20);
const LOGS: &[&str] = &["mariadb.err", "stderr.log"];

/// A MariaDB server on a free `127.0.0.1` port, in its own temp dir, with a unix socket there.
///
/// Made for speed: no binary log, a 16 MB buffer pool, small redo log, commits written but
/// not flushed (they survive a killed server, not a crashed OS).
/// It has a user [`user`](Self::user)`@'%'` with password [`password`](Self::password) and
/// all privileges on the database [`database`](Self::database); root connects through the
/// unix socket without a password (used by [`sql`](Self::sql)). Grant tables are on, so
/// wrong passwords are refused for real.
///
/// [`restart`](Self::restart) keeps the data (InnoDB recovers). Killed and its dir removed
/// on drop.
#[derive(Debug)]
pub struct MariaDbServer {
    bins: MyBins,
    port: u16,
    child: Mutex<Option<Child>>,
    dir: TempDir,
}

#[derive(Debug, Clone)]
struct MyBins {
    server: PathBuf,
    install_db: PathBuf,
    client: PathBuf,
}

impl MariaDbServer {
    /// Initializes a data dir and starts the server on a free port.
    ///
    /// Returns [`Error::BinaryMissing`] (naming the Debian package `mariadb-server`) if the
    /// binaries cannot be found.
    pub fn start() -> Result<Self> {
        let bins = find_bins()?;
        let dir = TempDir::with_prefix("dlock-mariadb")?;
        let key = cache_key(
            "mariadb",
            &[
                &bins.server.display().to_string(),
                &version_of(&bins.server),
                &is_root().to_string(),
            ],
        );
        match template(&key, |tmp| fresh_datadir(&bins, tmp))? {
            Some(tpl) => copy_dir(&tpl.join("data"), &dir.path().join("data"))?,
            None => fresh_datadir(&bins, dir.path())?,
        }
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = try_free_port()?;
            match launch(&bins, dir.path(), port) {
                Ok(child) => {
                    let server = MariaDbServer {
                        bins,
                        port,
                        child: Mutex::new(Some(child)),
                        dir,
                    };
                    server.sql(&format!("USE {DATABASE}; SELECT 1"))?;
                    return Ok(server);
                }
                Err(Attempt::Retry(e)) => last = Some(e),
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Start {
            what: "mariadbd".into(),
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

    /// The user tests connect as.
    pub fn user(&self) -> &'static str {
        USER
    }

    /// The password of [`user`](Self::user).
    pub fn password(&self) -> &'static str {
        PASSWORD
    }

    /// The database [`user`](Self::user) has all privileges on.
    pub fn database(&self) -> &'static str {
        DATABASE
    }

    /// `mysql://dlock:PASSWORD@127.0.0.1:PORT/dlock`.
    pub fn url(&self) -> String {
        self.url_with_password(PASSWORD)
    }

    /// [`url`](Self::url) with another password (percent-encoded), e.g. a wrong one.
    pub fn url_with_password(&self, password: &str) -> String {
        format!(
            "mysql://{USER}:{}@127.0.0.1:{}/{DATABASE}",
            percent_encode(password),
            self.port
        )
    }

    /// The temp dir: `data/`, the socket `mysqld.sock`, `mariadb.err`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's unix socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("mysqld.sock")
    }

    /// The server's pid, or `None` after [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        lock(&self.child).as_ref().map(Child::id)
    }

    /// Whether the server runs (a paused one counts).
    pub fn is_running(&self) -> bool {
        match lock(&self.child).as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILLs the server and reaps it. Idempotent.
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

    /// Freezes the server (SIGSTOP).
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
    }

    /// Resumes a [paused](Self::pause) server.
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
    }

    /// Kills the server if running and starts it again on the same port with the same data.
    /// On error the server is left stopped.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        let mut last = None;
        for attempt in 0..RESTART_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(RESTART_BACKOFF);
            }
            match launch(&self.bins, self.dir.path(), self.port) {
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

    /// Runs SQL (several statements allowed, `;`-separated) as root through the unix socket
    /// and returns the output tab-separated, without column names (one row per line,
    /// trimmed). A failing statement is an [`Error::Io`] carrying the client's message.
    pub fn sql(&self, sql: &str) -> Result<String> {
        client_sql(&self.bins, &self.socket(), sql)
    }

    fn signal(&mut self, sig: libc::c_int) {
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

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn describe(port: u16) -> String {
    format!("mariadbd on 127.0.0.1:{port}")
}

/// Makes a ready-to-copy data dir in `dir/data`: system tables, the tests' user and
/// database, then a clean shutdown.
fn fresh_datadir(bins: &MyBins, dir: &Path) -> Result<()> {
    install_db(bins, dir)?;
    let mut last = None;
    for _ in 0..START_ATTEMPTS {
        let port = try_free_port()?;
        match launch(bins, dir, port) {
            Ok(child) => {
                let r = client_sql(
                    bins,
                    &dir.join("mysqld.sock"),
                    &format!(
                        "CREATE DATABASE {DATABASE}; \
                         CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'; \
                         GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{USER}'@'%'"
                    ),
                );
                stop_gracefully(child, libc::SIGTERM);
                return r.map(|_| ());
            }
            Err(Attempt::Retry(e)) => last = Some(e),
            Err(Attempt::Fatal(e)) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::Start {
        what: "mariadbd".into(),
        detail: "no start attempt was made".into(),
    }))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn find_bins() -> Result<MyBins> {
    let missing = |binary: &str, package: &str| Error::BinaryMissing {
        binary: binary.into(),
        package: package.into(),
    };
    let server = match std::env::var(MARIADB_SERVER_ENV) {
        Ok(b) if b.contains('/') => {
            let p = PathBuf::from(&b);
            if !is_executable(&p) {
                return Err(missing(&b, PACKAGE));
            }
            p
        }
        Ok(b) if !b.is_empty() => find_on_path(&b).ok_or_else(|| missing(&b, PACKAGE))?,
        _ => ["mariadbd", "mysqld"]
            .iter()
            .find_map(|b| {
                find_on_path(b).or_else(|| {
                    let p = Path::new("/usr/sbin").join(b);
                    is_executable(&p).then_some(p)
                })
            })
            .ok_or_else(|| missing("mariadbd", PACKAGE))?,
    };
    let install_db = ["mariadb-install-db", "mysql_install_db"]
        .iter()
        .find_map(|b| find_on_path(b))
        .ok_or_else(|| missing("mariadb-install-db", PACKAGE))?;
    let client = ["mariadb", "mysql"]
        .iter()
        .find_map(|b| find_on_path(b))
        .ok_or_else(|| missing("mariadb", "mariadb-client"))?;
    Ok(MyBins {
        server,
        install_db,
        client,
    })
}

/// Server options shared by `mariadb-install-db` and the server itself. Each server gets its
/// own tmpdir: concurrent servers sharing `/tmp` collide on temporary table names.
fn common_args(dir: &Path) -> Vec<String> {
    let _ = std::fs::create_dir_all(dir.join("tmp"));
    let mut args = vec![
        "--no-defaults".to_string(),
        format!("--datadir={}", dir.join("data").display()),
        format!("--tmpdir={}", dir.join("tmp").display()),
        "--innodb-buffer-pool-size=16M".into(),
        "--innodb-log-file-size=4M".into(),
        "--skip-name-resolve".into(),
    ];
    if is_root() {
        args.push("--user=root".into());
    }
    args
}

fn install_db(bins: &MyBins, dir: &Path) -> Result<()> {
    let out = Command::new(&bins.install_db)
        .args(common_args(dir))
        .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                Error::BinaryMissing {
                    binary: bins.install_db.display().to_string(),
                    package: PACKAGE.into(),
                }
            } else {
                Error::Io(e)
            }
        })?;
    if !out.status.success() {
        return Err(Error::Start {
            what: "mariadb-install-db".into(),
            detail: format!(
                "failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}

fn launch(bins: &MyBins, dir: &Path, port: u16) -> std::result::Result<Child, Attempt> {
    let io_fatal = |e: io::Error| Attempt::Fatal(Error::Io(e));
    let stderr = File::options()
        .create(true)
        .append(true)
        .open(dir.join("stderr.log"))
        .map_err(io_fatal)?;
    let socket = dir.join("mysqld.sock");
    let mut cmd = Command::new(&bins.server);
    // --no-defaults must come first.
    cmd.args(common_args(dir))
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--port={port}"))
        .arg(format!("--pid-file={}", dir.join("mariadbd.pid").display()))
        .arg(format!("--log-error={}", dir.join("mariadb.err").display()))
        .args([
            "--bind-address=127.0.0.1",
            "--skip-log-bin",
            "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=500",
            "--performance-schema=OFF",
            "--skip-host-cache",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let mut child = match spawn::spawn(cmd) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Attempt::Fatal(Error::BinaryMissing {
                binary: bins.server.display().to_string(),
                package: PACKAGE.into(),
            }))
        }
        Err(e) => return Err(io_fatal(e)),
    };
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => {
                return Err(Attempt::Retry(Error::Start {
                    what: describe(port),
                    detail: format!("process exited early ({status}){}", log_tail(dir, LOGS)),
                }));
            }
            Err(e) => {
                kill_group_and_reap(child);
                return Err(io_fatal(e));
            }
        }
        // The socket lives in our temp dir, so whoever answers on it is our child; check the
        // TCP port too (it could be taken by another process).
        if socket.exists() && client_sql(bins, &socket, "SELECT 1").is_ok() {
            if std::net::TcpStream::connect_timeout(
                &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                Duration::from_millis(500),
            )
            .is_ok()
            {
                return Ok(child);
            }
            kill_group_and_reap(child);
            return Err(Attempt::Retry(Error::Start {
                what: describe(port),
                detail: format!("TCP port not reachable{}", log_tail(dir, LOGS)),
            }));
        }
        if start.elapsed() >= READY_TIMEOUT {
            kill_group_and_reap(child);
            return Err(Attempt::Fatal(Error::Start {
                what: describe(port),
                detail: format!("not ready after {READY_TIMEOUT:?}{}", log_tail(dir, LOGS)),
            }));
        }
        std::thread::sleep(READY_POLL);
    }
}

fn client_sql(bins: &MyBins, socket: &Path, sql: &str) -> Result<String> {
    let out = Command::new(&bins.client)
        .arg("--no-defaults")
        .arg(format!("--socket={}", socket.display()))
        .args(["-u", "root", "-N", "-B", "--connect-timeout=2", "-e", sql])
        .env_remove("MYSQL_PWD")
        .env_remove("MYSQL_HOST")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                Error::BinaryMissing {
                    binary: bins.client.display().to_string(),
                    package: "mariadb-client".into(),
                }
            } else {
                Error::Io(e)
            }
        })?;
    if !out.status.success() {
        return Err(Error::Io(io::Error::other(format!(
            "mariadb client failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_restarts_and_keeps_data() {
        let mut db = match MariaDbServer::start() {
            Err(Error::BinaryMissing { .. }) => return,
            r => r.expect("start mariadbd"),
        };
        assert_eq!(db.sql("SELECT 1 + 1").expect("sql"), "2");
        db.sql("CREATE TABLE dlock.t (x int) ENGINE=InnoDB; INSERT INTO dlock.t VALUES (7)")
            .expect("sql");
        let pid = db.pid().expect("pid");
        db.restart().expect("restart");
        assert_ne!(db.pid(), Some(pid));
        assert_eq!(db.sql("SELECT x FROM dlock.t").expect("sql"), "7");
        assert!(db.sql("SELECT nope").is_err());
        db.kill();
        assert!(!db.is_running());
    }
}
