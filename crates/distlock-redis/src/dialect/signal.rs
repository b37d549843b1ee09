//! python-redis-lock's release signal: a waiter blocks in `BLPOP lock-signal:NAME`, and a
//! release leaves one element there (for `signal_expire`, 1 s by default), taken by one
//! waiter. A dlock waiter in that dialect waits the same way, so that a release by either
//! library wakes it without polling, and a dlock release wakes a Python waiter.
//!
//! `BLPOP` blocks its connection, so each waiting attempt has a connection of its own, in a
//! task that runs one `BLPOP` per call of [`ReleaseWatch::changed`] (never ahead of one: an
//! element taken that nobody asked for would be a wake-up stolen from another waiter). The
//! answer goes through a channel, so a `changed` dropped mid-wait (cancel safety) leaves it
//! for the next call. Dropping the watch stops the task: a `BLPOP` in flight then may still
//! take an element, a wake-up lost for the others, who wake at the holder's lease end (or,
//! python-redis-lock's, at their `BLPOP` timeout: the lock's expire).

use crate::error::{map, KIND};
use distlock_core::backend::{async_trait, ReleaseWatch, Wake};
use distlock_core::{Error, Result};
use redis::AsyncConnectionConfig;
use std::time::Duration;
use tokio::sync::mpsc;

/// One `BLPOP` blocks at most this long (then the next starts): the server holds the waiter,
/// not a client timer, so this is not a polling interval.
const BLPOP_SECS: u64 = 30;

/// How long a connection may take to answer beyond a `BLPOP`'s own timeout.
const ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// A watch on a python-redis-lock signal list (see the module docs).
pub(crate) struct SignalWatch {
    ask: mpsc::UnboundedSender<()>,
    got: mpsc::UnboundedReceiver<Result<()>>,
    /// A `BLPOP` was asked for and its answer not taken yet.
    asked: bool,
    endpoint: String,
    task: tokio::task::AbortHandle,
}

impl SignalWatch {
    /// Starts the watch's task on `client` for the list `key` (no connection until the first
    /// call of `changed`).
    pub(crate) fn start(client: redis::Client, key: String, endpoint: String) -> Self {
        let (ask, mut asks) = mpsc::unbounded_channel::<()>();
        let (tell, got) = mpsc::unbounded_channel();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(ANSWER_MARGIN))
            .set_response_timeout(Some(Duration::from_secs(BLPOP_SECS) + ANSWER_MARGIN));
        let at = endpoint.clone();
        let task = tokio::spawn(async move {
            let mut con = None;
            while asks.recv().await.is_some() {
                let answer = loop {
                    let c = match &mut con {
                        Some(c) => c,
                        None => match client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await
                        {
                            Ok(c) => con.insert(c),
                            Err(e) => break Err(map(&at, e)),
                        },
                    };
                    let popped: redis::RedisResult<Option<(String, String)>> = redis::cmd("BLPOP")
                        .arg(&key)
                        .arg(BLPOP_SECS)
                        .query_async(c)
                        .await;
                    match popped {
                        Ok(Some(_)) => break Ok(()),
                        Ok(None) => continue,
                        Err(e) => {
                            con = None;
                            break Err(map(&at, e));
                        }
                    }
                };
                if tell.send(answer).is_err() {
                    return;
                }
            }
        });
        SignalWatch {
            ask,
            got,
            asked: false,
            endpoint,
            task: task.abort_handle(),
        }
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait]
impl ReleaseWatch for SignalWatch {
    async fn changed(&mut self) -> Result<Wake> {
        if !self.asked {
            self.ask.send(()).map_err(|_| self.ended())?;
            self.asked = true;
        }
        let answer = self.got.recv().await.ok_or_else(|| self.ended())?;
        self.asked = false;
        answer.map(|()| Wake::Released)
    }
}

impl SignalWatch {
    /// The task stopped (it never does while the watch lives, short of a panic).
    fn ended(&self) -> Error {
        Error::connection(
            KIND,
            self.endpoint.clone(),
            "the BLPOP task of the release signal ended",
        )
    }
}
