//! The grant-addressed protocol on a real etcd cluster, adversarially: requests whose replies
//! come too late (a proxy delays them past the operation timeout) are retried with the effect
//! of one; renewals never shorten and really give the lease asked for; a lease revoked behind
//! the holder's back is loss; a waiter that gives up touches only its own key; and `etcdctl
//! lock` (Go's `concurrency.Mutex`) and dlock exclude each other both ways.

use distlock_core::{
    AcquireReply, AcquireRequest, Backend, ClientOptions, GrantRef, HoldKey, LockKind, LostReason,
    LostSignal, ReleaseOutcome, RenewOutcome,
};
use distlock_etcd::EtcdBackend;

mod common;
use common::{client_at as client, etcdctl, etcdctl_lock, exits_ok, file_appears, hold, released};
use distlock_testkit::conformance::{
    others_renew_while_one_fails, poll_until, unique_name, wait_for_waiters,
};
use distlock_testkit::{DelayProxy, EtcdCluster, TempDir};
use etcd_client::GetOptions;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Per-call timeout of the proxied backends: a reply delayed by [`LATE`] misses it.
const OP_TIMEOUT: Duration = Duration::from_millis(1500);
/// A reply delay past [`OP_TIMEOUT`].
const LATE: Duration = Duration::from_millis(2500);

fn opts(lease: Duration) -> ClientOptions {
    ClientOptions::default()
        .watchdog_lease(lease)
        .op_timeout(OP_TIMEOUT)
        .connect_timeout(Duration::from_secs(3))
}

async fn backend(url: &str) -> EtcdBackend {
    EtcdBackend::connect(url, &opts(Duration::from_secs(10)))
        .await
        .expect("connect")
}

/// One proxy in front of one member: every request of a backend connected to it goes through
/// it, so a delay set on it hits exactly that backend's calls.
fn proxied(cluster: &EtcdCluster) -> (Arc<DelayProxy>, String) {
    let p = Arc::new(DelayProxy::start(cluster.client_addr(0), Duration::ZERO).expect("proxy"));
    let url = format!("etcd://{}", p.addr());
    (p, url)
}

fn request(name: &str, owner: &str, lease: Duration) -> AcquireRequest {
    let key = HoldKey {
        name: name.into(),
        owner: owner.into(),
        kind: LockKind::Mutex,
    };
    AcquireRequest::new(key, lease, LostSignal::new())
}

fn token(r: AcquireReply) -> u64 {
    match r {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    }
}

/// Another attempt (of `owner`) is refused the lock, and gives up: someone holds it.
async fn excluded(direct: &EtcdBackend, name: &str, owner: &str, lease: Duration) {
    let other = request(name, owner, lease);
    assert!(matches!(
        direct.acquire(&other).await.expect("other attempt"),
        AcquireReply::Held { .. }
    ));
    direct.give_up(&other).await.expect("give up");
}

