//! The snapshot model: one row per lock, with what a look at the server tells (holders,
//! leases, tokens, the queue) and what only a watcher that looks again can tell (how long a
//! holder has held, how long someone has waited where the server keeps no arrival times).

use distlock_core::{HolderInfo, ListedLock, LockInfo, LockKind, WaiterInfo};
use serde::Serialize;
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The locks of one backend at one moment, as `dlock top` and `dlock serve` show them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Snapshot {
    /// The backend's kind (`redis`, `etcd`, …).
    pub backend: String,
    /// Where it is (host and port, path, node list; never credentials).
    pub endpoint: String,
    /// When the snapshot was taken, in milliseconds since the Unix epoch (local clock).
    pub taken_at_ms: u64,
    /// The locks, sorted as asked ([`Sort`]).
    pub locks: Vec<LockRow>,
}

impl Snapshot {
    /// Locks held by at least one holder.
    pub fn held(&self) -> usize {
        self.locks.iter().filter(|l| l.held).count()
    }

    /// Waiters on all the locks (of the backends that count them).
    pub fn waiters(&self) -> u64 {
        self.locks
            .iter()
            .map(|l| u64::from(l.waiters.unwrap_or(0)))
            .sum()
    }

    /// The longest wait of any waiter, when one is known.
    pub fn oldest_wait(&self) -> Option<Duration> {
        self.locks.iter().filter_map(LockRow::oldest_wait).max()
    }

    /// The row of lock `name` (of any kind).
    pub fn get(&self, name: &str) -> Option<&LockRow> {
        self.locks.iter().find(|l| l.name == name)
    }

    /// Keeps the locks whose name starts with `prefix`.
    pub fn retain_prefix(&mut self, prefix: &str) {
        self.locks.retain(|l| l.name.starts_with(prefix));
    }

    /// Sorts the locks by `sort`.
    pub fn sort(&mut self, sort: Sort) {
        sort.apply(&mut self.locks);
    }
}

/// One lock in a [`Snapshot`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LockRow {
    /// Lock name.
    pub name: String,
    /// `mutex`, `fair`, `rw` (a read-write lock), `semaphore` or `election` ([`kind_name`]).
    pub kind: &'static str,
    /// Whether anyone holds it.
    pub held: bool,
    /// The holders (one for a held mutex; readers or a writer; a semaphore's holds).
    pub holders: Vec<HolderRow>,
    /// The last fencing token issued for the name (0 if none ever was).
    pub fencing_token: u64,
    /// Live waiters queued on the server, when the backend keeps a queue (`None`: unknown).
    pub waiters: Option<u32>,
    /// The longest wait, in milliseconds, when known: from the server's arrival times, or
    /// (then [`LockRow::oldest_wait_at_least`]) since a watcher first saw waiters.
    pub oldest_wait_ms: Option<u64>,
    /// The wait is a lower bound: the watcher saw the waiters already there.
    pub oldest_wait_at_least: bool,
    /// The waiters in line, first first, when the backend names them.
    pub queue: Vec<WaiterRow>,
    /// A semaphore's permit count.
    pub permits: Option<u32>,
}

impl LockRow {
    /// The longest wait, when known.
    pub fn oldest_wait(&self) -> Option<Duration> {
        self.oldest_wait_ms.map(Duration::from_millis)
    }

    /// The lock kind to inspect this lock with again.
    pub fn lock_kind(&self) -> LockKind {
        parse_kind(self.kind, self.permits).unwrap_or_default()
    }
}

/// One holder in a [`LockRow`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HolderRow {
    /// Owner id.
    pub owner: String,
    /// Host of an owner id the library made (`HOST:PID:RANDOM:SEQ`), else `None`.
    pub host: Option<String>,
    /// Process id of such an owner id.
    pub pid: Option<u32>,
    /// Re-entrant count, or a semaphore hold's permits.
    pub count: u32,
    /// `read` or `write` for a read-write lock.
    pub side: Option<&'static str>,
    /// Lease left in milliseconds (`None`: held while its session or process lives).
    pub lease_left_ms: Option<u64>,
    /// How long it has held, in milliseconds, as far as the watcher saw it.
    pub held_for_ms: u64,
    /// The hold is older: it was there when the watcher first looked.
    pub held_for_at_least: bool,
    /// An election leader's advertised value.
    pub value: Option<String>,
}

