//! [`Subscriptions`]: one table of wake-up subscriptions per notification connection.

use crate::backend::{AttemptId, ReleaseWatch, Wake};
use crate::error::{Error, Result};
use crate::fasthash::FastMap;
use async_trait::async_trait;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use tokio::sync::watch;

/// The waiters of one client on one notification connection (Redis `SUBSCRIBE`, Postgres
/// `LISTEN`), multiplexed by key (a channel name): the generic half of a backend's
/// [`Backend::watch`](crate::Backend::watch).
///
/// The backend keeps the connection and its reader task; the table keeps, per key, the
/// waiters of this client and what they have not seen yet. So the backend only:
/// 1. calls [`subscribe`](Subscriptions::subscribe) in `watch`, and sends the server
///    `SUBSCRIBE` when it answers `first == true`;
/// 2. calls [`notify_released`](Subscriptions::notify_released) or
///    [`notify_handoff`](Subscriptions::notify_handoff) from its reader for every message;
/// 3. calls [`fail_all`](Subscriptions::fail_all) when the connection breaks (every watch
///    then ends with an [`Error::Connection`], and the waiters subscribe again);
/// 4. sends `UNSUBSCRIBE` for the keys [`take_unused`](Subscriptions::take_unused) returns,
///    e.g. from the hook set with [`on_unused`](Subscriptions::on_unused), which runs when the
///    last watch of a key is dropped (the reference count reaches zero).
///
/// **The one rule:** do step 1 (`subscribe` and the `SUBSCRIBE` it asks for) and step 4
/// (`take_unused` and its `UNSUBSCRIBE`s) under one lock of yours (e.g. the connection's
/// `tokio::sync::Mutex`), so that an `UNSUBSCRIBE` never overtakes the `SUBSCRIBE` of a key
/// that got a new waiter meanwhile.
///
/// A watch wakes for a release that is notified after [`subscribe`](Subscriptions::subscribe)
/// returned it, even if it comes before the watch's first `changed()`; a handoff wakes only
/// the watch of the attempt it names (never a sibling attempt of the same owner).
///
/// ```
/// # async fn f() -> distlock_core::Result<()> {
/// use distlock_core::backend::{AttemptId, ReleaseWatch, Subscriptions, Wake};
/// let subs: Subscriptions<String> = Subscriptions::new("redis", "127.0.0.1:6379");
/// let attempt = AttemptId::new();
/// let (mut watch, first) = subs.subscribe("dlock:{a}".to_string(), &attempt);
/// assert!(first); // here the backend sends SUBSCRIBE dlock:{a}
/// subs.notify_handoff(&"dlock:{a}".to_string(), &attempt, 7);
/// assert_eq!(watch.changed().await?, Wake::HandedOver { token: 7 });
/// drop(watch);
/// assert_eq!(subs.take_unused(), vec!["dlock:{a}".to_string()]); // UNSUBSCRIBE it
/// # Ok(()) }
/// ```
pub struct Subscriptions<K> {
    inner: Arc<Shared<K>>,
}

impl<K> Clone for Subscriptions<K> {
    fn clone(&self) -> Self {
        Subscriptions {
            inner: self.inner.clone(),
        }
    }
}

impl<K> std::fmt::Debug for Subscriptions<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriptions")
            .field("backend", &self.inner.backend)
            .field("endpoint", &self.inner.endpoint)
            .finish_non_exhaustive()
    }
}

struct Shared<K> {
    backend: &'static str,
    endpoint: String,
    handoffs_as_releases: AtomicBool,
    next_id: AtomicU64,
    table: Mutex<HashMap<K, Channel>>,
    on_unused: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Orders the server commands of [`Subscriptions::watch`] and
    /// [`Subscriptions::unsubscribe_unused`].
    server: tokio::sync::Mutex<()>,
}

/// One key's state: what its watches have not seen yet.
struct Channel {
    /// Tells watches apart from those of an earlier subscription to the same key.
    id: u64,
    /// Live watches of this key.
    watches: usize,
    /// Plain releases notified.
    released: u64,
    /// Kept subscribed with no watch (see [`Subscriptions::pin`]).
    pinned: bool,
    /// Waiting attempts, with how many watches each has.
    attempts: FastMap<AttemptId, usize>,
    /// Handoffs not yet picked up: attempt → token.
    handed: FastMap<AttemptId, (u64, u64)>,
    /// Bumped on every notice; dropped (after saying why) when the key's watches fail.
    beat: watch::Sender<Beat>,
}

#[derive(Default)]
struct Beat {
    n: u64,
    failed: Option<Arc<str>>,
}

impl Channel {
    fn bump(&self) {
        self.beat.send_modify(|b| b.n = b.n.wrapping_add(1));
    }

    fn fail(self, why: &Arc<str>) {
        self.beat.send_modify(|b| b.failed = Some(why.clone()));
    }
}

