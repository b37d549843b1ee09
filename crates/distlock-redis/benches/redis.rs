//! `cargo bench -p distlock-redis`: dlock on one real redis-server, against a plain PING round
//! trip measured in the same run (the machine is shared and noisy; ratios travel, absolute
//! figures do not).
//!
//! - uncontended: one client, acquire + release in a loop;
//! - handoff: a waiter subscribed on the lock, time from the holder's release call to the
//!   waiter's grant;
//! - contended: 32 clients on one name, critical sections per second, acquire wait p50/p99.

use distlock_core::{Client, ClientOptions};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisServer;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn client(url: &str) -> (Client, Arc<RedisBackend>) {
    let opts = ClientOptions::default();
    let b = Arc::new(RedisBackend::connect(url, &opts).await.expect("connect"));
    (Client::new(b.clone(), opts).expect("client"), b)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 300 } else { 3000 };
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let (c, backend) = client(&url).await;

    // Warm up connections and scripts.
    for _ in 0..200 {
        backend.ping().await.expect("ping");
        let g = c
            .lock("warm")
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        let _ = g.release().await.expect("release");
    }

    let mut ping = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        backend.ping().await.expect("ping");
        ping.push(t.elapsed());
    }
    let lock = c.lock("uncontended").expect("lock");
    let mut pair = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let g = lock.acquire().await.expect("acquire");
        let _ = g.release().await.expect("release");
        pair.push(t.elapsed());
    }
    // The same pair through the backend trait alone (no guard, no watchdog bookkeeping).
    use distlock_core::Backend;
    let key = distlock_core::backend::HoldKey::new("raw", "bench", distlock_core::LockKind::Mutex);
    let mut raw = Vec::with_capacity(n);
    for _ in 0..n {
        // One attempt per acquisition, as the core makes them.
        let req = distlock_core::backend::AcquireRequest::new(
            key.clone(),
            Duration::from_secs(30),
            distlock_core::LostSignal::new(),
        );
        let t = Instant::now();
        let token = match backend.acquire(&req).await.expect("acquire") {
            distlock_core::backend::AcquireReply::Granted { token } => token,
            other => panic!("not granted: {other:?}"),
        };
        let _ = backend.release(&req.grant(token)).await.expect("release");
        raw.push(t.elapsed());
    }
    let raw50 = pct(&mut raw, 0.5);
    let ping50 = pct(&mut ping, 0.5);
    let pair50 = pct(&mut pair, 0.5);
    println!("PING round trip            p50 {:>8.1} us", us(ping50));
    println!(
        "backend acquire+release    p50 {:>8.1} us  = {:.2} PING round trips (two EVALSHAs)",
        us(raw50),
        us(raw50) / us(ping50)
    );
    println!(
        "acquire+release (1 client) p50 {:>8.1} us  = {:.2} PING round trips (goal <= 2.5)",
        us(pair50),
        us(pair50) / us(ping50)
    );

    // Handoff: holder releases while a waiter (own client) waits.
    let (w, _) = client(&url).await;
    let rounds = if quick { 50 } else { 300 };
    let mut handoff = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let name = format!("handoff-{i}");
        let g = c
            .lock(&name)
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        let wl = w.lock(&name).expect("lock");
        let waiter = tokio::spawn(async move {
            let g = wl.acquire().await.expect("waiter");
            let at = Instant::now();
            let _ = g.release().await;
            at
        });
        // Let the waiter try once and subscribe. Spin rather than sleep: after an idle sleep
        // the first wake-up of parked threads and of the server costs more than the handoff
        // itself on a VM, which PING in a tight loop does not pay either.
        let until = Instant::now() + Duration::from_millis(2);
        while Instant::now() < until {
            backend.ping().await.expect("ping");
        }
        let t0 = Instant::now();
        let _ = g.release().await.expect("release");
        let got = waiter.await.expect("join");
        handoff.push(got.saturating_duration_since(t0));
    }
    let h50 = pct(&mut handoff, 0.5);
    println!(
        "handoff to a waiter        p50 {:>8.1} us  = {:.2} PING round trips (goal <= 3)",
        us(h50),
        us(h50) / us(ping50)
    );

    // 32 contenders, each its own client.
    let clients = 32;
    let dur = Duration::from_secs(if quick { 1 } else { 5 });
    let mut tasks = Vec::new();
    let start = Instant::now() + Duration::from_millis(200);
    for _ in 0..clients {
        let (cl, _) = client(&url).await;
        tasks.push(tokio::spawn(async move {
            let lock = cl.lock("contended").expect("lock");
            tokio::time::sleep_until(start.into()).await;
            let mut waits = Vec::new();
            while start.elapsed() < dur {
                let t = Instant::now();
                let g = lock.acquire().await.expect("acquire");
                waits.push(t.elapsed());
                let _ = g.release().await.expect("release");
            }
            waits
        }));
    }
    let mut waits = Vec::new();
    let mut per_client = Vec::new();
    for t in tasks {
        let w = t.await.expect("join");
        per_client.push(w.len());
        waits.extend(w);
    }
    let ops = waits.len();
    let p50 = pct(&mut waits, 0.5);
    let p99 = pct(&mut waits, 0.99);
    println!(
        "32 contenders: {:.0} critical sections/s, wait p50 {:.0} us p99 {:.0} us, per-client ops min {} max {}",
        ops as f64 / dur.as_secs_f64(),
        us(p50),
        us(p99),
        per_client.iter().min().copied().unwrap_or(0),
        per_client.iter().max().copied().unwrap_or(0)
    );
}
