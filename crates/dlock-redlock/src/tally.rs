//! The quorum and token arithmetic, free of I/O (unit-tested below).
//!
//! `n` nodes, majority `q = n/2 + 1`. A node *counts* when this client trusts it right now
//! (reachable, its counters seeded, out of restart quarantine) and it answered in time; the
//! answers of other nodes are still used to give grants back, never to decide.

use dlock_core::{ReleaseOutcome, RenewOutcome};
use dlock_redis::QuorumReply;
use std::collections::HashMap;
use std::time::Duration;

/// Majority of `n` nodes.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// Validity left of a grant whose attempt started `elapsed` ago (Redlock's rule): the lease,
/// minus the time spent, minus the clock-drift allowance (1% + 2 ms). `None` if none is left.
pub fn validity(lease: Duration, elapsed: Duration) -> Option<Duration> {
    lease
        .checked_sub(elapsed)?
        .checked_sub(dlock_core::drift(lease))
        .filter(|v| !v.is_zero())
}

/// One node's part in an acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ballot {
    /// What the node answered (`None`: no answer, an error, not asked, or an epoch mismatch).
    pub reply: Option<QuorumReply>,
    /// The answer counts toward a majority.
    pub counted: bool,
    /// No answer, but the request may have run on the node (timeout, broken connection).
    pub maybe_granted: bool,
}

impl Ballot {
    fn counted_reply(&self) -> Option<QuorumReply> {
        self.reply.filter(|_| self.counted)
    }

    /// The node holds the lock for us after this attempt (as far as we know).
    pub fn granted(&self) -> bool {
        matches!(
            self.reply,
            Some(QuorumReply::Granted { .. } | QuorumReply::Reentered { .. })
        )
    }
}

/// What an acquisition attempt amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The owner already holds the lock on a majority: one more hold, same token.
    Reentry {
        /// The hold's token.
        token: u64,
        /// The owner's hold count on the majority after this re-entry.
        count: u32,
    },
    /// A majority granted: a new hold with this token, once a majority confirms it.
    Fresh {
        /// The token, larger than every token handed out before.
        token: u64,
    },
    /// Another owner holds it on enough nodes that no majority is free; try again after `ttl`.
    Held {
        /// When enough of its nodes expire for a majority to be free, if they expire.
        ttl: Option<Duration>,
    },
    /// Nobody has a majority (several clients split the nodes): retry after a random delay.
    Split,
    /// Fewer than a majority of nodes answered and count.
    NoQuorum {
        /// Nodes that answered and count.
        answered: usize,
    },
}

/// The most frequent value (the larger one on a tie).
pub(crate) fn plurality<T: Copy + Ord + std::hash::Hash>(
    vals: impl Iterator<Item = T>,
) -> Option<T> {
    let mut freq: HashMap<T, usize> = HashMap::new();
    for v in vals {
        *freq.entry(v).or_default() += 1;
    }
    freq.into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(v, _)| v)
}

/// Decides an attempt. `known_token` is the token this client handed out for the owner's
/// current hold, if it has one.
pub fn decide(ballots: &[Ballot], known_token: Option<u64>) -> Decision {
    let n = ballots.len();
    let q = quorum(n);
    let counted: Vec<QuorumReply> = ballots.iter().filter_map(Ballot::counted_reply).collect();
    let reentered: Vec<(u64, u64, u32)> = counted
        .iter()
        .filter_map(|r| match *r {
            QuorumReply::Reentered {
                counter,
                token,
                count,
            } => Some((counter, token, count)),
            _ => None,
        })
        .collect();
    let fresh: Vec<u64> = counted
        .iter()
        .filter_map(|r| match *r {
            QuorumReply::Granted { counter } => Some(counter),
            _ => None,
        })
        .collect();
    if reentered.len() >= q {
        let token = known_token
            .or_else(|| plurality(reentered.iter().map(|r| r.1)))
            .unwrap_or(0);
        let count = plurality(reentered.iter().map(|r| r.2)).unwrap_or(1);
        return Decision::Reentry { token, count };
    }
    if reentered.len() + fresh.len() >= q {
        // A node that incremented its counter is above every token it ever confirmed; one that
        // only re-entered (a hold left by an earlier failed attempt of ours) is at or above
        // them, so one more keeps the token strictly above everything before it.
        let token = fresh
            .iter()
            .copied()
            .chain(reentered.iter().map(|r| r.0 + 1))
            .max()
            .unwrap_or(1);
        return Decision::Fresh { token };
    }
    if counted.len() < q {
        return Decision::NoQuorum {
            answered: counted.len(),
        };
    }
    // A majority is free once at most n - q nodes are still held.
    let mut held: Vec<Option<Duration>> = counted
        .iter()
        .filter_map(|r| match *r {
            QuorumReply::Held { ttl, .. } => Some(ttl),
            _ => None,
        })
        .collect();
    let must_expire = held.len().saturating_sub(n - q);
    if must_expire == 0 {
        return Decision::Split;
    }
    // None (no expiry) sorts last.
    held.sort_by_key(|t| (t.is_none(), *t));
    Decision::Held {
        ttl: held.get(must_expire - 1).copied().flatten(),
    }
}

