//! `dlock run [--wait DUR] [--lease DUR] [--grace DUR] NAME -- CMD [ARGS…]`.
//!
//! The promise: the command (with every process it starts) runs only while the lock is held.
//! - It runs under a guard process (crate `distlock-run`) that stops every process the command
//!   started, whatever process group or session it moved to (a /proc walk of its descendants,
//!   a cgroup of the command's own where one can be made): `kill -9` of dlock takes all of it
//!   down, and signals dlock gets are forwarded to the command.
//! - The core's watchdog renews the lease (every lease/3); dlock follows the lease end it
//!   confirms (`LockGuard::lease_deadline`), so it knows the instant the last confirmed lease
//!   ends. The command is stopped — SIGTERM, SIGKILL `--grace` later — so that it is dead a
//!   margin *before* that instant, which is no later than the earliest moment the server could
//!   grant the lock to another owner.
//!   The guard enforces the same schedule, so a paused dlock cannot let the command run on.
//! - The lock is released, or reported lost, only once nothing of the command runs any more;
//!   on `file://` the guard holds the lock file too, so a killed dlock does not free the lock
//!   before that.
//! - Exit 76 whenever the lock was lost (or the command had to be stopped for it) before the
//!   command ended, even if the command then exited by itself.

use clap::Args;
use distlock_run::{boot_now, margin, max_grace, verdict, Event, Facts, Report, Spawn, Supervisor};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch::Sender;

#[derive(Args, Debug)]
#[command(after_long_help = RUN_HELP)]
pub struct RunArgs {
    /// How long to wait for the lock (default: forever; 0 tries once). A bare number is
    /// seconds; or e.g. 500ms, 10s, 2m. Connection errors and a lapsed place in the queue are
    /// retried within it.
    #[arg(long, value_parser = crate::duration_arg)]
    wait: Option<Duration>,
    /// Watchdog lease: the lock lives this long after dlock stops renewing it (e.g. if dlock is
    /// killed); renewed while the command runs.
    #[arg(long, value_parser = crate::duration_arg, default_value = "30s")]
    lease: Duration,
    /// How long the command gets between SIGTERM and SIGKILL when it has to be stopped
    /// [default: 5s]. At most half the lease minus a margin: longer is shortened to fit.
    #[arg(long, value_parser = crate::duration_arg)]
    grace: Option<Duration>,
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

const RUN_HELP: &str = "\
The command runs only while the lock is held:
  - It runs under a small guard process. Every process it starts stays within reach,
    whatever process group or session it moves to (timeout, setsid, a daemon, bash -m): the
    guard finds them as its descendants (it is a child subreaper) and, where a cgroup v2 can
    be made (root, or a delegated cgroup), in a cgroup of the command's own. If dlock is
    killed (even with kill -9) the guard kills all of them; SIGTERM, SIGINT, SIGHUP and SIGQUIT
    that dlock gets are forwarded to the command. When the command exits, whatever it left
    running gets SIGTERM, then SIGKILL after --grace. The lock is released (or reported lost)
    only once none of them runs; on file:// the guard holds the lock file until then.
  - If renewals keep failing, the command is stopped (SIGTERM, SIGKILL --grace later) so that
    it is dead before the last confirmed lease ends, i.e. before the server could give the
    lock to anyone else. Once the lock is known lost it is SIGKILLed at once.
  - The command's environment has DLOCK_NAME, DLOCK_OWNER and DLOCK_FENCING_TOKEN. What no
    local measure prevents is the whole machine or container being frozen (VM pause, cgroup
    freeze, suspend) past the lease, dlock and the command together: pass the fencing token to
    the resource you protect and have it reject tokens lower than the highest it has seen.
  - Out of reach: processes that a service outside the command starts for it (systemd-run, a
    running tmux server, at, a container runtime). DLOCK_CGROUP=off: no cgroup.

Exit status: the command's (128+N if it died of signal N); 75 if the lock was not acquired
within --wait; 76 if the lock was lost, or the command had to be stopped because renewals
failed, before the command ended (even if it then exited by itself); 1 for other errors
(bad URL, credentials, unsupported kind); 126/127 if the command could not be started.";

/// `--grace` when not given.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// The end of the lease a request sent at `sent` (boot clock) and confirmed promises, as the
/// core counts it (send time + lease − drift allowance).
fn confirmed_end(sent: Duration, lease: Duration) -> Duration {
    (sent + lease).saturating_sub(distlock::drift(lease))
}

/// `--grace` fitted to `lease` (with a note when it had to be shortened).
pub(crate) fn fit_grace(grace: Option<Duration>, lease: Duration) -> Duration {
    match grace {
        Some(g) if g > max_grace(lease) => {
            let fit = max_grace(lease);
            eprintln!(
                "dlock: --grace {g:?} does not fit in --lease {lease:?}; using {fit:?} so that the \
                 command is stopped before the lease can end"
            );
            fit
        }
        Some(g) => g,
        // The default quietly fits short leases.
        None => DEFAULT_GRACE.min(max_grace(lease)),
    }
}

pub async fn run(url: &str, args: RunArgs) -> u8 {
    if args.command.is_empty() {
        eprintln!("dlock: no command given");
        return crate::EXIT_ERROR;
    }
    let grace = fit_grace(args.grace, args.lease);
    let got = match acquire(url, &args).await {
        Ok(g) => g,
        Err(code) => return code,
    };
    let job = Job {
        what: format!("lock `{}`", args.name),
        name: args.name.clone(),
        lease: args.lease,
        grace,
        command: &args.command,
        env: Vec::new(),
        lock_file: got.lock_file(args.kind.lock_kind()),
    };
    supervise(got.held, got.attempt_sent, job).await
}

/// What a supervised command runs under: a lock's guard, or an election's leadership.
pub(crate) enum Held {
    /// `dlock run`.
    Lock(distlock::LockGuard),
    /// `dlock elect`.
    Leader(distlock::Leadership),
}

impl Held {
    fn guard(&self) -> &distlock::LockGuard {
        match self {
            Held::Lock(g) => g,
            Held::Leader(l) => l.guard(),
        }
    }

