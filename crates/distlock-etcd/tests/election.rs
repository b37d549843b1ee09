//! Elections on etcd: `etcdctl elect` (Go's `concurrency.Election`) and dlock's elections on
//! `dlock-election/NAME` take part in one election, both ways; a leader cut off from the
//! cluster, or whose lease is revoked, loses leadership before the next one leads, with a
//! greater token; a proclamation whose reply is lost, retried or duplicated, has the effect
//! of one; a cancelled campaign leaves nothing behind.

use distlock_core::backend::{AcquireReply, AcquireRequest, HoldKey, RenewOutcome};
use distlock_core::{Backend, Client, ClientOptions, LockKind, LostReason, LostSignal};
use distlock_etcd::EtcdBackend;
use distlock_testkit::conformance::{fast_opts, poll_until, unique_name, wait_for_waiters};
use distlock_testkit::{DelayProxy, EtcdCluster, TempDir};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{client_at as client, etcdctl, exits, Reaped};

fn opts(lease: Duration) -> ClientOptions {
    fast_opts().watchdog_lease(lease)
}

/// `etcdctl elect [-l] dlock-election/<name> [value]` against member 0 of `cluster`, its
/// standard output into `out`.
fn etcdctl_elect(
    bin: &str,
    cluster: &EtcdCluster,
    name: &str,
    value: Option<&str>,
    out: &Path,
) -> Reaped {
    let mut cmd = Command::new(bin);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", cluster.client_addr(0)))
        .arg("elect");
    match value {
        Some(v) => cmd.args([format!("dlock-election/{name}"), v.to_owned()]),
        None => cmd.args(["-l".to_owned(), format!("dlock-election/{name}")]),
    };
    let child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out).expect("stdout file"))
        .spawn()
        .expect("spawn etcdctl");
    Reaped(child)
}

