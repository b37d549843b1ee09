//! `dlock inspect NAME [--json]`.

use clap::Args;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Lock name.
    name: String,
    /// Print one JSON object: name, held, holders[{owner,count,lease_ms_left}], fencing_token.
    #[arg(long)]
    json: bool,
}

pub async fn inspect(url: &str, args: InspectArgs) -> u8 {
    let client = match crate::connect(url, dlock::ClientOptions::default()).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let info = match client.inspect(&args.name).await {
        Ok(i) => i,
        Err(e) => {
            eprintln!("dlock: {e}");
            return crate::EXIT_ERROR;
        }
    };
    let lease_ms = |h: &dlock::HolderInfo| h.lease_left.map(|d| d.as_millis() as u64);
    if args.json {
        let holders: Vec<_> = info
            .holders
            .iter()
            .map(|h| serde_json::json!({"owner": h.owner, "count": h.count, "lease_ms_left": lease_ms(h)}))
            .collect();
        let v = serde_json::json!({
            "name": info.name,
            "held": info.held(),
            "holders": holders,
            "fencing_token": info.fencing_token,
        });
        println!("{v}");
    } else {
        println!("lock:          {}", info.name);
        println!(
            "backend:       {} ({})",
            client.backend_kind(),
            client.endpoint()
        );
        println!("held:          {}", if info.held() { "yes" } else { "no" });
        for h in &info.holders {
            let lease = lease_ms(h).map_or_else(
                || "while the holder lives".to_owned(),
                |ms| format!("{ms} ms left"),
            );
            println!(
                "holder:        {} (holds: {}, lease: {lease})",
                h.owner, h.count
            );
        }
        println!("fencing token: {} (last issued)", info.fencing_token);
    }
    0
}
