//! One worker process: acquire → read-modify-write on the register → release, in a loop,
//! every event a JSON line on stdout. It stops after its current attempt when stdin closes.

use crate::broken::{self, BrokenLock};
use crate::history::{now_us, to_us, AttemptId, Event, EventKind, Kind, RegisterOpKind};
use crate::register::RegisterClient;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a worker locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A dlock backend URL (already pointed at the worker's proxy, if any).
    Url(String),
    /// A broken lock of the self-test over the store in a directory.
    Broken(broken::Variant, PathBuf),
}

/// A worker's settings, passed on its command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Its id (`w<slot>.<generation>`).
    pub id: String,
    /// What it locks.
    pub target: Target,
    /// The lock name (with `-<i>` appended when there are several).
    pub name: String,
    /// The kind of lock.
    pub kind: Kind,
    /// How many lock names; each attempt picks one.
    pub names: u32,
    /// Lease (the watchdog lease for dlock; the fixed lease of a broken lock).
    pub lease: Duration,
    /// Mean time between the read and the write of a section.
    pub work: Duration,
    /// Longest wait of one acquire.
    pub wait: Duration,
    /// The register.
    pub register: SocketAddr,
    /// Seed of its work times.
    pub seed: u64,
}

impl WorkerConfig {
    /// As command-line arguments (`key=value`), for [`WorkerConfig::from_args`].
    pub fn to_args(&self) -> Vec<String> {
        let target = match &self.target {
            Target::Url(u) => format!("url={u}"),
            Target::Broken(v, d) => format!("broken={}:{}", v.name(), d.display()),
        };
        vec![
            format!("id={}", self.id),
            target,
            format!("name={}", self.name),
            format!("kind={}", self.kind),
            format!("names={}", self.names),
            format!("lease-us={}", to_us(self.lease)),
            format!("work-us={}", to_us(self.work)),
            format!("wait-us={}", to_us(self.wait)),
            format!("register={}", self.register),
            format!("seed={}", self.seed),
        ]
    }

    /// Parses [`WorkerConfig::to_args`]'s output.
    pub fn from_args(args: &[String]) -> Result<WorkerConfig, String> {
        let get = |k: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
                .ok_or_else(|| format!("worker: missing {k}="))
        };
        let num = |k: &str| -> Result<u64, String> {
            get(k)?.parse().map_err(|_| format!("worker: bad {k}="))
        };
        let target = match get("url") {
            Ok(u) => Target::Url(u.to_string()),
            Err(_) => {
                let b = get("broken")?;
                let (v, d) = b.split_once(':').ok_or("worker: bad broken=")?;
                Target::Broken(v.parse()?, PathBuf::from(d))
            }
        };
        Ok(WorkerConfig {
            id: get("id")?.to_string(),
            target,
            name: get("name")?.to_string(),
            kind: get("kind")?.parse()?,
            names: u32::try_from(num("names")?)
                .ok()
                .filter(|&n| n > 0)
                .ok_or("worker: bad names=")?,
            lease: Duration::from_micros(num("lease-us")?),
            work: Duration::from_micros(num("work-us")?),
            wait: Duration::from_micros(num("wait-us")?),
            register: get("register")?
                .parse()
                .map_err(|_| "worker: bad register=".to_string())?,
            seed: num("seed")?,
        })
    }
}

enum Locker {
    Dlock(distlock::Client),
    Broken(BrokenLock),
}

enum Held {
    Dlock(distlock::LockGuard),
    Leader(distlock::Leadership),
    Broken(broken::Held),
}

impl Held {
    /// The dlock guard under a grant (a leadership's too).
    fn guard(&self) -> Option<&distlock::LockGuard> {
        match self {
            Held::Dlock(g) => Some(g),
            Held::Leader(l) => Some(l.guard()),
            Held::Broken(_) => None,
        }
    }

    fn token(&self) -> u64 {
        match (self, self.guard()) {
            (_, Some(g)) => g.fencing_token(),
            (Held::Broken(h), None) => h.token,
            _ => 0,
        }
    }

    fn lease_end(&self) -> u64 {
        match (self, self.guard()) {
            (_, Some(g)) => to_us(g.lease_deadline().as_boottime()),
            (Held::Broken(h), None) => h.lease_end,
            _ => 0,
        }
    }