/// SIGINT, on which `etcdctl elect` resigns and exits.
fn interrupt(child: &Reaped) {
    let ok = Command::new("kill")
        .args(["-INT", &child.0.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -INT failed");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

async fn printed(path: &Path, what: &str) -> String {
    poll_until(
        &format!("etcdctl to print `{what}`"),
        async || read(path),
        |s| s.lines().any(|l| l == what),
    )
    .await
}

/// `etcdctl elect` leads: dlock sees it as leader `(not dlock)` with its value, dlock's
/// candidate waits (woken by the watch, not before), and leads once etcdctl resigns, with a
/// greater token; its observer sees both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_etcdctl_leads_then_dlock() {
    let Some(bin) = etcdctl() else { return };
    let cluster = EtcdCluster::start_with_members(1).expect("cluster");
    let a = client(&cluster.url(), opts(Duration::from_secs(2))).await;
    let dir = TempDir::new().expect("temp dir");
    let name = unique_name("elect-ctl");
    let election = a.election(&name).expect("election");

    let out = dir.path().join("ctl.out");
    let mut ctl = etcdctl_elect(bin, &cluster, &name, Some("ctl-value"), &out);
    // etcdctl prints the leader key and its value once it leads.
    printed(&out, "ctl-value").await;
    let ctl_leader = election.leader().await.expect("leader").expect("a leader");
    assert!(
        ctl_leader.owner.starts_with("(not dlock) "),
        "{ctl_leader:?}"
    );
    assert_eq!(ctl_leader.value, "ctl-value");
    assert!(ctl_leader.fencing_token > 0);
    assert!(out_has_key(&out, &name, &ctl_leader.owner));
    let mut observer = election.observe();
    assert_eq!(
        observer.next().await.expect("observe"),
        Some(ctl_leader.clone())
    );

    assert!(election
        .try_campaign("dlock-value")
        .await
        .expect("try")
        .is_none());
    let waiting = {
        let e = election.clone();
        tokio::spawn(async move {
            e.campaign_timeout("dlock-value", Duration::from_secs(30))
                .await
        })
    };
    wait_for_waiters(&a, &name, LockKind::Election, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "dlock led while etcdctl did");

    interrupt(&ctl);
    let leader = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("dlock never led after etcdctl resigned")
        .expect("join")
        .expect("campaign");
    assert!(leader.fencing_token() > ctl_leader.fencing_token);
    assert_eq!(leader.value(), "dlock-value");
    exits(&mut ctl).await;
    // The observer: possibly nobody for a moment, then dlock.
    let mut seen = observer.next().await.expect("observe");
    if seen.is_none() {
        seen = observer.next().await.expect("observe");
    }
    let seen = seen.expect("a leader");
    assert_eq!(
        (seen.owner.as_str(), seen.value.as_str(), seen.fencing_token),
        (leader.owner(), "dlock-value", leader.fencing_token())
    );
    leader.resign().await.expect("resign");
}

/// The key line etcdctl printed is the election key of the leader dlock reports.
fn out_has_key(out: &Path, name: &str, owner: &str) -> bool {
    let lease_hex = owner.trim_start_matches("(not dlock) ");
    read(out)
        .lines()
        .any(|l| l == format!("dlock-election/{name}/{lease_hex}"))
}

/// dlock leads: `etcdctl elect -l` prints its value (and a proclaimed one), an `etcdctl
/// elect` candidate waits until dlock resigns, and then dlock sees it lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_dlock_leads_then_etcdctl() {
    let Some(bin) = etcdctl() else { return };
    let cluster = EtcdCluster::start_with_members(1).expect("cluster");
    let a = client(&cluster.url(), opts(Duration::from_secs(2))).await;
    let dir = TempDir::new().expect("temp dir");
    let name = unique_name("elect-dlock");
    let election = a.election(&name).expect("election");
    let leader = election.campaign("dlock-value").await.expect("campaign");

    let listen = dir.path().join("listen.out");
    let mut listener = etcdctl_elect(bin, &cluster, &name, None, &listen);
    printed(&listen, "dlock-value").await;
    leader.proclaim("dlock-value-2").await.expect("proclaim");
    printed(&listen, "dlock-value-2").await;

    let out = dir.path().join("ctl.out");
    let mut ctl = etcdctl_elect(bin, &cluster, &name, Some("ctl-value"), &out);
    wait_for_waiters(&a, &name, LockKind::Election, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(read(&out), "", "etcdctl led while dlock did");
    assert!(ctl.0.try_wait().expect("wait").is_none());
    assert!(!leader.is_lost());

    let token = leader.fencing_token();
    leader.resign().await.expect("resign");
    printed(&out, "ctl-value").await;
    printed(&listen, "ctl-value").await;
    let now = election.leader().await.expect("leader").expect("a leader");
    assert!(now.owner.starts_with("(not dlock) "), "{now:?}");
    assert_eq!(now.value, "ctl-value");
    assert!(now.fencing_token > token);
    interrupt(&ctl);
    exits(&mut ctl).await;
    interrupt(&listener);
    exits(&mut listener).await;
    assert_eq!(election.leader().await.expect("leader"), None);
}

/// A leader cut off from etcd (every byte of its connection dropped) stops renewing: its
/// lost signal has fired by the time the next candidate leads, and the new token is greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_cut_off_leader_loses_before_the_next_leads() {
    let cluster = EtcdCluster::start_with_members(1).expect("cluster");
    let proxy = DelayProxy::start(cluster.client_addr(0), Duration::ZERO).expect("proxy");
    let a = client(
        &format!("etcd://{}", proxy.addr()),
        opts(Duration::from_secs(2)),
    )
    .await;
    let b = client(&cluster.url(), opts(Duration::from_secs(20))).await;
    let name = unique_name("elect-cut");
    let first = a
        .election(&name)
        .expect("election")
        .campaign("a")
        .await
        .expect("campaign");
    let lost = first.lost_signal();
    let next = {
        let e = b.election(&name).expect("election");
        tokio::spawn(async move { e.campaign_timeout("b", Duration::from_secs(30)).await })
    };
    wait_for_waiters(&b, &name, LockKind::Election, 1).await;
    proxy.set_blackhole(true);
    let cut_at = Instant::now();
    let second = tokio::time::timeout(Duration::from_secs(30), next)
        .await
        .expect("no new leader")
        .expect("join")
        .expect("campaign");
    let lost_when_elected = lost.reason();
    eprintln!("cut off at 0, new leader at {:?}", cut_at.elapsed());
    assert_eq!(lost_when_elected, Some(LostReason::LeaseExpired));
    assert!(second.fencing_token() > first.fencing_token());
    let now = b
        .election(&name)
        .expect("election")
        .leader()
        .await
        .expect("leader")
        .expect("a leader");
    assert_eq!(
        (now.value.as_str(), now.fencing_token),
        ("b", second.fencing_token())
    );
    proxy.heal();
    second.resign().await.expect("resign");
}

/// The leader's session (its lease) revoked behind its back: its lost signal fires, the
/// waiting candidate leads with a greater token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_leader_whose_lease_is_revoked_loses() {
    let cluster = EtcdCluster::start_with_members(1).expect("cluster");
    let a = client(&cluster.url(), opts(Duration::from_secs(2))).await;
    let b = client(&cluster.url(), opts(Duration::from_secs(2))).await;
    let name = unique_name("elect-revoke");
    let first = a
        .election(&name)
        .expect("election")
        .campaign("a")
        .await
        .expect("campaign");
    let next = {
        let e = b.election(&name).expect("election");
        tokio::spawn(async move { e.campaign_timeout("b", Duration::from_secs(30)).await })
    };
    wait_for_waiters(&b, &name, LockKind::Election, 1).await;
    let backend = EtcdBackend::connect(&cluster.url(), &ClientOptions::default())
        .await
        .expect("connect");
    let mut etcd = backend.etcd_client().clone();
    let kvs = etcd
        .get(
            backend.election_prefix(&name),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_sort(
                        etcd_client::SortTarget::Create,
                        etcd_client::SortOrder::Ascend,
                    )
                    .with_limit(1),
            ),
        )
        .await
        .expect("get")
        .kvs()
        .to_vec();
    assert_eq!(kvs[0].value(), b"a");
    etcd.lease_revoke(kvs[0].lease()).await.expect("revoke");
    let second = tokio::time::timeout(Duration::from_secs(15), next)
        .await
        .expect("no new leader")
        .expect("join")
        .expect("campaign");
    assert!(second.fencing_token() > first.fencing_token());
    let reason = tokio::time::timeout(Duration::from_secs(10), first.lost())
        .await
        .expect("the old leader never learned");
    assert_eq!(reason, LostReason::NotHeld);
    second.resign().await.expect("resign");
}

