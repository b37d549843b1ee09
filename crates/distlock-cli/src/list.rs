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
        "{} {} {} {:>7} {:>20}",
        pad("NAME", 32),
        pad("KIND", 10),
        pad("HOLDERS (owner×count, lease left)", 40),
        "WAITING",
        "FENCING TOKEN"
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
            "{} {} {} {:>7} {:>20}",
            pad(&l.info.name, 32),
            pad(l.kind.as_str(), 10),
            pad(&holders, 40),
            waiting,
            l.info.fencing_token
        );
    }
    0
}

/// `s` followed by spaces up to `width` terminal columns (at least none): padded by the
/// columns its characters take (two for a CJK character, none for a combining mark), not by
/// their count, so that the next column starts at the same place on every line.
fn pad(s: &str, width: usize) -> String {
    let shown = unicode_width::UnicodeWidthStr::width(s);
    format!("{s}{}", " ".repeat(width.saturating_sub(shown)))
}

#[cfg(test)]
mod tests {
    use super::pad;

    #[test]
    fn pads_by_display_width() {
        assert_eq!(pad("ab", 4), "ab  ");
        // Two CJK characters take four columns.
        assert_eq!(pad("注文", 6), "注文  ");
        // A combining accent takes none.
        assert_eq!(pad("e\u{301}", 3), "e\u{301}  ");
        assert_eq!(pad("longer", 3), "longer");
    }
}
