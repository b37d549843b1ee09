//! `dlock release --force NAME [--kind K] [--yes]`: the operator's way out of a stuck lock.

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
    /// Kind of lock: mutex, fair, read or write (both: the read-write lock), semaphore=N.
    #[arg(long, default_value = "mutex", value_parser = crate::kind::parse)]
    kind: crate::kind::Kind,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    yes: bool,
}

pub async fn release(url: &str, args: ReleaseArgs) -> u8 {
    if !args.force {
        eprintln!(
            "dlock: `release` only removes another process's hold: add --force \
             (a holder releases its own lock when its command ends)"
        );
        return crate::EXIT_ERROR;
    }
    let client = match crate::connect(url, distlock::ClientOptions::default()).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let kind = args.kind.lock_kind();
    if !args.yes {
        // Show what would be removed, then ask.
        match client.inspect_kind(&args.name, kind).await {
            Ok(info) => {
                let holders: Vec<_> = info.holders.iter().map(|h| h.owner.as_str()).collect();
                eprintln!(
                    "lock `{}` ({}): holders: {}; fencing token {}",
                    args.name,
                    kind.as_str(),
                    if holders.is_empty() {
                        "none".to_owned()
                    } else {
                        holders.join(", ")
                    },
                    info.fencing_token
                );
            }
            Err(e) => eprintln!("dlock: cannot inspect `{}`: {e}", args.name),
        }
        eprint!("Remove every holder of `{}` by force? [y/N] ", args.name);
        let _ = std::io::stderr().flush();
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
        if answer != "y" && answer != "yes" {
            eprintln!("dlock: not released");
            return crate::EXIT_ERROR;
        }
    }
    match client.force_release(&args.name, kind).await {
        Ok(r) => {
            if r.removed.is_empty() {
                println!(
                    "lock `{}` had no holder; fencing token now {}",
                    args.name, r.fencing_token
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
            0
        }
        Err(e) => {
            eprintln!("dlock: {e}");
            crate::EXIT_ERROR
        }
    }
}
