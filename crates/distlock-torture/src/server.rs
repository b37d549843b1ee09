//! The server nemeses: a lock server the user named by pid (`--server-pid`) paused or
//! crashed and brought back, and a Sentinel failover.
//!
//! dlock never starts a server itself: a crash (`SIGKILL`) is followed by waiting for the
//! server's supervisor (systemd's `Restart=`, a container's restart policy, a test) to start it
//! again on the same port; the process that then listens there is the server from then on.
//! Linux only: the ports a process listens on are read from `/proc`.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

/// How long a crashed server may take to be listening again.
pub const RESTART_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a failover the sentinels accepted may take to name a new master.
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// A server process the user named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Its pid now.
    pub pid: u32,
    /// The TCP ports it listens on (found when it was named).
    pub ports: Vec<u16>,
}

impl Server {
    /// The server with pid `pid`: it must exist, be ours to signal and listen on a TCP port.
    ///
    /// # Errors
    /// A message saying which of these it is not.
    pub fn named(pid: u32) -> Result<Server, String> {
        signal(pid, 0).map_err(|e| format!("--server-pid {pid}: cannot signal it: {e}"))?;
        let ports = ports_of(pid);
        if ports.is_empty() {
            return Err(format!(
                "--server-pid {pid}: the process listens on no TCP port (name the lock server's pid)"
            ));
        }
        Ok(Server { pid, ports })
    }

    /// Stops the server (`SIGSTOP`) for `d`, then resumes it.
    ///
    /// # Errors
    /// When it cannot be signalled.
    pub fn pause(&self, d: Duration) -> Result<(), String> {
        signal(self.pid, libc::SIGSTOP).map_err(|e| format!("cannot pause the server: {e}"))?;
        thread::sleep(d);
        signal(self.pid, libc::SIGCONT).map_err(|e| format!("cannot resume the server: {e}"))
    }

