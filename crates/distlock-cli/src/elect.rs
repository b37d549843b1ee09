//! `dlock elect NAME [--value V] [--owner O] [--wait DUR] [--lease DUR] [--grace DUR] -- CMD
//! [ARGS…]` and `dlock leader NAME [--watch] [--json]`.
//!
//! `elect` campaigns in election NAME and runs CMD only while this process leads: the same
//! supervision as `dlock run` (crate `distlock-run`, see `run::supervise`), under the
//! leadership's lease instead of a lock's. So a hot standby is `dlock elect` started on
//! several hosts: one leads and runs CMD, the others wait; when the leader (or its host) dies,
//! another is elected with a higher fencing token and starts CMD.

use crate::run::{fit_grace, obtain, supervise, Held, Job, Waiting, Wanted};
use clap::Args;
use std::time::Duration;

#[derive(Args, Debug)]
#[command(after_long_help = ELECT_HELP)]
pub struct ElectArgs {
    /// The value to advertise while leading (e.g. this host's address), shown by `dlock
    /// leader` and in the command's DLOCK_LEADER_VALUE; at most 4096 bytes.
    #[arg(long, default_value = "")]
    value: String,
    /// Owner id to campaign as (default: unique per run; the host name makes `dlock leader`
    /// tell operators who leads).
    #[arg(long)]
    owner: Option<String>,
    #[command(flatten)]
    waiting: Waiting,
    /// Watchdog lease: leadership lives this long after dlock stops renewing it (e.g. if
    /// dlock is killed), on backends whose leases expire; renewed while the command runs.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "30s")]
    lease: Duration,
    /// How long the command gets between SIGTERM and SIGKILL when it has to be stopped
    /// [default: 5s]. At most half the lease minus a margin: longer is shortened to fit.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg)]
    grace: Option<Duration>,
    /// When dlock ends, print one JSON object on the last line of stdout (as `dlock run
    /// --json`; kind `election`).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    job: crate::run::JobArgs,
}

const ELECT_HELP: &str = "\
The command runs only while this process leads the election, with the guarantees of
`dlock run`: it runs under a guard process that stops every process it started, whatever
process group or session it moved to; it is stopped before the leadership's confirmed lease
ends if renewals fail, SIGKILLed as soon as the leadership is known lost, and the leadership is
resigned (or reported lost) only once none of its processes runs (the next candidate then
leads).

Hot standby: start `dlock elect NAME -- CMD` on several hosts; one leads and runs CMD, the
others wait; when the leader dies, another takes over with a higher fencing token.

The command's environment has DLOCK_NAME, DLOCK_OWNER, DLOCK_FENCING_TOKEN (strictly greater
than every earlier leader's: pass it with the writes CMD makes) and DLOCK_LEADER_VALUE.

The command may follow NAME without `--` (as for `dlock run`), or be a shell command line
given with -c CMD.

Exit status: the command's (128+N if it died of signal N); 75 (or -E CODE) if not elected
within --wait; 69 if the lock service could not be reached; 76 if leadership was lost before
the command ended; 1 for other errors (bad URL, an empty name, a value over 4096 bytes, a
backend without elections); 126/127 if the command could not be started.";

pub async fn elect(url: &str, args: ElectArgs) -> u8 {
    let command = args.job.argv();
    if command.is_empty() {
        eprintln!("dlock: no command given");
        return crate::EXIT_USAGE;
    }
    // Bad input is refused before connecting, with the core's own checks.
    if let Err(e) = check_input(&args) {
        eprintln!("dlock: {e}");
        return crate::EXIT_ERROR;
    }
    let grace = fit_grace(args.grace, args.lease);
    let mut report = crate::report::JsonReport::new(
        args.json,
        &args.job.name,
        distlock::LockKind::Election.as_str(),
        args.waiting.conflict_exit_code,
    );
    let wanted = Wanted {
        what: format!("the leadership of election `{}`", args.job.name),
        lease: args.lease,
        wait: args.waiting.wait(),
        connect_timeout: args.waiting.connect_timeout,
        others: "another candidate led the whole time",
        busy: "another candidate leads",
        conflict_exit: args.waiting.conflict_exit_code,
        say_not_acquired: true,
        target: Some(crate::holder::Target {
            name: args.job.name.clone(),
            kind: distlock::LockKind::Election,
        }),
    };
    let got = obtain(url, &wanted, |c, left| {
        let name = args.job.name.clone();
        let owner = args.owner.clone();
        let value = args.value.clone();
        Box::pin(async move {
            let mut e = c.election(&name)?;
            if let Some(o) = owner {
                e = e.with_owner(o)?;
            }
            match left {
                None => e.campaign(value).await,
                Some(l) => e.campaign_timeout(value, l).await,
            }
            .map(Held::Leader)
        })
    })
    .await;
    let got = match got {
        Ok(g) => g,
        Err(code) => return report.gave_up(code),
    };
    report.acquired(got.held.guard().owner(), got.held.guard().fencing_token());
    if let Held::Leader(l) = &got.held {
        eprintln!(
            "dlock: leading election `{}` as {} (fencing token {})",
            args.job.name,
            l.owner(),
            l.fencing_token()
        );
    }
    let job = Job {
        what: format!("the leadership of election `{}`", args.job.name),
        name: args.job.name.clone(),
        lease: args.lease,
        grace,
        command: &command,
        env: vec![("DLOCK_LEADER_VALUE", args.value.clone())],
        lock_file: got.lock_file(distlock::LockKind::Election),
        keep: None,
    };
    report.ran(supervise(got.held, got.attempt_sent, job).await)
}