/// One waiter in a [`LockRow`]'s queue.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WaiterRow {
    /// Owner id of the waiting attempt.
    pub owner: String,
    /// Host of an owner id the library made.
    pub host: Option<String>,
    /// Process id of such an owner id.
    pub pid: Option<u32>,
    /// `read` or `write` for a read-write lock.
    pub side: Option<&'static str>,
    /// How long it has waited (server clock), in milliseconds, when known.
    pub waited_ms: Option<u64>,
}

/// The name of a lock kind in snapshots and on the command line: a read-write lock is `rw`
/// (both of its sides are one lock).
pub fn kind_name(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Read | LockKind::Write => "rw",
        k => k.as_str(),
    }
}

/// The lock kind named `name` ([`kind_name`]; `read` and `write` are the read-write lock
/// too), for a semaphore of `permits` permits. `None` for an unknown name.
///
/// ```
/// use distlock_core::LockKind;
/// use distlock_observe::parse_kind;
/// assert_eq!(parse_kind("rw", None), Some(LockKind::Write));
/// assert_eq!(parse_kind("lock", None), None);
/// ```
pub fn parse_kind(name: &str, permits: Option<u32>) -> Option<LockKind> {
    Some(match name {
        "mutex" => LockKind::Mutex,
        "fair" => LockKind::Fair,
        "rw" | "write" => LockKind::Write,
        "read" => LockKind::Read,
        "election" => LockKind::Election,
        "semaphore" => {
            let limit = permits.unwrap_or(1).max(1);
            LockKind::Semaphore { permits: 1, limit }
        }
        _ => return None,
    })
}

/// How the rows are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sort {
    /// Most contended first: most waiters, then the oldest wait, then held before free and
    /// the longest held; then by name.
    #[default]
    Contention,
    /// By name.
    Name,
    /// The longest held first.
    Held,
    /// The shortest lease left first (the holds about to run out).
    Lease,
    /// Most waiters first.
    Waiters,
}

impl Sort {
    /// Every order, in the order the terminal view cycles through them.
    pub const ALL: [Sort; 5] = [
        Sort::Contention,
        Sort::Name,
        Sort::Held,
        Sort::Lease,
        Sort::Waiters,
    ];

    /// Its name on the command line and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Sort::Contention => "contention",
            Sort::Name => "name",
            Sort::Held => "held",
            Sort::Lease => "lease",
            Sort::Waiters => "waiters",
        }
    }

    /// The order named `s` ([`Sort::as_str`]).
    ///
    /// # Errors
    /// A message naming the orders there are.
    pub fn parse(s: &str) -> Result<Sort, String> {
        Sort::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Sort::ALL.iter().map(|o| o.as_str()).collect();
                format!("unknown sort order `{s}`: use one of {}", names.join(", "))
            })
    }

    /// The next order (the terminal view's `s` key).
    pub fn next(self) -> Sort {
        let i = Sort::ALL.iter().position(|&o| o == self).unwrap_or(0);
        Sort::ALL[(i + 1) % Sort::ALL.len()]
    }

    fn apply(self, rows: &mut [LockRow]) {
        let held_for = |r: &LockRow| r.holders.iter().map(|h| h.held_for_ms).max().unwrap_or(0);
        let lease = |r: &LockRow| {
            r.holders
                .iter()
                .filter_map(|h| h.lease_left_ms)
                .min()
                .unwrap_or(u64::MAX)
        };
        let waiters = |r: &LockRow| r.waiters.unwrap_or(0);
        let wait = |r: &LockRow| r.oldest_wait_ms.unwrap_or(0);
        match self {
            Sort::Contention => rows.sort_by(|a, b| {
                (waiters(b), wait(b), b.held, held_for(b))
                    .cmp(&(waiters(a), wait(a), a.held, held_for(a)))
                    .then_with(|| a.name.cmp(&b.name))
            }),
            Sort::Name => rows.sort_by(|a, b| a.name.cmp(&b.name).then(a.kind.cmp(b.kind))),
            Sort::Held => rows.sort_by(|a, b| {
                (b.held, held_for(b))
                    .cmp(&(a.held, held_for(a)))
                    .then_with(|| a.name.cmp(&b.name))
            }),
            Sort::Lease => rows.sort_by(|a, b| {
                (b.held, lease(a))
                    .cmp(&(a.held, lease(b)))
                    .then_with(|| a.name.cmp(&b.name))
            }),
            Sort::Waiters => rows.sort_by(|a, b| {
                (waiters(b), wait(b))
                    .cmp(&(waiters(a), wait(a)))
                    .then_with(|| a.name.cmp(&b.name))
            }),
        }
    }
}

