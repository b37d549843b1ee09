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
    #[command(flatten)]
    waiting: Waiting,
    /// Watchdog lease: the lock lives this long after dlock stops renewing it (e.g. if dlock is
    /// killed); renewed while the command runs.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "30s")]
    lease: Duration,
    /// How long the command gets between SIGTERM and SIGKILL when it has to be stopped
    /// [default: 5s]. At most half the lease minus a margin: longer is shortened to fit.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg)]
    grace: Option<Duration>,
    #[command(flatten)]
    which: Which,
    /// When dlock ends, print one JSON object on the last line of stdout: name, kind,
    /// outcome (ran, lost, not_acquired, unreachable, error), exit_code, command_status,
    /// owner, fencing_token, waited_ms, held_ms.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    job: JobArgs,
}

/// NAME and what runs under it, shared by `dlock run` and `dlock once`: COMMAND, or `-c CMD`.
#[derive(Args, Debug)]
pub(crate) struct JobArgs {
    /// Run this shell command line (`sh -c CMD`, flock -c) instead of COMMAND.
    #[arg(
        short = 'c',
        long = "command",
        value_name = "CMD",
        conflicts_with = "command"
    )]
    shell: Option<String>,
    /// Lock name (`dlock once`: the job's; `dlock elect`: the election's).
    pub(crate) name: String,
    /// The command and its arguments (after `--`, or right after NAME: everything from the
    /// first word after NAME on is the command's).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present = "shell",
        value_name = "COMMAND"
    )]
    command: Vec<String>,
}

/// `--owner`, `--kind`, `-s` and `-x` of `dlock run` and `dlock hold`: which lock, held as whom.
#[derive(Args, Debug)]
pub(crate) struct Which {
    /// Owner id to hold the lock as (default: unique per run).
    #[arg(long)]
    owner: Option<String>,
    /// Kind of lock: mutex, fair, read, write, or semaphore=N (one of N permits).
    #[arg(long, default_value = "mutex", value_parser = crate::kind::parse)]
    kind: crate::kind::Kind,
    /// A shared lock (flock -s): the read side of the read-write lock NAME, held by any number
    /// of -s holders at once and never with an -x holder. Same as --kind read.
    #[arg(short, long, conflicts_with_all = ["kind", "exclusive"])]
    shared: bool,
    /// An exclusive lock against -s holders (flock -x): the write side of the read-write lock
    /// NAME. Same as --kind write. (The default kind, mutex, is a lock of its own: scripts
    /// that mix shared and exclusive holders of NAME use -s and -x on every side.)
    #[arg(short = 'x', short_alias = 'e', long, conflicts_with = "kind")]
    exclusive: bool,
}

impl Which {
    /// The lock kind -s, -x or --kind ask for.
    pub(crate) fn kind(&self) -> crate::kind::Kind {
        if self.shared {
            crate::kind::Kind::Read
        } else if self.exclusive {
            crate::kind::Kind::Write
        } else {
            self.kind
        }
    }
}

impl JobArgs {
    /// The program and arguments to run: COMMAND, or `sh -c CMD`.
    pub(crate) fn argv(&self) -> Vec<String> {
        match &self.shell {
            Some(line) => vec!["sh".into(), "-c".into(), line.clone()],
            None => self.command.clone(),
        }
    }
}

const RUN_HELP: &str = "\
The command runs only while the lock is held:
  - It runs under a small guard process. Every process it starts stays within reach,
    whatever process group or session it moves to (timeout, setsid, a daemon, bash -m): the
    guard finds them as its descendants (it is a child subreaper) and, where a cgroup v2 can
    be made (root, or a delegated cgroup), in a cgroup of the command's own. If dlock is
    killed (even with kill -9) the guard kills all of them; SIGTERM, SIGINT, SIGHUP and SIGQUIT
    that dlock gets are forwarded to the command (with SIGCONT; after SIGTERM or SIGINT it
    is SIGKILLed --grace later if still running). In the foreground of a terminal the
    command gets the terminal: it reads prompts; Ctrl-C reaches it, Ctrl-Z stops it and
    dlock (fg resumes both). When the command exits, whatever it left running gets SIGTERM,
    then SIGKILL after --grace. The lock is released (or reported lost) only once none of
    them runs; on file:// the guard holds the lock file until then.
  - If renewals keep failing, the command is stopped (SIGTERM, SIGKILL --grace later) so that
    it is dead before the last confirmed lease ends, i.e. before the server could give the
    lock to anyone else. Once the lock is known lost it is SIGKILLed at once.
  - The command's environment has DLOCK_NAME, DLOCK_OWNER and DLOCK_FENCING_TOKEN. What no
    local measure prevents is the whole machine or container being frozen (VM pause, cgroup
    freeze, suspend) past the lease, dlock and the command together: pass the fencing token to
    the resource you protect and have it reject tokens lower than the highest it has seen.
  - Out of reach: processes that a service outside the command starts for it (systemd-run, a
    running tmux server, at, a container runtime). DLOCK_CGROUP=off: no cgroup.

