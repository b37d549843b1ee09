//! A real `redis-server` child process for tests.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::{Ready, ServerProcess, ServerSpec};
use crate::resp::{Conn, Reply};
use crate::spawn::{percent_encode, resolve_binary};
use crate::{try_free_port, Error, Result};

/// Environment variable that overrides the `redis-server` binary used by
/// [`RedisServer::start`] and [`RedisServer::start_with`]: either a name
/// looked up on `PATH` or a path. Unset or empty means `redis-server`.
pub const REDIS_SERVER_ENV: &str = "DLOCK_REDIS_SERVER";

const DEFAULT_BINARY: &str = "redis-server";
const PACKAGE: &str = "redis-server";
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Options for [`RedisServer::start_with`].
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// Password of the `default` user (`--requirepass`). `None`: no password.
    pub password: Option<String>,
    /// An extra ACL user `(name, password)` with all permissions
    /// (`--user NAME on >PASS ~* &* +@all`).
    pub acl_user: Option<(String, String)>,
    /// Further `redis-server` arguments, appended last
    /// (e.g. `["--enable-debug-command", "yes"]`).
    pub extra_args: Vec<String>,
}

/// A `redis-server` running on a free `127.0.0.1` port in its own temp dir,
/// without persistence (`--save "" --appendonly no`): a [`ServerProcess`].
///
/// Killed (even when paused), reaped, and its temp dir removed on drop.
#[derive(Debug)]
pub struct RedisServer {
    opts: RedisOptions,
    process: ServerProcess,
    /// Certificates and TLS port, for servers made by [`RedisServer::start_tls`].
    tls: Option<(crate::TestCerts, u16)>,
}

impl RedisServer {
    /// Starts `redis-server` with default options on a free port.
    ///
    /// The binary is `redis-server` from `PATH`, or the value of
    /// [`REDIS_SERVER_ENV`] (`DLOCK_REDIS_SERVER`) if set.
    pub fn start() -> Result<Self> {
        Self::start_with(RedisOptions::default())
    }

    /// Starts `redis-server` with `opts` on a free port (binary as in
    /// [`start`](Self::start)).
    pub fn start_with(opts: RedisOptions) -> Result<Self> {
        let binary = match std::env::var(REDIS_SERVER_ENV) {
            Ok(b) if !b.is_empty() => b,
            _ => DEFAULT_BINARY.to_string(),
        };
        Self::start_with_binary(&binary, opts)
    }

    /// Starts the given `redis-server` binary (a name looked up on `PATH`,
    /// or a path containing `/`) with `opts` on a free port.
    ///
    /// Returns [`Error::BinaryMissing`] if the binary does not exist. If the
    /// server exits early (e.g. the port was taken in a race) it is retried
    /// on a new port, up to 5 times; the final failure is an
    /// [`Error::Start`] carrying the tail of the server's log.
    pub fn start_with_binary(binary: &str, opts: RedisOptions) -> Result<Self> {
        let binary = resolve_binary(binary, PACKAGE)?;
        let dir = tempfile::Builder::new()
            .prefix("distlock-redis")
            .tempdir()?;
        let process = ServerProcess::start(spec(binary, &opts), dir)?;
        Ok(RedisServer {
            opts,
            process,
            tls: None,
        })
    }

    /// Starts a replica of `master` (`--replicaof`, default options otherwise) and waits until
    /// the two are linked: the master counts one more connected replica and the replica's link
    /// is up. For tests of `?wait_replicas` and of `dlock doctor`'s replication checks.
    pub fn start_replica_of(master: &RedisServer) -> Result<Self> {
        Self::start_replica_with(master, &[])
    }

