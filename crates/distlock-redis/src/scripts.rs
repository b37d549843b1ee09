//! The Lua scripts, loaded once, run by EVALSHA (reloaded on NOSCRIPT).
//!
//! Every script that grants shares one prelude, `scripts/fence.lua` and `scripts/fence_next.lua`
//! (the fencing token of a grant, and the counter's lifetime: see [`fenced!`]); the read-write lock and semaphore
//! scripts share a second one after it (`scripts/expiring.lua`: the keys' shape, pruning,
//! grants, the queue, the release side); the scripts that queue waiters share
//! `scripts/queue.lua` (a waiter's place: arrival order, also within one millisecond). They are put in front of each script at compile
//! time, so each script Redis runs is still one self-contained source.

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisResult, Value};

/// How long, in ms, a fencing counter outlives the lease of the last grant made from it: one
/// hour ([`crate::FENCE_MARGIN`]). A literal, so that it can go into the Lua prelude too.
macro_rules! fence_margin_ms {
    () => {
        3600000
    };
}
pub(crate) use fence_margin_ms;

/// A script and its SHA-1.
pub(crate) struct Script {
    source: &'static str,
    pub(crate) sha: String,
}

/// The files of `scripts/` named, concatenated into one Lua source.
macro_rules! lua {
    ($($file:literal),+) => {
        concat!($(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/", $file))),+)
    };
}
pub(crate) use lua;

/// The first line of the fencing prelude: `local FENCE_MARGIN_MS = …`.
macro_rules! fence_margin_line {
    () => {
        concat!(
            "local FENCE_MARGIN_MS = ",
            $crate::scripts::fence_margin_ms!(),
            "\n"
        )
    };
}
pub(crate) use fence_margin_line;

/// A script that grants (or writes a fencing counter): the fencing-token prelude
/// (`scripts/fence.lua` and `scripts/fence_next.lua`, after its margin), then the script's
/// files in order (paths under `scripts/`). Every token of every kind comes from this one copy.
/// (The mutex scripts put their uncontended path before part of it: [`Scripts::new`].)
macro_rules! fenced {
    ($($file:literal),+) => {
        concat!(
            $crate::scripts::fence_margin_line!(),
            $crate::scripts::lua!("fence.lua", "fence_next.lua", $($file),+)
        )
    };
}
pub(crate) use fenced;

impl Script {
    pub(crate) fn new(source: &'static str) -> Self {
        Script {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// EVALSHA command for this script.
    pub(crate) fn cmd(&self, keys: &[&str], args: &[&str]) -> Cmd {
        let mut c = self.head(keys.len());
        c.arg(keys).arg(args);
        c
    }

    /// The EVALSHA of this script with `keys` keys, before them (for a caller that writes
    /// its keys and arguments straight into the command).
    pub(crate) fn head(&self, keys: usize) -> Cmd {
        let mut c = redis::cmd("EVALSHA");
        c.arg(&self.sha).arg(keys);
        c
    }

    fn load_cmd(&self) -> Cmd {
        let mut c = redis::cmd("SCRIPT");
        c.arg("LOAD").arg(self.source);
        c
    }
}

/// A set of scripts, loaded together (and again together on NOSCRIPT): a struct of one
/// [`Script`] per field, its static made on first use, and `all()`.
macro_rules! script_set {
    ($(#[$doc:meta])* static $set:ident: $name:ident { $($field:ident: $source:expr,)+ }) => {
        $(#[$doc])*
        pub(crate) struct $name {
            $(pub(crate) $field: $crate::scripts::Script,)+
        }

        pub(crate) static $set: std::sync::LazyLock<$name> = std::sync::LazyLock::new(|| $name {
            $($field: $crate::scripts::Script::new($source),)+
        });

        impl $name {
            /// Every script of the set.
            pub(crate) fn all(&self) -> [&$crate::scripts::Script; [$(stringify!($field)),+].len()] {
                [$(&self.$field),+]
            }
        }
    };
}
pub(crate) use script_set;

script_set! {
    /// The scripts every connection runs: the reentrant (and fair) mutex, which elections share
    /// under their own keys, the read-write lock, the semaphore, an election's proclamation, the
    /// batched renewal of every family (`crate::renew`) and the operator's forced release.
    static SCRIPTS: Scripts {
        // The uncontended path of each runs before the prelude functions it does not call are
        // made (a Lua closure per function per call: measured, docs/redis-lock.md, "Costs"):
        // the acquire's after fence.lua (its token), the release's first.
        acquire: concat!(
            fence_margin_line!(),
            lua!("fence.lua", "acquire.lua", "fence_next.lua", "queue.lua", "acquire_wait.lua")
        ),
        release: concat!(
            lua!("release.lua"),
            fence_margin_line!(),
            lua!("fence.lua", "fence_next.lua", "release_handoff.lua")
        ),
        rw_acquire: fenced!("queue.lua", "expiring.lua", "rw_acquire.lua"),
        rw_release: fenced!("queue.lua", "expiring.lua", "rw_release.lua"),
        sem_acquire: fenced!("queue.lua", "expiring.lua", "sem_acquire.lua"),
        sem_release: fenced!("queue.lua", "expiring.lua", "sem_release.lua"),
        proclaim: lua!("proclaim.lua"),
        renew_many: lua!("renew.lua", "expiring_renew.lua", "dialect/renew.lua", "renew_many.lua"),
        force_release: fenced!("force_release.lua"),
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

/// Runs a pipeline of EVALSHAs, reloading `set` once on NOSCRIPT: the pipeline's error, or,
/// in a pipeline set to [`Pipeline::ignore_errors`] (whose error replies are that command's
/// `Value::ServerError`), one of its replies.
pub(crate) async fn eval_pipe<C: ConnectionLike>(
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
