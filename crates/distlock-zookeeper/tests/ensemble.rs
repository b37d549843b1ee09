//! The test ensemble itself: three real ZooKeeper servers that elect a leader, survive the
//! leader's SIGKILL, pause and take a restarted node back.

use distlock_testkit::ZkEnsemble;
use std::time::{Duration, Instant};

#[test]
fn ensemble_elects_fails_over_and_rejoins() {
    let t = Instant::now();
    let mut zk = ZkEnsemble::start().expect("start ensemble");
    eprintln!("ensemble up in {:?}", t.elapsed());
    assert_eq!(zk.len(), 3);
    assert_eq!(zk.connect_string().split(',').count(), 3);
    let leader = zk.leader().expect("leader");
    assert_eq!(zk.four_letter(leader, "ruok").expect("ruok"), "imok");
    let followers = (0..3)
        .filter(|&i| zk.mode(i).as_deref() == Some("follower"))
        .count();
    assert_eq!(followers, 2);

    let t = Instant::now();
    zk.kill(leader);
    assert!(!zk.is_running(leader));
    let new_leader = zk.wait_ready(Duration::from_secs(15)).expect("re-election");
    eprintln!("new leader after {:?}", t.elapsed());
    assert_ne!(new_leader, leader);

    zk.restart(leader).expect("restart");
    assert_eq!(zk.mode(leader).as_deref(), Some("follower"));

    // A paused follower stops answering; resumed, it serves again.
    let follower = (0..3).find(|&i| i != new_leader).expect("a follower");
    zk.pause(follower);
    assert_eq!(zk.mode(follower), None);
    zk.resume(follower);
    zk.wait_ready(Duration::from_secs(15))
        .expect("serving after resume");
}