flock(1) users: -n, -w SECS, -E CODE, -c CMD, -s and -x mean what they mean there; the
command may follow NAME without `--`. Unlike flock, -x is not the default: the default kind
(mutex) is a lock of its own, and -s/-x are the two sides of the read-write lock NAME.
Shared and exclusive holders of one NAME therefore all pass -s or -x. -c runs `sh -c CMD`
(not $SHELL).

Waiting on a terminal shows one status line on stderr after about a second (time waited,
the holder's pid and host, how long it has held the lock, its lease, the queue), erased when
the lock is granted; off a terminal nothing (-v: a line every ten seconds).

Exit status: the command's (128+N if it died of signal N); 75 (or -E CODE) if the lock was
not acquired within --wait (or on the one try of -n); 69 if the lock service could not be
reached (within --connect-timeout, or on the last try of --wait); 76 if the lock was lost,
or the command had to be stopped because renewals failed, before the command ended (even if
it then exited by itself); 1 for other errors (bad URL, credentials, unsupported kind);
126/127 if the command could not be started.";

/// `--wait`, `-n` and `--connect-timeout` of `dlock run` and `dlock elect`.
#[derive(Args, Debug)]
pub(crate) struct Waiting {
    /// How long to wait once connected (default: forever; 0 makes one try; flock -w). A bare
    /// number is seconds (fractions too); or e.g. 500ms, 10s, 2m, 1h30m. Lost connections and
    /// a lapsed place in the queue are retried within it.
    #[arg(
        short = 'w',
        long,
        visible_alias = "timeout",
        value_name = "DURATION",
        value_parser = crate::duration_arg,
        conflicts_with = "nonblock"
    )]
    wait: Option<Duration>,
    /// The exit status when the lock was not acquired: on the one try of -n, or when --wait
    /// ran out (flock -E).
    #[arg(
        short = 'E',
        long,
        value_name = "CODE",
        default_value_t = crate::EXIT_NOT_ACQUIRED
    )]
    pub(crate) conflict_exit_code: u8,
    /// Make one try, once connected, and give up (exit 75) if another owner has it: the same
    /// as --wait 0 (flock -n).
    #[arg(short = 'n', long)]
    nonblock: bool,
    /// How long to try to reach the lock service before giving up (exit 69); not counted
    /// against --wait. Without --wait, dlock keeps trying, one line per failure.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "10s")]
    pub(crate) connect_timeout: Duration,
}

impl Waiting {
    /// The wait: `None` for forever, zero for one try.
    pub(crate) fn wait(&self) -> Option<Duration> {
        if self.nonblock {
            Some(Duration::ZERO)
        } else {
            self.wait
        }
    }
}

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
    if args.job.argv().is_empty() {
        eprintln!("dlock: no command given");
        return crate::EXIT_USAGE;
    }
    let grace = fit_grace(args.grace, args.lease);
    let command = args.job.argv();
    let kind = args.which.kind();
    let mut report = crate::report::JsonReport::new(
        args.json,
        &args.job.name,
        kind.lock_kind().as_str(),
        args.waiting.conflict_exit_code,
    );
    let got = match acquire(url, &args.job.name, &args.which, args.lease, &args.waiting).await {
        Ok(g) => g,
        Err(code) => return report.gave_up(code),
    };
    report.acquired(got.held.guard().owner(), got.held.guard().fencing_token());
    let job = Job {
        what: format!("lock `{}`", args.job.name),
        name: args.job.name.clone(),
        lease: args.lease,
        grace,
        command: &command,
        env: Vec::new(),
        lock_file: got.lock_file(kind.lock_kind()),
        keep: None,
    };
    report.ran(supervise(got.held, got.attempt_sent, job).await)
}

