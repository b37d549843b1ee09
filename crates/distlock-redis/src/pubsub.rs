//! Release notifications: one subscriber connection per client, multiplexing lock channels
//! through the core's wake-up table ([`Subscriptions`]); docs/redis-lock.md, "Operations"
//! (wait), and on a cluster docs/redis-cluster.md, "Wake-ups".
//!
//! A lock's channel is subscribed only while a waiter of this client waits on it; its messages
//! are `r` (released) or `h TOKEN ATTEMPT` (handed over to ATTEMPT). A mutex (or election)
//! waiter listens on its client's **wake channel** (`NS:wake:ID`, subscribed once per
//! connection and pinned), which its queue entry names, so a watch is a table entry made before
//! the waiter's first request ([`Subscriber::ready`]); a Redlock node tells a queued waiter its
//! turn there as `h 0 ATTEMPT` (token 0 is never a grant's). If the connection breaks, every
//! watch ends with a connection error and the waiter subscribes again. On `redis+cluster://`
//! any node hears every PUBLISH: the subscriber stays on one until its connection breaks.

use crate::error::{map, KIND};
use distlock_core::backend::{AttemptId, ReleaseWatch, Subscription, Subscriptions};
use distlock_core::{Error, Result};
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Mutex;

/// One subscriber connection and the table of the channels it serves.
struct Conn {
    sink: PubSubSink,
    subs: Subscriptions<String>,
    alive: Arc<AtomicBool>,
    /// Which connection this is: an unsubscribe asked for by an earlier one must not touch it.
    generation: u64,
    /// The task reading the messages (stopped when the master moves).
    reader: tokio::task::AbortHandle,
}

/// Where a subscriber subscribes: at least one node, and the endpoint its errors name.
#[derive(Clone)]
struct Targets {
    clients: Vec<redis::Client>,
    endpoint: String,
}

pub(crate) struct Subscriber {
    /// Where to subscribe: the nodes (one; a cluster's several, any of which hears every
    /// PUBLISH) and the endpoint named in errors. Replaced when a Sentinel failover moves the
    /// master.
    targets: std::sync::Mutex<Targets>,
    /// Which node to try first (the last that answered).
    next: std::sync::atomic::AtomicUsize,
    timeout: Duration,
    /// The connection; its lock also orders every SUBSCRIBE before a later UNSUBSCRIBE.
    conn: Mutex<Option<Conn>>,
    generations: AtomicU64,
    /// Report handoffs as plain releases, so that the waiter's next attempt confirms the grant
    /// with its own write and WAIT (`?wait_replicas=N`).
    confirm_handoffs: bool,
    /// This client's wake channel (see the module docs), subscribed with every connection.
    wake: String,
    /// Tests: run once between a live connection's `alive` check and the subscription that
    /// relies on it (the window where its reader may die and drain the table).
    #[cfg(test)]
    race: std::sync::Mutex<Option<RaceHook>>,
}

/// Tests: see `Subscriber::race`.
#[cfg(test)]
type RaceHook = Box<dyn FnOnce(&Conn) + Send>;

/// A new wake channel name for a client in `namespace`: unique per backend.
pub(crate) fn wake_channel(namespace: &str) -> String {
    // An attempt id is 128 random bits in hex: as unique for a client.
    format!("{namespace}:wake:{}", AttemptId::new())
}

/// Passes one message of a lock's channel to the table.
fn deliver(subs: &Subscriptions<String>, channel: &str, payload: &[u8]) {
    let key = channel.to_owned();
    let text = String::from_utf8_lossy(payload);
    let mut parts = text.splitn(4, ' ');
    // A handoff or a wake-up (attempt, token, request), or else a release.
    let handoff = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        // A handoff to another attempt (of this client or another) wakes nobody here. It
        // names the waiter's request it followed (`crate::requests`); an older script's
        // does not (0: confirmed by an attempt). A token that does not parse cannot happen
        // with our scripts: it is a release, waking the waiters makes them try, and the
        // attempt it names claims the handoff.
        (Some("h"), Some(token), Some(attempt), request) => token.parse().ok().map(|t| {
            let request = request.and_then(|r| r.parse().ok()).unwrap_or(0);
            (attempt, t, request)
        }),
        // A wake-up for one waiting attempt (the contended mode's release freed the lock and
        // names the oldest waiter, see `crate::contended`): the core's table wakes one attempt
        // only through a handoff, so it is passed as one of token 0 — no grant: every wake-up
        // is confirmed by an attempt, which asks for the free lock like anyone else.
        (Some("w"), Some(attempt), None, None) => Some((attempt, 0, 0)),
        _ => None,
    };
    match handoff {
        Some((attempt, t, request)) => subs.notify_handoff_after(&key, attempt, t, request),
        None => subs.notify_released(&key),
    };
}

