//! Release notifications: one subscriber connection per client, multiplexing lock channels.
//!
//! A channel is subscribed only while at least one waiter of this client waits on that lock,
//! and unsubscribed when the last one stops, so thousands of lock names do not mean
//! thousands of idle subscriptions.
//!
//! Messages on a lock's channel are `r` (released) or `h TOKEN ATTEMPT` (handed over to the
//! waiting attempt ATTEMPT). Per channel the reader keeps a count of releases and a mailbox of
//! handoffs for the attempts waiting in this client, then bumps a `watch` version: a waiter is
//! woken only by a plain release or by a handoff to its own attempt — never by one to another
//! attempt of the same owner (a sibling task, or the write waiter of a handle whose read side
//! was granted) — and a message that arrives between the waiter's attempt and its sleep is not
//! lost. If the connection breaks,
//! every receiver sees its sender dropped and the waiter resubscribes on a new connection.

use crate::error::map;
use distlock_core::{async_trait, Error, ReleaseWatch, Result, Wake};
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::{watch, Mutex};

/// What one channel has seen, shared by the reader task and the channel's watches.
struct Channel {
    version: watch::Sender<u64>,
    mail: StdMutex<Mailbox>,
}

#[derive(Default)]
struct Mailbox {
    /// Plain releases seen.
    released: u64,
    /// Attempts of this client waiting on the channel, with how many watches each has.
    attempts: HashMap<String, usize>,
    /// Handoffs not yet picked up: attempt → token.
    handed: HashMap<String, u64>,
}

impl Channel {
    fn mail(&self) -> MutexGuard<'_, Mailbox> {
        self.mail.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, payload: &[u8]) {
        {
            let mut mail = self.mail();
            let text = String::from_utf8_lossy(payload);
            let mut parts = text.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("h"), Some(token), Some(attempt)) => {
                    if mail.attempts.contains_key(attempt) {
                        match token.parse() {
                            Ok(t) => {
                                mail.handed.insert(attempt.to_owned(), t);
                            }
                            // Cannot happen with our scripts; waking the waiter makes it
                            // try, and its attempt claims the handoff.
                            Err(_) => mail.released += 1,
                        }
                    } else {
                        // A handoff to another attempt (of this client or another): not
                        // ours to report.
                        return;
                    }
                }
                _ => mail.released += 1,
            }
        }
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }
}

type Channels = Arc<StdMutex<HashMap<String, Arc<Channel>>>>;

fn lock_map(c: &Channels) -> MutexGuard<'_, HashMap<String, Arc<Channel>>> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

struct Conn {
    sink: PubSubSink,
    /// Per channel: how many watches of this client use it.
    refs: HashMap<String, usize>,
    /// Per channel: where the reader task reports messages. Cleared when the connection ends.
    channels: Channels,
    alive: Arc<AtomicBool>,
    /// Which connection this is: a watch made on an earlier one must not touch this one's counts.
    generation: u64,
}

pub(crate) struct Subscriber {
    client: redis::Client,
    endpoint: String,
    timeout: Duration,
    conn: Mutex<Option<Conn>>,
    generations: AtomicU64,
    /// Report handoffs as plain releases, so that the waiter's next attempt confirms the grant
    /// with its own write and WAIT (`?wait_replicas=N`).
    confirm_handoffs: bool,
}

impl Subscriber {
    pub(crate) fn new(
        client: redis::Client,
        endpoint: String,
        timeout: Duration,
        confirm_handoffs: bool,
    ) -> Arc<Self> {
        Arc::new(Subscriber {
            client,
            endpoint,
            timeout,
            conn: Mutex::new(None),
            generations: AtomicU64::new(0),
            confirm_handoffs,
        })
    }