    /// Crashes the server (`SIGKILL`) and waits until a process listens on its first port
    /// again (its supervisor restarted it), at most `timeout`; that process is the server
    /// from then on.
    ///
    /// # Errors
    /// When it cannot be signalled, or nothing listens again in time.
    pub fn crash_and_wait(&mut self, timeout: Duration) -> Result<(), String> {
        let old = self.pid;
        signal(old, libc::SIGKILL).map_err(|e| format!("cannot kill the server: {e}"))?;
        let end = Instant::now() + timeout;
        let port = self.ports[0];
        loop {
            // The old process may linger as a zombie of its parent: it listens on nothing.
            if let Some(pid) = listener_of(port).filter(|&p| p != old) {
                self.pid = pid;
                return Ok(());
            }
            if Instant::now() >= end {
                return Err(format!(
                    "the server (pid {old}) was killed and nothing listened on port {port} again within {timeout:?}: restart-server needs a supervisor that starts it again (systemd Restart=, a container restart policy)"
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: kill(2) with a pid the user named; no memory is involved.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Socket inodes of the TCP sockets listening, by port (IPv4 and IPv6).
fn listening() -> Vec<(u16, u64)> {
    let mut v = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(f) = std::fs::File::open(table) else {
            continue;
        };
        for line in BufReader::new(f).lines().skip(1).map_while(Result::ok) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is `ADDR:PORT` in hex; state 0A is LISTEN; inode is field 9.
            let (Some(local), Some(&"0A"), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if let (Some(port), Ok(inode)) = (port, inode.parse()) {
                v.push((port, inode));
            }
        }
    }
    v
}

/// The socket inodes process `pid` has open.
fn sockets_of(pid: u32) -> HashSet<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// The TCP ports process `pid` listens on.
fn ports_of(pid: u32) -> Vec<u16> {
    let socks = sockets_of(pid);
    let mut ports: Vec<u16> = listening()
        .into_iter()
        .filter(|(_, i)| socks.contains(i))
        .map(|(p, _)| p)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The process listening on `port`, if any.
fn listener_of(port: u16) -> Option<u32> {
    let inodes: HashSet<u64> = listening()
        .into_iter()
        .filter(|&(p, _)| p == port)
        .map(|(_, i)| i)
        .collect();
    if inodes.is_empty() {
        return None;
    }
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| !sockets_of(pid).is_disjoint(&inodes))
}

/// The sentinels and master name of a `redis+sentinel://` URL.
///
/// # Errors
/// When the URL is not one.
pub fn sentinel_of(url: &str) -> Result<(Vec<String>, String), String> {
    let rest = url
        .strip_prefix("redis+sentinel://")
        .ok_or_else(|| format!("failover needs a redis+sentinel:// URL, not `{url}`"))?;
    let (hosts, path) = rest
        .split_once('/')
        .ok_or("a redis+sentinel:// URL names its master: redis+sentinel://HOST:PORT/MASTER")?;
    let hosts = hosts.rsplit('@').next().unwrap_or(hosts);
    let master = path.split('?').next().unwrap_or("").to_string();
    if master.is_empty() {
        return Err(
            "a redis+sentinel:// URL names its master: redis+sentinel://HOST:PORT/MASTER".into(),
        );
    }
    Ok((hosts.split(',').map(str::to_string).collect(), master))
}

/// One command to a sentinel (RESP over TCP); its first reply line.
fn sentinel_call(host: &str, args: &[&str]) -> std::io::Result<String> {
    let addr: SocketAddr = host
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{host} has no address")))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req += &format!("${}\r\n{a}\r\n", a.len());
    }
    s.write_all(req.as_bytes())?;
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).to_string())
}

/// Asks the sentinels of `url` for a failover (`SENTINEL FAILOVER`) and waits (at most
/// `timeout`) until they name another master. `Ok(false)` when no sentinel would start one
/// now (a failover still in progress, no replica good enough yet): nothing happened. A
/// failover accepted counts even if no new master is named in time (it may still be under
/// way, and it disturbed the clients all the same).
///
/// # Errors
/// When no sentinel answers.
pub fn sentinel_failover(url: &str, timeout: Duration) -> Result<bool, String> {
    let (hosts, master) = sentinel_of(url)?;
    let addr_of = |h: &str| {
        sentinel_call(h, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &master])
            .ok()
            .filter(|r| r.starts_with('*'))
    };
    let before = hosts.iter().find_map(|h| addr_of(h));
    // One sentinel runs the failover: ask them in turn until one accepts.
    let mut answered = false;
    let mut accepted = false;
    for h in &hosts {
        if let Ok(r) = sentinel_call(h, &["SENTINEL", "FAILOVER", &master]) {
            answered = true;
            if r.starts_with("+OK") {
                accepted = true;
                break;
            }
        }
    }
    if !answered {
        return Err(format!("no sentinel of {url} answered"));
    }
    if !accepted {
        return Ok(false);
    }
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        let now = hosts.iter().find_map(|h| addr_of(h));
        if now.is_some() && now != before {
            return Ok(true);
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_listening_is_found_by_its_port() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let me = std::process::id();
        assert!(ports_of(me).contains(&port));
        assert_eq!(listener_of(port), Some(me));
        assert_eq!(Server::named(me).map(|s| s.pid), Ok(me));
        drop(l);
        assert_eq!(listener_of(port), None);
    }

    #[test]
    fn bad_server_pids_are_refused() {
        // No such process (pid_max is at most 2^22).
        let e = Server::named(u32::MAX / 2).unwrap_err();
        assert!(e.contains("cannot signal"), "{e}");
    }

    #[test]
    fn sentinel_urls() {
        assert_eq!(
            sentinel_of("redis+sentinel://:pw@h1:26379,h2:26380/mymaster?wait_replicas=1"),
            Ok((
                vec!["h1:26379".into(), "h2:26380".into()],
                "mymaster".into()
            ))
        );
        assert!(sentinel_of("redis://h1:6379").is_err());
        assert!(sentinel_of("redis+sentinel://h1:26379").is_err());
    }
}
