//! The shared conformance suite on a real 3-member etcd cluster.

use distlock_testkit::{conformance::ServerHarness, EtcdCluster};

mod common;

fn etcd() -> ServerHarness<EtcdCluster> {
    common::harness(EtcdCluster::start().expect("start a 3-member etcd cluster"))
}

distlock_testkit::conformance_suite!(etcd());
distlock_testkit::adversarial_suite!(etcd());
distlock_testkit::election_suite!(etcd());