impl Subscriber {
    /// A subscriber at the first of `clients` that answers (at least one; a cluster's nodes).
    pub(crate) fn over(
        clients: Vec<redis::Client>,
        endpoint: String,
        timeout: Duration,
        confirm_handoffs: bool,
        wake: String,
    ) -> Arc<Self> {
        Arc::new(Subscriber {
            targets: std::sync::Mutex::new(Targets { clients, endpoint }),
            next: std::sync::atomic::AtomicUsize::new(0),
            timeout,
            conn: Mutex::new(None),
            generations: AtomicU64::new(0),
            confirm_handoffs,
            wake,
            #[cfg(test)]
            race: std::sync::Mutex::new(None),
        })
    }

    /// This client's wake channel.
    pub(crate) fn wake(&self) -> &str {
        &self.wake
    }

    /// The client the subscriber connects with (the first node).
    pub(crate) fn client(&self) -> redis::Client {
        self.targets().clients[0].clone()
    }

    fn targets(&self) -> Targets {
        crate::lock(&self.targets).clone()
    }

    fn endpoint(&self) -> String {
        self.targets().endpoint
    }

    /// The master moved (Sentinel): later subscriptions go to `client` (at `endpoint`). The
    /// waiters of the old connection are woken with a connection error and subscribe again,
    /// there: none keeps sleeping on a connection to the old master.
    pub(crate) async fn switch(&self, client: redis::Client, endpoint: String) {
        *crate::lock(&self.targets) = Targets {
            clients: vec![client],
            endpoint,
        };
        if let Some(old) = self.conn.lock().await.take() {
            old.reader.abort();
            old.alive.store(false, Ordering::SeqCst);
            old.subs
                .fail_all("the master was failed over; subscribing again on the new master");
        }
    }

    /// A pub/sub connection to the node that answered last, else to the next that answers,
    /// and the endpoint its watches name.
    async fn open(&self) -> Result<(redis::aio::PubSub, String)> {
        let Targets { clients, endpoint } = self.targets();
        let first = self.next.load(Ordering::Relaxed) % clients.len();
        let mut last = None;
        for i in (0..clients.len()).map(|k| (first + k) % clients.len()) {
            let pubsub = clients[i].get_async_pubsub();
            let e = match self
                .timed(&endpoint, "connecting the subscriber", pubsub)
                .await
            {
                Ok(p) => {
                    self.next.store(i, Ordering::Relaxed);
                    return Ok((p, endpoint));
                }
                Err(e) => e,
            };
            if clients.len() > 1 {
                tracing::debug!(node = %clients[i].get_connection_info().addr(), error = %e, "cannot subscribe at this node; trying the next");
            }
            last = Some(e);
        }
        Err(last.unwrap_or_else(|| self.timeout_error("connecting the subscriber")))
    }