/// One candidate through the trait, for proclamations addressed by hand.
async fn candidate(b: &EtcdBackend, name: &str, value: &str) -> distlock_core::backend::GrantRef {
    let mut req = AcquireRequest::new(
        HoldKey::new(name, "trait-owner", LockKind::Election),
        Duration::from_secs(30),
        LostSignal::new(),
    );
    req.value = Some(Arc::from(value));
    match b.acquire(&req).await.expect("acquire") {
        AcquireReply::Granted { token } => req.grant(token),
        other => panic!("not granted: {other:?}"),
    }
}

/// The candidate key of `name` (its value and version: one more per applied put).
async fn candidate_key(b: &EtcdBackend, name: &str) -> (String, i64) {
    let mut etcd = b.etcd_client().clone();
    let r = etcd
        .get(
            b.election_prefix(name),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .expect("get");
    assert_eq!(r.kvs().len(), 1, "{:?}", r.kvs());
    let kv = &r.kvs()[0];
    (
        String::from_utf8_lossy(kv.value()).into_owned(),
        kv.version(),
    )
}

/// Proclamations are numbered: a duplicate and a late one change nothing, and one whose
/// reply is lost (the connection dies after the server applied it) and which the core then
/// retries has the effect of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_proclaim_retried_or_duplicated_applies_once() {
    let cluster = EtcdCluster::start_with_members(1).expect("cluster");
    let direct = EtcdBackend::connect(&cluster.url(), &fast_opts())
        .await
        .expect("connect");
    let name = unique_name("elect-proclaim");
    // The candidate talks through a proxy (the grant and the proclamations: one backend, as
    // through a client); the checks read directly.
    let proxy = DelayProxy::start(cluster.client_addr(0), Duration::ZERO).expect("proxy");
    let via = Arc::new(
        EtcdBackend::connect(&format!("etcd://{}", proxy.addr()), &fast_opts())
            .await
            .expect("connect"),
    );
    let g = candidate(&via, &name, "v0").await;
    assert_eq!(candidate_key(&direct, &name).await, ("v0".into(), 1));
    let renewed = |r: distlock_core::Result<RenewOutcome>| {
        assert_eq!(r.expect("proclaim"), RenewOutcome::Renewed);
    };
    renewed(via.proclaim(&g, 1, "v1").await);
    assert_eq!(candidate_key(&direct, &name).await, ("v1".into(), 2));
    // The same request again: nothing written.
    renewed(via.proclaim(&g, 1, "v1").await);
    assert_eq!(candidate_key(&direct, &name).await, ("v1".into(), 2));
    renewed(via.proclaim(&g, 2, "v2").await);
    // A late duplicate of 1 never overwrites 2.
    renewed(via.proclaim(&g, 1, "v1").await);
    assert_eq!(candidate_key(&direct, &name).await, ("v2".into(), 3));
    // The lease is not touched: the key is on the lease it was granted on.
    let info = via
        .inspect(&name, LockKind::Election)
        .await
        .expect("inspect");
    assert_eq!(info.holders[0].value.as_deref(), Some("v2"));
    assert_eq!(info.holders[0].owner, "trait-owner");
    assert_eq!(info.fencing_token, g.token);

    // Through a proxy that loses the reply with the connection: the proclamation applied,
    // the caller saw an error; its retry (same number) answers Renewed and writes nothing.
    proxy.set_drop_replies(true);
    let lost_reply = {
        let (g, via) = (g.clone(), via.clone());
        tokio::spawn(async move { via.proclaim(&g, 3, "v3").await })
    };
    poll_until(
        "the proclamation to reach etcd",
        async || candidate_key(&direct, &name).await,
        |(v, _)| v == "v3",
    )
    .await;
    let e = lost_reply
        .await
        .expect("join")
        .expect_err("a reply got through a proxy that drops them");
    assert!(e.is_retryable(), "{e}");
    proxy.reset_all();
    proxy.set_drop_replies(false);
    // The core's retry: the same number again, on a new connection.
    let retried = poll_until(
        "the retry to get through",
        async || via.proclaim(&g, 3, "v3").await.ok(),
        Option::is_some,
    )
    .await;
    assert_eq!(retried, Some(RenewOutcome::Renewed));
    assert_eq!(candidate_key(&direct, &name).await, ("v3".into(), 4));

    // Gone: NotHeld, and nothing left behind after the release.
    via.release(&g).await.expect("release");
    assert_eq!(
        via.proclaim(&g, 4, "v4").await.expect("proclaim"),
        RenewOutcome::NotHeld
    );
    assert_nothing_under(&direct, &name).await;
}

