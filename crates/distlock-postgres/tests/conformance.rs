//! The shared conformance and adversarial suites on a real PostgreSQL server, in both modes:
//! session (advisory locks) and lease (`?mode=lease`). The harness is the testkit's SQL one.

mod support;

use support::{Modes, Pg};

mod session {
    use super::*;
    distlock_testkit::conformance_suite!(Pg::session());
    distlock_testkit::adversarial_suite!(Pg::session());
    distlock_testkit::election_suite!(Pg::session());
}

mod lease {
    use super::*;
    distlock_testkit::conformance_suite!(Pg::lease());
    distlock_testkit::adversarial_suite!(Pg::lease());
    distlock_testkit::election_suite!(Pg::lease());
}