    /// [`start_replica_of`](Self::start_replica_of) with further `redis-server` arguments
    /// (e.g. `["--replica-priority", "0"]`: never promoted by Sentinel). The replica of a
    /// master with a password has the same password (and syncs with it).
    ///
    /// # Errors
    /// As [`start_replica_of`](Self::start_replica_of).
    pub fn start_replica_with(master: &RedisServer, extra_args: &[&str]) -> Result<Self> {
        let before = connected_replicas(master)?;
        let mut args: Vec<String> = vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            master.port().to_string(),
        ];
        // A master with a password: the replica has the same one, and uses it to sync.
        if let Some(pw) = &master.opts.password {
            args.extend(["--masterauth".to_string(), pw.clone()]);
        }
        args.extend(extra_args.iter().map(|a| a.to_string()));
        let replica = Self::start_with(RedisOptions {
            password: master.opts.password.clone(),
            extra_args: args,
            ..Default::default()
        })?;
        let t = Instant::now();
        loop {
            let linked = replica
                .command(&["INFO", "replication"])?
                .contains("master_link_status:up");
            if linked && connected_replicas(master)? > before {
                return Ok(replica);
            }
            if t.elapsed() > Duration::from_secs(10) {
                return Err(Error::Start {
                    what: replica.process.describe(),
                    detail: format!(
                        "replica of port {} not linked after {:?}",
                        master.port(),
                        t.elapsed()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts a server that also serves TLS on a second free port, with a fresh test CA.
    /// [`tls_url`](Self::tls_url) is the `rediss://` URL (with `ca_file=` pointing at the CA);
    /// the plain port stays open for [`command`](Self::command).
    pub fn start_tls() -> Result<Self> {
        Self::start_tls_auth(false)
    }

    /// Like [`start_tls`](Self::start_tls), but the server requires a client certificate
    /// signed by the test CA (`--tls-auth-clients yes`). [`tls_url`](Self::tls_url) then has
    /// no client certificate (a connect with it is refused);
    /// [`tls_client_url`](Self::tls_client_url) adds one (`cert=`, `key=`).
    pub fn start_tls_client_certs() -> Result<Self> {
        Self::start_tls_auth(true)
    }

    fn start_tls_auth(auth_clients: bool) -> Result<Self> {
        let certs = crate::TestCerts::generate()?;
        let tls_port = try_free_port()?;
        let mut opts = RedisOptions::default();
        opts.extra_args.extend([
            "--tls-port".to_string(),
            tls_port.to_string(),
            "--tls-cert-file".to_string(),
            certs.cert().display().to_string(),
            "--tls-key-file".to_string(),
            certs.key().display().to_string(),
            "--tls-ca-cert-file".to_string(),
            certs.ca().display().to_string(),
            "--tls-auth-clients".to_string(),
            if auth_clients { "yes" } else { "no" }.to_string(),
        ]);
        let mut server = Self::start_with(opts)?;
        server.tls = Some((certs, tls_port));
        Ok(server)
    }

    crate::process::process_methods!(restart = false);

    /// `rediss://127.0.0.1:TLS_PORT?ca_file=CA` for servers made by
    /// [`start_tls`](Self::start_tls); `None` otherwise.
    pub fn tls_url(&self) -> Option<String> {
        self.tls.as_ref().map(|(certs, port)| {
            format!("rediss://127.0.0.1:{port}?ca_file={}", certs.ca().display())
        })
    }

    /// [`tls_url`](Self::tls_url) with a client certificate signed by the test CA
    /// (`&cert=PATH&key=PATH`, common name `dlock-client`), for servers made by
    /// [`start_tls_client_certs`](Self::start_tls_client_certs) (or [`start_tls`](Self::start_tls));
    /// `None` for servers without TLS.
    ///
    /// # Errors
    /// When the certificate cannot be made or written.
    pub fn tls_client_url(&self) -> Result<Option<String>> {
        let Some((certs, _)) = &self.tls else {
            return Ok(None);
        };
        let (cert, key) = certs.client("dlock-client")?;
        Ok(self
            .tls_url()
            .map(|u| format!("{u}&cert={}&key={}", cert.display(), key.display())))
    }

    /// The test CA of servers made by [`start_tls`](Self::start_tls) and
    /// [`start_tls_client_certs`](Self::start_tls_client_certs).
    pub fn tls_certs(&self) -> Option<&crate::TestCerts> {
        self.tls.as_ref().map(|(c, _)| c)
    }

    /// A connection URL: `redis://127.0.0.1:PORT`, or
    /// `redis://:PASSWORD@127.0.0.1:PORT` when [`RedisOptions::password`] is
    /// set (the password is percent-encoded). The ACL user is not part of the
    /// URL (the `default` user stays usable alongside it).
    pub fn url(&self) -> String {
        match &self.opts.password {
            Some(pw) => format!("redis://:{}@127.0.0.1:{}", percent_encode(pw), self.port()),
            None => format!("redis://127.0.0.1:{}", self.port()),
        }
    }

    /// Kills the server if running and starts a fresh one on the **same
    /// port** with **empty data** (nothing is persisted; a snapshot a replica
    /// wrote is removed first), simulating a restart without persistence.
    /// Retries a few times if the port is briefly busy.
    ///
    /// On error the server is left stopped.
    pub fn restart(&mut self) -> Result<()> {
        self.process.kill();
        let _ = std::fs::remove_file(self.dir().join("dump.rdb"));
        self.process.restart()
    }

    /// Kills the server (`SIGKILL`: a crash, no shutdown save) and starts it again on the
    /// **same port** in the **same directory**: it comes back with the last snapshot a `SAVE`
    /// (or `BGSAVE`) wrote there, and without every write made after it — a stock
    /// redis-server with RDB persistence after a crash. Without a snapshot it comes back
    /// empty. Retries a few times if the port is briefly busy.
    ///
    /// On error the server is left stopped.
    pub fn crash_restart(&mut self) -> Result<()> {
        self.process.restart()
    }

    /// The server's `run_id` (from `INFO server`); changes on every
    /// (re)start.
    pub fn run_id(&self) -> Result<String> {
        let info = self.command_reply(&["INFO", "server"])?;
        info_field(&info, "run_id").ok_or_else(|| {
            Error::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no run_id in INFO reply: {info}"),
            ))
        })
    }

    /// Calls of `cmd` (lower case, e.g. `"evalsha"`) the server has run so far, failed ones
    /// included (`INFO commandstats`; 0 before the first call).
    pub fn command_calls(&self, cmd: &str) -> Result<u64> {
        let info = self.command(&["INFO", "commandstats"])?;
        let key = format!("cmdstat_{cmd}:calls=");
        Ok(info
            .lines()
            .find_map(|l| l.trim().strip_prefix(key.as_str()))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// Sends one command over a fresh raw connection and returns the reply
    /// rendered as text (see [`Reply`]'s `Display`):
    /// simple strings as-is (`"OK"`, `"PONG"`), errors with a leading `-`
    /// (`"-NOAUTH Authentication required."`), integers in decimal, bulk
    /// strings as (lossy UTF-8) text, nil as `"(nil)"`, arrays as their
    /// elements joined by `\n`.
    ///
    /// Error *replies* are returned as `Ok("-...")`; `Err` means the server
    /// could not be reached, timed out (2 s), spoke garbage, or rejected the
    /// authentication. Authentication happens first when configured:
    /// `AUTH password` if [`RedisOptions::password`] is set, else
    /// `AUTH user password` if [`RedisOptions::acl_user`] is set.
    pub fn command(&self, args: &[&str]) -> Result<String> {
        Ok(self.command_reply(args)?.to_string())
    }

    /// Like [`command`](Self::command) but returns the structured [`Reply`].
    pub fn command_reply(&self, args: &[&str]) -> Result<Reply> {
        self.command_reply_timeout(args, COMMAND_TIMEOUT)
    }

    /// Calls of `command` (lower case, e.g. `evalsha`, or `hset` for the calls scripts make)
    /// since the server started or its last `CONFIG RESETSTAT`, from `INFO commandstats`; 0 for
    /// a command it has not run.
    pub fn calls(&self, command: &str) -> Result<u64> {
        let stats = self.command(&["INFO", "commandstats"])?;
        let prefix = format!("cmdstat_{command}:calls=");
        Ok(stats
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// A spy on the messages published on this server: a connection of its own subscribed to
    /// the channels matching `pattern` (`PSUBSCRIBE`), for tests that check what a script
    /// published and where.
    pub fn spy(&self, pattern: &str) -> Result<Spy> {
        let mut conn = Conn::connect(self.addr(), COMMAND_TIMEOUT)?;
        authenticate(&mut conn, &self.opts)?;
        let reply = conn.call(&["PSUBSCRIBE", pattern])?;
        if reply.is_error() {
            return Err(protocol_error(format!("PSUBSCRIBE {pattern}: {reply}")));
        }
        Ok(Spy { conn })
    }

    /// Like [`command_reply`](Self::command_reply) with an explicit timeout
    /// for connecting and for each read/write.
    pub fn command_reply_timeout(&self, args: &[&str], timeout: Duration) -> Result<Reply> {
        let mut conn = Conn::connect(self.addr(), timeout)?;
        authenticate(&mut conn, &self.opts)?;
        Ok(conn.call(args)?)
    }
}

/// An unexpected reply, as the kit's I/O error (the enum's home for protocol errors).
fn protocol_error(what: String) -> Error {
    Error::Io(io::Error::new(io::ErrorKind::InvalidData, what))
}

/// A pattern subscription on one server: see [`RedisServer::spy`].
pub struct Spy {
    conn: Conn,
}

impl Spy {
    /// Every message published on a matching channel since the spy started (or since the
    /// last call), as `(channel, payload)`, oldest first. Deterministic: a `PING` in
    /// subscribed mode is answered after every message published before it.
    pub fn drain(&mut self) -> Result<Vec<(String, String)>> {
        self.conn.send(&["PING"])?;
        let mut seen = Vec::new();
        loop {
            let Reply::Array(Some(items)) = self.conn.read()? else {
                return Err(protocol_error(
                    "the spy got a reply that is not a message".into(),
                ));
            };
            let text: Vec<String> = items.iter().map(ToString::to_string).collect();
            match text.first().map(String::as_str) {
                Some("pong") => return Ok(seen),
                Some("pmessage") if text.len() == 4 => {
                    seen.push((text[2].clone(), text[3].clone()));
                }
                _ => {
                    return Err(protocol_error(format!(
                        "the spy got an unexpected push: {text:?}"
                    )))
                }
            }
        }
    }
}

/// How to run `binary` with `opts`: in its dir, on the given port, ready once it answers
/// PING as our child.
fn spec(binary: PathBuf, opts: &RedisOptions) -> ServerSpec {
    let (o, probe_opts) = (opts.clone(), opts.clone());
    ServerSpec::new("redis-server", PACKAGE, move |dir, port| {
        let mut cmd = Command::new(&binary);
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(["--daemonize", "no"]);
        if let Some(pw) = &o.password {
            cmd.arg("--requirepass").arg(pw);
        }
        if let Some((user, pass)) = &o.acl_user {
            cmd.arg("--user")
                .arg(user)
                .arg("on")
                .arg(format!(">{pass}"))
                .args(["~*", "&*", "+@all"]);
        }
        cmd.args(&o.extra_args);
        cmd
    })
    .ready(move |c| {
        probe(
            SocketAddr::from(([127, 0, 0, 1], c.port)),
            &probe_opts,
            c.pid,
        )
    })
    .logs(&["redis.log"])
    .ready_timeout(READY_TIMEOUT, Duration::from_millis(10))
    .attempts(5, 10, Duration::from_millis(50))
}

/// PING until `+PONG` or `-NOAUTH`, then check via `INFO server` that the
/// answering process is our child (and not another server that owns the port).
fn probe(addr: SocketAddr, opts: &RedisOptions, pid: u32) -> Ready {
    let Ok(mut conn) = Conn::connect(addr, PROBE_TIMEOUT) else {
        return Ready::NotYet;
    };
    match conn.call(&["PING"]) {
        Ok(Reply::Simple(s)) if s == "PONG" => {}
        Ok(Reply::Error(e)) if e.starts_with("NOAUTH") => {}
        _ => return Ready::NotYet,
    }
    if authenticate(&mut conn, opts).is_err() {
        return Ready::Foreign("authentication failed".into());
    }
    match conn.call(&["INFO", "server"]) {
        Ok(info) => match info_field(&info, "process_id") {
            Some(p) if p == pid.to_string() => Ready::Yes,
            Some(p) => Ready::Foreign(format!("process_id {p}, expected {pid}")),
            None => Ready::NotYet,
        },
        Err(_) => Ready::NotYet,
    }
}

fn authenticate(conn: &mut Conn, opts: &RedisOptions) -> Result<()> {
    let reply = if let Some(pw) = &opts.password {
        conn.call(&["AUTH", pw.as_str()])?
    } else if let Some((user, pw)) = &opts.acl_user {
        conn.call(&["AUTH", user.as_str(), pw.as_str()])?
    } else {
        return Ok(());
    };
    match reply {
        Reply::Error(e) => Err(Error::Io(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("AUTH failed: {e}"),
        ))),
        _ => Ok(()),
    }
}

/// Extracts `field:value` from an `INFO` reply.
fn info_field(info: &Reply, field: &str) -> Option<String> {
    let Reply::Bulk(Some(bytes)) = info else {
        return None;
    };
    let text = String::from_utf8_lossy(bytes);
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k == field).then(|| v.trim().to_string())
    })
}

/// `connected_slaves` from the server's `INFO replication`.
fn connected_replicas(server: &RedisServer) -> Result<u32> {
    let info = server.command(&["INFO", "replication"])?;
    Ok(info
        .lines()
        .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_field_parsing() {
        let info = Reply::Bulk(Some(
            b"# Server\r\nrun_id:abc\r\nprocess_id:42\r\n".to_vec(),
        ));
        assert_eq!(info_field(&info, "run_id").as_deref(), Some("abc"));
        assert_eq!(info_field(&info, "process_id").as_deref(), Some("42"));
        assert_eq!(info_field(&info, "nope"), None);
    }
}
