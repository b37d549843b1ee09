//! The shared conformance and adversarial suites on a real MariaDB server, in both modes:
//! session (`GET_LOCK`) and table (`?mode=table`). The harness is the testkit's SQL one.

mod support;

use support::{Modes, My};

mod session {
    use super::*;
    distlock_testkit::conformance_suite!(My::session());
    distlock_testkit::adversarial_suite!(My::session());
    distlock_testkit::election_suite!(My::session());
}

mod table {
    use super::*;
    distlock_testkit::conformance_suite!(My::table());
    distlock_testkit::adversarial_suite!(My::table());
    distlock_testkit::election_suite!(My::table());
}
