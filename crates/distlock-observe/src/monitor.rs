//! [`Monitor`]: a client that looks at the locks again and again, remembers what it saw, and
//! tells what changed.

use crate::model::{unix_ms, Event, LockRow, Snapshot, Sort, Tracker};
use distlock_core::{Client, LockKind, Result};
use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::broadcast;

/// Events kept for a page that opens late (its timeline): at most this many…
const HISTORY_MAX: usize = 10_000;

/// Refresh statistics, for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RefreshStats {
    /// Refreshes that succeeded.
    pub ok: u64,
    /// Refreshes that failed (the server unreachable, a reply of the wrong shape).
    pub failed: u64,
    /// How long the last successful refresh took.
    pub last_duration: Duration,
}

/// Looks at every lock under a prefix of one backend, again and again: each
/// [`Monitor::refresh`] lists the locks (one call, pipelined where the backend can), builds a
/// [`Snapshot`] and records what changed since the last one as [`Event`]s, sent to
/// [`Monitor::subscribe`]rs and kept for [`Monitor::history`].
///
/// The changes are found by comparing snapshots, so a grant and release that both happen
/// between two looks is not seen; the refresh interval is the resolution.
///
/// ```no_run
/// # async fn f() -> distlock_core::Result<()> {
/// use distlock_observe::{Monitor, Sort};
/// let backend = std::sync::Arc::new(distlock_redis::RedisBackend::connect(
///     "redis://127.0.0.1:6379", &Default::default()).await?);
/// let client = distlock_core::Client::new(backend, Default::default())?;
/// let monitor = Monitor::new(client, "orders:");
/// let snap = monitor.refresh(Sort::Contention).await?;
/// print!("{}", distlock_observe::frame(&snap, 120));
/// # Ok(()) }
/// ```
pub struct Monitor {
    client: Client,
    prefix: String,
    tracker: tokio::sync::Mutex<Tracker>,
    last: Mutex<Option<Snapshot>>,
    history: Mutex<VecDeque<Event>>,
    history_span: Duration,
    events: broadcast::Sender<Event>,
    stats: Mutex<RefreshStats>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("backend", &self.client.backend_kind())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// A monitor of the locks of `client`'s backend whose names start with `prefix`; events
    /// are kept for 10 minutes.
    pub fn new(client: Client, prefix: impl Into<String>) -> Self {
        Monitor {
            client,
            prefix: prefix.into(),
            tracker: tokio::sync::Mutex::new(Tracker::new()),
            last: Mutex::new(None),
            history: Mutex::new(VecDeque::new()),
            history_span: Duration::from_secs(600),
            events: broadcast::channel(1024).0,
            stats: Mutex::new(RefreshStats::default()),
        }
    }

    /// The same, keeping events for `span` (the page's timeline).
    pub fn with_history(mut self, span: Duration) -> Self {
        self.history_span = span;
        self
    }

    /// The client it looks through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The prefix of the names it looks at.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Looks now: the snapshot, sorted by `sort`. The changes since the last look go to the
    /// subscribers and the history.
    ///
    /// # Errors
    /// [`Client::list`]'s: the backend cannot list, the server cannot be reached, a reply of
    /// the wrong shape.
    pub async fn refresh(&self, sort: Sort) -> Result<Snapshot> {
        let mut tracker = self.tracker.lock().await;
        let started = Instant::now();
        let listed = match self.client.list(&self.prefix).await {
            Ok(l) => l,
            Err(e) => {
                self.stats().failed += 1;
                return Err(e);
            }
        };
        let took = started.elapsed();
        let wall = SystemTime::now();
        let (locks, events) = tracker.observe(started, Instant::now(), wall, &listed);
        drop(tracker);
        {
            let mut s = self.stats();
            s.ok += 1;
            s.last_duration = took;
        }
        self.record(events);
        let mut snap = Snapshot {
            backend: self.client.backend_kind().to_owned(),
            endpoint: self.client.endpoint(),
            taken_at_ms: unix_ms(wall),
            locks,
        };
        snap.sort(sort);
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(snap.clone());
        Ok(snap)
    }

    /// The last snapshot [`Monitor::refresh`] took, if any.
    pub fn last(&self) -> Option<Snapshot> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// One lock of `kind` inspected now, with the holding and waiting times the monitor has
    /// seen (its holders and its queue in order).
    ///
    /// # Errors
    /// [`Client::inspect_kind`]'s: a bad name, a kind the backend lacks, the server
    /// unreachable.
    pub async fn detail(&self, name: &str, kind: LockKind) -> Result<LockRow> {
        let info = self.client.inspect_kind(name, kind).await?;
        let tracker = self.tracker.lock().await;
        Ok(tracker.detail(Instant::now(), kind, &info))
    }

    /// The events from now on. A subscriber that falls more than 1,024 events behind
    /// misses the oldest ones (it is told so by the channel).
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The events of the kept span, oldest first.
    pub fn history(&self) -> Vec<Event> {
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// How the refreshes went.
    pub fn refresh_stats(&self) -> RefreshStats {
        *self.stats()
    }

    /// Records `events` (and sends them to the subscribers), e.g. a forced release the
    /// server made.
    pub fn record(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let mut history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        let now = unix_ms(SystemTime::now());
        let span = u64::try_from(self.history_span.as_millis()).unwrap_or(u64::MAX);
        for e in events {
            // No subscriber is fine: the history keeps it.
            let _ = self.events.send(e.clone());
            history.push_back(e);
        }
        while history.len() > HISTORY_MAX
            || history
                .front()
                .is_some_and(|e| now.saturating_sub(e.at_ms) > span)
        {
            history.pop_front();
        }
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, RefreshStats> {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
