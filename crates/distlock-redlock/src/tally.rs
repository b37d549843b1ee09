//! The quorum and token arithmetic, free of I/O (unit-tested below).
//!
//! `n` nodes, majority `q = n/2 + 1`. A node *counts* when this client trusts it right now
//! (reachable, initialised, out of restart quarantine) and it answered in time; the
//! answers of other nodes are still used to give grants back, never to decide.

use distlock_core::backend::RenewOutcome;
use distlock_core::ReleaseOutcome;
use distlock_redis::{QuorumReply, QuorumVote};
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
        .checked_sub(distlock_core::drift(lease))
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
    /// A node asked whose vote is not in (or that failed in a way that may have run): it may
    /// have granted (given back if the attempt does not win), and does not count.
    pub fn unknown() -> Ballot {
        Ballot {
            maybe_granted: true,
            ..Ballot::default()
        }
    }

    /// The ballot of vote `v` from a node that `counts` in this client's view: it counts when
    /// the node does and the vote itself shows nothing suspicious (scripts loaded again, a
    /// restart quarantine by the node's own clock). An epoch mismatch is no ballot.
    pub fn of(v: &QuorumVote, counts: bool) -> Ballot {
        if v.reply == QuorumReply::EpochMismatch {
            return Ballot::default();
        }
        Ballot {
            reply: Some(v.reply),
            counted: counts && !v.scripts_reloaded && v.quarantine.is_none(),
            maybe_granted: false,
        }
    }

    fn counted_reply(&self) -> Option<QuorumReply> {
        self.reply.filter(|_| self.counted)
    }

    /// The node holds the lock for this attempt after its vote (as far as we know).
    pub fn granted(&self) -> bool {
        matches!(
            self.reply,
            Some(QuorumReply::Granted { .. } | QuorumReply::Holds { .. })
        )
    }
}

/// What an acquisition attempt amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The attempt already holds the lock on a majority with one `token`: its grant stands (a
    /// retry after a lost reply); the same token again.
    Again { token: u64 },
    /// A majority voted for the attempt: a grant with `token` (larger than every token handed
    /// out before), once a majority confirms it.
    Fresh { token: u64 },
    /// Another attempt holds it on enough nodes that no majority is free; try again after `ttl`
    /// (when enough of its nodes expire for a majority to be free, if they expire).
    Held { ttl: Option<Duration> },
    /// Nobody has a majority (several attempts split the nodes): retry after a random delay.
    Split,
    /// Fewer than a majority of nodes answered and count (`answered` did).
    NoQuorum { answered: usize },
}

/// The most frequent value (the larger one on a tie), with its frequency.
pub(crate) fn plurality<T: Copy + Ord + std::hash::Hash>(
    vals: impl Iterator<Item = T>,
) -> Option<(T, usize)> {
    let mut freq: HashMap<T, usize> = HashMap::new();
    for v in vals {
        *freq.entry(v).or_default() += 1;
    }
    freq.into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)))
}

/// The token this attempt's holds store on most counted nodes, and on how many.
fn held_token(ballots: &[Ballot]) -> Option<(u64, usize)> {
    let tokens = ballots.iter().filter_map(|b| match b.counted_reply()? {
        QuorumReply::Holds { token, .. } => Some(token),
        _ => None,
    });
    plurality(tokens)
}