/// `grant` is released through `b`, and its lock's queue is empty afterwards.
async fn released_and_gone(b: &EtcdBackend, direct: &EtcdBackend, grant: &GrantRef, name: &str) {
    assert_eq!(
        b.release(grant).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(queue(direct, name).await.is_empty());
}

/// Every key under the lock's queue prefix, read directly: (key, create revision, lease).
async fn queue(direct: &EtcdBackend, name: &str) -> Vec<(Vec<u8>, i64, i64)> {
    let mut kv = direct.etcd_client().kv_client();
    let r = kv
        .get(
            direct.queue_prefix(name),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .expect("get the queue");
    r.kvs()
        .iter()
        .map(|k| (k.key().to_vec(), k.create_revision(), k.lease()))
        .collect()
}

/// Waits until every reply chunk the proxy has read has also been forwarded (delayed replies
/// delivered), so later calls are not stuck behind them.
async fn drained(p: &DelayProxy) {
    poll_until(
        "delayed replies delivered",
        async || p.stats(),
        |s| s.replies.chunks_forwarded >= s.replies.chunks_read,
    )
    .await;
}

/// Makes the replies the proxy reads from now on late, once `bursts` bursts of replies (a
/// reply and its companion frames, then a quiet of 100 ms) have passed with the delay `pace`.
/// Calls of one backend are sequential and each waits for its reply, delayed by `pace`
/// (> 100 ms), so the call after the `bursts`-th is the first one whose reply is late.
fn late_after(p: &Arc<DelayProxy>, bursts: u32, pace: Duration) -> std::thread::JoinHandle<()> {
    p.set_reply_delay(pace);
    let p = p.clone();
    std::thread::spawn(move || {
        let quiet = Duration::from_millis(100);
        let give_up = Instant::now() + Duration::from_secs(20);
        let read = || p.stats().replies.chunks_read;
        let mut seen = read();
        for _ in 0..bursts {
            while read() == seen {
                if Instant::now() > give_up {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            seen = read();
            let mut last = Instant::now();
            while last.elapsed() < quiet {
                std::thread::sleep(Duration::from_millis(1));
                let n = read();
                if n != seen {
                    seen = n;
                    last = Instant::now();
                }
            }
        }
        p.set_reply_delay(LATE);
    })
}

/// A retry of an acquire whose reply came too late finds the attempt's own key and answers
/// with its token: one grant, one key, and the key is never deleted by a revoke of the
/// request's lease (which the backend used to send after any failed attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_retried_after_a_late_reply_is_one_grant() {
    let cluster = EtcdCluster::start().expect("cluster");
    let direct = backend(&cluster.url()).await;
    let (proxy, url) = proxied(&cluster);
    let b = backend(&url).await;
    // The fault needs the lease grant's reply on time and the transaction's late: a timing
    // a loaded machine can miss, so a round that did not produce it is played again.
    for round in 0..4 {
        let name = unique_name("retryacq");
        let req = request(&name, "retrier", Duration::from_secs(10));
        let flip = late_after(&proxy, 1, Duration::from_millis(600));
        let first = b.acquire(&req).await;
        flip.join().expect("flip thread");
        proxy.set_reply_delay(Duration::ZERO);
        drained(&proxy).await;
        let keys = queue(&direct, &name).await;
        // PREFIX/NAME is written by the same transaction as the key: it tells whether the
        // late transaction committed.
        let mut fence = direct.queue_prefix(&name);
        fence.pop();
        let committed = !direct
            .etcd_client()
            .kv_client()
            .get(fence, None)
            .await
            .expect("get")
            .kvs()
            .is_empty();
        assert!(
            !(first.is_err() && committed && keys.is_empty()),
            "the key of an acquire that committed (its reply late) was deleted"
        );
        if first.is_ok() || keys.is_empty() {
            eprintln!(
                "round {round}: fault not produced ({first:?}, {} keys); again",
                keys.len()
            );
            if let Ok(AcquireReply::Granted { token }) = first {
                b.release(&req.grant(token)).await.expect("release");
            }
            b.give_up(&req).await.expect("give up");
            continue;
        }
        eprintln!("round {round}: the acquire failed ({first:?}) but its transaction committed");
        assert_eq!(keys.len(), 1, "{keys:?}");
        let (key, rev, lease) = keys[0].clone();
        assert_eq!(key, direct.attempt_key(&name, &req.attempt));
        // Give a revoke sent after the failure time to land: the key must still be there.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            queue(&direct, &name).await,
            keys,
            "the key of a committed acquire was deleted after its reply was late"
        );
        // The retry: same attempt, same token, still one key.
        let t = token(b.acquire(&req).await.expect("retry"));
        assert_eq!(
            t,
            u64::try_from(rev).expect("rev"),
            "a retry got a second grant"
        );
        let after = queue(&direct, &name).await;
        assert_eq!(after.len(), 1, "{after:?}");
        assert_eq!(after[0].1, rev);
        assert_eq!(after[0].2, lease, "the retry moved the key off its lease");
        // Exclusive, and another attempt of the same owner is another holder.
        excluded(&direct, &name, "retrier", Duration::from_secs(1)).await;
        released_and_gone(&b, &direct, &req.grant(t), &name).await;
        // A give-up after the grant was released touches nothing (idempotent).
        b.give_up(&req).await.expect("give up");
        return;
    }
    panic!("could not produce a late acquire reply in 4 rounds");
}

/// A renewal that moves the key to a longer lease, whose re-put's reply is late: the key may
/// be on the new lease, so the new lease is never revoked for it (which would delete a live
/// hold); the next renewal finds the key where it is and renews it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_move_with_a_late_reply_keeps_the_hold() {
    let cluster = EtcdCluster::start().expect("cluster");
    let direct = backend(&cluster.url()).await;
    let (proxy, url) = proxied(&cluster);
    let b = backend(&url).await;
    for round in 0..4 {
        let name = unique_name("latemove");
        let req = request(&name, "mover", Duration::from_secs(6));
        let grant = req.grant(token(b.acquire(&req).await.expect("acquire")));
        let old = queue(&direct, &name).await[0].2;
        // The renewal's read and its lease grant answer on time, the re-put late.
        let flip = late_after(&proxy, 2, Duration::from_millis(600));
        let r = b.renew(&[(grant.clone(), Duration::from_secs(9))]).await;
        flip.join().expect("flip thread");
        proxy.set_reply_delay(Duration::ZERO);
        drained(&proxy).await;
        let q = queue(&direct, &name).await;
        // The 6 s lease cannot have run out yet: a key gone after a failed move was deleted.
        assert!(
            !(r.is_err() && q.is_empty()),
            "the hold was deleted after a lease move whose reply was late"
        );
        if r.is_ok() || q.len() != 1 || q[0].2 == old {
            eprintln!("round {round}: fault not produced ({r:?}, {q:?}); again");
            b.release(&grant).await.expect("release");
            continue;
        }
        eprintln!("round {round}: the move failed ({r:?}) but committed");
        assert_eq!(q[0].1, i64::try_from(grant.token).expect("token"));
        // Past the old lease's end: the hold lives on the new lease.
        poll_until(
            "the old lease gone",
            async || granted_ttl(&direct, old).await,
            Option::is_none,
        )
        .await;
        assert_eq!(
            queue(&direct, &name).await,
            q,
            "the hold was deleted after a move whose reply was late"
        );
        excluded(&direct, &name, "other", Duration::from_secs(1)).await;
        assert_eq!(
            b.renew(&[(grant.clone(), Duration::from_secs(9))])
                .await
                .expect("renew"),
            vec![RenewOutcome::Renewed]
        );
        assert_eq!(queue(&direct, &name).await, q, "renewed elsewhere");
        released_and_gone(&b, &direct, &grant, &name).await;
        return;
    }
    panic!("could not produce a late reply to a lease move in 4 rounds");
}

/// A release whose reply came too late and is retried: the retry finds no grant of its own
/// and says so; it never touches the grant another attempt got meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_retried_after_a_late_reply_touches_no_other_grant() {
    let cluster = EtcdCluster::start().expect("cluster");
    let direct = backend(&cluster.url()).await;
    let (proxy, url) = proxied(&cluster);
    let b = backend(&url).await;
    let name = unique_name("retryrel");
    let req = request(&name, "same-owner", Duration::from_secs(10));
    let grant = req.grant(token(b.acquire(&req).await.expect("acquire")));
    proxy.set_reply_delay(LATE);
    let r = b.release(&grant).await;
    assert!(r.is_err(), "a late release reply arrived in time: {r:?}");
    proxy.set_reply_delay(Duration::ZERO);
    drained(&proxy).await;
    assert!(
        queue(&direct, &name).await.is_empty(),
        "the late release did not go through"
    );
    // Another attempt — of the same owner — takes the lock meanwhile.
    let other = request(&name, "same-owner", Duration::from_secs(10));
    let t2 = token(direct.acquire(&other).await.expect("other"));
    assert!(t2 > grant.token);
    // The retry of the first release: reported, not repeated.
    assert_eq!(
        b.release(&grant).await.expect("retry"),
        ReleaseOutcome::TakenByOther
    );
    assert_eq!(
        b.renew(&[(grant.clone(), Duration::from_secs(5))])
            .await
            .expect("renew"),
        vec![RenewOutcome::NotHeld]
    );
    let info = direct
        .inspect(&name, LockKind::Mutex)
        .await
        .expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(
        info.fencing_token, t2,
        "the retried release hit the new grant"
    );
    assert_eq!(
        direct.release(&other.grant(t2)).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        b.release(&grant).await.expect("again"),
        ReleaseOutcome::Expired
    );
}

