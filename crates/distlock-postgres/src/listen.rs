//! Release notifications: one LISTEN connection per backend, multiplexing lock channels, on
//! the core's wake-up table ([`Subscriptions`]).
//!
//! A channel is listened to only while at least one waiter of this backend waits on that
//! lock: the table says when a channel is new (`LISTEN` it) and when its last watch is gone
//! (`UNLISTEN` it), and both happen under the connection's lock, so an `UNLISTEN` never
//! overtakes a new `LISTEN`. A notification between the waiter's attempt and its sleep is not
//! lost (the watch counts them). If the connection breaks, every watch fails and its waiter
//! subscribes again on a new connection.

use crate::common::{channel, election_key, key_of, Common};
use crate::error::KIND;
use distlock_core::backend::{AttemptId, NoWatch, Subscriptions};
use distlock_core::{AcquireRequest, Error, ReleaseWatch, Result};
use futures_util::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Mutex;
use tokio_postgres::AsyncMessage;

/// Why every watch fails when the connection ends.
const CLOSED: &str = "the notification connection closed";

struct Conn {
    client: tokio_postgres::Client,
    generation: u64,
}

pub(crate) struct Listener {
    common: Arc<Common>,
    /// Waiters listen for notifications (`listen=off`: they wake at their heartbeat).
    pub(crate) listen: bool,
    conn: Mutex<Option<Conn>>,
    subs: Subscriptions<String>,
    /// The generation of the current connection: a reader task of an older one that ends
    /// must not fail the watches of the new one.
    current: Arc<AtomicU64>,
}

impl Listener {
    pub(crate) fn new(common: Arc<Common>, listen: bool) -> Arc<Self> {
        let subs = Subscriptions::new(KIND, common.endpoint.clone());
        let listener = Arc::new(Listener {
            common,
            listen,
            conn: Mutex::new(None),
            subs,
            current: Arc::new(AtomicU64::new(0)),
        });
        let weak = Arc::downgrade(&listener);
        listener.subs.on_unused(move || {
            let (Some(l), Ok(rt)) = (weak.upgrade(), tokio::runtime::Handle::try_current()) else {
                return;
            };
            rt.spawn(async move { l.unlisten_unused().await });
        });
        listener
    }

    async fn connect(&self) -> Result<Conn> {
        let (client, mut connection) = self.common.open(None).await?;
        let generation = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        let (subs, current) = (self.subs.clone(), self.current.clone());
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(msg) = messages.next().await {
                match msg {
                    Ok(AsyncMessage::Notification(n)) => {
                        subs.notify_released(&n.channel().to_owned());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "postgres LISTEN connection failed");
                        break;
                    }
                }
            }
            if current.load(Ordering::SeqCst) == generation {
                subs.fail_all(CLOSED);
            }
        });
        Ok(Conn { client, generation })
    }

    /// Forgets the connection (its watches fail; waiters subscribe again on a new one).
    fn reset(&self, guard: &mut Option<Conn>) {
        if guard.take().is_some() {
            self.current.fetch_add(1, Ordering::SeqCst);
            self.subs.fail_all(CLOSED);
        }
    }

    /// Wake-ups for the waiters of `req`'s lock (none with `listen=off`). Notifications are
    /// plain wake-ups (no grant travels in them: a woken waiter tries again with its own
    /// attempt), so one subscription per lock serves every waiting attempt.
    pub(crate) async fn lock_watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        if !self.listen {
            return Ok(Box::new(NoWatch));
        }
        let ns = &self.common.namespace;
        let chan = channel(key_of(ns, &req.key.name, req.key.kind));
        self.watch(chan, &req.attempt).await
    }

    /// `LISTEN` on the election's channel, which its grants, resignations and proclamations
    /// `NOTIFY`. A leader whose session ends (session mode) or whose lease runs out (lease
    /// mode) without a resignation sends nothing: the next candidate's grant does, and
    /// observers look again at the leader's lease end. With `listen=off` nothing would wake
    /// an observer while nobody leads: `Unsupported`.
    pub(crate) async fn election_watch(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        if !self.listen {
            return Err(Error::unsupported(
                KIND,
                "observing elections with listen=off (nothing would wake the observer)",
            ));
        }
        let chan = channel(election_key(&self.common.namespace, name));
        self.watch(chan, &AttemptId::new()).await
    }

    /// Listens (if needed) on `channel` and returns a watch whose `changed()` fires on
    /// notifications, for `attempt`.
    pub(crate) async fn watch(
        &self,
        channel: String,
        attempt: &AttemptId,
    ) -> Result<Box<dyn ReleaseWatch>> {
        let mut guard = self.conn.lock().await;
        let stale = guard.as_ref().is_some_and(|c| {
            c.client.is_closed() || c.generation != self.current.load(Ordering::SeqCst)
        });
        if stale {
            self.reset(&mut guard);
        }
        let conn = match guard.as_ref() {
            Some(c) => c,
            None => guard.insert(self.connect().await?),
        };
        let (watch, first) = self.subs.subscribe(channel.clone(), attempt);
        if first {
            // The channel is `dlock_` + hex digits: a safe identifier.
            let sql = format!("LISTEN \"{channel}\"");
            if let Err(e) = self
                .common
                .run("LISTEN", conn.client.batch_execute(&sql))
                .await
            {
                // The connection is in an unknown state; start over next time.
                self.subs.fail(&channel, &e.to_string());
                self.reset(&mut guard);
                return Err(e);
            }
        }
        Ok(Box::new(watch))
    }

    /// `UNLISTEN`s the channels whose last watch is gone.
    async fn unlisten_unused(&self) {
        let mut guard = self.conn.lock().await;
        let channels = self.subs.take_unused();
        let Some(conn) = guard.as_ref() else {
            return;
        };
        // One round trip for all of them.
        let sql: String = channels
            .iter()
            .map(|c| format!("UNLISTEN \"{c}\";"))
            .collect();
        if !sql.is_empty() {
            let unlisten = conn.client.batch_execute(&sql);
            if self.common.run("UNLISTEN", unlisten).await.is_err() {
                self.reset(&mut guard);
            }
        }
    }

    /// Channels listened to right now (for tests).
    pub(crate) async fn listening(&self) -> usize {
        let _conn = self.conn.lock().await;
        self.subs.len()
    }
}
