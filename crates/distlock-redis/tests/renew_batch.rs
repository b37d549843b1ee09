//! One hold whose renewal fails does not fail the renewal of the other holds of its batch, on
//! real redis-server processes: one server, and a Redis Cluster (a key overwritten by an
//! operator, a paused master).

mod common;

use common::{acquired, client_for, name_on};
use distlock_core::ClientOptions;
use distlock_testkit::conformance::{others_renew_while_one_fails, unique_name};
use distlock_testkit::{RedisCluster, RedisServer};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(3);

/// The per-call timeout below the renewal interval (1 s).
fn opts() -> ClientOptions {
    ClientOptions::default()
        .watchdog_lease(LEASE)
        .op_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2))
}

/// An operator's `SET` over one holder's lock hash (a string where dlock keeps a hash) makes
/// that hold's renewal fail on the server (WRONGTYPE, which used to stop the whole batch's
/// script and fail every hold of the client); the other holds renewed in the same call stay
/// held, and the overwritten one is lost at its lease end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_overwritten_key_does_not_fail_the_renewal_of_the_others() {
    let server = RedisServer::start().expect("redis-server");
    let url = format!("redis://127.0.0.1:{}", server.port());
    let (a, _) = client_for(&url, opts()).await;
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(acquired(&a, &unique_name(&format!("batch{i}"))).await);
    }
    let key = format!("dlock:{{{}}}", guards[1].name());
    server
        .command(&["SET", &key, "overwritten by an operator"])
        .expect("SET");
    others_renew_while_one_fails(&guards, 1, LEASE).await;
    // Still theirs on the server: another client is refused them.
    let (b, _) = client_for(&url, opts()).await;
    for g in [&guards[0], &guards[2]] {
        let other = b.lock(g.name()).expect("lock").try_acquire().await;
        assert!(other.expect("try").is_none(), "{} was free", g.name());
    }
}

/// The same on a Redis Cluster, the overwritten hold's slot on the same master as another
/// hold's: that master's renewal script fails, and only the overwritten hold is unconfirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_one_overwritten_key_does_not_fail_the_renewal_of_the_others() {
    let cluster = RedisCluster::start_with(3, 0).expect("cluster");
    let (a, _) = client_for(&cluster.url(), opts()).await;
    let names = [
        name_on(&cluster, 0, "batch-a"),
        name_on(&cluster, 0, "batch-b"),
        name_on(&cluster, 1, "batch-c"),
    ];
    let mut guards = Vec::new();
    for n in &names {
        guards.push(acquired(&a, n).await);
    }
    let key = format!("dlock:{{{}}}", names[1]);
    cluster
        .command_at_key(&key, &["SET", &key, "overwritten by an operator"])
        .expect("SET");
    others_renew_while_one_fails(&guards, 1, LEASE).await;
}

/// Holds on two masters of a cluster, one master paused (SIGSTOP, no replica to fail over
/// to): the hold on the paused master cannot be renewed, and it is lost at its lease end;
/// the holds on the other master are renewed in the same calls and stay held. (The paused
/// master's pipeline used to fail the whole batch, or keep it waiting until the watchdog
/// dropped it, and every hold of the client was lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_paused_master_does_not_fail_the_renewal_of_the_others() {
    let mut cluster = RedisCluster::start_with(3, 0).expect("cluster");
    let (a, _) = client_for(&cluster.url(), opts()).await;
    let names = [
        name_on(&cluster, 0, "paused-a"),
        name_on(&cluster, 1, "paused-b"),
        name_on(&cluster, 0, "paused-c"),
    ];
    let mut guards = Vec::new();
    for n in &names {
        guards.push(acquired(&a, n).await);
    }
    cluster.pause(1);
    others_renew_while_one_fails(&guards, 1, LEASE).await;
    cluster.resume(1);
}