/// Two re-entrant guards, and a late reply on the way: releasing one leaves the lock held for
/// the other (nobody else gets in), and the last release, retried after its late reply, frees
/// it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_release_with_late_replies() {
    let cluster = EtcdCluster::start().expect("cluster");
    let (proxy, url) = proxied(&cluster);
    let o = opts(Duration::from_secs(12)).op_timeout(Duration::from_millis(700));
    let a = client(&url, o).await;
    let other = client(&cluster.url(), opts(Duration::from_secs(10))).await;
    let name = unique_name("reenter");
    let lock = a.lock(&name).expect("lock");
    let g1 = lock.acquire().await.expect("g1");
    let t1 = g1.fencing_token();
    let g2 = lock.acquire().await.expect("g2 re-enters");
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    proxy.set_reply_delay(Duration::from_millis(1200));
    assert_eq!(
        g1.release().await.expect("release g1"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    // Held for g2 all along: nobody else gets in.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert!(
            other
                .lock(&name)
                .expect("lock")
                .try_acquire()
                .await
                .expect("try")
                .is_none(),
            "another owner got the lock while a re-entrant guard still held it"
        );
        assert!(!g2.is_lost());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The last release: its first reply is late; the retry (undelayed, but queued behind the
    // late reply) finds the grant gone, which after a request of unknown outcome means it
    // went through.
    let before = proxy.stats().replies.chunks_read;
    let release = tokio::spawn(async move { g2.release().await });
    poll_until(
        "the release's reply",
        async || proxy.stats().replies.chunks_read,
        |n| *n > before,
    )
    .await;
    proxy.set_reply_delay(Duration::ZERO);
    let out = release.await.expect("join").expect("release g2");
    assert_eq!(out, ReleaseOutcome::Released);
    let g3 = other
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free after the last release");
    assert!(g3.fencing_token() > t1);
    released(g3).await;
}

/// The TTL etcd granted lease `id` (`None`: etcd does not know it).
async fn granted_ttl(direct: &EtcdBackend, id: i64) -> Option<i64> {
    let mut lc = direct.etcd_client().lease_client();
    match lc.time_to_live(id, None).await {
        Ok(r) if r.ttl() > 0 => Some(r.granted_ttl()),
        _ => None,
    }
}

/// `extend` never shortens (a shorter one is a keep-alive of the longer lease) and really gives
/// a longer lease than the key's (the key moves to a new lease, token unchanged, the old lease
/// is revoked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_short_and_long() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let direct = backend(&url).await;
    let a = client(&url, opts(Duration::from_secs(10))).await;
    let other = client(&url, opts(Duration::from_secs(10))).await;
    let name = unique_name("extend");
    let g = a
        .lock(&name)
        .expect("lock")
        .lease(Duration::from_secs(4))
        .expect("lease")
        .acquire()
        .await
        .expect("acquire");
    let q = queue(&direct, &name).await;
    assert_eq!(q.len(), 1);
    let (_, rev, lease) = q[0].clone();
    assert_eq!(u64::try_from(rev).expect("rev"), g.fencing_token());
    assert_eq!(granted_ttl(&direct, lease).await, Some(4));
    // Shorter than the lease: nothing shortens.
    g.extend(Duration::from_secs(1))
        .await
        .expect("extend short");
    assert_eq!(
        queue(&direct, &name).await,
        q,
        "a short extend moved the key"
    );
    let left = a.inspect(&name).await.expect("inspect").holders[0]
        .lease_left
        .expect("lease left");
    assert!(left >= Duration::from_secs(2), "shortened to {left:?}");
    // Longer than the lease's TTL: a new lease of at least that, same key, same token.
    g.extend(Duration::from_secs(9)).await.expect("extend long");
    let q2 = queue(&direct, &name).await;
    assert_eq!(q2.len(), 1);
    assert_eq!(q2[0].1, rev, "the token changed");
    assert_ne!(q2[0].2, lease, "the key stayed on the short lease");
    assert!(granted_ttl(&direct, q2[0].2).await >= Some(9));
    poll_until(
        "the old lease revoked",
        async || granted_ttl(&direct, lease).await,
        Option::is_none,
    )
    .await;
    // Past the first lease's end: still held, nobody else gets in.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert!(!g.is_lost(), "lost despite the extension");
    assert!(other
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    let left = a.inspect(&name).await.expect("inspect").holders[0]
        .lease_left
        .expect("lease left");
    assert!(left >= Duration::from_secs(2), "{left:?}");
    released(g).await;
    assert!(queue(&direct, &name).await.is_empty());
}

/// Revoking the holder's lease behind its back (as `etcdctl lease revoke` would) is loss: the
/// watchdog's next renewal says NotHeld and the lost signal fires; the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_revoked_behind_the_holders_back_is_lost() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let direct = backend(&url).await;
    let a = client(&url, opts(Duration::from_secs(3))).await;
    let name = unique_name("revoked");
    let g = hold(&a, &name).await;
    let q = queue(&direct, &name).await;
    assert_eq!(q.len(), 1);
    direct
        .etcd_client()
        .lease_client()
        .revoke(q[0].2)
        .await
        .expect("revoke");
    let reason = tokio::time::timeout(Duration::from_secs(8), g.lost())
        .await
        .expect("the holder never learned its lease was revoked");
    assert_eq!(reason, LostReason::NotHeld);
    let free = direct
        .acquire(&request(&name, "next", Duration::from_secs(5)))
        .await
        .expect("acquire");
    assert!(matches!(free, AcquireReply::Granted { .. }), "{free:?}");
    // Its release reports the lock as someone else's; it deletes nothing.
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    assert_eq!(queue(&direct, &name).await.len(), 1);
}