impl<K: Eq + Hash + Clone + Send + Sync + 'static> Subscriptions<K> {
    /// An empty table for backend kind `backend` talking to `endpoint` (both only for the
    /// errors of failed watches).
    pub fn new(backend: &'static str, endpoint: impl Into<String>) -> Self {
        Subscriptions {
            inner: Arc::new(Shared {
                backend,
                endpoint: endpoint.into(),
                handoffs_as_releases: AtomicBool::new(false),
                next_id: AtomicU64::new(1),
                table: Mutex::new(HashMap::new()),
                on_unused: OnceLock::new(),
                server: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Reports a handoff to a watch as [`Wake::Released`] instead of
    /// [`Wake::HandedOver`], so that the waiter's next attempt confirms the grant itself
    /// (e.g. Redis with `wait_replicas`, where the handoff was written by another
    /// connection). Default false.
    pub fn handoffs_as_releases(&self, yes: bool) {
        self.inner
            .handoffs_as_releases
            .store(yes, Ordering::Relaxed);
    }

    /// Sets the hook run (outside every lock, from the `Drop` of a watch, so possibly outside
    /// a runtime — check `tokio::runtime::Handle::try_current()` before spawning) when a key
    /// loses its last watch: typically it spawns a task that takes the connection's lock,
    /// calls [`take_unused`](Subscriptions::take_unused) and unsubscribes those keys. Only
    /// the first hook set is kept; false if one was set already.
    pub fn on_unused(&self, hook: impl Fn() + Send + Sync + 'static) -> bool {
        self.inner.on_unused.set(Box::new(hook)).is_ok()
    }

    fn table(&self) -> MutexGuard<'_, HashMap<K, Channel>> {
        self.inner.table()
    }

    /// A watch for the waiting `attempt` on `key`, and whether the key is new here (`true`:
    /// the backend must subscribe to it on the server now, before the waiter's next attempt;
    /// if that fails, call [`fail`](Subscriptions::fail) or
    /// [`fail_all`](Subscriptions::fail_all) and return the error).
    pub fn subscribe(&self, key: K, attempt: &AttemptId) -> (Subscription<K>, bool) {
        let mut table = self.table();
        let first = !table.contains_key(&key);
        let ch = table
            .entry(key.clone())
            .or_insert_with(|| self.inner.channel());
        ch.watches += 1;
        *ch.attempts.entry(attempt.clone()).or_insert(0) += 1;
        let watch = Subscription {
            shared: self.inner.clone(),
            key,
            attempt: attempt.clone(),
            id: ch.id,
            seen: ch.released,
            rx: ch.beat.subscribe(),
        };
        (watch, first)
    }

    /// Keeps `key` subscribed while no watch waits on it: [`take_unused`](Subscriptions::take_unused)
    /// never returns it, so the backend subscribes it once per connection (e.g. a client's
    /// own wake-up channel that every handoff to one of its waiters is sent to). Returns
    /// whether the key is new here (`true`: subscribe it on the server now). A pinned key
    /// with no live watch does not count in [`watched`](Subscriptions::watched); it goes
    /// with [`fail`](Subscriptions::fail) and [`fail_all`](Subscriptions::fail_all).
    pub fn pin(&self, key: K) -> bool {
        let mut table = self.table();
        let first = !table.contains_key(&key);
        table
            .entry(key)
            .or_insert_with(|| self.inner.channel())
            .pinned = true;
        first
    }

    /// [`subscribe`](Subscriptions::subscribe), and the server subscription it asks for, with
    /// the rule kept for you: `subscribe_on_server(key)` (your `SUBSCRIBE`, bounded by your
    /// per-call timeout) runs only for a new key, ordered with
    /// [`unsubscribe_unused`](Subscriptions::unsubscribe_unused) by a lock of the table. If it
    /// fails, the key's watches fail too and its error is returned.
    ///
    /// ```
    /// # async fn f() -> distlock_core::Result<()> {
    /// use distlock_core::backend::{AttemptId, Subscriptions};
    /// let subs: Subscriptions<String> = Subscriptions::new("postgres", "db:5432");
    /// let watch = subs
    ///     .watch("dlock_ab12".into(), &AttemptId::new(), |channel| async move {
    ///         // conn.batch_execute(&format!("LISTEN \"{channel}\"")).await
    ///         Ok(())
    ///     })
    ///     .await?;
    /// drop(watch);
    /// let n = subs.unsubscribe_unused(|channel| async move { /* UNLISTEN */ Ok(()) }).await?;
    /// assert_eq!(n, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// If dropped while `subscribe_on_server` runs, the watch is dropped with it; the key may
    /// be subscribed on the server, and the next `unsubscribe_unused` unsubscribes it.
    ///
    /// # Errors
    /// The error of `subscribe_on_server`.
    pub async fn watch<F, Fut>(
        &self,
        key: K,
        attempt: &AttemptId,
        subscribe_on_server: F,
    ) -> Result<Subscription<K>>
    where
        F: FnOnce(K) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let _order = self.inner.server.lock().await;
        let (watch, first) = self.subscribe(key.clone(), attempt);
        if first {
            if let Err(e) = subscribe_on_server(key.clone()).await {
                self.fail(&key, &e.to_string());
                return Err(e);
            }
        }
        Ok(watch)
    }

    /// [`take_unused`](Subscriptions::take_unused), and `unsubscribe_on_server` for each key,
    /// ordered with [`watch`](Subscriptions::watch). Returns how many keys were unsubscribed;
    /// stops at the first error (then the connection is in doubt: reset it and call
    /// [`fail_all`](Subscriptions::fail_all)).
    ///
    /// # Cancel safety
    /// If dropped half-way, the keys not yet unsubscribed stay subscribed on the server
    /// (harmless: nobody here waits on them) until the connection is reset.
    ///
    /// # Errors
    /// The first error of `unsubscribe_on_server`.
    pub async fn unsubscribe_unused<F, Fut>(&self, mut unsubscribe_on_server: F) -> Result<usize>
    where
        F: FnMut(K) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let _order = self.inner.server.lock().await;
        let keys = self.take_unused();
        let n = keys.len();
        for k in keys {
            unsubscribe_on_server(k).await?;
        }
        Ok(n)
    }

    /// A release (or a change that may be one) of `key`: wakes every watch of it. False if
    /// no waiter of this client watches it.
    pub fn notify_released(&self, key: &K) -> bool {
        let mut table = self.table();
        let Some(ch) = table.get_mut(key).filter(|c| c.watches > 0) else {
            return false;
        };
        ch.released = ch.released.wrapping_add(1);
        ch.bump();
        true
    }

    /// `key` was handed straight to the waiting `attempt` with fencing token `token`: wakes
    /// that attempt's watches only. False (and nobody is woken) if that attempt does not
    /// wait here: a handoff to another client's or another attempt's waiter is not ours.
    pub fn notify_handoff(&self, key: &K, attempt: &str, token: u64) -> bool {
        self.notify_handoff_after(key, attempt, token, 0)
    }

    /// As [`notify_handoff`](Subscriptions::notify_handoff), for a handoff made after the
    /// server answered the attempt's request number `request` (0: not known): the watch
    /// reports it as [`Wake::HandedOverAfter`].
    pub fn notify_handoff_after(&self, key: &K, attempt: &str, token: u64, request: u64) -> bool {
        let mut table = self.table();
        let Some(ch) = table.get_mut(key) else {
            return false;
        };
        let Some((a, _)) = ch.attempts.get_key_value(attempt) else {
            return false;
        };
        ch.handed.insert(a.clone(), (token, request));
        ch.bump();
        true
    }

    /// Notifies `wake` for `attempt` on `key`: [`Wake::Released`] as
    /// [`notify_released`](Subscriptions::notify_released), [`Wake::HandedOver`] as
    /// [`notify_handoff`](Subscriptions::notify_handoff).
    pub fn notify(&self, key: &K, attempt: &str, wake: Wake) -> bool {
        match wake {
            Wake::Released => self.notify_released(key),
            Wake::HandedOver { token } | Wake::Granted { token, .. } => {
                self.notify_handoff(key, attempt, token)
            }
            Wake::HandedOverAfter { token, request } => {
                self.notify_handoff_after(key, attempt, token, request)
            }
        }
    }

    /// The subscription of `key` broke (its `SUBSCRIBE` failed): every watch of it ends with
    /// an [`Error::Connection`] saying `why`, and the key is forgotten (the next `subscribe`
    /// is `first` again). False if it was not subscribed.
    pub fn fail(&self, key: &K, why: &str) -> bool {
        let ch = self.table().remove(key);
        match ch {
            Some(ch) => {
                ch.fail(&Arc::from(why));
                true
            }
            None => false,
        }
    }

    /// The connection broke: every watch ends with an [`Error::Connection`] saying `why`,
    /// and every key is forgotten (a new connection starts from an empty table). Returns
    /// how many keys were subscribed.
    pub fn fail_all(&self, why: &str) -> usize {
        let all: Vec<Channel> = self.table().drain().map(|(_, c)| c).collect();
        let why: Arc<str> = Arc::from(why);
        let n = all.len();
        for ch in all {
            ch.fail(&why);
        }
        n
    }

    /// Takes out the keys whose last watch is gone: unsubscribe them on the server now,
    /// under the lock the rule above names.
    pub fn take_unused(&self) -> Vec<K> {
        let mut table = self.table();
        let unused: Vec<K> = table
            .iter()
            .filter(|(_, c)| c.watches == 0 && !c.pinned)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &unused {
            table.remove(k);
        }
        unused
    }

    /// Keys subscribed (including those whose watches are gone and that
    /// [`take_unused`](Subscriptions::take_unused) has not taken yet).
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// True when no key is subscribed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys subscribed for a waiter: with a live watch, or unpinned and not yet taken by
    /// [`take_unused`](Subscriptions::take_unused) (a pinned key with no watch is not).
    pub fn in_use(&self) -> usize {
        self.table()
            .values()
            .filter(|c| c.watches > 0 || !c.pinned)
            .count()
    }

    /// Keys with at least one live watch.
    pub fn watched(&self) -> usize {
        self.table().values().filter(|c| c.watches > 0).count()
    }
}

