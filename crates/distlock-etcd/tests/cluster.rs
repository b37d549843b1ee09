//! The test kit's etcd cluster itself: start, leader, crash and restart of a member.

use distlock_testkit::EtcdCluster;
use std::time::{Duration, Instant};

#[test]
fn three_members_elect_and_survive_a_leader_crash() {
    let t = Instant::now();
    let mut c = EtcdCluster::start().expect("start etcd cluster");
    eprintln!("cluster up in {:?}: {}", t.elapsed(), c.url());
    assert_eq!(c.len(), 3);
    let leader = c.leader().expect("leader");
    let old_id = c.status(leader).expect("status").member_id;
    c.kill(leader);
    assert!(!c.is_running(leader));
    let t = Instant::now();
    let new = c.wait_leader(Duration::from_secs(10)).expect("new leader");
    eprintln!("new leader after {:?}", t.elapsed());
    assert_ne!(new, leader);
    assert_ne!(c.status(new).expect("status").member_id, old_id);
    c.restart(leader).expect("restart");
    assert!(c.is_running(leader));
    let st = c.status(leader).expect("status of the restarted member");
    assert_eq!(st.member_id, old_id, "the member rejoined with its data");
    assert_ne!(st.leader_id, 0);
    // Pause and resume a follower.
    let follower = (0..3)
        .find(|&i| i != c.leader().expect("leader"))
        .expect("follower");
    c.pause(follower);
    assert!(c.status(follower).is_err(), "a paused member answered");
    c.leader().expect("the others still agree");
    c.resume(follower);
    c.wait_leader(Duration::from_secs(10))
        .expect("all agree again");
}