    async fn release(self) -> distlock::Result<distlock::ReleaseOutcome> {
        match self {
            Held::Lock(g) => g.release().await,
            Held::Leader(l) => l.resign().await,
        }
    }
}

/// The command to run while [`Held`] and how.
pub(crate) struct Job<'a> {
    /// `lock `NAME`` or `the leadership of election `NAME``, for messages.
    pub(crate) what: String,
    pub(crate) name: String,
    pub(crate) lease: Duration,
    pub(crate) grace: Duration,
    pub(crate) command: &'a [String],
    /// Added to the command's environment, after `DLOCK_NAME`, `DLOCK_FENCING_TOKEN` and
    /// `DLOCK_OWNER`.
    pub(crate) env: Vec<(&'static str, String)>,
    /// On `file://`: a duplicate of the held lock's descriptor, for the guard to keep until
    /// every process of the command is gone ([`Got::lock_file`]).
    pub(crate) lock_file: Option<std::fs::File>,
}

/// Runs `job.command` while `held` lasts (acquired by an attempt sent at `attempt_sent`, boot
/// clock) and releases it when the command ends; the exit code (see `RUN_HELP`).
pub(crate) async fn supervise(held: Held, attempt_sent: Duration, job: Job<'_>) -> u8 {
    let Job {
        what,
        name,
        lease,
        grace,
        command,
        env: extra_env,
        lock_file,
    } = job;
    let margin = margin(lease);
    let acquired = boot_now();
    let guard = Arc::new(held);
    // A fresh confirmation: a long wait or a pause since the grant is measured here.
    let sent = boot_now();
    let mut lease_end = confirmed_end(attempt_sent, lease);
    match guard.guard().extend(lease).await {
        Ok(()) => lease_end = lease_end.max(confirmed_end(sent, lease)),
        Err(e) if e.is_not_owner() => {}
        Err(e) => eprintln!("dlock: confirming the lease failed ({e}); counting from the grant"),
    }
    let at = |t: Duration| fmt_at(t, acquired);
    if guard.guard().is_lost()
        || boot_now() >= distlock_run::Schedule::for_lease(lease_end, grace, margin).term
    {
        eprintln!(
            "dlock: {what} was lost before the command could start (the confirmed lease \
             ends {}, it is now {}); not running it",
            at(lease_end),
            at(boot_now())
        );
        release(guard).await;
        return crate::EXIT_LOST;
    }
    let mut env = vec![
        ("DLOCK_NAME", name.clone()),
        (
            "DLOCK_FENCING_TOKEN",
            guard.guard().fencing_token().to_string(),
        ),
        ("DLOCK_OWNER", guard.guard().owner().to_string()),
    ];
    env.extend(extra_env);
    let mut spawn = Spawn::new(command, &env, grace, margin, lease_end).cgroup(cgroup_allowed());
    if let Some(f) = &lock_file {
        spawn = spawn.hold(f.as_fd());
    }
    let group = Supervisor::spawn_with(spawn);
    // The guard has its own duplicate now; ours must not outlive the release.
    drop(lock_file);
    let group = match group {
        Ok(g) => g,
        Err(e) => {
            eprintln!("dlock: cannot start the command's guard: {e}");
            release(guard).await;
            return crate::EXIT_ERROR;
        }
    };
    let (end_tx, mut end_rx) = tokio::sync::watch::channel(lease_end);
    let renewer = tokio::spawn(follow(guard.clone(), lease, end_tx));
    let lost_signal = guard.guard().lost_signal();
    let outcome = group
        .wait(&mut end_rx, lost_signal.lost(), |event| match event {
            Event::Stopping { lease_end, kill_at } => eprintln!(
                "dlock: renewals of {what} have not been confirmed; the lease ends {}: \
                     stopping the command (SIGTERM now, SIGKILL {})",
                at(lease_end),
                at(kill_at)
            ),
            Event::Lost(reason) => {
                eprintln!(
                    "dlock: {what} was lost while the command ran ({reason}); killing the command"
                )
            }
            _ => {}
        })
        .await;
    let seen_end = outcome.seen_end;
    renewer.abort();
    let _ = renewer.await;
    let lease_end = *end_rx.borrow();
    let mut lost_seen = outcome.lost_seen;
    if lost_seen.is_none() && guard.guard().is_lost() {
        lost_seen = guard.guard().lost_signal().reason().map(|r| (seen_end, r));
    }
    let (ended, cmd_end) = match outcome.report {
        Some(Report::Ended(e, t)) => (e, t),
        Some(Report::Failed(code, msg)) => {
            let program = command.first().map_or("", String::as_str);
            eprintln!("dlock: cannot run `{program}`: {msg}");
            release(guard).await;
            return code;
        }
        Some(Report::LeaseTooShort) => {
            eprintln!(
                "dlock: the lease of {what} ran too short before the command could start \
                 (it ends {}); not running it",
                at(lease_end)
            );
            release(guard).await;
            return crate::EXIT_LOST;
        }
        // The guard died without a word (killed from outside, or by the stop schedule).
        _ => (outcome.guard_status, seen_end),
    };
    let release_sent = boot_now();
    let released = release(guard).await;
    let mut facts = Facts::new(
        lease_end,
        distlock_run::Schedule::for_lease(lease_end, grace, margin).term,
        cmd_end,
    );
    facts.stopped_at = outcome.stopped_at;
    facts.lost_seen = lost_seen;
    facts.release_not_held = released == Some(false);
    facts.release_sent = release_sent;
    match verdict(&facts) {
        Some(why) => {
            eprintln!(
                "dlock: {what} was lost before the command ended: {why}; the confirmed lease \
                 ended {}, the command ended {} (times since it was acquired); the \
                 command's own status was {}",
                at(lease_end),
                at(cmd_end),
                ended.exit_code()
            );
            crate::EXIT_LOST
        }
        None => ended.exit_code(),
    }
}

/// `+1.234s` from `origin`, or `-0.100s` before it.
fn fmt_at(t: Duration, origin: Duration) -> String {
    if t >= origin {
        format!("at +{:.3}s", (t - origin).as_secs_f64())
    } else {
        format!("at -{:.3}s", (origin - t).as_secs_f64())
    }
}

/// Follows the lease the core's watchdog renews (every lease/3; dlock's locks are all in
/// watchdog mode) and publishes each confirmed lease end, on the boot clock. Ends when the
/// lock is gone.
async fn follow(held: Arc<Held>, lease: Duration, end: Sender<Duration>) {
    let guard = held.guard();
    let every = (lease / 20).clamp(Duration::from_millis(10), Duration::from_millis(250));
    while !guard.is_lost() {
        tokio::time::sleep(every).await;
        // The boot clock first: the end computed errs early, by the time between the reads.
        let now = boot_now();
        let left = guard.lease_left();
        if left.is_zero() {
            // Ran out (`lease_left` is zero then, not the time since): nothing to publish.
            continue;
        }
        let e = now + left;
        end.send_if_modified(|cur| {
            let later = e > *cur;
            if later {
                *cur = e;
            }
            later
        });
    }
}

/// Releases the lock; `Some(false)` if the server no longer had it, `None` on an error.
async fn release(guard: Arc<Held>) -> Option<bool> {
    let guard = match Arc::try_unwrap(guard) {
        Ok(g) => g,
        // Another reference lives on (cannot happen once the renewer ended): dropping ours
        // leaves the release to the last one.
        Err(_) => return None,
    };
    match guard.release().await {
        Ok(distlock::ReleaseOutcome::Expired) | Ok(distlock::ReleaseOutcome::TakenByOther) => {
            Some(false)
        }
        Ok(_) => Some(true),
        Err(e) => {
            eprintln!("dlock: release failed ({e}); the lock frees itself when its lease ends");
            None
        }
    }
}

/// True for errors that waiting cannot heal: the URL, the credentials, the kind of lock, the
/// arguments. Everything else (connection, session, a lapsed place in the queue, a reply that
/// made no sense once) is retried within `--wait`.
pub(crate) fn is_permanent(e: &distlock::Error) -> bool {
    matches!(
        e,
        distlock::Error::InvalidUrl { .. }
            | distlock::Error::Auth { .. }
            | distlock::Error::Unsupported { .. }
            | distlock::Error::InvalidArgument(_)
    )
}

/// Connects and acquires within `--wait`, healing what can heal.
async fn acquire(url: &str, args: &RunArgs) -> Result<Got, u8> {
    let wanted = Wanted {
        what: format!("lock `{}`", args.name),
        name: &args.name,
        lease: args.lease,
        wait: args.wait,
        others: "another owner held it the whole time",
    };
    obtain(url, &wanted, |c, left| {
        let name = args.name.clone();
        let kind = args.kind;
        let owner = args.owner.clone();
        Box::pin(async move {
            match kind {
                crate::kind::Kind::Semaphore(permits) => {
                    let sem = c.semaphore(&name, permits)?;
                    match left {
                        None => sem.acquire(1).await,
                        Some(l) => sem.acquire_timeout(1, l).await,
                    }
                }
                kind => {
                    let lock = kind.lock(&c, &name)?;
                    let lock = match owner {
                        Some(o) => lock.with_owner(o)?,
                        None => lock,
                    };
                    match left {
                        None => lock.acquire().await,
                        Some(l) => lock.acquire_timeout(l).await,
                    }
                }
            }
            .map(Held::Lock)
        })
    })
    .await
}

/// What [`obtain`] waits for.
pub(crate) struct Wanted<'a> {
    /// `lock `NAME``, for messages.
    pub(crate) what: String,
    pub(crate) name: &'a str,
    pub(crate) lease: Duration,
    pub(crate) wait: Option<Duration>,
    /// Why nothing was got when no error came up: `another owner held it the whole time`.
    pub(crate) others: &'static str,
}