/// What a supervised command runs under: a lock's guard, or an election's leadership.
pub(crate) enum Held {
    /// `dlock run`.
    Lock(distlock::LockGuard),
    /// `dlock elect`.
    Leader(distlock::Leadership),
}

impl Held {
    pub(crate) fn guard(&self) -> &distlock::LockGuard {
        match self {
            Held::Lock(g) => g,
            Held::Leader(l) => l.guard(),
        }
    }

    pub(crate) async fn release(self) -> distlock::Result<distlock::ReleaseOutcome> {
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
    /// Another lock, given up when the command ends but no sooner than it has been held the
    /// given time ([`distlock::LockGuard::release_after`]): `dlock once`'s interval lock.
    pub(crate) keep: Option<(distlock::LockGuard, Duration)>,
}

/// How a supervised command went: dlock's exit code (see `RUN_HELP`), and what it is made of.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ran {
    /// dlock's exit code.
    pub(crate) code: u8,
    /// The command's own exit status (128+N for signal N), if it was started and ended.
    pub(crate) status: Option<u8>,
    /// The lock (or leadership) was lost, or the command had to be stopped for it, before
    /// the command ended.
    pub(crate) lost: bool,
}

impl Ran {
    /// dlock gave up without a command status: `lost` or not.
    fn without_status(code: u8, lost: bool) -> Ran {
        Ran {
            code,
            status: None,
            lost,
        }
    }
}

