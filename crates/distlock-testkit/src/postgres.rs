//! A real PostgreSQL server (`postgres`) child process for tests.
//!
//! The cluster is made with `initdb` in a fresh temp dir, the server listens on a free
//! `127.0.0.1` port and on a unix socket inside that dir, and everything runs as the
//! `postgres` OS user when the tests run as root (PostgreSQL refuses to run as root).
//! Local (unix socket) connections are trusted; TCP connections need a password, so tests
//! of wrong passwords are real.
//!
//! [`PostgresServer::start_tls`] and [`PostgresServer::start_tls_client_certs`] start one
//! with `ssl=on` and a certificate of the testkit's throwaway CA ([`TestCerts`]); TCP
//! connections must then use TLS (`hostssl` lines only in its `pg_hba.conf`).

use std::ffi::CString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{Ready, ServerProcess, ServerSpec};
use crate::spawn::{find_on_path, is_executable, run, run_setup};
use crate::template::{prepared_dir, version_of, DATABASE, PASSWORD, USER};
use crate::{Error, Result, TestCerts};

/// Environment variable naming the directory holding `initdb`, `postgres` and `psql`
/// (e.g. `/usr/lib/postgresql/16/bin`). Unset: `PATH`, then the newest
/// `/usr/lib/postgresql/*/bin`.
pub const POSTGRES_BIN_DIR_ENV: &str = "DLOCK_POSTGRES_BIN_DIR";

const PACKAGE: &str = "postgresql";
/// The superuser's password over TCP (locally it is trusted).
const ADMIN_PASSWORD: &str = "dlock-admin-pw";
/// The directory (inside the server's dir) of a TLS server's certificates and `pg_hba.conf`.
const TLS_DIR: &str = "tls";

/// How a TLS server checks the clients of the test role over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientAuth {
    /// `hostssl … md5`: a password, over TLS.
    Password,
    /// `hostssl … cert`: a client certificate signed by the test CA whose common name is the
    /// role's name; no password.
    Cert,
}

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
    process: ServerProcess,
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
        Self::start_with(None)
    }

    /// Like [`start`](Self::start), with `ssl=on`: the server presents `certs`'
    /// [server certificate](TestCerts::cert) (for `127.0.0.1` and `localhost`, signed by
    /// [`certs.ca()`](TestCerts::ca)), and TCP connections must use TLS (a plain one is refused
    /// by `pg_hba.conf`: "no encryption"); they still log in with a password. Local (unix
    /// socket) connections stay trusted. The certificates are copied into the server's dir
    /// ([`tls_ca`](Self::tls_ca) is the CA's copy), so `certs` may be dropped.
    ///
    /// # Errors
    /// As [`start`](Self::start), and [`Error::Io`] when the certificates cannot be copied.
    pub fn start_tls(certs: &TestCerts) -> Result<Self> {
        Self::start_with(Some((certs, ClientAuth::Password)))
    }

    /// Like [`start_tls`](Self::start_tls), but the test role [`user`](Self::user) logs in
    /// over TCP with a client certificate instead of a password (`hostssl … cert`): one signed
    /// by `certs`' CA whose common name is the role's name, e.g.
    /// [`certs.client(server.user())`](TestCerts::client). The superuser (`admin_url`) still
    /// uses its password.
    ///
    /// # Errors
    /// As [`start_tls`](Self::start_tls).
    pub fn start_tls_client_certs(certs: &TestCerts) -> Result<Self> {
        Self::start_with(Some((certs, ClientAuth::Cert)))
    }

    fn start_with(tls: Option<(&TestCerts, ClientAuth)>) -> Result<Self> {
        let bins = find_pg_bins()?;
        let run_as = run_as_postgres()?;
        let parts = [
            bins.postgres.display().to_string(),
            version_of(&bins.postgres),
            format!("{run_as:?}"),
        ];
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let dir = prepared_dir("dlock-pg", &parts, run_as, |d| {
            fresh_cluster(&bins, run_as, d)
        })?;
        if let Some((certs, auth)) = tls {
            install_tls(dir.path(), certs, auth, run_as)?;
        }
        let server = PostgresServer {
            process: ServerProcess::start(spec(&bins, run_as, tls.is_some()), dir)?,
            bins,
        };
        // Warm up: the first connection to a database loads its catalog caches.
        server.sql("SELECT 1")?;
        Ok(server)
    }

    crate::process::process_methods!();
    crate::template::sql_account_methods!("postgres");

    /// The superuser `postgres` over TCP, in the tests' database.
    pub fn admin_url(&self) -> String {
        format!(
            "postgres://postgres:{ADMIN_PASSWORD}@127.0.0.1:{}/{DATABASE}",
            self.port()
        )
    }

    /// The copy of the test CA's certificate a server of [`start_tls`](Self::start_tls) or
    /// [`start_tls_client_certs`](Self::start_tls_client_certs) uses (it lives as long as the
    /// server); `None` for a server without TLS.
    pub fn tls_ca(&self) -> Option<PathBuf> {
        let ca = self.dir().join(TLS_DIR).join("ca.pem");
        ca.exists().then_some(ca)
    }

    /// The directory of the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.process.dir()
    }

    /// Runs SQL as the superuser in the tests' database (through `psql` on the unix socket)
    /// and returns the output unaligned, tuples only (`a|b` per row, one row per line,
    /// trimmed). A failing statement is an [`Error::Io`] carrying psql's message.
    pub fn sql(&self, sql: &str) -> Result<String> {
        self.psql(DATABASE, &[sql])
    }

    fn psql(&self, db: &str, commands: &[&str]) -> Result<String> {
        psql_at(&self.bins, self.dir(), self.port(), db, commands)
    }
}