/// One hold whose renewal errors does not fail the renewal of the others in its batch: an
/// operator's `etcdctl put` over one holder's key (foreign data, and off its lease) makes that
/// hold's renewal fail on its own; the other holds of the same client, renewed in the same
/// call, stay held (they used to be lost at their lease end with it), and the overwritten one
/// is lost at its lease end, never confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_overwritten_key_does_not_fail_the_renewal_of_the_others() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let direct = backend(&url).await;
    let lease = Duration::from_secs(3);
    let a = client(&url, opts(lease)).await;
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(hold(&a, &unique_name(&format!("batch{i}"))).await);
    }
    let q = queue(&direct, guards[1].name()).await;
    assert_eq!(q.len(), 1, "{q:?}");
    direct
        .etcd_client()
        .kv_client()
        .put(q[0].0.clone(), "overwritten by an operator", None)
        .await
        .expect("put");
    others_renew_while_one_fails(&guards, 1, lease).await;
    // Still theirs on the server: another client is refused them.
    let b = client(&url, opts(lease)).await;
    for g in [&guards[0], &guards[2]] {
        let other = b.lock(g.name()).expect("lock").try_acquire().await;
        assert!(other.expect("try").is_none(), "{} was free", g.name());
    }
}

/// A waiter whose give-up cannot reach etcd (its connection blackholed as its wait runs out)
/// leaves no key behind once etcd answers again: its key's lease is revoked then, so when the
/// holder releases, a third client gets the lock at once. (The key used to stay queued for the
/// waiter's whole lease and then hold the lock for an attempt nobody waits for.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_up_that_cannot_get_through_leaves_no_key_behind() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let direct = backend(&url).await;
    let (proxy, proxied_url) = proxied(&cluster);
    // Far longer than the test: only a revoke can free the waiter's key in time.
    let lease = Duration::from_secs(60);
    let a = client(&url, opts(lease)).await;
    let b = client(&proxied_url, opts(lease)).await;
    let name = unique_name("unheard-give-up");
    let g = hold(&a, &name).await;
    let waiter = b.lock(&name).expect("lock");
    let waiting = tokio::spawn(async move {
        waiter
            .acquire_timeout(Duration::from_secs(3))
            .await
            .map(|g| g.fencing_token())
    });
    poll_until(
        "the waiter's key queued behind the holder's",
        async || queue(&direct, &name).await.len(),
        |n| *n == 2,
    )
    .await;
    proxy.set_blackhole(true);
    let r = waiting.await.expect("task");
    assert!(r.is_err(), "the waiter got the lock: {r:?}");
    assert_eq!(
        queue(&direct, &name).await.len(),
        2,
        "the give-up got through the blackhole"
    );
    proxy.heal();
    proxy.reset_all();
    released(g).await;
    let c = client(&url, opts(lease)).await;
    let lock = c.lock(&name).expect("lock");
    poll_until(
        "a third client gets the lock once the holder released",
        async || lock.try_acquire().await.expect("try").is_some(),
        |got| *got,
    )
    .await;
}