    /// `Some(last confirmed lease end)` when the lock says the grant is lost.
    fn is_lost(&self) -> Option<Option<u64>> {
        match (self, self.guard()) {
            (_, Some(g)) => g
                .is_lost()
                .then(|| Some(to_us(g.lease_deadline().as_boottime()))),
            (Held::Broken(h), None) => h.is_lost().map(Some),
            _ => None,
        }
    }

    /// Releases (resigns); the outcome as the worker reports it.
    async fn release(self) -> String {
        let outcome = match self {
            Held::Dlock(g) => g.release().await,
            Held::Leader(l) => l.resign().await,
            Held::Broken(h) => {
                return match tokio::task::spawn_blocking(move || h.release()).await {
                    Ok(Ok(o)) => o,
                    Ok(Err(e)) => format!("error: {e}"),
                    Err(e) => format!("error: {e}"),
                }
            }
        };
        match outcome {
            Ok(distlock::ReleaseOutcome::Released) => "released".to_string(),
            Ok(distlock::ReleaseOutcome::Expired) => "expired".to_string(),
            Ok(distlock::ReleaseOutcome::TakenByOther) => "taken".to_string(),
            Ok(o) => format!("{o:?}"),
            Err(e) => format!("error: {e}"),
        }
    }
}

/// One acquire of `kind` on `name` through `client`, waiting at most `wait`; `shared` asks
/// for the read side of a read-write lock.
async fn acquire(
    client: &distlock::Client,
    kind: Kind,
    name: &str,
    owner: &str,
    shared: bool,
    wait: Duration,
) -> distlock::Result<Held> {
    let lock = match kind {
        Kind::Mutex => client.lock(name)?.with_owner(owner)?,
        Kind::Fair => client.fair_lock(name)?.with_owner(owner)?,
        Kind::ReadWrite => {
            let rw = client.rw_lock(name)?.with_owner(owner)?;
            if shared {
                rw.read()
            } else {
                rw.write()
            }
        }
        Kind::Semaphore(n) => {
            return Ok(Held::Dlock(
                client.semaphore(name, n)?.acquire_timeout(1, wait).await?,
            ))
        }
        Kind::Election => {
            return Ok(Held::Leader(
                client
                    .election(name)?
                    .with_owner(owner)?
                    .campaign_timeout(owner, wait)
                    .await?,
            ))
        }
    };
    Ok(Held::Dlock(lock.acquire_timeout(wait).await?))
}

/// Writes one event line to stdout.
fn emit(id: &AttemptId, kind: EventKind) {
    let e = Event {
        id: id.clone(),
        t: now_us(),
        t_coord: 0,
        kind,
    };
    if let Ok(line) = serde_json::to_string(&e) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    }
}

/// Emits `Lost` once per attempt.
#[derive(Clone)]
struct LostOnce(Arc<AtomicBool>, AttemptId);

impl LostOnce {
    fn fire(&self, lease_end: Option<u64>, reason: &str) {
        if !self.0.swap(true, Ordering::SeqCst) {
            emit(
                &self.1,
                EventKind::Lost {
                    lease_end,
                    reason: reason.to_string(),
                },
            );
        }
    }
}

/// Runs a worker until its stdin closes; the exit code (0, or 1 after printing an error).
pub async fn run(cfg: WorkerConfig) -> u8 {
    match work(cfg).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dlock torture worker: {e}");
            1
        }
    }
}

