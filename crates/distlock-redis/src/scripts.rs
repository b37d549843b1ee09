//! The Lua scripts, loaded once, run by EVALSHA (reloaded on NOSCRIPT).
//!
//! The read-write lock and semaphore scripts share one prelude (`scripts/expiring.lua`: the
//! keys' shape, pruning, grants, the queue, the release side), put in front of each at compile
//! time, so each script Redis runs is still one self-contained source.

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisResult, Value};

/// A script and its SHA-1.
pub(crate) struct Script {
    source: &'static str,
    sha: String,
}

/// A read-write lock or semaphore script: the shared prelude, then the script itself.
macro_rules! expiring {
    ($file:literal) => {
        concat!(
            include_str!("../scripts/expiring.lua"),
            include_str!(concat!("../scripts/", $file))
        )
    };
}

impl Script {
    pub(crate) fn new(source: &'static str) -> Self {
        Script {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// EVALSHA command for this script.
    pub(crate) fn cmd(&self, keys: &[&str], args: &[&str]) -> Cmd {
        let mut c = redis::cmd("EVALSHA");
        c.arg(&self.sha).arg(keys.len()).arg(keys).arg(args);
        c
    }

    fn load_cmd(&self) -> Cmd {
        let mut c = redis::cmd("SCRIPT");
        c.arg("LOAD").arg(self.source);
        c
    }
}

/// The scripts: the reentrant (and fair) mutex, which elections share under their own keys,
/// the read-write lock, the semaphore, an election's proclamation (the renewal of every
/// family is `crate::renew`'s one script).
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) rw_acquire: Script,
    pub(crate) rw_release: Script,
    pub(crate) sem_acquire: Script,
    pub(crate) sem_release: Script,
    pub(crate) proclaim: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            acquire: Script::new(include_str!("../scripts/acquire.lua")),
            release: Script::new(include_str!("../scripts/release.lua")),
            rw_acquire: Script::new(expiring!("rw_acquire.lua")),
            rw_release: Script::new(expiring!("rw_release.lua")),
            sem_acquire: Script::new(expiring!("sem_acquire.lua")),
            sem_release: Script::new(expiring!("sem_release.lua")),
            proclaim: Script::new(include_str!("../scripts/proclaim.lua")),
        }
    }

    /// Every script a connection runs (loaded at connect, reloaded together on NOSCRIPT),
    /// with the batched renewal (`crate::renew`).
    pub(crate) fn all(&self) -> [&Script; 8] {
        [
            &self.acquire,
            &self.release,
            &self.rw_acquire,
            &self.rw_release,
            &self.sem_acquire,
            &self.sem_release,
            &self.proclaim,
            crate::renew::script(),
        ]
    }
}

/// Loads every script of `set` (one pipelined round trip).
pub(crate) async fn load<C: ConnectionLike>(con: &mut C, set: &[&Script]) -> RedisResult<()> {
    let mut p = redis::pipe();
    for s in set {
        p.add_command(s.load_cmd()).ignore();
    }
    p.query_async::<()>(con).await
}

pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Runs one EVALSHA; on NOSCRIPT (server restarted or flushed) loads `set` and retries once.
/// Also says whether it had to reload.
pub(crate) async fn eval<C: ConnectionLike>(
    con: &mut C,
    set: &[&Script],
    cmd: &Cmd,
) -> RedisResult<(Value, bool)> {
    match cmd.query_async::<Value>(con).await {
        Err(e) if is_noscript(&e) => {
            load(con, set).await?;
            Ok((cmd.query_async(con).await?, true))
        }
        other => Ok((other?, false)),
    }
}

/// Runs a pipeline of EVALSHAs, reloading `set` once on NOSCRIPT.
pub(crate) async fn eval_pipe<C: ConnectionLike>(
    con: &mut C,
    set: &[&Script],
    pipe: &Pipeline,
) -> RedisResult<Vec<Value>> {
    match pipe.query_async::<Vec<Value>>(con).await {
        Err(e) if is_noscript(&e) => {
            load(con, set).await?;
            pipe.query_async(con).await
        }
        other => other,
    }
}

/// Runs a pipeline of EVALSHAs set to [`Pipeline::ignore_errors`], whose error replies are
/// that command's `Value::ServerError`, reloading `set` once when one of them is NOSCRIPT.
pub(crate) async fn eval_pipe_each<C: ConnectionLike>(
    con: &mut C,
    set: &[&Script],
    pipe: &Pipeline,
) -> RedisResult<Vec<Value>> {
    let noscript = |v: &Value| matches!(v, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript));
    match pipe.query_async::<Vec<Value>>(con).await {
        Ok(v) if !v.iter().any(noscript) => Ok(v),
        Err(e) if !is_noscript(&e) => Err(e),
        _ => {
            load(con, set).await?;
            pipe.query_async(con).await
        }
    }
}