/// No candidate key and no metadata key of election `name` is left.
async fn assert_nothing_under(b: &EtcdBackend, name: &str) {
    let mut etcd = b.etcd_client().clone();
    for prefix in [
        b.election_prefix(name),
        format!("{}-election-meta/", b.prefix()).into_bytes(),
    ] {
        let r = etcd
            .get(
                prefix.clone(),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only(),
                ),
            )
            .await
            .expect("get");
        let left: Vec<String> = r
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .filter(|k| k.contains(name))
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

/// A campaign dropped while it waits deletes its candidate key and metadata key; the
/// election and the lock of the same name are apart; a forced release removes the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_cancelled_campaign_leaves_nothing() {
    let cluster = EtcdCluster::start_with_members(1).expect("cluster");
    let a: Client = client(&cluster.url(), opts(Duration::from_secs(2))).await;
    let b: Client = client(&cluster.url(), opts(Duration::from_secs(2))).await;
    let name = unique_name("elect-cancel");
    let leader = a
        .election(&name)
        .expect("election")
        .campaign("a")
        .await
        .expect("campaign");
    // A lock of the same name is another thing.
    let lock = b
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("the lock is free");
    let waiting = {
        let e = b.election(&name).expect("election");
        tokio::spawn(async move { e.campaign("b").await })
    };
    wait_for_waiters(&b, &name, LockKind::Election, 1).await;
    waiting.abort();
    let _ = waiting.await;
    poll_until(
        "the cancelled candidate to leave",
        async || {
            b.inspect_kind(&name, LockKind::Election)
                .await
                .expect("inspect")
                .waiters
        },
        |w| *w == Some(0),
    )
    .await;
    lock.release().await.expect("release");
    // The operator's way out: the leader's keys go, its owner and value are reported, the
    // token moves past it, and the leader learns at its next renewal.
    let forced = b
        .force_release(&name, LockKind::Election)
        .await
        .expect("force");
    assert_eq!(forced.removed.len(), 1, "{forced:?}");
    assert_eq!(forced.removed[0].owner, leader.owner());
    assert_eq!(forced.removed[0].value.as_deref(), Some("a"));
    assert!(forced.fencing_token > leader.fencing_token());
    let reason = tokio::time::timeout(Duration::from_secs(10), leader.lost())
        .await
        .expect("the forced-out leader never learned");
    assert_eq!(reason, LostReason::NotHeld);
    drop(leader);
    let backend = EtcdBackend::connect(&cluster.url(), &ClientOptions::default())
        .await
        .expect("connect");
    poll_until(
        "the election to be empty",
        async || {
            b.inspect_kind(&name, LockKind::Election)
                .await
                .expect("inspect")
                .held()
        },
        |h| !h,
    )
    .await;
    assert_nothing_under(&backend, &name).await;
}
