//! A real MariaDB server (`mariadbd`) child process for tests.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{Ready, ServerProcess, ServerSpec};
use crate::spawn::{find_on_path, is_executable, run, run_setup};
use crate::template::{prepared_dir, version_of, DATABASE, PASSWORD, USER};
use crate::{Error, Result, TestCerts};

/// Environment variable naming the `mariadbd` (or `mysqld`) binary to run: a name looked up
/// on `PATH` or a path. Unset: `mariadbd` from `PATH`, then `/usr/sbin`.
pub const MARIADB_SERVER_ENV: &str = "DLOCK_MARIADB_SERVER";

const PACKAGE: &str = "mariadb-server";
/// The subdirectory of a TLS server's dir holding its copies of the CA, certificate and key.
const TLS_DIR: &str = "tls";
/// The login of a TLS server that must connect over TLS (`REQUIRE SSL`).
const SSL_USER: &str = "dlock_ssl";
/// The login of a TLS server that must show a client certificate signed by the test CA
/// (`REQUIRE X509`).
const X509_USER: &str = "dlock_x509";

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
///
/// [`start_tls`](Self::start_tls) starts one with TLS on.
#[derive(Debug)]
pub struct MariaDbServer {
    bins: MyBins,
    process: ServerProcess,
    tls: bool,
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
        Self::start_with(None)
    }

    /// Like [`start`](Self::start), with TLS on: the server presents `certs`' server
    /// certificate (valid for `127.0.0.1` and `localhost`, signed by
    /// [`certs.ca()`](TestCerts::ca)), checks client certificates against that CA, and
    /// refuses unencrypted TCP connections (`require_secure_transport`; root's unix socket
    /// still works). Besides [`user`](Self::user) it has two logins with the same password
    /// and privileges: [`ssl_user`](Self::ssl_user) (`REQUIRE SSL`) and [`x509_user`](Self::x509_user)
    /// (`REQUIRE X509`: a client certificate signed by the CA, e.g.
    /// [`certs.client("dlock_x509")`](TestCerts::client)).
    ///
    /// The server keeps copies of the files in its dir ([`tls_ca`](Self::tls_ca) is the
    /// CA's), so `certs` may be dropped.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_tls(certs: &TestCerts) -> Result<Self> {
        Self::start_with(Some(certs))
    }

    fn start_with(certs: Option<&TestCerts>) -> Result<Self> {
        let bins = find_bins()?;
        let parts = [
            bins.server.display().to_string(),
            version_of(&bins.server),
            is_root().to_string(),
        ];
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let dir = prepared_dir("dlock-mariadb", &parts, None, |d| fresh_datadir(&bins, d))?;
        if let Some(certs) = certs {
            let tls = dir.path().join(TLS_DIR);
            std::fs::create_dir_all(&tls)?;
            std::fs::copy(certs.ca(), tls.join("ca.pem"))?;
            std::fs::copy(certs.cert(), tls.join("server.pem"))?;
            std::fs::copy(certs.key(), tls.join("server.key"))?;
        }
        let tls = certs.is_some();
        let server = MariaDbServer {
            process: ServerProcess::start(spec(&bins, tls), dir)?,
            bins,
            tls,
        };
        server.sql(&format!("USE {DATABASE}; SELECT 1"))?;
        if tls {
            let mut sql = String::new();
            for (user, require) in [(SSL_USER, "SSL"), (X509_USER, "X509")] {
                sql.push_str(&format!(
                    "CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY '{PASSWORD}' \
                     REQUIRE {require}; \
                     GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{user}'@'%'; "
                ));
            }
            server.sql(&sql)?;
        }
        Ok(server)
    }

    /// A login of a [`start_tls`](Self::start_tls) server that must connect over TLS
    /// (`REQUIRE SSL`), with [`password`](Self::password).
    pub fn ssl_user(&self) -> &'static str {
        SSL_USER
    }

    /// A login of a [`start_tls`](Self::start_tls) server that must present a client
    /// certificate signed by the test CA (`REQUIRE X509`), with [`password`](Self::password).
    pub fn x509_user(&self) -> &'static str {
        X509_USER
    }

    /// The copy of the test CA's certificate a server of [`start_tls`](Self::start_tls)
    /// trusts and whose server certificate it signed (it lives as long as the server);
    /// `None` for a server without TLS.
    pub fn tls_ca(&self) -> Option<PathBuf> {
        self.tls.then(|| self.dir().join(TLS_DIR).join("ca.pem"))
    }

    crate::process::process_methods!();
    crate::template::sql_account_methods!("mysql");

    /// The server's unix socket.
    pub fn socket(&self) -> PathBuf {
        self.dir().join("mysqld.sock")
    }

    /// Runs SQL (several statements allowed, `;`-separated) as root through the unix socket
    /// and returns the output tab-separated, without column names (one row per line,
    /// trimmed). A failing statement is an [`Error::Io`] carrying the client's message.
    pub fn sql(&self, sql: &str) -> Result<String> {
        client_sql(&self.bins, &self.socket(), sql, ADMIN_CONNECT_TIMEOUT)
    }
}

