//! `dlock release --force NAME [--kind K] [--yes] [--json]`: the operator's way out of a
//! stuck lock.

use clap::Args;
use std::io::{BufRead, IsTerminal, Write};

#[derive(Args, Debug)]
pub struct ReleaseArgs {
    /// Lock name.
    name: String,
    /// Remove the holder(s) although they did not release: required (a normal release is
    /// done by the holder itself). The fencing token is advanced past every token issued, so
    /// a removed holder's writes to a fenced store are rejected; its lost signal fires at its
    /// next renewal.
    #[arg(long)]
    force: bool,
    /// Kind of lock: mutex, fair, read or write (both: the read-write lock), semaphore=N
    /// [default: the kind the backend has state for under NAME, else mutex].
    #[arg(long, value_parser = crate::kind::parse)]
    kind: Option<crate::kind::Kind>,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    yes: bool,
    /// Go ahead even when the backend has no state for NAME (no holder, no waiter, no
    /// fencing token ever issued): the release then only records NAME's fencing counter
    /// (e.g. after the server lost its data, to fence off holders it forgot). Without it, an
    /// unknown name (often a typo) is reported and nothing changes (exit 1).
    #[arg(long)]
    allow_unknown: bool,
    /// Print one JSON object on stdout: name, kind, unknown (true: the backend had no state
    /// for NAME and nothing was changed), removed [{owner, count}], fencing_token (after the
    /// release).
    #[arg(long)]
    json: bool,
}

pub async fn release(url: &str, args: ReleaseArgs) -> u8 {
    if !args.force {
        eprintln!(
            "dlock: `release` only removes another process's hold: add --force \
             (a holder releases its own lock when its command ends)"
        );
        return crate::EXIT_USAGE;
    }
    let client = match crate::connect(url, distlock::ClientOptions::default()).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let kind = match crate::kind::resolve(&client, &args.name, args.kind).await {
        Ok(k) => k,
        Err(code) => return code,
    };
    let info = match client.inspect_kind(&args.name, kind).await {
        Ok(info) => info,
        Err(e) => {
            eprintln!("dlock: cannot inspect lock `{}`: {e}", args.name);
            return crate::EXIT_ERROR;
        }
    };
    if crate::kind::is_unknown(&info) && !args.allow_unknown {
        eprintln!(
            "dlock: lock `{}` ({}) is unknown to {} at {}: no holder, no waiter, no fencing \
             token ever issued; nothing changed (check the name with `dlock list`, the kind \
             with --kind; --allow-unknown to record its fencing counter anyway)",
            args.name,
            crate::kind::describe(kind),
            client.backend_kind(),
            client.endpoint()
        );
        if args.json {
            report(&args.name, kind, true, &[], info.fencing_token);
        }
        return crate::EXIT_ERROR;
    }
    if !args.yes && !confirm(&args.name, kind, &info) {
        eprintln!("dlock: not released");
        return crate::EXIT_ERROR;
    }
    match client.force_release(&args.name, kind).await {
        Ok(r) if args.json => {
            report(&args.name, kind, false, &r.removed, r.fencing_token);
            0
        }
        Ok(r) => {
            print_released(&args.name, &r);
            0
        }
        Err(e) => {
            eprintln!("dlock: {e}");
            crate::EXIT_ERROR
        }
    }
}

/// `--json`: one object with the name, the kind, whether NAME was unknown, the holders removed
/// and the fencing token after the release.
fn report(
    name: &str,
    kind: distlock::LockKind,
    unknown: bool,
    removed: &[distlock::HolderInfo],
    token: u64,
) {
    let removed: Vec<_> = removed
        .iter()
        .map(|h| serde_json::json!({"owner": h.owner, "count": h.count}))
        .collect();
    let v = serde_json::json!({
        "name": name,
        "kind": crate::kind::describe(kind),
        "unknown": unknown,
        "removed": removed,
        "fencing_token": token,
    });
    println!("{v}");
}

/// Shows what would be removed and asks on stderr; true on `y` or `yes` from stdin.
fn confirm(name: &str, kind: distlock::LockKind, info: &distlock::LockInfo) -> bool {
    let holders: Vec<_> = info.holders.iter().map(|h| h.owner.as_str()).collect();
    eprintln!(
        "lock `{}` ({}): holders: {}; fencing token {}",
        name,
        crate::kind::describe(kind),
        if holders.is_empty() {
            "none".to_owned()
        } else {
            holders.join(", ")
        },
        info.fencing_token
    );
    let mut err = std::io::stderr();
    let _ =
        write!(err, "Remove every holder of `{name}` by force? [y/N] ").and_then(|()| err.flush());
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        // Piped input is fine (`echo y | dlock release --force`), but say so.
        eprintln!();
    }
    let mut line = String::new();
    let answer = match stdin.lock().read_line(&mut line) {
        Ok(_) => line.trim().to_ascii_lowercase(),
        Err(_) => String::new(),
    };
    answer == "y" || answer == "yes"
}

/// The human-readable outcome of a forced release.
fn print_released(name: &str, r: &distlock::ForceReleased) {
    if r.removed.is_empty() {
        println!(
            "lock `{}` had no holder; fencing token now {}",
            name, r.fencing_token
        );
    }
    for h in &r.removed {
        println!("removed holder {} (holds: {})", h.owner, h.count);
    }
    if !r.removed.is_empty() {
        println!(
            "fencing token advanced to {}: writes with older tokens are rejected by fenced stores",
            r.fencing_token
        );
    }
}