/// What [`obtain`] got.
pub(crate) struct Got {
    pub(crate) held: Held,
    /// When (boot clock) the attempt that got it started.
    pub(crate) attempt_sent: Duration,
    /// The backend itself on `file://`.
    files: Option<distlock::file::FileBackend>,
}

impl Got {
    /// On `file://`: a duplicate of the descriptor whose `flock` is the lock (of kind
    /// `kind`), for the guard. The kernel frees a file lock when its last descriptor closes:
    /// with only dlock's, a killed dlock would free it while its guard is still killing the
    /// command.
    pub(crate) fn lock_file(&self, kind: distlock::LockKind) -> Option<std::fs::File> {
        let g = self.held.guard();
        match self
            .files
            .as_ref()?
            .hold_file(kind, g.name(), g.fencing_token())
        {
            Ok(f) => f,
            Err(e) => {
                eprintln!(
                    "dlock: cannot keep the lock file open for the command's guard ({e}); if \
                     dlock is killed, the lock is free while the command is still being stopped"
                );
                None
            }
        }
    }
}

/// `DLOCK_CGROUP=off` (or `0`, `no`, `false`) keeps the command out of a cgroup of its own.
fn cgroup_allowed() -> bool {
    !matches!(
        std::env::var("DLOCK_CGROUP").as_deref().map(str::trim),
        Ok("off" | "0" | "no" | "false")
    )
}