/// Decides an attempt.
pub fn decide(ballots: &[Ballot]) -> Decision {
    let n = ballots.len();
    let q = quorum(n);
    let counted: Vec<QuorumReply> = ballots.iter().filter_map(Ballot::counted_reply).collect();
    // Two majorities intersect, so at most one token can be on a majority.
    if let Some((token, _)) = held_token(ballots).filter(|(_, k)| *k >= q) {
        return Decision::Again { token };
    }
    let ours: Vec<u64> = counted
        .iter()
        .filter_map(|r| match *r {
            // A node that incremented its counter is above every token it ever confirmed.
            QuorumReply::Granted { counter } => Some(counter),
            // One that only kept this attempt's hold (left by an earlier round whose outcome
            // was not a grant) is at or above them: one more keeps the token above them.
            QuorumReply::Holds { counter, .. } => Some(counter + 1),
            _ => None,
        })
        .collect();
    if ours.len() >= q {
        let token = ours.into_iter().max().unwrap_or(0).max(1);
        return Decision::Fresh { token };
    }
    if counted.len() < q {
        return Decision::NoQuorum {
            answered: counted.len(),
        };
    }
    // A majority is free once at most n - q nodes are still held (a node where another
    // waiter is first counts as held, with no known end: it is that waiter's turn).
    let mut held: Vec<Option<Duration>> = counted
        .iter()
        .filter_map(|r| match *r {
            QuorumReply::Held { ttl, .. } => Some(ttl),
            QuorumReply::Behind { .. } => Some(None),
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

/// True when the votes in so far fix the outcome whatever the `pending` votes still out say:
/// the attempt's grant stands on a majority, or a majority voted for it and the votes out
/// cannot turn it into "the grant stands" (which would keep the token of a retried grant), or
/// so many nodes are held by others that no majority can be free. Votes still out are then
/// not waited for.
pub fn settled(ballots: &[Ballot], pending: usize) -> bool {
    let n = ballots.len();
    let q = quorum(n);
    let count = |f: fn(&QuorumReply) -> bool| {
        ballots
            .iter()
            .filter_map(Ballot::counted_reply)
            .filter(f)
            .count()
    };
    let same = held_token(ballots).map_or(0, |(_, k)| k);
    let ours = count(|r| matches!(r, QuorumReply::Granted { .. } | QuorumReply::Holds { .. }));
    same >= q
        || (ours >= q && same + pending < q)
        || count(|r| matches!(r, QuorumReply::Held { .. } | QuorumReply::Behind { .. })) > n - q
}

/// For a grant with `token`: the nodes whose vote was for this attempt but whose counter or
/// stored token is not `token` yet, to raise.
pub fn raises(ballots: &[Ballot], token: u64) -> Vec<usize> {
    ballots
        .iter()
        .enumerate()
        .filter_map(|(i, b)| match b.reply {
            Some(QuorumReply::Granted { counter }) if counter != token => Some(i),
            Some(QuorumReply::Holds { token: t, .. }) if t != token => Some(i),
            _ => None,
        })
        .collect()
}

/// How many counted nodes confirm the grant `decision` gives, after the raises (`raised[i]`:
/// `Some(true)` raised to the token, `Some(false)` not, `None` not asked). A grant that stands
/// was confirmed by a majority when it was made (its token is on a majority:
/// [`Decision::Again`]); 0 for no grant. A fresh one is confirmed by the counted nodes that
/// now hold the lock for this attempt with `token` stored with the hold (and so a fencing
/// counter of at least `token`): at `token` already, or raised to it. A grant needs a majority
/// of them: the hold is then on a majority under the grant's address (what renewals and the
/// release name), and every later majority meets a counter at least `token`, so later tokens
/// are larger.
pub fn confirmed(decision: Decision, ballots: &[Ballot], raised: &[Option<bool>]) -> usize {
    let token = match decision {
        Decision::Again { .. } => return quorum(ballots.len()),
        Decision::Fresh { token } => token,
        _ => return 0,
    };
    let at_token =
        |i: usize, stored: u64| raised.get(i).copied().flatten().unwrap_or(stored == token);
    ballots
        .iter()
        .enumerate()
        .filter(|(i, b)| match b.counted_reply() {
            Some(QuorumReply::Granted { counter }) => at_token(*i, counter),
            Some(QuorumReply::Holds { token: t, .. }) => at_token(*i, t),
            _ => false,
        })
        .count()
}

/// Combines the nodes' release outcomes (`None`: no answer). `Err(answered)` when neither a
/// majority answered nor a majority released.
pub fn release_outcome(outs: &[Option<ReleaseOutcome>]) -> Result<ReleaseOutcome, usize> {
    let q = quorum(outs.len());
    let answered: Vec<ReleaseOutcome> = outs.iter().flatten().copied().collect();
    let count = |o: ReleaseOutcome| answered.iter().filter(|a| **a == o).count();
    if count(ReleaseOutcome::Released) >= q {
        return Ok(ReleaseOutcome::Released);
    }
    if answered.len() < q {
        return Err(answered.len());
    }
    let taken = count(ReleaseOutcome::TakenByOther);
    let expired = count(ReleaseOutcome::Expired);
    // Released on fewer than a majority: the grant was no longer held by a majority (its
    // lease had run out on the others), so as a lock it had expired.
    Ok(if taken > 0 && taken >= expired {
        ReleaseOutcome::TakenByOther
    } else {
        ReleaseOutcome::Expired
    })
}

/// Combines the nodes' renewals of `holds` holds. Per node: whether it `counts`, and its
/// outcomes (`outs`, `None`: no answer). Per hold: `Renewed` when a majority of counting nodes
/// renewed it, `NotHeld` when so many nodes no longer have it that a majority never can,
/// `None` (undecided) otherwise.
pub fn renew_outcomes(
    counts: &[bool],
    outs: &[Option<Vec<RenewOutcome>>],
    holds: usize,
) -> Vec<Option<RenewOutcome>> {
    let n = outs.len();
    let q = quorum(n);
    (0..holds)
        .map(|h| {
            let mut renewed = 0;
            let mut gone = 0;
            for (counts, outs) in counts.iter().zip(outs) {
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

/// A batch's outcomes from the per-hold decisions ([`renew_outcomes`]): the undecided holds are
/// `Unconfirmed` (retried by the watchdog); also their indexes.
pub fn renew_batch(outcomes: &[Option<RenewOutcome>]) -> (Vec<RenewOutcome>, Vec<usize>) {
    let undecided = (0..outcomes.len())
        .filter(|&h| outcomes[h].is_none())
        .collect();
    let outs = outcomes
        .iter()
        .map(|o| o.unwrap_or(RenewOutcome::Unconfirmed))
        .collect();
    (outs, undecided)
}

/// The last token handed out for a name, as far as the `counters` of the nodes that answered
/// (of `n`) tell: every grant leaves a majority at or above its token, so at least
/// `q - (n - answered)` of them are — the value that many reach. Late votes (each a node's own
/// clock floor, above the grant's token) and failed attempts move single nodes beyond it; the
/// largest counter alone would report those. 0 when nothing is known (or the counters expired).
pub fn last_token(counters: &[u64], n: usize) -> u64 {
    let mut sorted = counters.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let reach = quorum(n)
        .saturating_sub(n.saturating_sub(sorted.len()))
        .max(1);
    sorted
        .get(reach - 1)
        .or(sorted.last())
        .copied()
        .unwrap_or(0)
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
    fn holds(counter: u64, token: u64) -> Ballot {
        b(Holds { counter, token })
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
        let fresh = decide(&ballots);
        assert_eq!(fresh, Decision::Fresh { token: 9 });
        assert_eq!(raises(&ballots, 9), vec![0, 4]);
        // Before the raise only node 1 has the grant's token; a majority must have it.
        assert_eq!(confirmed(fresh, &ballots, &[]), 1);
        let raised = [Some(true), None, None, None, Some(false)];
        assert_eq!(confirmed(fresh, &ballots, &raised), 2);
        let raised = [Some(true), None, None, None, Some(true)];
        assert_eq!(confirmed(fresh, &ballots, &raised), 3);
    }

    #[test]
    fn uncounted_answers_do_not_decide() {
        let mut ballots = [
            b(Granted { counter: 3 }),
            b(Granted { counter: 3 }),
            held(3, 100),
        ];
        ballots[1].counted = false;
        assert_eq!(decide(&ballots), Decision::Split);
        ballots[2].counted = false;
        assert_eq!(decide(&ballots), Decision::NoQuorum { answered: 1 });
        // An uncounted grant still gets raised (and given back on failure).
        assert!(ballots[1].granted());
        // Uncounted holds of this attempt do not make its grant stand.
        let mut ballots = [holds(5, 5), holds(5, 5), b(Granted { counter: 6 })];
        ballots[1].counted = false;
        assert_eq!(decide(&ballots), Decision::Fresh { token: 6 });
    }

    #[test]
    fn a_retried_grant_keeps_its_token() {
        // The attempt's grant (token 20) stands on a majority: a retry gets 20 again, and the
        // node that granted afresh (its hold had run out) and the one whose raise never
        // arrived (still its own counter, 19) are raised to it.
        let ballots = [
            holds(20, 20),
            holds(21, 20),
            holds(19, 19),
            b(Granted { counter: 22 }),
            holds(20, 20),
        ];
        assert_eq!(decide(&ballots), Decision::Again { token: 20 });
        assert_eq!(raises(&ballots, 20), vec![2, 3]);
        // The grant stands on only 2 of 5: a fresh grant, above every counter seen (a node
        // that only kept the hold has not incremented: one more).
        let ballots = [
            holds(20, 20),
            holds(21, 20),
            b(Granted { counter: 21 }),
            none(),
            none(),
        ];
        let fresh = decide(&ballots);
        assert_eq!(fresh, Decision::Fresh { token: 22 });
        assert_eq!(raises(&ballots, 22), vec![0, 1, 2]);
        assert_eq!(confirmed(fresh, &ballots, &[]), 0);
        let raised = [Some(true), Some(true), Some(true), None, None];
        assert_eq!(confirmed(fresh, &ballots, &raised), 3);
    }

    #[test]
    fn settles_early_only_when_the_rest_cannot_matter() {
        let (p, g) = (Ballot::unknown(), b(Granted { counter: 1 }));
        let (h, o) = (holds(1, 1), held(1, 9));
        for (ballots, pending, want) in [
            ([g, g, g, p, p], 2, true),
            ([g, g, p, p, p], 3, false),
            ([o, o, o, p, p], 2, true),
            ([o, o, g, g, p], 1, false),
            // Two holds of the grant and a fresh vote: a third hold would make the grant stand.
            ([h, h, g, p, p], 2, false),
            // Four for the attempt and one out, which could still make the grant stand.
            ([h, h, g, g, p], 1, false),
            ([h, h, g, g, g], 0, true),
            ([h, h, h, g, p], 1, true),
        ] {
            assert_eq!(settled(&ballots, pending), want, "{ballots:?}");
        }
    }

    #[test]
    fn held_waits_for_enough_expiries() {
        let (h, g) = (|ms| held(1, ms), b(Granted { counter: 2 }));
        let forever = b(Held {
            counter: 1,
            ttl: None,
        });
        let ttl = |ms| Decision::Held {
            ttl: Some(Duration::from_millis(ms)),
        };
        for (ballots, want) in [
            // 5 nodes held with various ttls: 3 must expire, so the third smallest.
            (vec![h(500), h(100), h(300), h(400), forever], ttl(400)),
            // 2 held, 1 free of 3: one held node must expire.
            (vec![h(500), h(100), g], ttl(100)),
            // Two holders with two nodes each and one node ours: nobody has a majority.
            (vec![h(500), h(100), h(500), h(100), g], ttl(100)),
            (vec![h(500), h(100), g, g, none()], Decision::Split),
        ] {
            assert_eq!(decide(&ballots), want, "{ballots:?}");
        }
    }

    #[test]
    fn another_waiters_turn_counts_as_held() {
        let behind = b(Behind { counter: 1 });
        let g = b(Granted { counter: 2 });
        assert_eq!(
            decide(&[behind, behind, behind, g, g]),
            Decision::Held { ttl: None }
        );
        assert_eq!(decide(&[behind, g, g]), Decision::Fresh { token: 2 });
        assert!(settled(&[behind, behind, behind, none(), none()], 2));
        assert!(!settled(&[behind, behind, g, none(), none()], 2));
    }

    #[test]
    fn ballots_of_votes() {
        let g = Granted { counter: 4 };
        assert_eq!(Ballot::of(&QuorumVote::new(g), true), b(g));
        assert!(!Ballot::of(&QuorumVote::new(g), false).counted);
        // A node in quarantine by its own clock, or one that had forgotten its scripts
        // (restarted?), does not count, whatever this client thought of it.
        let mut v = QuorumVote::new(g);
        v.quarantine = Some(Duration::from_secs(1));
        assert!(!Ballot::of(&v, true).counted);
        let mut v = QuorumVote::new(g);
        v.scripts_reloaded = true;
        let ballot = Ballot::of(&v, true);
        assert!(!ballot.counted && ballot.granted() && !ballot.maybe_granted);
        // An epoch mismatch changed nothing on the node: no ballot at all.
        assert_eq!(Ballot::of(&QuorumVote::new(EpochMismatch), true), none());
        let u = Ballot::unknown();
        assert!(u.maybe_granted && !u.counted && u.reply.is_none());
    }

    #[test]
    fn confirmed_grants() {
        let g = b(Granted { counter: 9 });
        let ballots = [g, b(Granted { counter: 7 }), g, none(), none()];
        let fresh = Decision::Fresh { token: 9 };
        assert_eq!(confirmed(fresh, &ballots, &[]), 2);
        let raised = [None, Some(true), None, None, None];
        assert_eq!(confirmed(fresh, &ballots, &raised), 3);
        // A grant that stands was confirmed by a majority when it was made.
        let h = holds(9, 9);
        let ballots = [h, h, h, none(), none()];
        assert_eq!(confirmed(Decision::Again { token: 9 }, &ballots, &[]), 3);
        assert_eq!(confirmed(Decision::Split, &ballots, &[]), 0);
    }

    #[test]
    fn release_majorities() {
        use ReleaseOutcome::*;
        for (outs, want) in [
            ([Some(Released), Some(Released), None], Released),
            // A retried release: the nodes it reached the first time answer "nothing here".
            ([Some(Expired), Some(Expired), Some(Released)], Expired),
            ([Some(Expired), Some(Expired), Some(TakenByOther)], Expired),
            ([Some(TakenByOther), Some(TakenByOther), None], TakenByOther),
        ] {
            assert_eq!(release_outcome(&outs), Ok(want), "{outs:?}");
        }
        let two = [Some(Released), None, None, None, Some(Released)];
        assert_eq!(release_outcome(&two), Err(2));
    }

    #[test]
    fn renew_majorities() {
        use RenewOutcome::*;
        let outs = [
            Some(vec![Renewed, NotHeld, Renewed]),
            Some(vec![Renewed, NotHeld, NotHeld]),
            Some(vec![Renewed, Renewed, NotHeld]),
            None,
            Some(vec![Renewed, Renewed, NotHeld]),
        ];
        let outcomes = renew_outcomes(&[true, true, false, true, true], &outs, 3);
        assert_eq!(outcomes, vec![Some(Renewed), None, Some(NotHeld)]);
        assert_eq!(
            renew_batch(&outcomes),
            (vec![Renewed, Unconfirmed, NotHeld], vec![1])
        );
    }

    #[test]
    fn last_tokens() {
        // All 3 answered: two at the grant's token, one late vote above it.
        assert_eq!(last_token(&[10, 12, 10], 3), 10);
        // 2 of 3 answered: only one of them must be at or above it.
        assert_eq!(last_token(&[10, 12], 3), 12);
        // 5 of 5: the third largest; 4 of 5: the second.
        assert_eq!(last_token(&[1, 9, 7, 8, 3], 5), 7);
        assert_eq!(last_token(&[1, 9, 7, 8], 5), 8);
        assert_eq!(last_token(&[], 3), 0);
    }

    #[test]
    fn wake_thresholds() {
        for (n, watched, want) in [(5, 5, 3), (5, 4, 2), (5, 2, 1), (3, 3, 2), (3, 1, 1)] {
            assert_eq!(wake_threshold(n, watched), want, "{n} {watched}");
        }
    }
}