/// Two clients with one owner id are two holders; the second one's wait runs out and gives up,
/// which deletes its own key only: the first one's grant is untouched (it used to be the key
/// both shared, revoked by the one that gave up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_its_siblings_hold_alone() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let direct = backend(&url).await;
    let a = client(&url, opts(Duration::from_secs(3))).await;
    let b = client(&url, opts(Duration::from_secs(3))).await;
    let name = unique_name("sibling");
    let g = a
        .lock(&name)
        .expect("lock")
        .with_owner("shared-owner")
        .expect("owner")
        .acquire()
        .await
        .expect("acquire");
    let sibling = b
        .lock(&name)
        .expect("lock")
        .with_owner("shared-owner")
        .expect("owner");
    let err = sibling
        .acquire_timeout(Duration::from_millis(800))
        .await
        .expect_err("the same owner id in another client is another holder");
    assert!(err.is_timeout(), "{err}");
    assert!(sibling.try_acquire().await.expect("try").is_none());
    // Its key is gone, ours is there, and stays through renewals.
    let q = queue(&direct, &name).await;
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(u64::try_from(q[0].1).expect("rev"), g.fencing_token());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!g.is_lost(), "{:?}", g.lost_signal().reason());
    assert_eq!(queue(&direct, &name).await, q);
    // The same at the trait: a give-up of another attempt of the same owner.
    excluded(&direct, &name, "shared-owner", Duration::from_secs(5)).await;
    assert_eq!(queue(&direct, &name).await, q);
    released(g).await;
}