/// Connects; on `file://` builds the backend here and keeps it, for [`Got::lock_file`].
async fn connect(
    url: &str,
    opts: distlock::ClientOptions,
) -> distlock::Result<(distlock::Client, Option<distlock::file::FileBackend>)> {
    if url
        .get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("file:"))
    {
        let files = distlock::file::FileBackend::from_url(url, &opts)?;
        let client = distlock::Client::new(Arc::new(files.clone()), opts)?;
        return Ok((client, Some(files)));
    }
    Ok((distlock::connect_with(url, opts).await?, None))
}

/// Connects and runs `attempt` within `wanted.wait`, healing what can heal (a new client
/// after a connection error, a backoff between tries).
pub(crate) async fn obtain(
    url: &str,
    wanted: &Wanted<'_>,
    mut attempt: impl FnMut(
        distlock::Client,
        Option<Duration>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = distlock::Result<Held>> + Send>,
    >,
) -> Result<Got, u8> {
    let opts = distlock::ClientOptions::default().watchdog_lease(wanted.lease);
    let opts = if wanted.lease / 3 <= opts.get_op_timeout() {
        opts.op_timeout((wanted.lease / 3).max(Duration::from_millis(50)))
    } else {
        opts
    };
    let deadline = wanted.wait.map(|w| tokio::time::Instant::now() + w);
    let left = || deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
    let mut client: Option<distlock::Client> = None;
    let mut files: Option<distlock::file::FileBackend> = None;
    let mut last_err: Option<String> = None;
    let mut backoff = Duration::from_millis(100);
    let what = &wanted.what;
    let timed_out = |last_err: &Option<String>| {
        let waited = wanted.wait.unwrap_or_default();
        match last_err {
            Some(e) => {
                eprintln!("dlock: {what} was not acquired within {waited:?}; last error: {e}")
            }
            None => eprintln!(
                "dlock: {what} was not acquired within {waited:?}: {}",
                wanted.others
            ),
        }
        crate::EXIT_NOT_ACQUIRED
    };
    loop {
        let attempt_sent = boot_now();
        let result: distlock::Result<Held> = async {
            let c = match &client {
                Some(c) => c.clone(),
                None => {
                    let connect = connect(url, opts.clone());
                    let (c, f) = match left() {
                        Some(l) => match tokio::time::timeout(l, connect).await {
                            Ok(r) => r?,
                            Err(_) => {
                                return Err(distlock::Error::Timeout {
                                    name: wanted.name.to_owned(),
                                    waited: wanted.wait.unwrap_or_default(),
                                })
                            }
                        },
                        None => connect.await?,
                    };
                    client = Some(c.clone());
                    files = f;
                    c
                }
            };
            attempt(c, left()).await
        }
        .await;
        match result {
            Ok(held) => {
                return Ok(Got {
                    held,
                    attempt_sent,
                    files,
                })
            }
            Err(e) if e.is_timeout() => return Err(timed_out(&last_err)),
            Err(e) if is_permanent(&e) => {
                eprintln!("dlock: {e}");
                return Err(crate::EXIT_ERROR);
            }
            Err(e) => {
                if e.is_connection() {
                    // A fresh client heals a broken session (ZooKeeper, SQL) too.
                    client = None;
                }
                let msg = e.to_string();
                if last_err.as_deref() != Some(msg.as_str()) {
                    eprintln!("dlock: {msg}; retrying");
                }
                last_err = Some(msg);
                let pause = backoff.mul_f64(0.5 + fastrand::f64() / 2.0);
                backoff = (backoff * 2).min(Duration::from_secs(2));
                match left() {
                    Some(l) if l.is_zero() => return Err(timed_out(&last_err)),
                    Some(l) => tokio::time::sleep(pause.min(l)).await,
                    None => tokio::time::sleep(pause).await,
                }
                if left().is_some_and(|l| l.is_zero()) {
                    return Err(timed_out(&last_err));
                }
            }
        }
    }
}