    async fn connect(self: &Arc<Self>) -> Result<Conn> {
        let (pubsub, endpoint) = self.open().await?;
        let (mut sink, mut stream) = pubsub.split();
        // The wake channel first: every waiter of this connection relies on it.
        (self.timed(&endpoint, "SUBSCRIBE", sink.subscribe(&self.wake))).await?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let subs: Subscriptions<String> = Subscriptions::new(KIND, endpoint);
        subs.handoffs_as_releases(self.confirm_handoffs);
        subs.pin(self.wake.clone());
        let me = Arc::downgrade(self);
        subs.on_unused(move || unsubscribe_later(&me, generation));
        let alive = Arc::new(AtomicBool::new(true));
        let (reader_subs, reader_alive) = (subs.clone(), alive.clone());
        let reader_me = Arc::downgrade(self);
        let reader = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                deliver(
                    &reader_subs,
                    msg.get_channel_name(),
                    msg.get_payload_bytes(),
                );
            }
            reader_alive.store(false, Ordering::SeqCst);
            // The node may be gone: the next connection tries another first.
            if let Some(me) = reader_me.upgrade() {
                me.next.fetch_add(1, Ordering::Relaxed);
            }
            reader_subs.fail_all("the subscriber connection closed");
            tracing::debug!("redis subscriber connection closed");
        });
        Ok(Conn {
            sink,
            subs,
            alive,
            generation,
            reader: reader.abort_handle(),
        })
    }

    fn timeout_error(&self, what: &str) -> Error {
        Error::call_timeout(KIND, self.endpoint(), what, self.timeout)
    }

    /// `call` (`what`, for a timeout) within the subscriber's timeout, its error mapped.
    async fn timed<T>(
        &self,
        endpoint: &str,
        what: &str,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r.map_err(|e| map(endpoint, e)),
            Err(_) => Err(self.timeout_error(what)),
        }
    }

    /// The same watch if it can be made now, without a round trip or waiting for a lock: the
    /// connection is up, so its wake channel is subscribed (`connect` pins it, and a table
    /// loses it only with the connection, after `alive` is cleared). `None` before the first
    /// wait of this client, after the connection broke (also while the watch was being
    /// made: see [`subscribe_live`](Self::subscribe_live)), or while another call holds it.
    pub(crate) fn ready(&self, attempt: &AttemptId) -> Option<Box<dyn ReleaseWatch>> {
        let guard = self.conn.try_lock().ok()?;
        let conn = guard.as_ref().filter(|c| c.alive.load(Ordering::SeqCst))?;
        let (watch, _) = self.subscribe_live(conn, self.wake.clone(), attempt)?;
        Some(Box::new(watch))
    }

    /// `conn.subs.subscribe(key, attempt)`, or `None` if the connection died meanwhile. Its
    /// reader clears `alive`, then fails (and drains) the table: a watch that went into the
    /// table before the drain is failed by it, and one that went in after it finds `alive`
    /// cleared here — so no watch sits in a table nothing will ever wake or fail.
    fn subscribe_live(
        &self,
        conn: &Conn,
        key: String,
        attempt: &AttemptId,
    ) -> Option<(Subscription<String>, bool)> {
        #[cfg(test)]
        self.race_point(conn);
        let (watch, first) = conn.subs.subscribe(key, attempt);
        conn.alive.load(Ordering::SeqCst).then_some((watch, first))
    }

    /// Tests: runs the hook set in `race`, if any.
    #[cfg(test)]
    fn race_point(&self, conn: &Conn) {
        let hook = crate::lock(&self.race).take();
        if let Some(hook) = hook {
            hook(conn);
        }
    }

    /// The live connection in `guard`, connecting first if there is none (or it died).
    async fn live<'g>(
        self: &Arc<Self>,
        guard: &'g mut tokio::sync::MutexGuard<'_, Option<Conn>>,
    ) -> Result<&'g mut Conn> {
        if !guard
            .as_ref()
            .is_some_and(|c| c.alive.load(Ordering::SeqCst))
        {
            **guard = None;
            **guard = Some(self.connect().await?);
        }
        guard
            .as_mut()
            .ok_or_else(|| self.timeout_error("connecting the subscriber"))
    }

    /// Subscribes (if needed) and returns a watch for the waiting `attempt` on `channel`.
    pub(crate) async fn watch(
        self: &Arc<Self>,
        channel: String,
        attempt: &AttemptId,
    ) -> Result<Box<dyn ReleaseWatch>> {
        let mut guard = self.conn.lock().await;
        // A connection that dies right after `live` looked is replaced (once).
        for _ in 0..2 {
            let conn = self.live(&mut guard).await?;
            let Some((watch, first)) = self.subscribe_live(conn, channel.clone(), attempt) else {
                *guard = None;
                continue;
            };
            if first {
                let sub = conn.sink.subscribe(&channel);
                if let Err(e) = self.timed(&self.endpoint(), "SUBSCRIBE", sub).await {
                    conn.subs.fail(&channel, &e.to_string());
                    // The connection is in an unknown state; start over next time.
                    *guard = None;
                    return Err(e);
                }
            }
            return Ok(Box::new(watch));
        }
        let closed = "the subscriber connection closed while subscribing";
        Err(Error::connection(KIND, self.endpoint(), closed))
    }

    /// Unsubscribes the channels whose last watch went, if connection `generation` is still
    /// the one in use.
    async fn unsubscribe_unused(&self, generation: u64) {
        let mut guard = self.conn.lock().await;
        let Some(conn) = guard.as_mut().filter(|c| c.generation == generation) else {
            return;
        };
        let unused = conn.subs.take_unused();
        if unused.is_empty() || !conn.alive.load(Ordering::SeqCst) {
            return;
        }
        // One UNSUBSCRIBE for all of them (a mutex waiter leaves two channels at once).
        match tokio::time::timeout(self.timeout, conn.sink.unsubscribe(&unused)).await {
            Ok(Ok(())) => {}
            _ => *guard = None,
        }
    }

    /// Channels with a waiter of this client right now (for tests): a lock's channel, or the
    /// wake channel while a mutex waiter listens there.
    pub(crate) async fn subscribed(&self) -> usize {
        self.conn
            .lock()
            .await
            .as_ref()
            .map_or(0, |c| c.subs.in_use())
    }
}

