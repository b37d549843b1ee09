//! `dlock list [--prefix P] [--json]`: every lock the backend has state for.

use clap::Args;

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only locks whose name starts with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Print one JSON array of objects {name, kind, holders:[{owner,count,lease_ms_left,side}],
    /// waiters, fencing_token} (plus permits for semaphores).
    #[arg(long)]
    json: bool,
}

pub async fn list(url: &str, args: ListArgs) -> u8 {
    let client = match crate::connect(url, distlock::ClientOptions::default()).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let locks = match client.list(&args.prefix).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("dlock: {e}");
            return crate::EXIT_ERROR;
        }
    };
    let lease_ms = |h: &distlock::HolderInfo| h.lease_left.map(|d| d.as_millis() as u64);
    if args.json {
        let arr: Vec<_> = locks
            .iter()
            .map(|l| {
                let holders: Vec<_> = l
                    .info
                    .holders
                    .iter()
                    .map(|h| {
                        serde_json::json!({
                            "owner": h.owner,
                            "count": h.count,
                            "lease_ms_left": lease_ms(h),
                            "side": h.side.map(|s| s.as_str()),
                        })
                    })
                    .collect();
                let mut v = serde_json::json!({
                    "name": l.info.name,
                    "kind": l.kind.as_str(),
                    "holders": holders,
                    "waiters": l.info.waiters,
                    "fencing_token": l.info.fencing_token,
                });
                if let (Some(p), Some(o)) = (l.info.permits, v.as_object_mut()) {
                    o.insert("permits".into(), p.into());
                }
                v
            })
            .collect();
        println!("{}", serde_json::Value::Array(arr));
        return 0;
    }
    println!(
        "{:<32} {:<10} {:<40} {:>7} {:>20}",
        "NAME", "KIND", "HOLDERS (owner×count, lease left)", "WAITING", "FENCING TOKEN"
    );
    for l in &locks {
        let holders = if l.info.holders.is_empty() {
            "-".to_owned()
        } else {
            l.info
                .holders
                .iter()
                .map(|h| {
                    let side = h
                        .side
                        .map_or_else(String::new, |s| format!("{}:", s.as_str()));
                    let lease =
                        lease_ms(h).map_or_else(|| "session".to_owned(), |ms| format!("{ms}ms"));
                    format!("{side}{}×{} {lease}", h.owner, h.count)
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let waiting = l
            .info
            .waiters
            .map_or_else(|| "?".to_owned(), |w| w.to_string());
        println!(
            "{:<32} {:<10} {:<40} {:>7} {:>20}",
            l.info.name,
            l.kind.as_str(),
            holders,
            waiting,
            l.info.fencing_token
        );
    }
    0
}