    async fn connect(&self) -> Result<Conn> {
        let pubsub = tokio::time::timeout(self.timeout, self.client.get_async_pubsub())
            .await
            .map_err(|_| self.timeout_error("connecting the subscriber"))?
            .map_err(|e| map(&self.endpoint, e))?;
        let (sink, mut stream) = pubsub.split();
        let channels: Channels = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let (c2, a2) = (channels.clone(), alive.clone());
        tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let ch = lock_map(&c2).get(msg.get_channel_name()).cloned();
                if let Some(ch) = ch {
                    ch.deliver(msg.get_payload_bytes());
                }
            }
            a2.store(false, Ordering::SeqCst);
            // Dropping every sender ends every waiter's `changed()` with an error.
            lock_map(&c2).clear();
            tracing::debug!("redis subscriber connection closed");
        });
        Ok(Conn {
            sink,
            refs: HashMap::new(),
            channels,
            alive,
            generation: self.generations.fetch_add(1, Ordering::Relaxed),
        })
    }

    fn timeout_error(&self, what: &str) -> Error {
        Error::Connection {
            backend: crate::error::KIND,
            endpoint: self.endpoint.clone(),
            source: format!("{what} took longer than {:?}", self.timeout).into(),
        }
    }

    /// Subscribes (if needed) and returns a watch for the waiting `attempt` on `channel`.
    pub(crate) async fn watch(
        self: &Arc<Self>,
        channel: String,
        attempt: &str,
    ) -> Result<Box<dyn ReleaseWatch>> {
        let mut guard = self.conn.lock().await;
        if guard
            .as_ref()
            .is_some_and(|c| !c.alive.load(Ordering::SeqCst))
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
            let (version, _) = watch::channel(0u64);
            let ch = Arc::new(Channel {
                version,
                mail: StdMutex::default(),
            });
            lock_map(&conn.channels).insert(channel.clone(), ch);
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
        let Some(ch) = lock_map(&conn.channels).get(&channel).cloned() else {
            // The connection died while we subscribed.
            *guard = None;
            return Err(self.timeout_error("SUBSCRIBE"));
        };
        let seen = {
            let mut mail = ch.mail();
            *mail.attempts.entry(attempt.to_owned()).or_insert(0) += 1;
            mail.released
        };
        Ok(Box::new(RedisWatch {
            rx: ch.version.subscribe(),
            channel: ch,
            attempt: attempt.to_owned(),
            confirm_handoffs: self.confirm_handoffs,
            seen,
            generation: conn.generation,
            name: Some(channel),
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
        lock_map(&conn.channels).remove(&channel);
        if !conn.alive.load(Ordering::SeqCst) {
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
    channel: Arc<Channel>,
    attempt: String,
    confirm_handoffs: bool,
    /// Plain releases already reported to this waiter.
    seen: u64,
    generation: u64,
    name: Option<String>,
    subscriber: Weak<Subscriber>,
}

#[async_trait]
impl ReleaseWatch for RedisWatch {
    async fn changed(&mut self) -> Result<Wake> {
        loop {
            {
                let mut mail = self.channel.mail();
                if let Some(token) = mail.handed.remove(&self.attempt) {
                    if self.confirm_handoffs {
                        // The grant was written by the releaser's connection; a WAIT on ours
                        // would not cover it. The next attempt of this waiter finds it (same
                        // token), rewrites it and waits for the replicas, or gives it back.
                        return Ok(Wake::Released);
                    }
                    return Ok(Wake::HandedOver { token });
                }
                if mail.released != self.seen {
                    self.seen = mail.released;
                    return Ok(Wake::Released);
                }
            }
            self.rx.changed().await.map_err(|_| Error::Connection {
                backend: crate::error::KIND,
                endpoint: self
                    .subscriber
                    .upgrade()
                    .map_or_else(String::new, |s| s.endpoint.clone()),
                source: "the subscriber connection closed".into(),
            })?;
        }
    }
}

impl Drop for RedisWatch {
    fn drop(&mut self) {
        {
            let mut mail = self.channel.mail();
            if let Some(n) = mail.attempts.get_mut(&self.attempt) {
                *n -= 1;
                if *n == 0 {
                    mail.attempts.remove(&self.attempt);
                    mail.handed.remove(&self.attempt);
                }
            }
        }
        let (Some(channel), Some(sub)) = (self.name.take(), self.subscriber.upgrade()) else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let generation = self.generation;
            rt.spawn(async move { sub.unwatch(channel, generation).await });
        }
    }
}