/// What changed between two looks ([`Event::event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// A holder appeared.
    Granted,
    /// A holder left before its lease ran out (released, or removed by a forced release).
    Released,
    /// A holder's lease ran out without a release: the holder lost the lock (or crashed).
    Lost,
    /// More waiters than at the last look.
    Waiting,
}

impl Change {
    /// Its name in the event stream (`granted`, `released`, `lost`, `waiting`).
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Granted => "granted",
            Change::Released => "released",
            Change::Lost => "lost",
            Change::Waiting => "waiting",
        }
    }
}

/// One change seen between two snapshots.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Event {
    /// When it was seen, in milliseconds since the Unix epoch (local clock).
    pub at_ms: u64,
    /// What happened.
    pub event: Change,
    /// The lock.
    pub name: String,
    /// Its kind ([`kind_name`]).
    pub kind: &'static str,
    /// The holder granted, released or lost; the first new waiter when the backend names
    /// them.
    pub owner: Option<String>,
    /// The lock's last fencing token at the time.
    pub fencing_token: u64,
    /// Waiters at the time, when the backend counts them.
    pub waiters: Option<u32>,
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The rows of one look, by name and kind.
type Rows = HashMap<(String, &'static str), LockRow>;

/// When something was first seen, and whether it was already there at the first look.
#[derive(Debug, Clone, Copy)]
struct Seen {
    at: Instant,
    at_least: bool,
}

/// The memory of a watcher that looks again and again: when each holder and each queue was
/// first seen, and the last look (to tell what changed). Pure: [`Tracker::observe`] takes
/// the time and the listing, so it is the same with any backend and in tests.
#[derive(Debug, Default)]
pub struct Tracker {
    /// (name, kind, owner) → first seen holding.
    holders: HashMap<(String, &'static str, String), Seen>,
    /// (name, kind) → first seen with waiters.
    waiting: HashMap<(String, &'static str), Seen>,
    /// The rows of the last look and when it was.
    last: Option<(Instant, Rows)>,
}

impl Tracker {
    /// A tracker that has not looked yet.
    pub fn new() -> Self {
        Tracker::default()
    }

    /// The rows of `listed`, from a look that started at `started` and ended at `now`
    /// (`wall`: the end on the wall clock), and the changes since the last look (none at
    /// the first: everything there then was there before, and its times are lower bounds).
    ///
    /// A holder gone since the last look is [`Change::Lost`] when its lease (as that look
    /// read it) could have run out in between — from the start of that look to the end of
    /// this one — else [`Change::Released`].
    pub fn observe(
        &mut self,
        started: Instant,
        now: Instant,
        wall: SystemTime,
        listed: &[ListedLock],
    ) -> (Vec<LockRow>, Vec<Event>) {
        let first = self.last.is_none();
        let rows: Vec<LockRow> = listed
            .iter()
            .map(|l| self.row(now, first, l.kind, &l.info))
            .collect();
        let at_ms = unix_ms(wall);
        let mut events = Vec::new();
        let mut current: Rows = HashMap::with_capacity(rows.len());
        for r in &rows {
            current.insert((r.name.clone(), r.kind), r.clone());
        }
        if let Some((then, before)) = &self.last {
            // From the start of the last look (its reads came after) to the end of this one.
            let elapsed = now.saturating_duration_since(*then);
            for (key, old) in before {
                let new = current.get(key);
                for h in &old.holders {
                    if new.is_some_and(|n| n.holders.iter().any(|o| o.owner == h.owner)) {
                        continue;
                    }
                    // Gone: a lease that ran out since the last look was lost, not released.
                    let lapsed = h.lease_left_ms.is_some_and(|l| ms(elapsed) >= l);
                    events.push(Event {
                        at_ms,
                        event: if lapsed {
                            Change::Lost
                        } else {
                            Change::Released
                        },
                        name: key.0.clone(),
                        kind: key.1,
                        owner: Some(h.owner.clone()),
                        fencing_token: new.map_or(old.fencing_token, |n| n.fencing_token),
                        waiters: new.and_then(|n| n.waiters),
                    });
                }
            }
            for r in &rows {
                let old = before.get(&(r.name.clone(), r.kind));
                for h in &r.holders {
                    if old.is_some_and(|o| o.holders.iter().any(|x| x.owner == h.owner)) {
                        continue;
                    }
                    events.push(Event {
                        at_ms,
                        event: Change::Granted,
                        name: r.name.clone(),
                        kind: r.kind,
                        owner: Some(h.owner.clone()),
                        fencing_token: r.fencing_token,
                        waiters: r.waiters,
                    });
                }
                let was = old.and_then(|o| o.waiters).unwrap_or(0);
                if r.waiters.unwrap_or(0) > was {
                    let known: Vec<&str> = old
                        .map(|o| o.queue.iter().map(|w| w.owner.as_str()).collect())
                        .unwrap_or_default();
                    let newcomer = r.queue.iter().find(|w| !known.contains(&w.owner.as_str()));
                    events.push(Event {
                        at_ms,
                        event: Change::Waiting,
                        name: r.name.clone(),
                        kind: r.kind,
                        owner: newcomer.map(|w| w.owner.clone()),
                        fencing_token: r.fencing_token,
                        waiters: r.waiters,
                    });
                }
            }
        }
        // Forget what is gone, so that a holder that comes back is new.
        self.holders.retain(|(name, kind, owner), _| {
            current
                .get(&(name.clone(), *kind))
                .is_some_and(|r| r.holders.iter().any(|h| &h.owner == owner))
        });
        self.waiting
            .retain(|key, _| current.get(key).is_some_and(|r| r.waiters.unwrap_or(0) > 0));
        self.last = Some((started, current));
        (rows, events)
    }

    /// The row of one lock inspected now, with the times this tracker knows (without
    /// counting it as a look: a detail between two refreshes changes nothing).
    pub fn detail(&self, now: Instant, kind: LockKind, info: &LockInfo) -> LockRow {
        let mut scratch = Tracker {
            holders: self.holders.clone(),
            waiting: self.waiting.clone(),
            last: None,
        };
        scratch.row(now, self.last.is_none(), kind, info)
    }

    fn row(&mut self, now: Instant, first: bool, kind: LockKind, info: &LockInfo) -> LockRow {
        let kind = kind_name(kind);
        let new = Seen {
            at: now,
            at_least: first,
        };
        let holders = info
            .holders
            .iter()
            .map(|h| {
                let seen = *self
                    .holders
                    .entry((info.name.clone(), kind, h.owner.clone()))
                    .or_insert(new);
                holder_row(h, now.saturating_duration_since(seen.at), seen.at_least)
            })
            .collect();
        let waiters = info.waiters;
        let (oldest_wait_ms, oldest_wait_at_least) = match info.oldest_wait() {
            Some(w) => (Some(ms(w)), false),
            None if waiters.unwrap_or(0) > 0 => {
                let seen = *self.waiting.entry((info.name.clone(), kind)).or_insert(new);
                (Some(ms(now.saturating_duration_since(seen.at))), true)
            }
            None => (None, false),
        };
        LockRow {
            name: info.name.clone(),
            kind,
            held: info.held(),
            holders,
            fencing_token: info.fencing_token,
            waiters,
            oldest_wait_ms,
            oldest_wait_at_least,
            queue: info.queue.iter().map(waiter_row).collect(),
            permits: info.permits,
        }
    }
}

fn holder_row(h: &HolderInfo, held_for: Duration, at_least: bool) -> HolderRow {
    let origin = h.origin();
    HolderRow {
        owner: h.owner.clone(),
        host: origin.map(|(host, _)| host.to_owned()),
        pid: origin.map(|(_, pid)| pid),
        count: h.count,
        side: h.side.map(LockKind::as_str),
        lease_left_ms: h.lease_left.map(ms),
        held_for_ms: ms(held_for),
        held_for_at_least: at_least,
        value: h.value.clone(),
    }
}

fn waiter_row(w: &WaiterInfo) -> WaiterRow {
    let origin = w.origin();
    WaiterRow {
        owner: w.owner.clone(),
        host: origin.map(|(host, _)| host.to_owned()),
        pid: origin.map(|(_, pid)| pid),
        side: w.side.map(LockKind::as_str),
        waited_ms: w.waited.map(ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(name: &str, owners: &[(&str, u64)], waiters: u32) -> ListedLock {
        let holders = owners
            .iter()
            .map(|(o, lease)| {
                HolderInfo::new(*o, 1).with_lease_left(Some(Duration::from_millis(*lease)))
            })
            .collect();
        ListedLock::new(
            LockKind::Mutex,
            LockInfo::new(name)
                .with_holders(holders)
                .with_waiters(Some(waiters))
                .with_fencing_token(7),
        )
    }

    #[test]
    fn a_watcher_tells_grants_releases_losses_and_waits_apart() {
        let mut t = Tracker::new();
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let (rows, events) = t.observe(t0, t0, wall, &[listed("a", &[("h1", 10_000)], 0)]);
        assert!(events.is_empty(), "the first look is the baseline");
        assert!(rows[0].holders[0].held_for_at_least);

        // h1 releases early; h2 gets it; two wait.
        let t1 = t0 + Duration::from_secs(1);
        let (rows, events) = t.observe(t1, t1, wall, &[listed("a", &[("h2", 200)], 2)]);
        let kinds: Vec<_> = events.iter().map(|e| e.event).collect();
        assert_eq!(
            kinds,
            [Change::Released, Change::Granted, Change::Waiting],
            "{events:?}"
        );
        assert_eq!(events[1].owner.as_deref(), Some("h2"));
        assert!(!rows[0].holders[0].held_for_at_least);
        assert!(rows[0].oldest_wait_at_least, "no queue times: observed");

        // h2's 200 ms lease runs out unreleased.
        let t2 = t1 + Duration::from_secs(1);
        let (rows, events) = t.observe(t2, t2, wall, &[listed("a", &[], 2)]);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].event, Change::Lost);
        assert_eq!(rows[0].oldest_wait_ms, Some(1000), "waiting since t1");
    }

    #[test]
    fn contention_puts_the_longest_queues_first() {
        let mut t = Tracker::new();
        let now = Instant::now();
        let (mut rows, _) = t.observe(
            now,
            now,
            SystemTime::now(),
            &[
                listed("free", &[], 0),
                listed("busy", &[("x", 1000)], 3),
                listed("held", &[("y", 1000)], 0),
                listed("queued", &[("z", 1000)], 1),
            ],
        );
        Sort::Contention.apply(&mut rows);
        let names: Vec<_> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["busy", "queued", "held", "free"]);
        Sort::Name.apply(&mut rows);
        assert_eq!(rows[0].name, "busy");
        assert_eq!(Sort::parse("lease"), Ok(Sort::Lease));
        assert!(Sort::parse("size").unwrap_err().contains("contention"));
    }
}
