//! `dlock torture --self-test`: the whole harness (worker processes, register, pause
//! nemesis, checker) run against the broken locks of [`crate::broken`]; each must be flagged
//! with the violation a person would expect, and the correct sibling must pass.

use crate::broken::Variant;
use crate::run::{self, Config, Nemesis, Report, WorkerCommand};
use crate::worker::Target;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One lock of the self-test.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Case {
    /// The lock.
    pub lock: String,
    /// The violation it must show (`None`: none at all).
    pub expected: Option<String>,
    /// Whether the checker found what was expected.
    pub passed: bool,
    /// The run's report.
    pub report: Report,
}

/// The self-test's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SelfTest {
    /// Every case passed.
    pub ok: bool,
    /// One line.
    pub verdict: String,
    /// Per lock.
    pub cases: Vec<Case>,
}

/// The violation a person expects of each lock.
pub fn expected(v: Variant) -> Option<&'static str> {
    match v {
        Variant::Correct => None,
        // A release deletes the next holder's record; a third one gets the lock beside it.
        Variant::NoOwnerCheck => Some("overlap"),
        // The work outlasts the lease; nobody tells the holder.
        Variant::NoRenewal => Some("overlap"),
        // Every grant after a release gets token 1 again.
        Variant::TokenReset => Some("duplicate-token"),
        // A killed holder's record stays: the waiters wait for nobody.
        Variant::NoExpiry => Some("held-by-nobody"),
    }
}

/// The run of one variant: 4 workers for 4 s, lease 300 ms, holders paused past the lease (or
/// killed, for the lock that never expires).
pub fn config(v: Variant, dir: std::path::PathBuf, worker: WorkerCommand, seed: u64) -> Config {
    let lease = Duration::from_millis(300);
    Config {
        target: Target::Broken(v, dir),
        kind: crate::history::Kind::Mutex,
        names: 1,
        clients: 4,
        // A lock that never expires is found once a waiter has waited past the checker's
        // bound (lease + at least 3 s) after the kill: twice that, so that a loaded machine
        // that starts the workers or the kill late still shows it.
        duration: if v == Variant::NoExpiry {
            Duration::from_secs(8)
        } else {
            Duration::from_secs(4)
        },
        lease,
        // Work well inside the renewal interval, except for the lock without renewal, whose
        // work often outlasts its lease.
        work: if v == Variant::NoRenewal {
            lease * 3 / 2
        } else {
            lease / 5
        },
        // A lock that never expires shows under kill (a paused holder comes back and
        // releases); the others under pause.
        nemeses: vec![if v == Variant::NoExpiry {
            Nemesis::Kill
        } else {
            Nemesis::Pause
        }],
        seed,
        worker,
        name: "self-test".into(),
        history_out: None,
        server_pids: Vec::new(),
        timeline_out: None,
    }
}

/// Runs every variant (in parallel) and checks each verdict.
///
/// # Errors
///
/// A message when a run could not be made (a worker did not start, no temporary directory).
pub fn self_test(worker: &WorkerCommand, seed: u64) -> Result<SelfTest, String> {
    let base = std::env::temp_dir().join(format!(
        "dlock-torture-self-test-{}-{}",
        std::process::id(),
        crate::history::now_us()
    ));
    let results: Vec<Result<Case, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = Variant::ALL
            .into_iter()
            .map(|v| {
                let dir = base.join(v.name());
                let cfg = config(v, dir, worker.clone(), seed);
                s.spawn(move || {
                    let report = run::run(&cfg)?;
                    let want = expected(v);
                    let passed = match want {
                        None => report.ok,
                        Some(k) => report.analysis.violation_counts.contains_key(k),
                    };
                    Ok(Case {
                        lock: v.name().to_string(),
                        expected: want.map(str::to_string),
                        passed,
                        report,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a self-test run panicked".into()))
            })
            .collect()
    });
    let _ = std::fs::remove_dir_all(&base);
    let cases = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    let ok = cases.iter().all(|c| c.passed);
    let failed: Vec<&str> = cases
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.lock.as_str())
        .collect();
    let verdict = if ok {
        format!(
            "PASS: the checker flagged all {} broken locks and passed the correct one",
            cases.len() - 1
        )
    } else {
        format!("FAIL: not as expected: {}", failed.join(", "))
    };
    Ok(SelfTest { ok, verdict, cases })
}
