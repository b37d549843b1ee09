//! The shared conformance suite on a real three-node ZooKeeper ensemble.
//!
//! One ensemble per test binary (per test process under nextest); every case uses its own
//! lock names. Locks live as long as their ZooKeeper session, so the cases about fixed leases
//! ending on the server are skipped (`no_lease_expiry`): see `docs/zookeeper.md`.

use distlock_core::LockKind;
use distlock_testkit::{conformance::ServerHarness, ZkEnsemble};
use distlock_zookeeper::ZkBackend;
use zookeeper_client as zk;

fn zk() -> ServerHarness<&'static ZkEnsemble> {
    let url = |e: &&ZkEnsemble| e.url();
    ServerHarness::new(ZkEnsemble::shared(), url, |url, o| async move {
        ZkBackend::connect(&url, &o).await
    })
    .no_lease_expiry()
    // One node behind the proxy: the client balances requests over the nodes it is given.
    .proxy(|e| vec![e.addr(0)])
    // Deletes every lock node of the mutex, as an operator with `zkCli.sh` might.
    .break_lock(|e, name| async move {
        let zk = zk::Client::connect(&e.connect_string())
            .await
            .expect("operator session");
        let dir = distlock_zookeeper::lock_dir("dlock", &name, LockKind::Mutex).expect("dir");
        let children = zk.list_children(&dir).await.expect("list");
        let nodes: Vec<&String> = children.iter().filter(|c| c.starts_with("_c_")).collect();
        assert!(!nodes.is_empty(), "nothing to delete in {dir}");
        for c in nodes {
            zk.delete(&format!("{dir}/{c}"), None)
                .await
                .expect("delete");
        }
    })
}

distlock_testkit::conformance_suite!(zk());
distlock_testkit::adversarial_suite!(zk());
distlock_testkit::election_suite!(zk());
