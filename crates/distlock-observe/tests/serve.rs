//! The server of `dlock serve`, in process, against a real Redis: the JSON API matches what
//! the server holds, `/metrics` parses strictly and carries the state and the process's own
//! client metrics, the event stream tells grants, waits, releases and losses, and a forced
//! release needs `--allow-release` and the token.

use distlock_core::{Client, ClientOptions, LockGuard};
use distlock_observe::{Monitor, ServeOptions};
use distlock_redis::RedisBackend;
use distlock_testkit::http::{request, HttpReply};
use distlock_testkit::RedisServer;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(30);

/// The process's recorder (one per process; every test of this binary shares it).
fn recorder() -> metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("the recorder")
        })
        .clone()
}

async fn client(url: &str) -> Client {
    // Short leases: a removed holder learns it at its next renewal (a third of the lease).
    let opts = ClientOptions::default().watchdog_lease(Duration::from_secs(2));
    let backend = Arc::new(RedisBackend::connect(url, &opts).await.expect("connect"));
    Client::new(backend, opts).expect("client")
}

/// A server over the locks of `url` on a free loopback port; it stops when the sender drops.
async fn start(url: &str, opts: ServeOptions) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let monitor = Arc::new(Monitor::new(client(url).await, ""));
    let listener = distlock_observe::server::bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind");
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let opts = opts.refresh(Duration::from_millis(100));
    tokio::spawn(distlock_observe::server::serve(
        listener,
        monitor,
        opts,
        async {
            let _ = rx.await;
        },
    ));
    (addr, tx)
}

async fn get(addr: SocketAddr, path: &str) -> HttpReply {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || request(addr, "GET", &path, &[], None, PATIENCE))
        .await
        .unwrap()
        .expect("GET")
}

async fn delete(addr: SocketAddr, path: &str, token: Option<&str>) -> HttpReply {
    let path = path.to_owned();
    let auth = token.map(|t| format!("Bearer {t}"));
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| ("Authorization", a))
            .into_iter()
            .collect();
        request(addr, "DELETE", &path, &headers, None, PATIENCE)
    })
    .await
    .unwrap()
    .expect("DELETE")
}

fn json(r: &HttpReply) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