/// The table's hook when a channel loses its last watch (from the watch's `Drop`): the
/// unsubscribe runs in a task, under the connection lock.
fn unsubscribe_later(subscriber: &Weak<Subscriber>, generation: u64) {
    let Some(sub) = subscriber.upgrade() else {
        return;
    };
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move { sub.unsubscribe_unused(generation).await });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::backend::Wake;
    use distlock_testkit::RedisServer;
    use std::time::Instant;

    /// A hook for `race` that kills the subscriber connection on `server` and returns once its
    /// reader has cleared `alive` and drained the table (as a connection that dies at that
    /// very moment would).
    fn kill_and_drain(server: Arc<RedisServer>) -> RaceHook {
        Box::new(move |conn: &Conn| {
            server
                .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
                .expect("CLIENT KILL");
            let t = Instant::now();
            while conn.alive.load(Ordering::SeqCst) || !conn.subs.is_empty() {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "the reader never ended"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    }

    /// Issue 23 #5: the subscriber connection dies between the `alive` check and the
    /// subscription (a deterministic interleaving through the `race` hook: on a real server
    /// the window is a few instructions wide). The watch handed out must not sit in the drained
    /// table, where nothing would ever wake or fail it: `ready` hands out none, and
    /// `watch` of the wake channel one on a fresh connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_watch_is_handed_out_on_a_table_the_dying_reader_drained() {
        let server = Arc::new(RedisServer::start().expect("redis"));
        let client = redis::Client::open(server.url()).expect("client");
        let sub = Subscriber::over(
            vec![client],
            "test".into(),
            Duration::from_secs(2),
            false,
            wake_channel("test"),
        );
        // Connected, the wake channel subscribed.
        drop(
            sub.watch(sub.wake.clone(), &AttemptId::new())
                .await
                .expect("watch"),
        );
        let mut failures = Vec::new();
        let attempt = AttemptId::new();
        *sub.race.lock().expect("race") = Some(kill_and_drain(server.clone()));
        if let Some(mut w) = sub.ready(&attempt) {
            let r = tokio::time::timeout(Duration::from_secs(3), w.changed()).await;
            if !matches!(r, Ok(Err(_))) {
                failures.push(format!(
                    "ready: a watch on a dead connection neither failed nor fired: {r:?}"
                ));
            }
        }
        // A live connection again, then the same race in watch (of the wake channel).
        drop(
            sub.watch(sub.wake.clone(), &AttemptId::new())
                .await
                .expect("watch"),
        );
        *sub.race.lock().expect("race") = Some(kill_and_drain(server.clone()));
        let mut w = sub.watch(sub.wake.clone(), &attempt).await.expect("watch");
        // On a live connection a publish on the wake channel reaches it (a failed watch is
        // fine too: the waiter subscribes again).
        server
            .command(&["PUBLISH", sub.wake(), "r"])
            .expect("PUBLISH");
        let r = tokio::time::timeout(Duration::from_secs(3), w.changed()).await;
        if !matches!(r, Ok(Ok(Wake::Released) | Err(_))) {
            failures.push(format!("watch: the watch is on no live connection: {r:?}"));
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
