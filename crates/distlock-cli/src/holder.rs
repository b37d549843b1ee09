//! Who holds a lock dlock could not get: the words of the "not acquired" message.

use crate::run::human;
use std::time::Duration;

/// How long a look at the holders may take before the message goes out without them.
const LOOK_LIMIT: Duration = Duration::from_secs(2);

impl Seen {
    /// How many wait in the lock's queue, where the backend keeps one.
    pub(crate) fn waiters(&self) -> Option<u32> {
        self.info.waiters
    }
}

/// What to look at: a lock name and its kind (an election's is [`distlock::LockKind::Election`]).
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) kind: distlock::LockKind,
}

/// The holders seen at one moment.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    info: distlock::LockInfo,
    at: tokio::time::Instant,
    /// An election's leader, not a lock's holder.
    led: bool,
}

/// The holders of `target` now, or `None` when the backend cannot say in time (the message
/// then goes out without them).
pub(crate) async fn look(client: &distlock::Client, target: &Target) -> Option<Seen> {
    let at = tokio::time::Instant::now();
    match tokio::time::timeout(LOOK_LIMIT, client.inspect_kind(&target.name, target.kind)).await {
        Ok(Ok(info)) => Some(Seen {
            info,
            at,
            led: matches!(target.kind, distlock::LockKind::Election),
        }),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "could not inspect the holders");
            None
        }
        Err(_) => {
            tracing::debug!("inspecting the holders took longer than {LOOK_LIMIT:?}");
            None
        }
    }
}

/// `held by web-1:4242:0a1b2c3d:1 (host web-1, pid 4242) for at least 5s, lease 25s left`
/// (`led by …` for an election):
/// the holders seen `now`; a holder already seen at `first` has held the lock at least since
/// then. `None` when nobody holds it any more.
pub(crate) fn describe(now: &Seen, first: Option<&Seen>) -> Option<String> {
    const SHOWN: usize = 3;
    let holders = &now.info.holders;
    if holders.is_empty() {
        return None;
    }
    let one = |h: &distlock::HolderInfo| {
        let mut s = h.owner.clone();
        if let Some((host, pid)) = h.origin() {
            s += &format!(" (host {host}, pid {pid})");
        }
        if let Some(d) = held_since(h, now, first) {
            s += &format!(" for at least {}", human(d));
        }
        match h.lease_left {
            Some(l) => s += &format!(", lease {} left", human(l)),
            None => s += ", held while its process or session lives",
        }
        s
    };
    let mut parts: Vec<String> = holders.iter().take(SHOWN).map(one).collect();
    if holders.len() > SHOWN {
        parts.push(format!("{} more", holders.len() - SHOWN));
    }
    let by = if now.led { "led by" } else { "held by" };
    let who = if holders.len() == 1 {
        by.to_owned()
    } else {
        format!("{by} {} holders:", holders.len())
    };
    Some(format!("{who} {}", parts.join("; ")))
}

/// How long `h`, seen `now`, has held the lock at least: since `first` if it was a holder
/// then too.
fn held_since(h: &distlock::HolderInfo, now: &Seen, first: Option<&Seen>) -> Option<Duration> {
    first
        .filter(|f| f.info.holders.iter().any(|o| o.owner == h.owner))
        .map(|f| now.at.saturating_duration_since(f.at))
        .filter(|d| !d.is_zero())
}

/// [`describe`] in a few words, for a status line: `held by pid 4242 on web-1 for 5s+,
/// lease 25s left` (the owner id when it names no host and pid; `and 2 more` for several).
pub(crate) fn brief(now: &Seen, first: Option<&Seen>) -> Option<String> {
    let h = now.info.holders.first()?;
    let by = if now.led { "led by" } else { "held by" };
    let mut s = match h.origin() {
        Some((host, pid)) => format!("{by} pid {pid} on {host}"),
        None => format!("{by} {}", h.owner),
    };
    if let Some(d) = held_since(h, now, first) {
        s += &format!(" for {}+", human(Duration::from_secs(d.as_secs())));
    }
    if let Some(l) = h.lease_left {
        s += &format!(", lease {} left", human(Duration::from_secs(l.as_secs())));
    }
    if now.info.holders.len() > 1 {
        s += &format!(" and {} more", now.info.holders.len() - 1);
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::{HolderInfo, LockInfo};

    fn seen(holders: Vec<HolderInfo>, at: tokio::time::Instant) -> Seen {
        Seen {
            info: LockInfo::new("x").with_holders(holders),
            at,
            led: false,
        }
    }

    #[test]
    fn names_host_pid_time_held_and_lease() {
        let t0 = tokio::time::Instant::now();
        let h = HolderInfo::new("web-1:4242:0a1b2c3d:1", 1)
            .with_lease_left(Some(Duration::from_millis(25_400)));
        let first = seen(vec![h.clone()], t0);
        let now = seen(vec![h], t0 + Duration::from_secs(5));
        assert_eq!(
            describe(&now, Some(&first)).as_deref(),
            Some(
                "held by web-1:4242:0a1b2c3d:1 (host web-1, pid 4242) for at least 5s, \
                 lease 25.4s left"
            )
        );
        // A holder that came after the first look: no claim about how long.
        let other = seen(vec![HolderInfo::new("batch", 1)], t0);
        assert_eq!(
            describe(&now, Some(&other)).as_deref(),
            Some("held by web-1:4242:0a1b2c3d:1 (host web-1, pid 4242), lease 25.4s left")
        );
        assert_eq!(describe(&seen(vec![], t0), None), None);
        let many: Vec<_> = (0..5)
            .map(|i| HolderInfo::new(format!("r{i}"), 1))
            .collect();
        let text = describe(&seen(many, t0), None).expect("held");
        assert!(
            text.starts_with("held by 5 holders: r0, held while"),
            "{text}"
        );
        assert!(text.ends_with("; 2 more"), "{text}");
        let h = HolderInfo::new("web-1:4242:0a1b2c3d:1", 1)
            .with_lease_left(Some(Duration::from_millis(25_400)));
        let (first, now) = (
            seen(vec![h.clone()], t0),
            seen(
                vec![h, HolderInfo::new("r", 1)],
                t0 + Duration::from_millis(5_300),
            ),
        );
        assert_eq!(
            brief(&now, Some(&first)).as_deref(),
            Some("held by pid 4242 on web-1 for 5s+, lease 25s left and 1 more")
        );
    }
}