/// `/api/locks` until the lock `name` satisfies `done` (within [`PATIENCE`]).
async fn listed_until(addr: SocketAddr, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let r = get(addr, "/api/locks").await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = json(&r);
        if let Some(l) = v["locks"]
            .as_array()
            .and_then(|a| a.iter().find(|l| l["name"] == name))
        {
            if done(l) {
                return l.clone();
            }
        }
        assert!(t.elapsed() < PATIENCE, "not in time: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn waiter(c: &Client, name: &str, owner: &str) -> tokio::task::JoinHandle<LockGuard> {
    let lock = c.lock(name).unwrap().with_owner(owner).unwrap();
    tokio::spawn(async move { lock.acquire_timeout(PATIENCE).await.expect("waiter") })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_and_metrics_show_what_the_server_holds() {
    let prometheus = recorder();
    let redis = RedisServer::start().expect("redis");
    let url = redis.url();
    let opts = ServeOptions::new()
        .metrics_names(vec!["web-a".into(), "web-never".into()])
        .prometheus(prometheus);
    let (addr, _stop) = start(&url, opts).await;
    let c = client(&url).await;
    let held = c.lock("web-a").unwrap().acquire().await.expect("acquire");
    let w1 = waiter(&c, "web-a", "w1");
    listed_until(addr, "web-a", |l| l["waiters"] == 1).await;
    let w2 = waiter(&c, "web-a", "w2");
    let l = listed_until(addr, "web-a", |l| l["waiters"] == 2).await;

    // The row is what the server holds.
    let info = c.inspect("web-a").await.unwrap();
    assert_eq!(l["kind"], "mutex");
    assert_eq!(l["held"], true);
    assert_eq!(l["holders"][0]["owner"], held.owner(), "{l}");
    assert_eq!(l["holders"][0]["owner"], info.holders[0].owner.as_str());
    let (host, pid) = info.holders[0].origin().expect("a core-made owner id");
    assert_eq!(l["holders"][0]["host"], host);
    assert_eq!(l["holders"][0]["pid"], pid);
    assert_eq!(l["fencing_token"], held.fencing_token());
    let queue: Vec<&str> = l["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["owner"].as_str().unwrap())
        .collect();
    assert_eq!(queue, ["w1", "w2"], "{l}");
    assert!(l["oldest_wait_ms"].as_u64().is_some(), "{l}");
    assert_eq!(
        l["oldest_wait_at_least"], false,
        "Redis records arrivals: {l}"
    );

    // One lock's detail.
    let d = json(&get(addr, "/api/locks/web-a").await);
    assert_eq!(d["name"], "web-a");
    assert_eq!(d["queue"][0]["owner"], "w1", "{d}");
    assert_eq!(d["queue"][1]["owner"], "w2", "{d}");
    // A free lock is free, not an error.
    let free = get(addr, "/api/locks/web-never").await;
    assert_eq!(
        (free.status, json(&free)["held"].clone()),
        (200, Value::Bool(false))
    );
    // Bad input: a 400 that says what to do.
    let bad = get(addr, "/api/locks/web-a?kind=lock").await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(
        json(&bad)["error"]
            .as_str()
            .unwrap()
            .contains("mutex, fair"),
        "{}",
        bad.body
    );
    let bad = get(addr, "/api/locks?sort=size").await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    let long = format!("/api/locks/{}", "x".repeat(2000));
    assert_eq!(get(addr, &long).await.status, 400);
    // Read-only by default.
    let refused = delete(addr, "/api/locks/web-a", Some("anything")).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(c.inspect("web-a").await.unwrap().held());

    // /metrics: strict text format, the state per backend, per name only for the names asked.
    let m = get(addr, "/metrics").await;
    assert_eq!(m.status, 200);
    assert!(m
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let samples =
        distlock_testkit::prom::parse(&m.body).unwrap_or_else(|e| panic!("{e}\n{}", m.body));
    let value = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
    };
    let redis_label = [("backend", "redis")];
    assert_eq!(
        value("dlock_locks_held", &redis_label),
        Some(1.0),
        "{}",
        m.body
    );
    assert_eq!(
        value("dlock_lock_waiters", &redis_label),
        Some(2.0),
        "{}",
        m.body
    );
    assert!(value("dlock_lock_oldest_wait_seconds", &redis_label).is_some_and(|w| w >= 0.0));
    assert_eq!(
        value("dlock_lock_held_by_name", &[("name", "web-a")]),
        Some(1.0)
    );
    assert_eq!(
        value("dlock_lock_waiters_by_name", &[("name", "web-a")]),
        Some(2.0)
    );
    assert_eq!(
        value("dlock_lock_held_by_name", &[("name", "web-never")]),
        Some(0.0)
    );
    assert!(
        samples
            .iter()
            .filter(|s| s.labels.contains_key("name"))
            .all(|s| s.name.ends_with("_by_name")),
        "no per-name label on the other series: {}",
        m.body
    );
    // The process's own client metrics: this process acquired and waited.
    assert!(
        samples
            .iter()
            .any(|s| s.name.starts_with("dlock_acquire_wait_seconds")),
        "client metrics: {}",
        m.body
    );

    held.release().await.unwrap();
    w1.await.unwrap().release().await.unwrap();
    w2.await.unwrap().release().await.unwrap();
    let l = listed_until(addr, "web-a", |l| l["held"] == false).await;
    assert_eq!(l["waiters"], 0, "{l}");
}

/// Reads the event stream of `addr` in a thread: (event, data) pairs.
fn events(addr: SocketAddr) -> mpsc::Receiver<(String, Value)> {
    let (tx, rx) = mpsc::channel();
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    std::thread::spawn(move || {
        let mut event = String::new();
        for line in BufReader::new(s).lines() {
            let Ok(line) = line else { return };
            if line.starts_with("HTTP/1.1 200") && tx.send(("open".into(), Value::Null)).is_err() {
                return;
            }
            if let Some(e) = line.strip_prefix("event: ") {
                event = e.to_owned();
            } else if let Some(d) = line.strip_prefix("data: ") {
                let v = serde_json::from_str(d).unwrap_or(Value::Null);
                if tx.send((std::mem::take(&mut event), v)).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// The next event `kind` of lock `name` (by owner `owner`, when given), skipping others.
async fn next_event(
    rx: &mut mpsc::Receiver<(String, Value)>,
    kind: &str,
    name: &str,
    owner: Option<&str>,
) -> Value {
    let t = Instant::now();
    let mut skipped = Vec::new();
    loop {
        match rx.try_recv() {
            Ok((e, v)) => {
                if e == kind && v["name"] == name && owner.is_none_or(|o| v["owner"] == o) {
                    assert_eq!(v["event"], kind, "{v}");
                    return v;
                }
                skipped.push((e, v));
            }
            Err(mpsc::TryRecvError::Empty) => {
                assert!(
                    t.elapsed() < PATIENCE,
                    "no {kind} of {name}; got {skipped:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("the stream ended: {e}; got {skipped:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_event_stream_tells_grants_waits_releases_and_losses() {
    let redis = RedisServer::start().expect("redis");
    let url = redis.url();
    let (addr, stop) = start(&url, ServeOptions::new()).await;
    // A first look (the baseline: changes are told from there on), then the stream.
    assert_eq!(get(addr, "/api/locks").await.status, 200);
    let rx = events(addr);
    // The reply's head came: the handler has subscribed, no later change is missed.
    let mut rx = tokio::task::spawn_blocking(move || {
        let (first, _) = rx.recv_timeout(PATIENCE).expect("the stream opens");
        assert_eq!(first, "open");
        rx
    })
    .await
    .unwrap();
    let c = client(&url).await;
    let first = c
        .lock("ev")
        .unwrap()
        .with_owner("first")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    next_event(&mut rx, "granted", "ev", Some("first")).await;
    let second = waiter(&c, "ev", "second");
    let w = next_event(&mut rx, "waiting", "ev", None).await;
    assert_eq!(w["owner"], "second", "Redis names the newcomer: {w}");
    first.release().await.unwrap();
    next_event(&mut rx, "released", "ev", Some("first")).await;
    let g = next_event(&mut rx, "granted", "ev", Some("second")).await;
    assert!(g["fencing_token"].as_u64().unwrap() > 0);
    second.await.unwrap().release().await.unwrap();
    next_event(&mut rx, "released", "ev", Some("second")).await;
    // A fixed lease nobody renews runs out: the holder lost it.
    let lapsing = c
        .lock("ev-lapse")
        .unwrap()
        .with_owner("lapsing")
        .unwrap()
        .lease(Duration::from_millis(300))
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    next_event(&mut rx, "granted", "ev-lapse", Some("lapsing")).await;
    next_event(&mut rx, "lost", "ev-lapse", Some("lapsing")).await;
    drop(lapsing);
    // The history keeps them for a page that opens late.
    let h = json(&get(addr, "/api/history").await);
    let kinds: Vec<&str> = h
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    for k in ["granted", "waiting", "released", "lost"] {
        assert!(kinds.contains(&k), "{h}");
    }
    // Stopping the server ends the stream.
    drop(stop);
    let t = Instant::now();
    loop {
        match rx.try_recv() {
            Err(mpsc::TryRecvError::Disconnected) => break,
            _ => {
                assert!(t.elapsed() < PATIENCE, "the stream outlived the server");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forced_release_needs_the_token() {
    let redis = RedisServer::start().expect("redis");
    let url = redis.url();
    let token = "a-release-token-of-32-characters";
    let (addr, _stop) = start(&url, ServeOptions::new().allow_release(token)).await;
    let c = client(&url).await;
    let held = c.lock("stuck").unwrap().acquire().await.unwrap();
    let l = listed_until(addr, "stuck", |l| l["held"] == true).await;
    assert_eq!(l["holders"][0]["owner"], held.owner());
    let none = delete(addr, "/api/locks/stuck", None).await;
    assert_eq!(none.status, 401, "{}", none.body);
    assert!(none.body.contains("Authorization: Bearer"), "{}", none.body);
    let wrong = delete(
        addr,
        "/api/locks/stuck",
        Some("a-release-token-of-32-characterz"),
    )
    .await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert!(
        c.inspect("stuck").await.unwrap().held(),
        "refused requests remove nothing"
    );
    let ok = delete(addr, "/api/locks/stuck", Some(token)).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let v = json(&ok);
    assert_eq!(v["removed"][0], held.owner(), "{v}");
    assert!(v["fencing_token"].as_u64().unwrap() > held.fencing_token());
    tokio::time::timeout(PATIENCE, held.lost())
        .await
        .expect("the removed holder learns it lost the lock");
    listed_until(addr, "stuck", |l| l["held"] == false).await;
    let lists = json(&get(addr, "/api/locks").await);
    assert_eq!(lists["release_allowed"], true);
}
