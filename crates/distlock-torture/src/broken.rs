//! Deliberately broken locks for `dlock torture --self-test`, and their correct sibling.
//!
//! Real locks over a real store: a directory shared by the worker processes, every operation
//! done under `flock(2)` on `<dir>/guard` so that it is atomic across processes. The lock
//! record `<dir>/lock` holds `owner token expiry_µs`; the token counter lives in
//! `<dir>/counter`. Each variant breaks one rule the way real home-made locks do.

use crate::history::now_us;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Which lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Everything right: owner-checked release, renewal with an owner check, a counter that
    /// survives releases. The self-test's control: must pass.
    Correct,
    /// Release deletes the record without checking who holds it (`DEL key`).
    NoOwnerCheck,
    /// No renewal and no lost signal: the lease is fixed and the work can outlast it.
    NoRenewal,
    /// The token counter lives in the lock record and restarts when the record is deleted.
    TokenReset,
    /// The record never expires (`SETNX` without `EXPIRE`): a holder that dies keeps the
    /// lock forever, though its client promised a lease.
    NoExpiry,
}

impl Variant {
    /// Every variant, the control first.
    pub const ALL: [Variant; 5] = [
        Variant::Correct,
        Variant::NoOwnerCheck,
        Variant::NoRenewal,
        Variant::TokenReset,
        Variant::NoExpiry,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Correct => "correct",
            Variant::NoOwnerCheck => "no-owner-check",
            Variant::NoRenewal => "no-renewal",
            Variant::TokenReset => "token-reset",
            Variant::NoExpiry => "no-expiry",
        }
    }

    fn renews(self) -> bool {
        self != Variant::NoRenewal
    }

    /// The expiry the store records for a lease ending at `end`.
    fn stored_expiry(self, end: u64) -> u64 {
        if self == Variant::NoExpiry {
            u64::MAX
        } else {
            end
        }
    }
}

impl FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> Result<Variant, String> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("unknown broken lock `{s}`"))
    }
}

/// A lock of one variant over the store in `dir`.
#[derive(Debug, Clone)]
pub struct BrokenLock {
    variant: Variant,
    dir: PathBuf,
    lease: Duration,
}

/// The lock record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    owner: String,
    token: u64,
    expiry: u64,
}

/// The store locked for one operation (the flock is released when dropped).
struct Store<'a> {
    dir: &'a Path,
    _guard: File,
}

impl Store<'_> {
    fn open(dir: &Path) -> io::Result<Store<'_>> {
        let guard = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("guard"))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(guard.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Store { dir, _guard: guard })
    }

    fn record(&self) -> io::Result<Option<Record>> {
        let s = match fs::read_to_string(self.dir.join("lock")) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut f = s.split_whitespace();
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad lock record");
        Ok(Some(Record {
            owner: f.next().ok_or_else(bad)?.to_string(),
            token: f.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?,
            expiry: f.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?,
        }))
    }

    fn put(&self, r: &Record) -> io::Result<()> {
        let tmp = self.dir.join("lock.tmp");
        fs::write(&tmp, format!("{} {} {}", r.owner, r.token, r.expiry))?;
        fs::rename(tmp, self.dir.join("lock"))
    }

    fn delete(&self) -> io::Result<()> {
        match fs::remove_file(self.dir.join("lock")) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn next_counter(&self) -> io::Result<u64> {
        let path = self.dir.join("counter");
        let n = match fs::read_to_string(&path) {
            Ok(s) => s.trim().parse().unwrap_or(0),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        } + 1;
        fs::write(path, n.to_string())?;
        Ok(n)
    }
}

/// A grant of a [`BrokenLock`].
#[derive(Debug)]
pub struct Held {
    lock: BrokenLock,
    /// The record as granted.
    owner: String,
    /// The fencing token.
    pub token: u64,
    /// The lease end at the grant, µs.
    pub lease_end: u64,
    /// The lease end the keeper last confirmed, µs.
    confirmed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// Fires (with the last confirmed lease end) when the keeper finds the lock gone.
    pub lost: tokio::sync::watch::Receiver<Option<u64>>,
}

