//! One hold whose renewal a majority cannot decide does not fail the renewal of the other
//! holds of its batch, on real redis-server processes.

mod common;

use common::{opts, Cluster};
use distlock_testkit::conformance::{others_renew_while_one_fails, unique_name};
use std::time::Duration;

/// Three nodes, one of them paused, and one hold's key deleted by an operator on a second
/// node: that hold is renewed on one node and gone on another, so no majority decides it,
/// while the other holds of the same client (renewed in the same call) are renewed by the two
/// nodes that answer. They stay held (the whole batch used to fail with the undecided hold,
/// and every lock of the client was lost at its lease end); the undecided one is lost at its
/// lease end, never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_hold_does_not_fail_the_renewal_of_the_others() {
    let mut c = Cluster::start(3);
    c.settle().await;
    let lease = Duration::from_secs(3);
    // The per-call timeout below the renewal interval (1 s): the renewal must answer for the
    // decided holds before it, with the paused node still silent.
    let a = c
        .client(
            "node_timeout=50ms",
            opts(3000).op_timeout(Duration::from_millis(500)),
        )
        .await;
    let mut guards = Vec::new();
    for i in 0..3 {
        let name = unique_name(&format!("batch{i}"));
        guards.push(
            a.lock(&name)
                .expect("lock")
                .acquire()
                .await
                .expect("acquire"),
        );
        c.wait_held_on(&[0, 1, 2], &name, Duration::from_secs(5))
            .await;
    }
    let bad = guards[1].name().to_owned();
    c.servers[1]
        .command(&["DEL", &format!("dlock:{{{bad}}}")])
        .expect("DEL");
    c.servers[2].pause();
    others_renew_while_one_fails(&guards, 1, lease).await;
    c.servers[2].resume();
}
