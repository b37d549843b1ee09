//! The shared conformance suite over TLS: one etcd member serving only https with
//! `--client-cert-auth`, reached with `etcds://…?cacert=&cert=&key=` (and through a proxy,
//! which passes the TLS bytes through, for the cases that need one).

use distlock_testkit::{conformance::ServerHarness, EtcdCluster};

mod common;

fn etcd_tls() -> ServerHarness<EtcdCluster> {
    common::harness(EtcdCluster::start_tls(1, true).expect("start an etcd member with TLS"))
}

distlock_testkit::conformance_suite!(etcd_tls());