impl BrokenLock {
    /// A lock of `variant` over the store in `dir` (created if missing).
    pub fn new(variant: Variant, dir: PathBuf, lease: Duration) -> io::Result<BrokenLock> {
        fs::create_dir_all(&dir)?;
        Ok(BrokenLock {
            variant,
            dir,
            lease,
        })
    }

    fn lease_us(&self) -> u64 {
        crate::history::to_us(self.lease)
    }

    /// Tries until `wait` runs out; `None` when it did. Blocking.
    pub fn acquire(&self, owner: &str, wait: Duration) -> io::Result<Option<Held>> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(h) = self.try_once(owner)? {
                return Ok(Some(h));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            thread::sleep(Duration::from_millis(3 + fastrand::u64(..10)));
        }
    }

    fn try_once(&self, owner: &str) -> io::Result<Option<Held>> {
        let s = Store::open(&self.dir)?;
        let now = now_us();
        let old = s.record()?;
        if old.as_ref().is_some_and(|r| r.expiry > now) {
            return Ok(None);
        }
        let token = match self.variant {
            // The counter is the record's: gone with it.
            Variant::TokenReset => old.map_or(1, |r| r.token + 1),
            _ => s.next_counter()?,
        };
        let rec = Record {
            owner: owner.to_string(),
            token,
            expiry: now + self.lease_us(),
        };
        s.put(&Record {
            expiry: self.variant.stored_expiry(rec.expiry),
            ..rec.clone()
        })?;
        drop(s);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::watch::channel(None);
        let confirmed = Arc::new(AtomicU64::new(rec.expiry));
        if self.variant.renews() {
            let (lock, stop, rec) = (self.clone(), Arc::clone(&stop), rec.clone());
            let c = Arc::clone(&confirmed);
            thread::Builder::new()
                .name("broken-keeper".into())
                .spawn(move || lock.keep(rec, &stop, &c, &tx))?;
        }
        Ok(Some(Held {
            lock: self.clone(),
            owner: rec.owner,
            token,
            lease_end: rec.expiry,
            confirmed,
            stop,
            lost: rx,
        }))
    }

    /// Renews every lease/2 while the record is ours; signals lost when it is not.
    fn keep(
        &self,
        mut rec: Record,
        stop: &AtomicBool,
        confirmed: &AtomicU64,
        lost: &tokio::sync::watch::Sender<Option<u64>>,
    ) {
        loop {
            thread::sleep(self.lease / 2);
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let Ok(s) = Store::open(&self.dir) else {
                continue;
            };
            match s.record() {
                Ok(Some(r)) if r.owner == rec.owner && r.token == rec.token => {
                    rec.expiry = now_us() + self.lease_us();
                    let stored = Record {
                        expiry: self.variant.stored_expiry(rec.expiry),
                        ..rec.clone()
                    };
                    if s.put(&stored).is_err() {
                        continue;
                    }
                    confirmed.store(rec.expiry, Ordering::SeqCst);
                }
                Ok(_) => {
                    let _ = lost.send(Some(rec.expiry));
                    return;
                }
                Err(_) => continue,
            }
        }
    }
}

impl Held {
    /// Whether the lock knows the grant is lost: its confirmed lease ran out, or the keeper
    /// found the record gone. Never true for [`Variant::NoRenewal`], which has no lost signal.
    pub fn is_lost(&self) -> Option<u64> {
        if !self.lock.variant.renews() {
            return None;
        }
        let end = self.confirmed.load(Ordering::SeqCst);
        (now_us() > end || self.lost.borrow().is_some()).then_some(end)
    }

    /// Releases; the outcome as the worker reports it. Blocking.
    pub fn release(self) -> io::Result<String> {
        self.stop.store(true, Ordering::SeqCst);
        let s = Store::open(&self.lock.dir)?;
        let rec = s.record()?;
        let ours = rec
            .as_ref()
            .is_some_and(|r| r.owner == self.owner && r.token == self.token);
        if self.lock.variant == Variant::NoOwnerCheck {
            s.delete()?;
            return Ok("released".into());
        }
        Ok(match rec {
            _ if ours => {
                s.delete()?;
                "released".into()
            }
            None => "expired".into(),
            Some(_) => "taken".into(),
        })
    }
}
