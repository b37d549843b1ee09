//! The fenced register the coordinator serves on loopback.
//!
//! One integer value per lock name. Every operation carries a fencing token; the register
//! keeps the highest token it has seen per name and refuses any operation with a lower one (the
//! rule dlock's docs teach for a store), except a shared read (a reader of a read-write lock
//! cannot harm the value; its token still counts as seen). Every operation, accepted or not, is
//! recorded with the register's clock.
//!
//! Protocol, one line each way per call: `read|sread <worker> <attempt> <lock> <token>` /
//! `write <worker> <attempt> <lock> <token> <value>` → `ok <value>` or `rej <highest token>`.

use crate::history::{now_us, AttemptId, RegisterOp, RegisterOpKind};
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

#[derive(Debug, Default)]
struct State {
    /// Per lock name: the value and the highest token seen.
    values: std::collections::HashMap<u32, (u64, Option<u64>)>,
    ops: Vec<RegisterOp>,
}

/// A running register; stops accepting when dropped.
#[derive(Debug)]
pub struct Register {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl Register {
    /// Starts a register on a free loopback port.
    pub fn start() -> io::Result<Register> {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (Arc::clone(&state), Arc::clone(&stop));
        thread::Builder::new()
            .name("torture-register".into())
            .spawn(move || {
                while !st.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let s = Arc::clone(&s);
                            let _ = thread::Builder::new()
                                .name("torture-register-conn".into())
                                .spawn(move || serve(conn, &s));
                        }
                        Err(_) => thread::sleep(Duration::from_millis(10)),
                    }
                }
            })?;
        Ok(Register { addr, state, stop })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every operation so far, in the register's order.
    pub fn ops(&self) -> Vec<RegisterOp> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ops
            .clone()
    }
}

impl Drop for Register {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(conn: TcpStream, state: &Mutex<State>) {
    let _ = conn.set_nodelay(true);
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let reply = match parse(&line) {
            Some((id, op, token, value)) => apply(state, id, op, token, value),
            None => "err bad request".to_string(),
        };
        if writeln!(w, "{reply}").is_err() {
            return;
        }
    }
}

fn parse(line: &str) -> Option<(AttemptId, RegisterOpKind, u64, u64)> {
    let mut f = line.split_whitespace();
    let op = match f.next()? {
        "read" => RegisterOpKind::Read,
        "sread" => RegisterOpKind::SharedRead,
        "write" => RegisterOpKind::Write,
        _ => return None,
    };
    let worker = f.next()?.to_string();
    let attempt = f.next()?.parse().ok()?;
    let lock = f.next()?.parse().ok()?;
    let token = f.next()?.parse().ok()?;
    let value = match op {
        RegisterOpKind::Read | RegisterOpKind::SharedRead => 0,
        RegisterOpKind::Write => f.next()?.parse().ok()?,
    };
    Some((
        AttemptId {
            worker,
            attempt,
            lock,
        },
        op,
        token,
        value,
    ))
}

fn apply(
    state: &Mutex<State>,
    id: AttemptId,
    op: RegisterOpKind,
    token: u64,
    value: u64,
) -> String {
    let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
    let (current, max_token) = s.values.entry(id.lock).or_default();
    let accepted = op == RegisterOpKind::SharedRead || max_token.is_none_or(|m| token >= m);
    if accepted {
        *max_token = Some(max_token.map_or(token, |m| m.max(token)));
        if op == RegisterOpKind::Write {
            *current = value;
        }
    }
    let value = if op == RegisterOpKind::Write {
        value
    } else {
        *current
    };
    let highest = max_token.unwrap_or(0);
    s.ops.push(RegisterOp {
        id,
        t: now_us(),
        op,
        token,
        value,
        accepted,
    });
    if accepted {
        format!("ok {value}")
    } else {
        format!("rej {highest}")
    }
}

/// A worker's connection to the register.
#[derive(Debug)]
pub struct RegisterClient {
    r: tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: tokio::net::tcp::OwnedWriteHalf,
}

impl RegisterClient {
    /// Connects.
    pub async fn connect(addr: SocketAddr) -> io::Result<RegisterClient> {
        let s = tokio::net::TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        let (r, w) = s.into_split();
        Ok(RegisterClient {
            r: tokio::io::BufReader::new(r),
            w,
        })
    }

    /// One call: `(accepted, value)`, the value read or written.
    pub async fn call(
        &mut self,
        id: &AttemptId,
        op: RegisterOpKind,
        token: u64,
        value: u64,
    ) -> io::Result<(bool, u64)> {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let (w, a, l) = (&id.worker, id.attempt, id.lock);
        let req = match op {
            RegisterOpKind::Read => format!("read {w} {a} {l} {token}\n"),
            RegisterOpKind::SharedRead => format!("sread {w} {a} {l} {token}\n"),
            RegisterOpKind::Write => format!("write {w} {a} {l} {token} {value}\n"),
        };
        self.w.write_all(req.as_bytes()).await?;
        let mut line = String::new();
        if self.r.read_line(&mut line).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "register closed",
            ));
        }
        let mut f = line.split_whitespace();
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("register said {line:?}"),
            )
        };
        let ok = match f.next() {
            Some("ok") => true,
            Some("rej") => false,
            _ => return Err(bad()),
        };
        let n = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        Ok((ok, if ok { n } else { value }))
    }
}
