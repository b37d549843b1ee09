//! The macros that expand the cases into tests.

/// Expands to one `#[tokio::test]` per conformance case, each calling `$make` for a harness.
///
/// ```ignore
/// distlock_testkit::conformance_suite!(MyHarness::start());
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@cases $make;
            mutual_exclusion, try_acquire_contended, reentrancy, non_owner_cannot_release,
            fencing_tokens_increase, acquire_timeout_deadline, waiter_woken_by_release,
            cancelled_acquire_leaves_nothing, watchdog_renews, drop_releases,
            fixed_lease_expires, crashed_holder_frees_at_lease_end, extend_lease,
            lost_when_broken, invalid_input, backend_contract,
            rw_readers_share_writer_excludes, rw_downgrade_and_tokens, rw_writer_not_starved,
            fair_lock_fifo, semaphore_permits, multi_lock_no_deadlock);
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $make;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
}

/// Expands to one `#[tokio::test]` per adversarial case (see [`adversarial`](crate::conformance::adversarial)), each calling
/// `$make` for a harness. Kept apart from [`conformance_suite!`](crate::conformance_suite) so a
/// backend runs both and they fail one by one.
///
/// ```ignore
/// distlock_testkit::adversarial_suite!(MyHarness::start());
/// ```
#[macro_export]
macro_rules! adversarial_suite {
    ($make:expr) => {
        $crate::adversarial_suite!(@cases $make;
            late_reply_on_release, retried_acquire_is_one, late_reply_on_renew,
            extend_shorter_than_watchdog, fixed_and_watchdog_guards, sibling_waiters_handoff,
            rw_sibling_waiters, cancel_at_every_await, semaphore_edges,
            data_loss_tokens_increase, contended_soak);
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $make;
                $crate::conformance::adversarial::$case(&harness).await;
            }
        )*
    };
}

/// Expands to one `#[tokio::test]` per election case (see [`election`](crate::conformance)),
/// each calling `$make` for a harness. On a backend without elections every case is skipped,
/// saying so.
///
/// ```ignore
/// distlock_testkit::election_suite!(MyHarness::start());
/// ```
#[macro_export]
macro_rules! election_suite {
    ($make:expr) => {
        $crate::election_suite!(@cases $make;
            one_leader_at_a_time, try_campaign_and_leader, resign_wakes_candidate,
            proclaim_changes_value, stale_proclaim_is_ignored, observe_changes,
            partitioned_leader_replaced, cancelled_campaign_leaves_nothing,
            election_apart_from_lock, election_invalid_input);
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        mod election {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let harness = $make;
                    $crate::conformance::$case(&harness).await;
                }
            )*
        }
    };
}
