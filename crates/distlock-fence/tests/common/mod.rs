//! What the concurrent-holder tests of every store count.
#![allow(dead_code)] // Each test file uses its own part.

use distlock_fence::Error;
use tokio::task::JoinHandle;

/// Writes applied, rejected as stale, and made after their grant ended.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub applied: u64,
    pub stale: u64,
    pub late: u64,
}

impl Tally {
    /// Counts the outcome of one fenced write; any error but a stale token fails the test.
    pub fn record<T>(&mut self, r: Result<T, Error>) {
        match r {
            Ok(_) => self.applied += 1,
            Err(Error::Stale { token, newer }) => {
                assert!(newer > token, "stale {token}, newer {newer}");
                self.stale += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// The sum of the tallies of `tasks`.
    pub async fn sum(tasks: Vec<JoinHandle<Tally>>) -> Tally {
        let mut all = Tally::default();
        for t in tasks {
            let t = t.await.expect("task");
            all.applied += t.applied;
            all.stale += t.stale;
            all.late += t.late;
        }
        all
    }
}