/// True when the votes in so far fix the outcome whatever the others say: a majority of
/// counting nodes granted afresh, or re-entered, or is held by someone else (so a majority can
/// no longer be free). Votes still out are then not waited for.
pub fn settled(ballots: &[Ballot]) -> bool {
    let n = ballots.len();
    let q = quorum(n);
    let count = |f: fn(&QuorumReply) -> bool| {
        ballots
            .iter()
            .filter_map(Ballot::counted_reply)
            .filter(f)
            .count()
    };
    count(|r| matches!(r, QuorumReply::Granted { .. })) >= q
        || count(|r| matches!(r, QuorumReply::Reentered { .. })) >= q
        || count(|r| matches!(r, QuorumReply::Held { .. })) > n - q
}

/// For a fresh grant with `token`: the nodes to raise, each with the hold count to set
/// (1 where an earlier attempt left a hold of ours, 0 to leave it).
pub fn fresh_raises(ballots: &[Ballot], token: u64) -> Vec<(usize, u32)> {
    ballots
        .iter()
        .enumerate()
        .filter_map(|(i, b)| match b.reply {
            Some(QuorumReply::Granted { counter }) if counter != token => Some((i, 0)),
            Some(QuorumReply::Reentered { .. }) => Some((i, 1)),
            _ => None,
        })
        .collect()
}

/// For a re-entry: the nodes whose stored token or hold count differs from the majority's,
/// with the count to set.
pub fn reentry_fixes(ballots: &[Ballot], token: u64, count: u32) -> Vec<(usize, u32)> {
    ballots
        .iter()
        .enumerate()
        .filter_map(|(i, b)| match b.reply {
            Some(QuorumReply::Granted { .. }) => Some((i, count)),
            Some(QuorumReply::Reentered {
                token: t, count: c, ..
            }) if t != token || c != count => Some((i, count)),
            _ => None,
        })
        .collect()
}

/// How many counted nodes now have a fencing counter of at least `token` for this name:
/// granting nodes already at `token` or raised to it (`raised[i] == Some(true)`), and nodes
/// held by others whose counter already was at least `token` (counters never go down).
pub fn confirmations(ballots: &[Ballot], token: u64, raised: &[Option<bool>]) -> usize {
    ballots
        .iter()
        .enumerate()
        .filter(|(i, b)| {
            let raised_ok = raised.get(*i).copied().flatten();
            match b.counted_reply() {
                Some(QuorumReply::Granted { counter }) => raised_ok.unwrap_or(counter == token),
                Some(QuorumReply::Reentered { .. }) => raised_ok == Some(true),
                Some(QuorumReply::Held { counter, .. }) => counter >= token,
                _ => false,
            }
        })
        .count()
}

/// Combines the nodes' release outcomes (`None`: no answer). `Err(answered)` when neither a
/// majority answered nor a majority had the hold.
pub fn release_outcome(outs: &[Option<ReleaseOutcome>]) -> Result<ReleaseOutcome, usize> {
    let q = quorum(outs.len());
    let answered: Vec<ReleaseOutcome> = outs.iter().flatten().copied().collect();
    let released = answered
        .iter()
        .filter(|o| **o == ReleaseOutcome::Released)
        .count();
    let still: Vec<u32> = answered
        .iter()
        .filter_map(|o| match o {
            ReleaseOutcome::StillHeld { remaining } => Some(*remaining),
            _ => None,
        })
        .collect();
    if released + still.len() >= q {
        return Ok(if still.len() > released {
            ReleaseOutcome::StillHeld {
                remaining: plurality(still.into_iter()).unwrap_or(1),
            }
        } else {
            ReleaseOutcome::Released
        });
    }
    if answered.len() < q {
        return Err(answered.len());
    }
    let taken = answered
        .iter()
        .filter(|o| **o == ReleaseOutcome::TakenByOther)
        .count();
    let expired = answered
        .iter()
        .filter(|o| **o == ReleaseOutcome::Expired)
        .count();
    Ok(if taken > 0 && taken >= expired {
        ReleaseOutcome::TakenByOther
    } else {
        ReleaseOutcome::Expired
    })
}