/// The name, owner and value, checked as the core checks them.
fn check_input(args: &ElectArgs) -> distlock::Result<()> {
    distlock::validate_name(&args.job.name)?;
    if let Some(o) = &args.owner {
        distlock::validate_owner(o)?;
    }
    if args.value.len() > distlock::MAX_VALUE_LEN {
        return Err(distlock::Error::invalid(format!(
            "--value is {} bytes long; the limit is {} bytes (advertise a key to the data, \
             not the data)",
            args.value.len(),
            distlock::MAX_VALUE_LEN
        )));
    }
    if args.value.contains('\0') {
        return Err(distlock::Error::invalid(
            "--value contains a NUL character; use printable text",
        ));
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct LeaderArgs {
    /// Election name.
    name: String,
    /// Keep running and print each change of leadership (a new leader, nobody, a new value)
    /// as it happens, one line each.
    #[arg(long)]
    watch: bool,
    /// Print one JSON object (per change with --watch): name, led, owner, value,
    /// fencing_token, lease_ms_left (owner and value null when nobody leads).
    #[arg(long)]
    json: bool,
}

pub async fn leader(url: &str, args: LeaderArgs) -> u8 {
    if let Err(e) = distlock::validate_name(&args.name) {
        eprintln!("dlock: {e}");
        return crate::EXIT_ERROR;
    }
    let client = match crate::connect(url, distlock::ClientOptions::default()).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let election = match client.election(&args.name) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("dlock: {e}");
            return crate::EXIT_ERROR;
        }
    };
    if !args.watch {
        return match election.leader().await {
            Ok(l) => {
                print_leader(&client, &args, l.as_ref(), false);
                0
            }
            Err(e) => {
                eprintln!("dlock: {e}");
                crate::EXIT_ERROR
            }
        };
    }
    let mut changes = election.observe();
    let mut backoff = crate::run::backoff();
    loop {
        match changes.next().await {
            Ok(l) => {
                backoff.reset();
                print_leader(&client, &args, l.as_ref(), true);
            }
            Err(e) if crate::run::is_permanent(&e) => {
                eprintln!("dlock: {e}");
                return crate::EXIT_ERROR;
            }
            Err(e) => {
                // Connection trouble: say so and go on watching.
                eprintln!("dlock: {e}; watching again");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

fn print_leader(
    client: &distlock::Client,
    args: &LeaderArgs,
    l: Option<&distlock::Leader>,
    watching: bool,
) {
    let lease_ms = l.and_then(|l| l.lease_left.map(|d| d.as_millis() as u64));
    if args.json {
        let v = serde_json::json!({
            "name": args.name,
            "led": l.is_some(),
            "owner": l.map(|l| l.owner.as_str()),
            "value": l.map(|l| l.value.as_str()),
            "fencing_token": l.map(|l| l.fencing_token),
            "lease_ms_left": lease_ms,
        });
        println!("{v}");
    } else if watching {
        match l {
            Some(l) => println!(
                "leader: {} (fencing token {}) value: {}",
                l.owner, l.fencing_token, l.value
            ),
            None => println!("leader: none (nobody leads)"),
        }
    } else {
        println!("election:      {}", args.name);
        println!(
            "backend:       {} ({})",
            client.backend_kind(),
            client.endpoint()
        );
        match l {
            Some(l) => {
                println!("leader:        {}", l.owner);
                println!("value:         {}", l.value);
                println!("fencing token: {}", l.fencing_token);
                let lease = lease_ms.map_or_else(
                    || "while the leader lives".to_owned(),
                    |ms| format!("{ms} ms left"),
                );
                println!("lease:         {lease}");
            }
            None => println!("leader:        none (nobody leads)"),
        }
    }
    // Each change reaches a pipe at once.
    use std::io::Write;
    let _ = std::io::stdout().flush();
}
