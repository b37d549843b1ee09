//! The Lua scripts, loaded once, run by EVALSHA (reloaded on NOSCRIPT).

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisResult, Value};

/// A script and its SHA-1.
pub(crate) struct Script {
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

impl Script {
    fn new(source: &'static str) -> Self {
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

    pub(crate) fn load_cmd(&self) -> Cmd {
        let mut c = redis::cmd("SCRIPT");
        c.arg("LOAD").arg(self.source);
        c
    }
}

/// The scripts: the reentrant (and fair) mutex, the read-write lock, the semaphore.
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) renew: Script,
    pub(crate) rw_acquire: Script,
    pub(crate) rw_release: Script,
    pub(crate) sem_acquire: Script,
    pub(crate) sem_release: Script,
    pub(crate) expiring_renew: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            acquire: Script::new(include_str!("../scripts/acquire.lua")),
            release: Script::new(include_str!("../scripts/release.lua")),
            renew: Script::new(include_str!("../scripts/renew.lua")),
            rw_acquire: Script::new(include_str!("../scripts/rw_acquire.lua")),
            rw_release: Script::new(include_str!("../scripts/rw_release.lua")),
            sem_acquire: Script::new(include_str!("../scripts/sem_acquire.lua")),
            sem_release: Script::new(include_str!("../scripts/sem_release.lua")),
            expiring_renew: Script::new(include_str!("../scripts/expiring_renew.lua")),
        }
    }

    /// Loads every script (one pipelined round trip).
    pub(crate) async fn load_all<C: ConnectionLike>(&self, con: &mut C) -> RedisResult<()> {
        let mut p = redis::pipe();
        for s in [
            &self.acquire,
            &self.release,
            &self.renew,
            &self.rw_acquire,
            &self.rw_release,
            &self.sem_acquire,
            &self.sem_release,
            &self.expiring_renew,
        ] {
            p.add_command(s.load_cmd()).ignore();
        }
        p.query_async::<()>(con).await
    }
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Runs one EVALSHA; on NOSCRIPT (server restarted or flushed) loads the scripts and retries once.
pub(crate) async fn eval<C: ConnectionLike>(
    con: &mut C,
    scripts: &Scripts,
    cmd: &Cmd,
) -> RedisResult<Value> {
    match cmd.query_async::<Value>(con).await {
        Err(e) if is_noscript(&e) => {
            scripts.load_all(con).await?;
            cmd.query_async(con).await
        }
        other => other,
    }
}

/// Runs a pipeline of EVALSHAs, reloading the scripts once on NOSCRIPT.
pub(crate) async fn eval_pipe<C: ConnectionLike>(
    con: &mut C,
    scripts: &Scripts,
    pipe: &Pipeline,
) -> RedisResult<Vec<Value>> {
    match pipe.query_async::<Vec<Value>>(con).await {
        Err(e) if is_noscript(&e) => {
            scripts.load_all(con).await?;
            pipe.query_async(con).await
        }
        other => other,
    }
}
