//! `dlock hold NAME`: hold a lock across several commands of a shell script.
//!
//! It acquires the lock (with `run`'s waiting, kinds and exit codes), prints the fencing token
//! on a line of its own, and keeps the lock (the watchdog renews it) until SIGTERM, SIGINT or
//! SIGHUP, or until its standard input — when that is a pipe — reaches end of file; then it
//! releases and exits 0. If the lock is lost meanwhile, it says so and exits 76 at once.

use crate::run::{acquire, Waiting, Which};
use clap::Args;
use std::io::Write;
use std::time::Duration;

#[derive(Args, Debug)]
#[command(after_long_help = HOLD_HELP)]
pub struct HoldArgs {
    #[command(flatten)]
    waiting: Waiting,
    /// Watchdog lease: the lock lives this long after dlock stops renewing it (e.g. if dlock is
    /// killed); renewed while dlock holds it.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "30s")]
    lease: Duration,
    #[command(flatten)]
    which: Which,
    /// Lock name.
    name: String,
}

const HOLD_HELP: &str = "\
For shell scripts that need one lock across several commands. dlock hold prints the fencing
token (one line on stdout) once the lock is held, then holds it until SIGTERM, SIGINT or
SIGHUP, or until its standard input reaches end of file when it is a pipe (a terminal or
/dev/null is not watched). It then releases the lock and exits 0.

  coproc HOLD { dlock hold -w 10 nightly; }
  read -r token <&\"${HOLD[0]}\" || { wait $HOLD_PID; exit $?; }   # not acquired: 75
  step-one --fencing-token \"$token\" && step-two --fencing-token \"$token\"
  exec {HOLD[1]}>&-             # close its stdin: release
  wait $HOLD_PID                # 0: released; 76: the lock was lost meanwhile

Lost lock: dlock hold cannot stop the script's commands (they are not its children). If
renewals fail past the lease or the lock is taken away, it prints why and exits 76 at once:
check its status before trusting work done under it, and pass the fencing token to the
resources you write so that they reject a lost holder's late writes. Use `dlock run` when
one command (or `sh -c` script) can do the work: it stops the command before the lease ends.

Exit status: 0 released after a signal or end of input; 75 (or -E CODE) not acquired within
--wait; 69 the lock service could not be reached; 76 the lock was lost while held; 1 other
errors.";

pub async fn hold(url: &str, args: HoldArgs) -> u8 {
    // Handlers first: a signal sent as soon as the token is read must release, not kill.
    let mut signals = distlock_run::forwarded_signals();
    let got = match acquire(url, &args.name, &args.which, args.lease, &args.waiting).await {
        Ok(g) => g,
        Err(code) => return code,
    };
    let held = got.held;
    let guard = held.guard();
    let token = guard.fencing_token();
    eprintln!(
        "dlock: holding lock `{}` as {} (fencing token {token}) until SIGTERM, SIGINT or \
         SIGHUP{}",
        args.name,
        guard.owner(),
        if stdin_is_pipe() {
            ", or until stdin closes"
        } else {
            ""
        }
    );
    let mut out = std::io::stdout();
    // A reader that went away (a script that did not want the token) is fine: it can still
    // end the hold with a signal.
    let _ = writeln!(out, "{token}").and_then(|()| out.flush());
    let stdin_closed = watch_stdin();
    let lost = guard.lost_signal();
    tokio::select! {
        n = distlock_run::recv_any(&mut signals) => {
            tracing::info!(signal = n, "releasing on a signal");
        }
        () = stdin_closed => tracing::info!("releasing: stdin closed"),
        reason = lost.lost() => {
            eprintln!("dlock: lock `{}` was lost while held ({reason})", args.name);
            return crate::EXIT_LOST;
        }
    }
    match held.release().await {
        Ok(distlock::ReleaseOutcome::Expired) | Ok(distlock::ReleaseOutcome::TakenByOther) => {
            eprintln!(
                "dlock: lock `{}` was lost while held (its lease had ended at the release)",
                args.name
            );
            crate::EXIT_LOST
        }
        Ok(_) => 0,
        Err(e) => {
            eprintln!(
                "dlock: releasing lock `{}` failed ({}); it frees itself when its lease ends",
                args.name,
                crate::run::one_line(&e)
            );
            crate::EXIT_ERROR
        }
    }
}

/// True when standard input is a pipe or a socket (a coprocess, `… | dlock hold`), whose end
/// of file means "release"; a terminal or /dev/null is not watched.
fn stdin_is_pipe() -> bool {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only writes into the struct we own; fd 0 is only inspected.
    if unsafe { libc::fstat(0, &mut st) } != 0 {
        return false;
    }
    matches!(st.st_mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFSOCK)
}

/// Resolves when standard input (a pipe) reaches end of file or fails; never otherwise.
async fn watch_stdin() {
    if !stdin_is_pipe() {
        return std::future::pending().await;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A plain thread: a blocking read of stdin has no async form that ends with the process.
    let spawned = std::thread::Builder::new()
        .name("dlock-stdin".into())
        .spawn(move || {
            let mut buf = [0u8; 512];
            loop {
                match std::io::Read::read(&mut std::io::stdin().lock(), &mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(());
        });
    match spawned {
        Ok(_) => {
            let _ = rx.await;
        }
        Err(e) => {
            eprintln!("dlock: cannot watch stdin ({e}); a signal ends the hold");
            std::future::pending::<()>().await;
        }
    }
}