/// Makes a ready-to-copy data dir in `dir/data`: system tables, the tests' user and
/// database, then a clean shutdown.
fn fresh_datadir(bins: &MyBins, dir: &Path) -> Result<()> {
    install_db(bins, dir)?;
    let server = ServerProcess::start_in(spec(bins, false), dir)?;
    let r = client_sql(
        bins,
        &dir.join("mysqld.sock"),
        &format!(
            "CREATE DATABASE {DATABASE}; \
             CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'; \
             GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{USER}'@'%'"
        ),
        ADMIN_CONNECT_TIMEOUT,
    );
    server.stop(libc::SIGTERM, Duration::from_secs(30));
    r.map(|_| ())
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
    let mut cmd = Command::new(&bins.install_db);
    cmd.args(common_args(dir))
        .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
        .current_dir(dir);
    run_setup(cmd, PACKAGE, "mariadb-install-db")
}

/// `mariadbd` in `dir/data` on a port and on the socket `dir/mysqld.sock`, ready once root
/// gets an answer on the socket (which lives in our dir, so whoever answers is our child) and
/// the TCP port accepts connections. With `tls`, TLS on with the files in `dir/tls` and
/// unencrypted TCP refused.
fn spec(bins: &MyBins, tls: bool) -> ServerSpec {
    let server = bins.server.clone();
    let probe_bins = bins.clone();
    ServerSpec::new("mariadbd", PACKAGE, move |dir, port| {
        let mut cmd = Command::new(&server);
        // --no-defaults must come first.
        cmd.args(common_args(dir))
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
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
            ]);
        if tls {
            let f = |name: &str| dir.join(TLS_DIR).join(name).display().to_string();
            cmd.arg(format!("--ssl-ca={}", f("ca.pem")))
                .arg(format!("--ssl-cert={}", f("server.pem")))
                .arg(format!("--ssl-key={}", f("server.key")))
                .arg("--require-secure-transport=ON");
        }
        cmd
    })
    .ready(move |c| {
        let socket = c.dir.join("mysqld.sock");
        if !socket.exists() || client_sql(&probe_bins, &socket, "SELECT 1", 2).is_err() {
            return Ready::NotYet;
        }
        let tcp = SocketAddr::from((Ipv4Addr::LOCALHOST, c.port));
        match std::net::TcpStream::connect_timeout(&tcp, Duration::from_millis(500)) {
            Ok(_) => Ready::Yes,
            Err(e) => Ready::Foreign(format!("TCP port not reachable: {e}")),
        }
    })
    .output("stderr.log")
    .logs(&["mariadb.err"])
    .ready_timeout(Duration::from_secs(30), Duration::from_millis(20))
    .attempts(5, 20, Duration::from_millis(100))
}

/// How long (seconds) the administrator's client may wait for a running server's greeting.
/// Only a live but slow server makes it wait (a stopped one refuses at once): on a loaded
/// 2-core machine, a probe connecting over and over beside the MariaDB tests saw greetings take
/// 1.4 s and 2.0 s, and with 2 s a test that only read a table failed ("reading initial
/// communication packet", error 110).
const ADMIN_CONNECT_TIMEOUT: u32 = 15;

/// Runs `sql` as root through `socket`, waiting at most `connect_timeout` seconds for the
/// server's greeting.
fn client_sql(bins: &MyBins, socket: &Path, sql: &str, connect_timeout: u32) -> Result<String> {
    let mut cmd = Command::new(&bins.client);
    cmd.arg("--no-defaults")
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--connect-timeout={connect_timeout}"))
        .args(["-u", "root", "-N", "-B", "-e", sql])
        .env_remove("MYSQL_PWD")
        .env_remove("MYSQL_HOST");
    let out = run(cmd, "mariadb-client")?;
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
    fn tls_server_has_ssl_on_and_refuses_plain_tcp() {
        let certs = TestCerts::generate().expect("certs");
        let db = match MariaDbServer::start_tls(&certs) {
            Ok(db) => db,
            Err(Error::BinaryMissing { .. }) => return,
            Err(e) => panic!("{e}"),
        };
        drop(certs);
        let ca = db.tls_ca().expect("the CA's copy");
        assert!(ca.exists(), "{}", ca.display());
        assert_eq!(
            db.sql("SELECT @@have_ssl, @@require_secure_transport")
                .expect("sql"),
            "YES\t1"
        );
        let users = db
            .sql("SELECT user, ssl_type FROM mysql.user WHERE user LIKE 'dlock%' ORDER BY user")
            .expect("users");
        assert_eq!(
            users, "dlock\t\ndlock_ssl\tANY\ndlock_x509\tX509",
            "{users}"
        );
    }

    crate::template::durable_sql_server_test!(
        MariaDbServer,
        "CREATE TABLE dlock.t (x int) ENGINE=InnoDB",
        "dlock.t"
    );
}
