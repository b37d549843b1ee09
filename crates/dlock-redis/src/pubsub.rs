//! Release notifications: one subscriber connection per client, multiplexing lock channels.
//!
//! A channel is subscribed only while at least one waiter of this client waits on that lock,
//! and unsubscribed when the last one stops, so thousands of lock names do not mean
//! thousands of idle subscriptions. Each waiter holds a `watch` receiver whose version moves
//! on every message: a release that arrives between the waiter's attempt and its sleep is
//! not lost. If the connection breaks, every receiver sees its sender dropped and the waiter
//! resubscribes on a new connection.

use crate::error::map;
use dlock_core::{async_trait, Error, ReleaseWatch, Result};
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;
use tokio::sync::{watch, Mutex};

type Senders = Arc<StdMutex<HashMap<String, watch::Sender<u64>>>>;

struct Conn {
    sink: PubSubSink,
    /// Per channel: how many waiters of this client use it.
    refs: HashMap<String, usize>,
    /// Per channel: where the reader task reports messages. Dropped when the connection ends.
    senders: Senders,
    alive: Arc<std::sync::atomic::AtomicBool>,
    /// Which connection this is: a watch made on an earlier one must not touch this one's counts.
    generation: u64,
}

pub(crate) struct Subscriber {
    client: redis::Client,
    endpoint: String,
    timeout: Duration,
    conn: Mutex<Option<Conn>>,
    generations: std::sync::atomic::AtomicU64,
}

impl Subscriber {
    pub(crate) fn new(client: redis::Client, endpoint: String, timeout: Duration) -> Arc<Self> {
        Arc::new(Subscriber {
            client,
            endpoint,
            timeout,
            conn: Mutex::new(None),
            generations: std::sync::atomic::AtomicU64::new(0),
        })
    }

    async fn connect(&self) -> Result<Conn> {
        let pubsub = tokio::time::timeout(self.timeout, self.client.get_async_pubsub())
            .await
            .map_err(|_| self.timeout_error("connecting the subscriber"))?
            .map_err(|e| map(&self.endpoint, e))?;
        let (sink, mut stream) = pubsub.split();
        let senders: Senders = Arc::default();
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (s2, a2) = (senders.clone(), alive.clone());
        tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let map = s2.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(tx) = map.get(msg.get_channel_name()) {
                    tx.send_modify(|v| *v = v.wrapping_add(1));
                }
            }
            a2.store(false, std::sync::atomic::Ordering::SeqCst);
            // Dropping every sender ends every waiter's `changed()` with an error.
            s2.lock().unwrap_or_else(|p| p.into_inner()).clear();
            tracing::debug!("redis subscriber connection closed");
        });
        Ok(Conn {
            sink,
            refs: HashMap::new(),
            senders,
            alive,
            generation: self
                .generations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    fn timeout_error(&self, what: &str) -> Error {
        Error::Connection {
            backend: crate::error::KIND,
            endpoint: self.endpoint.clone(),
            source: format!("{what} took longer than {:?}", self.timeout).into(),
        }
    }

    /// Subscribes (if needed) and returns a watch whose `changed()` fires on releases.
    pub(crate) async fn watch(self: &Arc<Self>, channel: String) -> Result<Box<dyn ReleaseWatch>> {
        let mut guard = self.conn.lock().await;
        if guard
            .as_ref()
            .is_some_and(|c| !c.alive.load(std::sync::atomic::Ordering::SeqCst))
        {
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(self.connect().await?);
        }
        let Some(conn) = guard.as_mut() else {
            return Err(self.timeout_error("connecting the subscriber"));
        };
        let refs = conn.refs.get(&channel).copied().unwrap_or(0);
        if refs == 0 {
            let (tx, _) = watch::channel(0u64);
            conn.senders
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(channel.clone(), tx);
            let sub = tokio::time::timeout(self.timeout, conn.sink.subscribe(&channel)).await;
            let failed = match sub {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(map(&self.endpoint, e)),
                Err(_) => Some(self.timeout_error("SUBSCRIBE")),
            };
            if let Some(e) = failed {
                // The connection is in an unknown state; start over next time.
                *guard = None;
                return Err(e);
            }
        }
        conn.refs.insert(channel.clone(), refs + 1);
        let rx = conn
            .senders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&channel)
            .map(|tx| tx.subscribe());
        let Some(rx) = rx else {
            // The connection died while we subscribed.
            *guard = None;
            return Err(self.timeout_error("SUBSCRIBE"));
        };
        Ok(Box::new(RedisWatch {
            rx,
            generation: conn.generation,
            channel: Some(channel),
            subscriber: Arc::downgrade(self),
        }))
    }

    async fn unwatch(&self, channel: String, generation: u64) {
        let mut guard = self.conn.lock().await;
        let Some(conn) = guard.as_mut().filter(|c| c.generation == generation) else {
            return;
        };
        let Some(n) = conn.refs.get_mut(&channel) else {
            return;
        };
        *n -= 1;
        if *n > 0 {
            return;
        }
        conn.refs.remove(&channel);
        conn.senders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&channel);
        if !conn.alive.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        match tokio::time::timeout(self.timeout, conn.sink.unsubscribe(&channel)).await {
            Ok(Ok(())) => {}
            _ => *guard = None,
        }
    }

    /// Channels this client is subscribed to right now (for tests).
    pub(crate) async fn subscribed(&self) -> usize {
        self.conn.lock().await.as_ref().map_or(0, |c| c.refs.len())
    }
}

struct RedisWatch {
    rx: watch::Receiver<u64>,
    generation: u64,
    channel: Option<String>,
    subscriber: Weak<Subscriber>,
}

#[async_trait]
impl ReleaseWatch for RedisWatch {
    async fn changed(&mut self) -> Result<()> {
        self.rx.changed().await.map_err(|_| Error::Connection {
            backend: crate::error::KIND,
            endpoint: self
                .subscriber
                .upgrade()
                .map_or_else(String::new, |s| s.endpoint.clone()),
            source: "the subscriber connection closed".into(),
        })
    }
}

impl Drop for RedisWatch {
    fn drop(&mut self) {
        let (Some(channel), Some(sub)) = (self.channel.take(), self.subscriber.upgrade()) else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let generation = self.generation;
            rt.spawn(async move { sub.unwatch(channel, generation).await });
        }
    }
}