/// Runs `job.command` while `held` lasts (acquired by an attempt sent at `attempt_sent`, boot
/// clock) and releases it when the command ends; how it went.
pub(crate) async fn supervise(held: Held, attempt_sent: Duration, job: Job<'_>) -> Ran {
    let Job {
        what,
        name,
        lease,
        grace,
        command,
        env: extra_env,
        lock_file,
        keep,
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
        return Ran::without_status(crate::EXIT_LOST, true);
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
        Ok(g) => {
            tracing::info!(command = ?command, "command started under {what}");
            g
        }
        Err(e) => {
            eprintln!("dlock: cannot start the command's guard: {e}");
            release(guard).await;
            return Ran::without_status(crate::EXIT_ERROR, false);
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
            return Ran::without_status(code, false);
        }
        Some(Report::LeaseTooShort) => {
            eprintln!(
                "dlock: the lease of {what} ran too short before the command could start \
                 (it ends {}); not running it",
                at(lease_end)
            );
            release(guard).await;
            return Ran::without_status(crate::EXIT_LOST, true);
        }
        // The guard died without a word (killed from outside, or by the stop schedule).
        _ => (outcome.guard_status, seen_end),
    };
    let release_sent = boot_now();
    tracing::info!(
        status = ended.exit_code(),
        "command ended; releasing {what}"
    );
    let released = release(guard).await;
    if let Some((kept, at_least)) = keep {
        let name = kept.name().to_owned();
        if let Err(e) = kept.release_after(at_least).await {
            eprintln!("dlock: giving up lock `{name}` failed ({e}); it frees when its lease ends");
        }
    }
    let mut facts = Facts::new(
        lease_end,
        distlock_run::Schedule::for_lease(lease_end, grace, margin).term,
        cmd_end,
    );
    facts.stopped_at = outcome.stopped_at;
    facts.lost_seen = lost_seen;
    facts.release_not_held = released == Some(false);
    facts.release_sent = release_sent;
    let status = Some(ended.exit_code());
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
            Ran {
                code: crate::EXIT_LOST,
                status,
                lost: true,
            }
        }
        None => Ran {
            code: ended.exit_code(),
            status,
            lost: false,
        },
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
pub(crate) async fn acquire(
    url: &str,
    name: &str,
    which: &Which,
    lease: Duration,
    waiting: &Waiting,
) -> Result<Got, u8> {
    let wanted = Wanted {
        what: format!("lock `{name}`"),
        lease,
        wait: waiting.wait(),
        connect_timeout: waiting.connect_timeout,
        others: "another owner held it the whole time",
        busy: "another owner has it",
        conflict_exit: waiting.conflict_exit_code,
        say_not_acquired: true,
        target: Some(crate::holder::Target {
            name: name.to_owned(),
            kind: which.kind().lock_kind(),
        }),
    };
    obtain(url, &wanted, |c, left| {
        let name = name.to_owned();
        let kind = which.kind();
        let owner = which.owner.clone();
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
pub(crate) struct Wanted {
    /// `lock `NAME``, for messages.
    pub(crate) what: String,
    pub(crate) lease: Duration,
    pub(crate) wait: Option<Duration>,
    /// How long connecting may take (`--connect-timeout`), not counted against `wait`.
    pub(crate) connect_timeout: Duration,
    /// Why nothing was got when no error came up: `another owner held it the whole time`.
    pub(crate) others: &'static str,
    /// Why the one try of `--wait 0` got nothing: `another owner has it`.
    pub(crate) busy: &'static str,
    /// The exit code when it was not got within the wait (`-E`, default 75).
    pub(crate) conflict_exit: u8,
    /// The lock whose holders the "not acquired" message names, where the backend can
    /// inspect it.
    pub(crate) target: Option<crate::holder::Target>,
    /// Whether [`obtain`] says "not acquired" itself (`dlock once` words its skips its own way).
    pub(crate) say_not_acquired: bool,
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

/// The message of a connection try that ran out of time.
const CUT_SHORT: &str = "no connection within";

/// One connection attempt, given at most `limit`: a server that does not answer in time is
/// a connection error, as one that refuses.
async fn connect_within(
    url: &str,
    opts: &distlock::ClientOptions,
    limit: Duration,
) -> distlock::Result<(distlock::Client, Option<distlock::file::FileBackend>)> {
    match tokio::time::timeout(limit, connect(url, opts.clone())).await {
        Ok(r) => r,
        Err(_) => Err(distlock::Error::connection(
            "lock service",
            distlock::conn::redact(url),
            format!("{CUT_SHORT} {}", human(limit)),
        )),
    }
}

/// True for an error of connecting that waiting cannot heal: [`is_permanent`] ones; on
/// `file://` every one (the lock directory is local: a path that is a file, not writable or on
/// a network file system stays so); a server that answers something that is not its
/// protocol (e.g. `redis://` at an HTTP server).
fn is_permanent_at_connect(e: &distlock::Error) -> bool {
    is_permanent(e) || e.backend() == Some("file") || e.is_unexpected_reply()
}

/// The lines dlock prints while it retries: a new error at once, the same one again at most
/// every [`Retrying::EVERY`], with how long it has been failing.
pub(crate) struct Retrying {
    since: Option<tokio::time::Instant>,
    printed: Option<(String, tokio::time::Instant)>,
}

impl Retrying {
    /// At most one line per this long while the same error repeats.
    pub(crate) const EVERY: Duration = Duration::from_secs(10);

    pub(crate) fn new() -> Self {
        Retrying {
            since: None,
            printed: None,
        }
    }

    /// The error of the last failed try.
    pub(crate) fn last(&self) -> Option<&str> {
        self.printed.as_ref().map(|(m, _)| m.as_str())
    }

    /// Notes a failed try whose error is `msg`; prints a line when it is new or when the last
    /// line is [`Self::EVERY`] old.
    pub(crate) fn failed(&mut self, msg: &str) {
        let now = tokio::time::Instant::now();
        let since = *self.since.get_or_insert(now);
        let line = match &self.printed {
            Some((last, at)) if last == msg => {
                if now.duration_since(*at) < Self::EVERY {
                    return;
                }
                format!(
                    "dlock: {msg}; still retrying (failing for {})",
                    human(now.duration_since(since))
                )
            }
            _ => format!("dlock: {msg}; retrying"),
        };
        eprintln!("{line}");
        self.printed = Some((msg.to_owned(), now));
    }
}

/// `e` on one line: a driver's multi-line message joined by spaces.
pub(crate) fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A duration as a person writes it: `0s`, `250ms`, `1.5s`, `2m30s`, `1h30m`.
pub(crate) fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 && !d.is_zero() {
        return format!("{}µs", d.as_micros().max(1));
    }
    if ms < 1000 {
        return if ms == 0 {
            "0s".into()
        } else {
            format!("{ms}ms")
        };
    }
    let secs = d.as_secs();
    if secs < 60 {
        let s = format!("{:.3}", d.as_secs_f64());
        return format!("{}s", s.trim_end_matches('0').trim_end_matches('.'));
    }
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out += &format!("{h}h");
    }
    if m > 0 {
        out += &format!("{m}m");
    }
    if s > 0 {
        out += &format!("{s}s");
    }
    out
}

/// Connects and runs `attempt` within `wanted.wait`, healing what can heal (a new client
/// after a connection error, a backoff between tries).
///
/// Connecting comes first and is not counted against the wait: it is given
/// `wanted.connect_timeout` (with a finite wait, a refused or silent server is tried again
/// until then; without one, forever). `--wait 0` is then one attempt on a live connection.
/// Exit codes: 1 for an error waiting cannot heal, [`crate::EXIT_UNREACHABLE`] when the
/// server could not be reached (while connecting, or when the wait ran out with a connection
/// error), [`crate::EXIT_NOT_ACQUIRED`] when it was held elsewhere for the whole wait.
pub(crate) async fn obtain(
    url: &str,
    wanted: &Wanted,
    mut attempt: impl FnMut(
        distlock::Client,
        Option<Duration>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = distlock::Result<Held>> + Send>,
    >,
) -> Result<Got, u8> {
    let opts = distlock::ClientOptions::default()
        .watchdog_lease(wanted.lease)
        .connect_timeout(wanted.connect_timeout);
    let opts = if wanted.lease / 3 <= opts.get_op_timeout() {
        opts.op_timeout((wanted.lease / 3).max(Duration::from_millis(50)))
    } else {
        opts
    };
    let what = &wanted.what;
    let mut retrying = Retrying::new();
    let mut backoff = backoff();
    let permanent = |e: &distlock::Error| {
        eprintln!("dlock: {}", one_line(e));
        crate::EXIT_ERROR
    };
    let unreachable = |e: &str, why: String| {
        eprintln!("dlock: cannot reach the lock service ({why}): {e}");
        crate::EXIT_UNREACHABLE
    };

    // Connecting: its own time limit, not the wait's.
    let started = tokio::time::Instant::now();
    tracing::info!(url = %distlock::conn::redact(url), "connecting");
    let (mut client, mut files) = loop {
        let limit = match wanted.wait {
            None => wanted.connect_timeout,
            Some(_) => wanted.connect_timeout.saturating_sub(started.elapsed()),
        };
        match connect_within(url, &opts, limit).await {
            Ok((c, f)) => {
                tracing::info!(
                    backend = c.backend_kind(),
                    endpoint = %c.endpoint(),
                    took = %human(started.elapsed()),
                    "connected"
                );
                break (Some(c), f);
            }
            Err(e) if is_permanent_at_connect(&e) => return Err(permanent(&e)),
            Err(e) => {
                let left = wanted.connect_timeout.saturating_sub(started.elapsed());
                let msg = one_line(&e);
                if wanted.wait.is_some() && left.is_zero() {
                    let why = format!(
                        "{what} was not tried; --connect-timeout {}",
                        human(wanted.connect_timeout)
                    );
                    // A try cut short by the limit says less than the failure before it.
                    let last = retrying.last().filter(|_| msg.contains(CUT_SHORT));
                    return Err(unreachable(last.unwrap_or(&msg), why));
                }
                retrying.failed(&msg);
                let pause = backoff.next_delay();
                match wanted.wait {
                    // The last try gets what is left, at least a few milliseconds.
                    Some(_) => tokio::time::sleep(pause.min(left.saturating_sub(MIN_TRY))).await,
                    None => tokio::time::sleep(pause).await,
                }
            }
        }
    };

    // Waiting: from the first live connection.
    let deadline = wanted.wait.map(|w| tokio::time::Instant::now() + w);
    // Who holds it as the wait begins: a holder still there when it runs out has held the
    // lock at least that long. (Not for the one try of `--wait 0`, nor without a limit.)
    let mut first_look = match (&client, &wanted.target, wanted.wait) {
        (Some(c), Some(t), Some(w)) if !w.is_zero() => {
            let (c, t) = (c.clone(), t.clone());
            Some(tokio::spawn(
                async move { crate::holder::look(&c, &t).await },
            ))
        }
        _ => None,
    };
    let left = || deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
    let waited = human(wanted.wait.unwrap_or_default());
    // Until a try has come back from the server, a reply that makes no sense means a server
    // of another kind, not a passing fault.
    let mut answered = false;
    let wait_began = tokio::time::Instant::now();
    loop {
        let attempt_sent = boot_now();
        tracing::debug!(wait_left = ?left().map(human), "trying to acquire {what}");
        let result: distlock::Result<Held> = async {
            let c = match &client {
                Some(c) => c.clone(),
                None => {
                    let (c, f) = connect_within(url, &opts, wanted.connect_timeout).await?;
                    client = Some(c.clone());
                    files = f;
                    c
                }
            };
            // What the wait is at, on a terminal (not for the one try of --wait 0).
            let status = match (&wanted.target, wanted.wait) {
                (Some(_), Some(w)) if w.is_zero() => None,
                (Some(t), _) => Some(crate::status::Status::start(&c, t, what, wait_began)),
                (None, _) => None,
            };
            let held = attempt(c, left()).await;
            if let Some(s) = status {
                s.stop();
            }
            held
        }
        .await;
        let e = match result {
            Ok(held) => {
                tracing::info!(
                    fencing_token = held.guard().fencing_token(),
                    owner = held.guard().owner(),
                    waited = %human(boot_now().saturating_sub(attempt_sent)),
                    "{what} acquired"
                );
                return Ok(Got {
                    held,
                    attempt_sent,
                    files,
                });
            }
            Err(e) if e.is_timeout() && !wanted.say_not_acquired => {
                return Err(wanted.conflict_exit);
            }
            Err(e) if e.is_timeout() => {
                let first = first_look.take();
                if wanted.wait.is_some_and(|w| w.is_zero()) {
                    let why = why_not(client.as_ref(), wanted, first, wanted.busy).await;
                    eprintln!(
                        "dlock: {what} was not acquired on its one try (-n, --wait 0): {why}"
                    );
                } else {
                    let why = why_not(client.as_ref(), wanted, first, wanted.others).await;
                    eprintln!("dlock: {what} was not acquired within {waited}: {why}");
                }
                return Err(wanted.conflict_exit);
            }
            Err(e) if is_permanent(&e) || (!answered && e.is_unexpected_reply()) => {
                return Err(permanent(&e))
            }
            Err(e) => e,
        };
        if e.is_connection() {
            // A fresh client heals a broken session (ZooKeeper, SQL) too.
            client = None;
        } else {
            answered = true;
        }
        if left().is_some_and(|l| l.is_zero()) {
            if e.is_connection() {
                let why = format!("{what} not acquired within {waited}");
                return Err(unreachable(&one_line(&e), why));
            }
            eprintln!(
                "dlock: {what} was not acquired within {waited}; last error: {}",
                one_line(&e)
            );
            return Err(wanted.conflict_exit);
        }
        retrying.failed(&one_line(&e));
        let pause = backoff.next_delay();
        match left() {
            Some(l) => tokio::time::sleep(pause.min(l)).await,
            None => tokio::time::sleep(pause).await,
        }
    }
}

/// The words after "not acquired …: ": the holders of `wanted.target` as seen now, with how
/// long each has held it at least when `first` (a look as the wait began) saw it too;
/// `fallback` when the backend cannot say.
async fn why_not(
    client: Option<&distlock::Client>,
    wanted: &Wanted,
    first: Option<tokio::task::JoinHandle<Option<crate::holder::Seen>>>,
    fallback: &str,
) -> String {
    let (Some(client), Some(target)) = (client, &wanted.target) else {
        return fallback.to_owned();
    };
    let now = crate::holder::look(client, target).await;
    let first = match first {
        // Unfinished by now, it would tell nothing the look just made does not.
        Some(h) if h.is_finished() => h.await.ok().flatten(),
        Some(h) => {
            h.abort();
            None
        }
        None => None,
    };
    now.and_then(|n| crate::holder::describe(&n, first.as_ref()))
        .unwrap_or_else(|| fallback.to_owned())
}

/// The least time a connection try is given when the pauses between tries leave less.
const MIN_TRY: Duration = Duration::from_millis(200);

/// Jittered exponential pauses between tries (the core's backoff): 100 ms doubling up to 2 s.
pub(crate) fn backoff() -> distlock::backoff::Backoff {
    let policy =
        distlock::RetryPolicy::new(u32::MAX, Duration::from_millis(100), Duration::from_secs(2));
    distlock::backoff::Backoff::new(policy)
}