/// Makes a ready-to-copy cluster in `dir/data`: initdb, then the roles and the database of
/// the tests, then a clean shutdown.
fn fresh_cluster(bins: &PgBins, run_as: Option<(u32, u32)>, dir: &Path) -> Result<()> {
    initdb(bins, run_as, dir)?;
    let server = ServerProcess::start_in(spec(bins, run_as, false), dir)?;
    let r = psql_at(
        bins,
        dir,
        server.port(),
        "postgres",
        &[
            "SET password_encryption = 'md5'",
            &format!("ALTER ROLE postgres PASSWORD '{ADMIN_PASSWORD}'"),
            &format!("CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'"),
            &format!("CREATE DATABASE {DATABASE} OWNER {USER}"),
        ],
    );
    // SIGINT: fast shutdown, leaving a clean cluster behind.
    server.stop(libc::SIGINT, Duration::from_secs(30));
    r.map(|_| ())
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
    let out = run(cmd, "postgresql-client")?;
    if !out.status.success() {
        return Err(Error::Io(io::Error::other(format!(
            "psql failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
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
        .current_dir(dir);
    if let Some((uid, gid)) = run_as {
        cmd.uid(uid).gid(gid);
    }
    run_setup(cmd, PACKAGE, "initdb")
}

/// Copies the CA, the server certificate and its key into `dir/tls` (owned by the server's
/// user, the key readable by it alone: PostgreSQL refuses a key others can read) and writes
/// the `pg_hba.conf` of a TLS server there: local trusted, TCP over TLS only.
fn install_tls(
    dir: &Path,
    certs: &TestCerts,
    auth: ClientAuth,
    run_as: Option<(u32, u32)>,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tls = dir.join(TLS_DIR);
    std::fs::create_dir_all(&tls)?;
    let user_line = match auth {
        ClientAuth::Password => format!("hostssl all {USER} 127.0.0.1/32 md5"),
        ClientAuth::Cert => format!("hostssl all {USER} 127.0.0.1/32 cert"),
    };
    let hba = format!("local all all trust\n{user_line}\nhostssl all postgres 127.0.0.1/32 md5\n");
    std::fs::write(tls.join("pg_hba.conf"), hba)?;
    std::fs::copy(certs.ca(), tls.join("ca.pem"))?;
    std::fs::copy(certs.cert(), tls.join("server.pem"))?;
    std::fs::copy(certs.key(), tls.join("server.key"))?;
    std::fs::set_permissions(
        tls.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )?;
    if let Some((uid, gid)) = run_as {
        for f in ["", "pg_hba.conf", "ca.pem", "server.pem", "server.key"] {
            std::os::unix::fs::chown(tls.join(f), Some(uid), Some(gid))?;
        }
    }
    Ok(())
}

/// The postmaster in `dir/data` on a port (and a unix socket in `dir`), ready once
/// `postmaster.pid` says so; with `tls`, `ssl=on` with the files of [`install_tls`].
fn spec(bins: &PgBins, run_as: Option<(u32, u32)>, tls: bool) -> ServerSpec {
    let postgres = bins.postgres.clone();
    ServerSpec::new("postgres", PACKAGE, move |dir, port| {
        let mut cmd = Command::new(&postgres);
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
            .env("LC_ALL", "C");
        if tls {
            let file = |name: &str| dir.join(TLS_DIR).join(name).display().to_string();
            for (key, name) in [
                ("ssl_cert_file", "server.pem"),
                ("ssl_key_file", "server.key"),
                ("ssl_ca_file", "ca.pem"),
                ("hba_file", "pg_hba.conf"),
            ] {
                cmd.arg("-c").arg(format!("{key}={}", file(name)));
            }
            cmd.args(["-c", "ssl=on"]);
        }
        if let Some((uid, gid)) = run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    })
    .ready(
        |c| match postmaster_ready(&c.dir.join("data").join("postmaster.pid"), c.pid) {
            true => Ready::Yes,
            false => Ready::NotYet,
        },
    )
    .output("postgres.log")
    .ready_timeout(Duration::from_secs(20), Duration::from_millis(10))
    .attempts(5, 20, Duration::from_millis(100))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_parsing() {
        let dir = tempfile::tempdir().expect("tmp");
        let f = dir.path().join("postmaster.pid");
        std::fs::write(&f, "42\n/d\n1\n5432\n/s\n127.0.0.1\n 1 2\nstarting\n").expect("w");
        assert!(!postmaster_ready(&f, 42));
        std::fs::write(&f, "42\n/d\n1\n5432\n/s\n127.0.0.1\n 1 2\nready   \n").expect("w");
        assert!(postmaster_ready(&f, 42));
        assert!(!postmaster_ready(&f, 43));
    }

    crate::template::durable_sql_server_test!(PostgresServer, "CREATE TABLE t (x int)", "t");

    #[test]
    fn tls_server_has_ssl_on_and_tls_only_hba() {
        let certs = TestCerts::generate().expect("certs");
        let mut db = match PostgresServer::start_tls_client_certs(&certs) {
            Err(Error::BinaryMissing { .. }) => return,
            r => r.expect("start the TLS server"),
        };
        drop(certs);
        assert_eq!(db.sql("SHOW ssl").expect("sql"), "on");
        let rules = db
            .sql("SELECT type || ' ' || auth_method FROM pg_hba_file_rules ORDER BY line_number")
            .expect("hba");
        assert_eq!(rules, "local trust\nhostssl cert\nhostssl md5", "{rules}");
        let ca = db.tls_ca().expect("the CA's copy");
        assert!(std::fs::read_to_string(ca)
            .expect("read")
            .starts_with("-----BEGIN CERTIFICATE-----"));
        db.restart().expect("restart with TLS");
        assert_eq!(db.sql("SHOW ssl").expect("sql"), "on");
    }
}
