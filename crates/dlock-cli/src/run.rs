//! `dlock run [--wait DUR] [--lease DUR] NAME -- CMD [ARGS…]`.

use clap::Args;
use std::time::Duration;
use tokio::process::Command;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// How long to wait for the lock (default: forever; 0 tries once). E.g. 500ms, 10s, 2m.
    #[arg(long, value_parser = crate::duration_arg)]
    wait: Option<Duration>,
    /// Watchdog lease: the lock lives this long after dlock stops renewing it (e.g. if dlock is
    /// killed); renewed every lease/3 while the command runs.
    #[arg(long, value_parser = crate::duration_arg, default_value = "30s")]
    lease: Duration,
    /// After the lock is lost, how long the command gets between SIGTERM and SIGKILL.
    #[arg(long, value_parser = crate::duration_arg, default_value = "5s")]
    grace: Duration,
    /// Owner id to hold the lock as (default: unique per run).
    #[arg(long)]
    owner: Option<String>,
    /// Kind of lock: mutex, fair, read, write, or semaphore=N (one of N permits).
    #[arg(long, default_value = "mutex", value_parser = crate::kind::parse)]
    kind: crate::kind::Kind,
    /// Lock name.
    name: String,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub async fn run(url: &str, args: RunArgs) -> u8 {
    let opts = dlock::ClientOptions::default().watchdog_lease(args.lease);
    let opts = if args.lease / 3 <= opts.get_op_timeout() {
        opts.op_timeout((args.lease / 3).max(Duration::from_millis(50)))
    } else {
        opts
    };
    let client = match crate::connect(url, opts).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let acquired = match args.kind {
        crate::kind::Kind::Semaphore(permits) => match client.semaphore(&args.name, permits) {
            Ok(sem) => match args.wait {
                None => sem.acquire(1).await,
                Some(w) => sem.acquire_timeout(1, w).await,
            },
            Err(e) => Err(e),
        },
        kind => {
            let lock = match kind
                .lock(&client, &args.name)
                .and_then(|l| match &args.owner {
                    Some(o) => l.with_owner(o.clone()),
                    None => Ok(l),
                }) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("dlock: {e}");
                    return crate::EXIT_ERROR;
                }
            };
            match args.wait {
                None => lock.acquire().await,
                Some(w) => lock.acquire_timeout(w).await,
            }
        }
    };
    let guard = match acquired {
        Ok(g) => g,
        Err(e) if e.is_timeout() => {
            eprintln!("dlock: {e}");
            return crate::EXIT_NOT_ACQUIRED;
        }
        Err(e) => {
            eprintln!("dlock: {e}");
            return crate::EXIT_ERROR;
        }
    };
    let Some((program, rest)) = args.command.split_first() else {
        eprintln!("dlock: no command given");
        return crate::EXIT_ERROR;
    };
    let mut child = match Command::new(program)
        .args(rest)
        .env("DLOCK_NAME", &args.name)
        .env("DLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        .env("DLOCK_OWNER", guard.owner())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dlock: cannot run `{program}`: {e}");
            let _ = guard.release().await;
            return 127;
        }
    };
    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    let forward = |child: &tokio::process::Child, sig: i32| {
        if let Some(pid) = child.id() {
            // SAFETY: kill(2) with a pid we spawned and a valid signal number has no memory effects.
            unsafe {
                libc::kill(pid as libc::pid_t, sig);
            }
        }
    };
    let status = loop {
        tokio::select! {
            st = child.wait() => break st,
            reason = guard.lost() => {
                eprintln!(
                    "dlock: lock `{}` was lost while the command ran ({reason}); stopping the command",
                    args.name
                );
                forward(&child, libc::SIGTERM);
                if tokio::time::timeout(args.grace, child.wait()).await.is_err() {
                    eprintln!("dlock: the command did not stop within {:?}; killing it", args.grace);
                    let _ = child.kill().await;
                }
                let _ = guard.release().await;
                return crate::EXIT_LOST;
            }
            _ = recv(&mut sigterm) => forward(&child, libc::SIGTERM),
            _ = recv(&mut sigint) => forward(&child, libc::SIGINT),
        }
    };
    let released = guard.release().await;
    if let Err(e) = &released {
        eprintln!("dlock: release failed ({e}); the lock frees itself when its lease ends");
    }
    match status {
        Ok(st) => exit_code(st),
        Err(e) => {
            eprintln!("dlock: waiting for the command failed: {e}");
            crate::EXIT_ERROR
        }
    }
}

async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

fn exit_code(st: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(crate::EXIT_ERROR),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(crate::EXIT_ERROR),
        _ => crate::EXIT_ERROR,
    }
}
