//! Helpers shared by this crate's test files (each includes it with `mod common;`).
#![allow(dead_code)] // each test file uses a part

use distlock_core::{Client, ClientOptions, LockGuard, ReleaseOutcome};
use distlock_etcd::EtcdBackend;
use distlock_testkit::conformance::poll_until;
use distlock_testkit::EtcdCluster;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// A client of its own backend (its own connection) on the cluster at `url`.
pub async fn client_at(url: &str, opts: ClientOptions) -> Client {
    let backend = EtcdBackend::connect(url, &opts).await.expect("connect");
    Client::new(Arc::new(backend), opts).expect("client")
}

/// Acquires mutex `name` through `c`, waiting as long as it takes.
pub async fn hold(c: &Client, name: &str) -> LockGuard {
    c.lock(name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire")
}

/// `etcdctl`, or `None` (the test is skipped, saying so; under `DLOCK_TEST_STRICT` it fails)
/// if it is not installed.
pub fn etcdctl() -> Option<&'static str> {
    let path = "/usr/bin/etcdctl";
    if Path::new(path).exists() {
        Some(path)
    } else {
        distlock_testkit::skip_or_fail(
            "the etcdctl interoperability test",
            &format!("{path} not found (Debian package etcd-client)"),
        );
        None
    }
}

/// A child process killed when the test ends, however it ends.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `etcdctl lock dlock/<name> -- sh -c <script>` against every member of `cluster`.
pub fn etcdctl_lock(bin: &str, cluster: &EtcdCluster, name: &str, script: &str) -> Reaped {
    let endpoints: Vec<String> = (0..cluster.len())
        .map(|i| cluster.client_addr(i).to_string())
        .collect();
    let child = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["lock", &format!("dlock/{name}"), "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn etcdctl");
    Reaped(child)
}

pub async fn file_appears(path: &Path) {
    let p = path.to_owned();
    poll_until(
        &format!("{} to appear", path.display()),
        async || p.exists(),
        |e| *e,
    )
    .await;
}

/// Waits until `child` has exited, and returns its status.
pub async fn exits(child: &mut Reaped) -> Option<ExitStatus> {
    poll_until(
        "etcdctl to exit",
        async || child.0.try_wait().expect("wait"),
        Option::is_some,
    )
    .await
}

pub async fn exits_ok(child: &mut Reaped) {
    let status = exits(child).await;
    assert!(status.is_some_and(|s| s.success()), "etcdctl: {status:?}");
}

/// Releases `g` and checks that it was still held.
pub async fn released(g: LockGuard) {
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Acquires mutex `name` through `c` within `timeout`; `what` names the step if it fails.
pub async fn hold_within(c: &Client, name: &str, timeout: Duration, what: &str) -> LockGuard {
    c.lock(name)
        .expect("lock")
        .acquire_timeout(timeout)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The password of user `root` on [`secured`] clusters.
pub const PASSWORD: &str = "hunter2-Ÿ-s3cret";

/// A TLS member (no client certificates) with user `root` (password [`PASSWORD`]) and
/// authentication enabled.
pub async fn secured() -> EtcdCluster {
    let cluster = EtcdCluster::start_tls(1, false).expect("tls cluster");
    let ca = std::fs::read(cluster.certs().expect("certs").ca()).expect("ca");
    let tls = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(ca));
    let co = etcd_client::ConnectOptions::new().with_tls(tls);
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), Some(co))
        .await
        .expect("admin");
    admin.user_add("root", PASSWORD, None).await.expect("user");
    admin.role_add("root").await.expect("role");
    admin.user_grant_role("root", "root").await.expect("grant");
    admin.auth_enable().await.expect("auth enable");
    cluster
}

/// The conformance harness on `cluster` (plain or TLS: its `url()` says how to connect): one
/// member behind the proxy (the client balances requests over the members it is given, so a
/// fault on one of several proxies might see no traffic at all); a lock is broken by deleting
/// its whole queue.
pub fn harness(cluster: EtcdCluster) -> distlock_testkit::conformance::ServerHarness<EtcdCluster> {
    distlock_testkit::conformance::ServerHarness::new(
        cluster,
        EtcdCluster::url,
        |url, o| async move { EtcdBackend::connect(&url, &o).await },
    )
    .proxy(|c| vec![c.client_addr(0)])
    .break_lock(|c, name| async move {
        let b = EtcdBackend::connect(&c.url(), &ClientOptions::default())
            .await
            .expect("connect");
        let all = Some(etcd_client::DeleteOptions::new().with_prefix());
        let r = b
            .etcd_client()
            .kv_client()
            .delete(b.queue_prefix(&name), all)
            .await;
        assert!(r.expect("delete").deleted() >= 1, "nothing to delete");
    })
}