async fn work(cfg: WorkerConfig) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 64];
        let mut stdin = tokio::io::stdin();
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        s.store(true, Ordering::SeqCst);
    });
    let locker = match &cfg.target {
        Target::Url(url) => {
            let opts = distlock::ClientOptions::default().watchdog_lease(cfg.lease);
            let client = distlock::connect_with(url, opts)
                .await
                .map_err(|e| format!("cannot connect to {url}: {e}"))?;
            Locker::Dlock(client)
        }
        Target::Broken(v, dir) => {
            Locker::Broken(BrokenLock::new(*v, dir.clone(), cfg.lease).map_err(|e| e.to_string())?)
        }
    };
    let mut reg = RegisterClient::connect(cfg.register)
        .await
        .map_err(|e| format!("cannot reach the register: {e}"))?;
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    let mut attempt = 0;
    while !stop.load(Ordering::SeqCst) {
        let lock = rng.u32(..cfg.names);
        let id = AttemptId {
            worker: cfg.id.clone(),
            attempt,
            lock,
        };
        let name = if cfg.names > 1 {
            format!("{}-{lock}", cfg.name)
        } else {
            cfg.name.clone()
        };
        // Half the attempts on a read-write lock read.
        let shared = cfg.kind == Kind::ReadWrite && rng.bool();
        attempt += 1;
        emit(&id, EventKind::AttemptStart);
        let held = match &locker {
            Locker::Dlock(c) => {
                match acquire(c, cfg.kind, &name, &cfg.id, shared, cfg.wait).await {
                    Ok(h) => Ok(Some(h)),
                    Err(e) => Err(e.to_string()),
                }
            }
            Locker::Broken(b) => {
                let (b, owner, wait) = (b.clone(), id.to_string(), cfg.wait);
                match tokio::task::spawn_blocking(move || b.acquire(&owner, wait)).await {
                    Ok(Ok(h)) => Ok(h.map(Held::Broken)),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        let held = match held {
            Ok(Some(h)) => h,
            Ok(None) => {
                emit(
                    &id,
                    EventKind::AttemptFailed {
                        error: "deadline".into(),
                    },
                );
                continue;
            }
            Err(error) => {
                emit(&id, EventKind::AttemptFailed { error });
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let token = held.token();
        emit(
            &id,
            EventKind::Grant {
                token,
                lease_end: Some(held.lease_end()),
                shared,
            },
        );
        let lost = LostOnce(Arc::new(AtomicBool::new(false)), id.clone());
        let check = |held: &Held| {
            if let Some(end) = held.is_lost() {
                lost.fire(end, "lease-expired");
            }
        };
        // A semaphore's holders hold at once: no register (see Kind::uses_register); a
        // reader only reads.
        let read = match (cfg.kind.uses_register(), shared) {
            (false, _) => None,
            (true, true) => {
                register_call(&mut reg, &id, RegisterOpKind::SharedRead, token, 0).await?;
                None
            }
            (true, false) => register_call(&mut reg, &id, RegisterOpKind::Read, token, 0).await?,
        };
        let work = to_us(cfg.work);
        let pause = Duration::from_micros(rng.u64(work / 2..=work * 3 / 2));
        sleep_watching(&held, pause, &lost).await;
        check(&held);
        if let Some(v) = read {
            register_call(&mut reg, &id, RegisterOpKind::Write, token, v + 1).await?;
        }
        check(&held);
        emit(&id, EventKind::ReleaseStart);
        let outcome = held.release().await;
        emit(&id, EventKind::Released { outcome });
    }
    Ok(())
}

/// Sleeps `d`; fires `lost` the moment the lock's lost signal does.
async fn sleep_watching(held: &Held, d: Duration, lost: &LostOnce) {
    let sleep = tokio::time::sleep(d);
    tokio::pin!(sleep);
    match (held, held.guard()) {
        (_, Some(g)) => {
            tokio::select! {
                () = &mut sleep => return,
                reason = g.lost() => {
                    lost.fire(Some(to_us(g.lease_deadline().as_boottime())), &format!("{reason:?}"));
                }
            }
        }
        (Held::Broken(h), None) => {
            let mut rx = h.lost.clone();
            tokio::select! {
                () = &mut sleep => return,
                v = rx.wait_for(|v| v.is_some()) => {
                    if let Ok(v) = v {
                        lost.fire(*v, "not-held");
                    }
                }
            }
        }
        // Every dlock grant has a guard.
        (Held::Dlock(_) | Held::Leader(_), None) => {}
    }
    sleep.await;
}

/// One register call, recorded; `Some(value)` when accepted.
async fn register_call(
    reg: &mut RegisterClient,
    id: &AttemptId,
    op: RegisterOpKind,
    token: u64,
    value: u64,
) -> Result<Option<u64>, String> {
    let sent = now_us();
    let (accepted, value) = reg
        .call(id, op, token, value)
        .await
        .map_err(|e| format!("register: {e}"))?;
    emit(
        id,
        EventKind::Register {
            sent,
            op,
            token,
            value,
            accepted,
        },
    );
    Ok(accepted.then_some(value))
}
