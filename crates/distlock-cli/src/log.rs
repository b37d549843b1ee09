//! `-v`, `DLOCK_LOG` and `RUST_LOG`: tracing events of dlock and the library on stderr.
//!
//! Off unless asked for, so that scripts see only dlock's own lines. `-v` shows dlock's and
//! the library's events at `info`, `-vv` at `debug`, `-vvv` at `trace` (other crates: warnings
//! only). `DLOCK_LOG` (or, when it is unset, `RUST_LOG`) adds filter directives in
//! tracing-subscriber's syntax (`debug`, `distlock_redis=trace`, `warn,dlock=debug`), which
//! win over `-v` for the targets they name.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// The crates whose events `-v` shows: the binary's own (target `dlock`) and the library's.
const OURS: &[&str] = &[
    "dlock",
    "distlock",
    "distlock_core",
    "distlock_etcd",
    "distlock_file",
    "distlock_lab",
    "distlock_mysql",
    "distlock_postgres",
    "distlock_redis",
    "distlock_redlock",
    "distlock_run",
    "distlock_sql",
    "distlock_torture",
    "distlock_zookeeper",
];

/// The filter for `verbose` `-v`s and the environment's directives; `None` when nothing is
/// asked for. Errors name the variable and the directive it could not read.
fn filter(verbose: u8, env: Option<(&str, &str)>) -> Result<Option<EnvFilter>, String> {
    let level = match verbose {
        0 => None,
        1 => Some("info"),
        2 => Some("debug"),
        _ => Some("trace"),
    };
    let env = env.filter(|(_, spec)| !spec.trim().is_empty());
    if level.is_none() && env.is_none() {
        return Ok(None);
    }
    let mut directives = vec!["warn".to_owned()];
    if let Some(level) = level {
        directives.extend(OURS.iter().map(|t| format!("{t}={level}")));
    }
    let mut filter = EnvFilter::try_new(directives.join(",")).map_err(|e| e.to_string())?;
    if let Some((var, spec)) = env {
        for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let d = d.parse().map_err(|e| {
                format!(
                    "{var}: `{d}` is not a log directive ({e}); write e.g. `debug`, \
                     `distlock_redis=trace` or `warn,dlock=debug`"
                )
            })?;
            filter = filter.add_directive(d);
        }
    }
    Ok(Some(filter))
}

/// Installs the stderr subscriber `-v`/`DLOCK_LOG`/`RUST_LOG` ask for (none when nothing is
/// asked for). Errors: a directive that does not parse, as a message for the user.
pub(crate) fn init(verbose: u8) -> Result<(), String> {
    let var = |name: &'static str| std::env::var(name).ok().map(|v| (name, v));
    let env = var("DLOCK_LOG").or_else(|| var("RUST_LOG"));
    let Some(filter) = filter(verbose, env.as_ref().map(|(n, v)| (*n, v.as_str())))? else {
        return Ok(());
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init()
        .map_err(|e| format!("cannot start logging: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_unless_asked_and_bad_directives_are_named() {
        assert!(filter(0, None).expect("ok").is_none());
        assert!(filter(0, Some(("DLOCK_LOG", " "))).expect("ok").is_none());
        let f = filter(2, None).expect("ok").expect("some").to_string();
        assert!(f.contains("distlock_core=debug"), "{f}");
        let f = filter(0, Some(("RUST_LOG", "dlock=trace")))
            .expect("ok")
            .expect("some")
            .to_string();
        assert!(f.contains("dlock=trace"), "{f}");
        let e = filter(0, Some(("DLOCK_LOG", "dlock=loud"))).expect_err("bad");
        assert!(
            e.starts_with("DLOCK_LOG: `dlock=loud` is not a log directive"),
            "{e}"
        );
    }
}