impl<K> Shared<K> {
    /// A new key's state.
    fn channel(&self) -> Channel {
        Channel {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            watches: 0,
            released: 0,
            pinned: false,
            attempts: FastMap::default(),
            handed: FastMap::default(),
            beat: watch::channel(Beat::default()).0,
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<K, Channel>> {
        // Every update is a few map operations on plain data: a poisoned lock holds whole data.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One waiter's watch from [`Subscriptions::subscribe`]: a [`ReleaseWatch`]. Dropping it
/// counts the key's watches down; at zero the key awaits its unsubscribe.
pub struct Subscription<K: Eq + Hash> {
    shared: Arc<Shared<K>>,
    key: K,
    attempt: AttemptId,
    id: u64,
    seen: u64,
    rx: watch::Receiver<Beat>,
}

impl<K: Eq + Hash> std::fmt::Debug for Subscription<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl<K: Eq + Hash> Subscription<K> {
    fn broken(&self) -> Error {
        let why = self
            .rx
            .borrow()
            .failed
            .clone()
            .unwrap_or_else(|| Arc::from("the notification connection closed"));
        Error::connection(
            self.shared.backend,
            self.shared.endpoint.clone(),
            why.to_string(),
        )
    }

    /// What is waiting for this watch now, if anything; `Err` if its subscription broke.
    fn poll_mail(&mut self) -> Result<Option<Wake>> {
        let as_release = self.shared.handoffs_as_releases.load(Ordering::Relaxed);
        let mut table = self.shared.table();
        let Some(ch) = table.get_mut(&self.key).filter(|c| c.id == self.id) else {
            drop(table);
            return Err(self.broken());
        };
        // Seen under the table lock: a notice after this moves the beat on again.
        self.rx.borrow_and_update();
        if let Some((token, request)) = ch.handed.remove(&self.attempt) {
            return Ok(Some(match (as_release, request) {
                (true, _) => Wake::Released,
                (false, 0) => Wake::HandedOver { token },
                (false, request) => Wake::HandedOverAfter { token, request },
            }));
        }
        if ch.released != self.seen {
            self.seen = ch.released;
            return Ok(Some(Wake::Released));
        }
        Ok(None)
    }
}

#[async_trait]
impl<K: Eq + Hash + Send + Sync + 'static> ReleaseWatch for Subscription<K> {
    /// The next release of the key, or handoff to this attempt, since the last call (or since
    /// the subscription, for the first call).
    ///
    /// # Cancel safety
    /// Cancel safe: a notice is taken out only when it is returned.
    async fn changed(&mut self) -> Result<Wake> {
        loop {
            if let Some(w) = self.poll_mail()? {
                return Ok(w);
            }
            if self.rx.changed().await.is_err() {
                return Err(self.broken());
            }
        }
    }
}

impl<K: Eq + Hash> Drop for Subscription<K> {
    fn drop(&mut self) {
        let now_unused = {
            let mut table = self.shared.table();
            let Some(ch) = table.get_mut(&self.key).filter(|c| c.id == self.id) else {
                return;
            };
            ch.watches = ch.watches.saturating_sub(1);
            if let Some(n) = ch.attempts.get_mut(&self.attempt) {
                *n -= 1;
                if *n == 0 {
                    ch.attempts.remove(&self.attempt);
                    ch.handed.remove(&self.attempt);
                }
            }
            ch.watches == 0 && !ch.pinned
        };
        if now_unused {
            if let Some(hook) = self.shared.on_unused.get() {
                hook();
            }
        }
    }
}

/// A watch that never fires, for a backend (or a mode) without notifications, e.g. behind a
/// pooler that drops them: waiters then wake at the holder's lease end or their heartbeat.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoWatch;

#[async_trait]
impl ReleaseWatch for NoWatch {
    /// Never resolves.
    ///
    /// # Cancel safety
    /// Cancel safe.
    async fn changed(&mut self) -> Result<Wake> {
        std::future::pending().await
    }
}

#[cfg(test)]
mod tests;
