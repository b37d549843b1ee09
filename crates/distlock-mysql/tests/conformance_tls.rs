//! A representative part of the conformance suite over TLS, in both modes, on a server that
//! refuses unencrypted TCP, with `ssl-mode=VERIFY_IDENTITY` against the testkit's throwaway CA.
#![cfg(feature = "tls")]

mod support;

use distlock_testkit::sql_faults::SqlMode;
use support::{connect_tls, delete_holder_row, free_lock_row, tls_server};

mod session {
    use super::*;
    distlock_testkit::conformance_suite!(@cases SqlMode::new(
        tls_server(),
        "?ssl-mode=VERIFY_IDENTITY",
        connect_tls,
        delete_holder_row
    ); mutual_exclusion, try_acquire_contended, reentrancy, fencing_tokens_increase,
       waiter_woken_by_release, drop_releases, crashed_holder_frees_at_lease_end,
       lost_when_broken, backend_contract);
}

mod table {
    use super::*;
    distlock_testkit::conformance_suite!(@cases SqlMode::new(
        tls_server(),
        "?mode=table&ssl-mode=VERIFY_IDENTITY",
        connect_tls,
        free_lock_row
    ); mutual_exclusion, try_acquire_contended, fencing_tokens_increase,
       waiter_woken_by_release, crashed_holder_frees_at_lease_end, lost_when_broken,
       backend_contract);
}