/// Combines the nodes' renewals of `holds` holds. Per node: whether it counts, and its
/// outcomes (`None`: no answer). Per hold: `Renewed` when a majority of counting nodes
/// renewed it, `NotHeld` when so many nodes no longer have it that a majority never can,
/// `None` (undecided) otherwise.
pub fn renew_outcomes(
    per_node: &[(bool, Option<Vec<RenewOutcome>>)],
    holds: usize,
) -> Vec<Option<RenewOutcome>> {
    let n = per_node.len();
    let q = quorum(n);
    (0..holds)
        .map(|h| {
            let mut renewed = 0;
            let mut gone = 0;
            for (counts, outs) in per_node {
                match outs.as_ref().and_then(|o| o.get(h)) {
                    Some(RenewOutcome::Renewed) if *counts => renewed += 1,
                    Some(RenewOutcome::NotHeld) => gone += 1,
                    _ => {}
                }
            }
            if renewed >= q {
                Some(RenewOutcome::Renewed)
            } else if gone > n - q {
                Some(RenewOutcome::NotHeld)
            } else {
                None
            }
        })
        .collect()
}

/// Minimum number of nodes whose release message wakes a waiter watching `watched` of `n`
/// nodes: a majority holder's release reaches at least `q - (n - watched)` of them.
pub fn wake_threshold(n: usize, watched: usize) -> usize {
    (quorum(n) + watched).saturating_sub(n).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use QuorumReply::*;

    fn b(reply: QuorumReply) -> Ballot {
        Ballot {
            reply: Some(reply),
            counted: true,
            maybe_granted: false,
        }
    }
    fn none() -> Ballot {
        Ballot::default()
    }
    fn held(counter: u64, ms: u64) -> Ballot {
        b(Held {
            counter,
            ttl: Some(Duration::from_millis(ms)),
        })
    }

    #[test]
    fn majority_and_validity() {
        assert_eq!([1, 2, 3, 4, 5, 6, 7].map(quorum), [1, 2, 2, 3, 3, 4, 4]);
        let s = Duration::from_secs(1);
        // 1 s lease, drift 12 ms.
        assert_eq!(
            validity(s, Duration::from_millis(100)),
            Some(Duration::from_millis(888))
        );
        assert_eq!(validity(s, Duration::from_millis(988)), None);
        assert_eq!(validity(s, Duration::from_secs(2)), None);
    }

    #[test]
    fn fresh_grant_takes_the_largest_counter() {
        let ballots = [
            b(Granted { counter: 7 }),
            b(Granted { counter: 9 }),
            held(12, 100),
            none(),
            b(Granted { counter: 7 }),
        ];
        assert_eq!(decide(&ballots, None), Decision::Fresh { token: 9 });
        assert_eq!(fresh_raises(&ballots, 9), vec![(0, 0), (4, 0)]);
        // Before the raise only node 1 and node 2 (held, counter 12 >= 9) confirm.
        assert_eq!(confirmations(&ballots, 9, &[]), 2);
        let raised = [Some(true), None, None, None, Some(false)];
        assert_eq!(confirmations(&ballots, 9, &raised), 3);
    }

    #[test]
    fn uncounted_answers_do_not_decide() {
        let mut ballots = [
            b(Granted { counter: 3 }),
            b(Granted { counter: 3 }),
            held(3, 100),
        ];
        ballots[1].counted = false;
        assert_eq!(decide(&ballots, None), Decision::Split);
        ballots[2].counted = false;
        assert_eq!(decide(&ballots, None), Decision::NoQuorum { answered: 1 });
        // An uncounted grant still gets raised (and given back on failure).
        assert!(ballots[1].granted());
    }

    #[test]
    fn leftover_hold_is_counted_as_grant_with_a_larger_token() {
        // Node 0 still has a hold of ours from a failed attempt (counter 10).
        let ballots = [
            b(Reentered {
                counter: 10,
                token: 10,
                count: 2,
            }),
            b(Granted { counter: 8 }),
            held(9, 50),
        ];
        assert_eq!(decide(&ballots, None), Decision::Fresh { token: 11 });
        assert_eq!(fresh_raises(&ballots, 11), vec![(0, 1), (1, 0)]);
        assert_eq!(confirmations(&ballots, 11, &[]), 0);
        assert_eq!(
            confirmations(&ballots, 11, &[Some(true), Some(true), None]),
            2
        );
    }

    #[test]
    fn reentry_needs_a_majority_and_keeps_the_token() {
        let r = |token, count| {
            b(Reentered {
                counter: 20,
                token,
                count,
            })
        };
        let ballots = [
            r(20, 2),
            r(20, 2),
            r(15, 2),
            b(Granted { counter: 21 }),
            none(),
        ];
        assert_eq!(
            decide(&ballots, None),
            Decision::Reentry {
                token: 20,
                count: 2
            }
        );
        assert_eq!(
            decide(&ballots, Some(15)),
            Decision::Reentry {
                token: 15,
                count: 2
            }
        );
        assert_eq!(reentry_fixes(&ballots, 20, 2), vec![(2, 2), (3, 2)]);
        // Re-entered on 2 of 5 only: a fresh grant (the old hold is not on a majority).
        let ballots = [
            r(20, 2),
            r(20, 2),
            b(Granted { counter: 21 }),
            none(),
            none(),
        ];
        assert_eq!(decide(&ballots, None), Decision::Fresh { token: 21 });
    }

    #[test]
    fn settles_early_only_when_the_rest_cannot_matter() {
        let pending = Ballot {
            maybe_granted: true,
            ..Ballot::default()
        };
        let g = b(Granted { counter: 1 });
        assert!(settled(&[g, g, g, pending, pending]));
        assert!(!settled(&[g, g, pending, pending, pending]));
        assert!(settled(&[
            held(1, 9),
            held(1, 9),
            held(1, 9),
            pending,
            pending
        ]));
        assert!(!settled(&[held(1, 9), held(1, 9), g, g, pending]));
        let r = b(Reentered {
            counter: 1,
            token: 1,
            count: 2,
        });
        // Two re-entries and a grant: a third re-entry would make it a re-entry.
        assert!(!settled(&[r, r, g, pending, pending]));
        assert!(settled(&[r, r, r, g, pending]));
    }

    #[test]
    fn held_waits_for_enough_expiries() {
        // 5 nodes held with various ttls: 3 must expire, so the third smallest.
        let ballots = [
            held(1, 500),
            held(1, 100),
            held(1, 300),
            held(1, 400),
            b(Held {
                counter: 1,
                ttl: None,
            }),
        ];
        assert_eq!(
            decide(&ballots, None),
            Decision::Held {
                ttl: Some(Duration::from_millis(400))
            }
        );
        // 2 held, 1 free of 3: one held node must expire.
        let ballots = [held(1, 500), held(1, 100), b(Granted { counter: 2 })];
        assert_eq!(
            decide(&ballots, None),
            Decision::Held {
                ttl: Some(Duration::from_millis(100))
            }
        );
        // Two holders with two nodes each and one node ours: nobody has a majority.
        let ballots = [
            held(1, 500),
            held(1, 100),
            held(1, 500),
            held(1, 100),
            b(Granted { counter: 2 }),
        ];
        assert_eq!(
            decide(&ballots, None),
            Decision::Held {
                ttl: Some(Duration::from_millis(100))
            }
        );
        let ballots = [
            held(1, 500),
            held(1, 100),
            b(Granted { counter: 2 }),
            b(Granted { counter: 2 }),
            none(),
        ];
        assert_eq!(decide(&ballots, None), Decision::Split);
    }

    #[test]
    fn release_majorities() {
        use ReleaseOutcome::*;
        let s = |n| Some(StillHeld { remaining: n });
        assert_eq!(
            release_outcome(&[Some(Released), Some(Released), None]),
            Ok(Released)
        );
        assert_eq!(
            release_outcome(&[s(1), s(1), Some(Released)]),
            Ok(s(1).unwrap())
        );
        assert_eq!(
            release_outcome(&[Some(Expired), Some(Expired), Some(TakenByOther)]),
            Ok(Expired)
        );
        assert_eq!(
            release_outcome(&[Some(TakenByOther), Some(TakenByOther), None]),
            Ok(TakenByOther)
        );
        assert_eq!(
            release_outcome(&[Some(Released), None, None, None, Some(Released)]),
            Err(2)
        );
    }

    #[test]
    fn renew_majorities() {
        use RenewOutcome::*;
        let per_node = [
            (true, Some(vec![Renewed, NotHeld, Renewed])),
            (true, Some(vec![Renewed, NotHeld, NotHeld])),
            (false, Some(vec![Renewed, Renewed, NotHeld])),
            (true, None),
            (true, Some(vec![Renewed, Renewed, NotHeld])),
        ];
        assert_eq!(
            renew_outcomes(&per_node, 3),
            vec![Some(Renewed), None, Some(NotHeld)]
        );
    }

    #[test]
    fn wake_thresholds() {
        assert_eq!(wake_threshold(5, 5), 3);
        assert_eq!(wake_threshold(5, 4), 2);
        assert_eq!(wake_threshold(5, 2), 1);
        assert_eq!(wake_threshold(3, 3), 2);
        assert_eq!(wake_threshold(3, 1), 1);
    }
}
