//! The conformance suite over TLS: session mode whole, lease mode a representative subset, on a
//! server with `ssl=on` that refuses unencrypted TCP, with `sslmode=verify-full` against the
//! testkit's throwaway CA.
#![cfg(feature = "tls")]

mod support;

use distlock_testkit::sql_faults::SqlMode;
use support::{connect_tls, delete_holder_row, free_lease_row, tls_server};

mod session {
    use super::*;
    distlock_testkit::conformance_suite!(SqlMode::new(
        tls_server(),
        "?sslmode=verify-full",
        connect_tls,
        delete_holder_row
    ));
}

mod lease {
    use super::*;
    distlock_testkit::conformance_suite!(@cases SqlMode::new(
        tls_server(),
        "?mode=lease&sslmode=verify-full",
        connect_tls,
        free_lease_row
    ); mutual_exclusion, try_acquire_contended, fencing_tokens_increase, waiter_woken_by_release,
       crashed_holder_frees_at_lease_end, lost_when_broken, backend_contract);
}