/// `etcdctl lock dlock/NAME` (Go's `concurrency.Mutex`) and dlock's lock `NAME` (default
/// prefix) exclude each other, both ways: dlock's keys sit in the same queue and follow its
/// create-revision order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_dlock_exclude_each_other() {
    let Some(bin) = etcdctl() else { return };
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let a = client(&url, opts(Duration::from_secs(10))).await;
    let dir = TempDir::new().expect("temp dir");
    let name = unique_name("etcdctl");
    let lock = a.lock(&name).expect("lock");

    // etcdctl holds: dlock's try fails, its wait waits until etcdctl lets go.
    let (held, go) = (dir.path().join("held"), dir.path().join("go"));
    let script = format!(
        "touch '{}'; while [ ! -e '{}' ]; do sleep 0.05; done",
        held.display(),
        go.display()
    );
    let mut ctl = etcdctl_lock(bin, &cluster, &name, &script);
    file_appears(&held).await;
    assert!(
        lock.try_acquire().await.expect("try").is_none(),
        "dlock got a lock etcdctl holds"
    );
    let info = a.inspect(&name).await.expect("inspect");
    assert!(info.holders[0].owner.starts_with("(not dlock)"), "{info:?}");
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await })
    };
    wait_for_waiters(&a, &name, LockKind::Mutex, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "dlock's acquire returned while etcdctl held the lock"
    );
    std::fs::write(&go, b"").expect("touch go");
    let g = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("dlock never got the lock etcdctl released")
        .expect("join")
        .expect("acquire");
    exits_ok(&mut ctl).await;

    // dlock holds: etcdctl waits until dlock releases.
    let marker = dir.path().join("marker");
    let mut ctl = etcdctl_lock(
        bin,
        &cluster,
        &name,
        &format!("touch '{}'", marker.display()),
    );
    wait_for_waiters(&a, &name, LockKind::Mutex, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !marker.exists(),
        "etcdctl ran its command while dlock held the lock"
    );
    assert!(ctl.0.try_wait().expect("wait").is_none());
    assert!(!g.is_lost());
    released(g).await;
    file_appears(&marker).await;
    exits_ok(&mut ctl).await;
    assert!(!a.inspect(&name).await.expect("inspect").held());
}
