//! Release notifications: one LISTEN connection per backend, multiplexing lock channels.
//!
//! A channel is listened to only while at least one waiter of this backend waits on that
//! lock. Each waiter holds a `watch` receiver whose version moves on every notification, so a
//! release between the waiter's attempt and its sleep is not lost. If the connection breaks,
//! every receiver sees its sender dropped and the waiter subscribes again on a new connection.

use crate::common::Common;
use crate::error::KIND;
use distlock_core::{async_trait, Error, ReleaseWatch, Result, Wake};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use tokio::sync::{watch, Mutex};
use tokio_postgres::AsyncMessage;

type Senders = Arc<StdMutex<HashMap<String, watch::Sender<u64>>>>;

struct Conn {
    client: tokio_postgres::Client,
    refs: HashMap<String, usize>,
    senders: Senders,
    alive: Arc<AtomicBool>,
    generation: u64,
}

pub(crate) struct Listener {
    common: Arc<Common>,
    conn: Mutex<Option<Conn>>,
    generations: AtomicU64,
}

impl Listener {
    pub(crate) fn new(common: Arc<Common>) -> Arc<Self> {
        Arc::new(Listener {
            common,
            conn: Mutex::new(None),
            generations: AtomicU64::new(0),
        })
    }

    async fn connect(&self) -> Result<Conn> {
        let (client, mut connection) = self.common.open().await?;
        let senders: Senders = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let (s2, a2) = (senders.clone(), alive.clone());
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(msg) = messages.next().await {
                match msg {
                    Ok(AsyncMessage::Notification(n)) => {
                        let map = s2.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(tx) = map.get(n.channel()) {
                            tx.send_modify(|v| *v = v.wrapping_add(1));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "postgres LISTEN connection failed");
                        break;
                    }
                }
            }
            a2.store(false, Ordering::SeqCst);
            // Dropping every sender ends every waiter's `changed()` with an error.
            s2.lock().unwrap_or_else(|p| p.into_inner()).clear();
        });
        Ok(Conn {
            client,
            refs: HashMap::new(),
            senders,
            alive,
            generation: self.generations.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Listens (if needed) on `channel` and returns a watch whose `changed()` fires on
    /// notifications.
    pub(crate) async fn watch(self: &Arc<Self>, channel: String) -> Result<Box<dyn ReleaseWatch>> {
        let mut guard = self.conn.lock().await;
        if guard
            .as_ref()
            .is_some_and(|c| !c.alive.load(Ordering::SeqCst) || c.client.is_closed())
        {
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(self.connect().await?);
        }
        let Some(conn) = guard.as_mut() else {
            return Err(self.broken("LISTEN"));
        };
        let refs = conn.refs.get(&channel).copied().unwrap_or(0);
        if refs == 0 {
            let (tx, _) = watch::channel(0u64);
            conn.senders
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(channel.clone(), tx);
            // The channel is `dlock_` + hex digits: a safe identifier.
            let sql = format!("LISTEN \"{channel}\"");
            if let Err(e) = self
                .common
                .run("LISTEN", conn.client.batch_execute(&sql))
                .await
            {
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
            *guard = None;
            return Err(self.broken("LISTEN"));
        };
        Ok(Box::new(PgWatch {
            rx,
            generation: conn.generation,
            channel: Some(channel),
            listener: Arc::downgrade(self),
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
        if !conn.alive.load(Ordering::SeqCst) {
            return;
        }
        let sql = format!("UNLISTEN \"{channel}\"");
        if self
            .common
            .run("UNLISTEN", conn.client.batch_execute(&sql))
            .await
            .is_err()
        {
            *guard = None;
        }
    }

    /// Channels listened to right now (for tests).
    pub(crate) async fn listening(&self) -> usize {
        self.conn.lock().await.as_ref().map_or(0, |c| c.refs.len())
    }

    fn broken(&self, what: &str) -> Error {
        Error::Connection {
            backend: KIND,
            endpoint: self.common.endpoint.clone(),
            source: format!("{what}: the notification connection closed").into(),
        }
    }
}

struct PgWatch {
    rx: watch::Receiver<u64>,
    generation: u64,
    channel: Option<String>,
    listener: Weak<Listener>,
}

#[async_trait]
impl ReleaseWatch for PgWatch {
    async fn changed(&mut self) -> Result<Wake> {
        match self.rx.changed().await {
            Ok(()) => Ok(Wake::Released),
            Err(_) => Err(Error::Connection {
                backend: KIND,
                endpoint: self
                    .listener
                    .upgrade()
                    .map_or_else(String::new, |l| l.common.endpoint.clone()),
                source: "the notification connection closed".into(),
            }),
        }
    }
}

impl Drop for PgWatch {
    fn drop(&mut self) {
        let (Some(channel), Some(listener)) = (self.channel.take(), self.listener.upgrade()) else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let generation = self.generation;
            rt.spawn(async move { listener.unwatch(channel, generation).await });
        }
    }
}

/// A watch that never fires, for `listen=off` (behind poolers that drop notifications):
/// waiters then wake at their heartbeat or the holder's lease end.
pub(crate) struct NoWatch;

#[async_trait]
impl ReleaseWatch for NoWatch {
    async fn changed(&mut self) -> Result<Wake> {
        std::future::pending().await
    }
}
