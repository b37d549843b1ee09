//! `dlock inspect NAME [--kind K] [--json]`.

use clap::Args;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Lock name.
    name: String,
    /// Print one JSON object: name, held, holders[{owner,count,lease_ms_left}], fencing_token
    /// (plus kind, waiters, a holder's side for read-write locks, and permits and
    /// permits_in_use for semaphores).
    #[arg(long)]
    json: bool,
    /// Kind of lock: mutex, fair, read or write (both show the read-write lock), semaphore=N
    /// [default: the kind the backend has state for under NAME, else mutex].
    #[arg(long, value_parser = crate::kind::parse)]
    kind: Option<crate::kind::Kind>,
}

pub async fn inspect(url: &str, args: InspectArgs) -> u8 {
    let client = match crate::connect(url, distlock::ClientOptions::default()).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let kind = match crate::kind::resolve(&client, &args.name, args.kind).await {
        Ok(k) => k,
        Err(code) => return code,
    };
    let info = match client.inspect_kind(&args.name, kind).await {
        Ok(i) => i,
        Err(e) => {
            eprintln!("dlock: {e}");
            return crate::EXIT_ERROR;
        }
    };
    let lease_ms = |h: &distlock::HolderInfo| h.lease_left.map(|d| d.as_millis() as u64);
    if args.json {
        let holders: Vec<_> = info
            .holders
            .iter()
            .map(|h| {
                let mut v = serde_json::json!({
                    "owner": h.owner,
                    "count": h.count,
                    "lease_ms_left": lease_ms(h),
                });
                if let (Some(side), Some(o)) = (h.side, v.as_object_mut()) {
                    o.insert("side".into(), side.as_str().into());
                }
                v
            })
            .collect();
        let mut v = serde_json::json!({
            "name": info.name,
            "held": info.held(),
            "holders": holders,
            "fencing_token": info.fencing_token,
            "kind": kind.as_str(),
            "waiters": info.waiters,
        });
        if let (Some(permits), Some(o)) = (info.permits, v.as_object_mut()) {
            o.insert("permits".into(), permits.into());
            o.insert("permits_in_use".into(), info.permits_in_use().into());
        }
        println!("{v}");
        return 0;
    }
    println!("lock:          {}", info.name);
    println!(
        "backend:       {} ({})",
        client.backend_kind(),
        client.endpoint()
    );
    println!("kind:          {}", crate::kind::describe(kind));
    println!("held:          {}", if info.held() { "yes" } else { "no" });
    if let Some(permits) = info.permits {
        println!(
            "permits:       {} of {permits} in use",
            info.permits_in_use()
        );
    }
    if info.holders.iter().any(|h| h.side.is_some()) {
        let writer = info
            .holders
            .iter()
            .find(|h| h.side == Some(distlock::LockKind::Write))
            .map_or("none", |h| h.owner.as_str());
        let readers = info
            .holders
            .iter()
            .filter(|h| h.side == Some(distlock::LockKind::Read))
            .count();
        println!("writer:        {writer}");
        println!("readers:       {readers}");
    }
    for h in &info.holders {
        let lease = lease_ms(h).map_or_else(
            || "while the holder lives".to_owned(),
            |ms| format!("{ms} ms left"),
        );
        let side = h
            .side
            .map_or_else(String::new, |s| format!("{}, ", s.as_str()));
        println!(
            "holder:        {} ({side}holds: {}, lease: {lease})",
            h.owner, h.count
        );
    }
    if let Some(w) = info.waiters {
        println!("waiting:       {w}");
    }
    println!("fencing token: {} (last issued)", info.fencing_token);
    0
}
