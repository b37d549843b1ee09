//! Cost as the work grows: critical sections/s and wait p99 for 1 to 256 clients on one name
//! (dlock, its `fair` kind and rslock), 1,000 names × 4 clients, and (dlock only) 1,000
//! waiters queued on one name: the server's memory for them and how soon the head of the queue
//! gets the lock once it is released.

use super::*;

/// Clients on one name, one point of the curve each.
pub(super) const CROWDS: [usize; 5] = [1, 4, 16, 64, 256];
/// Names of the many-names scenario, and clients on each.
pub(super) const NAMES: usize = 1000;
pub(super) const PER_NAME: usize = 4;
/// Waiters queued on one name.
pub(super) const WAITERS: usize = 1000;

/// One point of a curve.
pub(super) struct Point {
    pub(super) clients: usize,
    pub(super) c: Contended,
}

/// The one-name curve of `peer`.
pub(super) async fn one_name_curve<P: Peer>(
    peer: &P,
    nodes: &[String],
    run: Duration,
) -> Res<Vec<Point>> {
    let mut points = Vec::new();
    for clients in CROWDS {
        let tag = format!("curve-{}-{clients}", P::NAME.replace(' ', "-"));
        let c = crowd(peer, nodes, 1, clients, run, &tag).await?;
        print_contended(
            &format!("curve, {clients:3} clients, one name"),
            P::NAME,
            &c,
        );
        points.push(Point { clients, c });
    }
    Ok(points)
}

/// `NAMES` names, `PER_NAME` clients taking part on every one.
pub(super) async fn many_names<P: Peer>(
    peer: &P,
    nodes: &[String],
    run: Duration,
) -> Res<Contended> {
    let tag = format!("names-{}", P::NAME.replace(' ', "-"));
    let c = crowd(peer, nodes, NAMES, PER_NAME, run, &tag).await?;
    print_contended(&format!("{NAMES} names × {PER_NAME} clients"), P::NAME, &c);
    Ok(c)
}

/// `WAITERS` waiters on one name, queued behind one holder, then let through one by one.
pub(super) struct Queue {
    pub(super) kind: &'static str,
    pub(super) waiters: usize,
    /// The server's `used_memory` with the waiters queued, less before, per waiter.
    pub(super) bytes_per_waiter: f64,
    /// From the release of a holder to the grant of the next (the head of the queue).
    pub(super) head_p50: Duration,
    pub(super) head_p99: Duration,
    /// The first handoff, with the whole queue behind the head.
    pub(super) first: Duration,
    /// How long the queue took to drain.
    pub(super) drained: Duration,
}

/// `WAITERS` handles (10 clients of 100 each) wait for the lock `peer` holds.
pub(super) async fn queue<P: Peer<Client = Client, Locker = distlock::Lock>>(
    peer: &P,
    url: &str,
    kind: &'static str,
) -> Res<Queue> {
    let name = format!("peers-queue-{kind}");
    let mut info = connection(url).await?;
    let holder_client = peer.client(&[url.to_owned()]).await?;
    let holder = peer.locker(&holder_client, &name)?;
    let first_guard = holder.acquire_timeout(DEADLINE).await?;
    let before = used_memory(&mut info).await?;
    let clients = 10;
    // Each waiter's grant time and release time.
    let log: Arc<std::sync::Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = peer.client(&[url.to_owned()]).await?;
        for _ in 0..WAITERS / clients {
            let l = peer.locker(&client, &name)?;
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let g = l.acquire_timeout(Duration::from_secs(120)).await?;
                let got = Instant::now();
                g.release().await?;
                let gone = Instant::now();
                log.lock().map_err(|_| "poisoned")?.push((got, gone));
                Res::Ok(())
            }));
        }
    }
    // Until the server has every waiter queued.
    let queued_by = Instant::now() + Duration::from_secs(60);
    loop {
        let waiters = holder_client
            .inspect_kind(&name, holder.kind())
            .await?
            .waiters;
        if waiters.unwrap_or(0) as usize >= WAITERS {
            break;
        }
        if Instant::now() > queued_by {
            return Err(format!("{kind}: only {waiters:?} of {WAITERS} waiters queued").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let queued = used_memory(&mut info).await?;
    let released = Instant::now();
    first_guard.release().await?;
    for t in tasks {
        t.await??;
    }
    let drained = released.elapsed();
    let mut log = std::mem::take(&mut *log.lock().map_err(|_| "poisoned")?);
    log.sort_unstable();
    let mut heads = Vec::new();
    let mut prev_release = released;
    for &(got, gone) in &log {
        heads.push(got.saturating_duration_since(prev_release));
        prev_release = gone;
    }
    let first = heads.first().copied().unwrap_or_default();
    Ok(Queue {
        kind,
        waiters: log.len(),
        bytes_per_waiter: queued.saturating_sub(before) as f64 / WAITERS as f64,
        head_p50: pct(&mut heads, 0.5),
        head_p99: pct(&mut heads, 0.99),
        first,
        drained,
    })
}

async fn used_memory(con: &mut redis::aio::MultiplexedConnection) -> Res<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(con).await?;
    Ok(info_num(&info, "used_memory:", None))
}

pub(super) fn print_queue(q: &Queue) {
    println!(
        "{WAITERS} waiters on one name, dlock {}: server memory {:.0} bytes per waiter, head wake-up after a release p50 {:.0} µs p99 {:.0} µs (first, whole queue behind it: {:.0} µs), {} waiters through in {:.0} ms",
        q.kind,
        q.bytes_per_waiter,
        us(q.head_p50),
        us(q.head_p99),
        us(q.first),
        q.waiters,
        ms(q.drained)
    );
}

/// Everything the curves show.
pub(super) struct Curves {
    pub(super) dlock: Vec<Point>,
    pub(super) fair: Vec<Point>,
    pub(super) rslock: Vec<Point>,
    /// dlock, rslock.
    pub(super) names: Option<(Contended, Contended)>,
    pub(super) queues: Vec<Queue>,
    pub(super) held: Vec<Watchdog>,
}

pub(super) fn print_curves(c: &Curves) {
    println!();
    println!("| clients on one name | dlock | dlock `fair` | rslock 0.10 | dlock/rslock |");
    println!("|---|---|---|---|---|");
    for ((d, f), r) in c.dlock.iter().zip(&c.fair).zip(&c.rslock) {
        println!(
            "| {} | {:.0}/s, p99 {:.1} ms | {:.0}/s, p99 {:.1} ms | {:.0}/s, p99 {:.1} ms | {:.2}× ops, {:.3}× p99 |",
            d.clients,
            d.c.per_sec,
            ms(d.c.p99),
            f.c.per_sec,
            ms(f.c.p99),
            r.c.per_sec,
            ms(r.c.p99),
            x(d.c.per_sec, r.c.per_sec),
            x(us(d.c.p99), us(r.c.p99))
        );
    }
    if let Some((d, r)) = &c.names {
        println!(
            "| {NAMES} names × {PER_NAME} clients | {:.0}/s, p99 {:.1} ms | | {:.0}/s, p99 {:.1} ms | {:.2}× ops, {:.3}× p99 |",
            d.per_sec,
            ms(d.p99),
            r.per_sec,
            ms(r.p99),
            x(d.per_sec, r.per_sec),
            x(us(d.p99), us(r.p99))
        );
    }
    println!();
    println!("| dlock, locks held by one client | RSS | round trips per renewal tick | EVALSHA per tick |");
    println!("|---|---|---|---|");
    for w in &c.held {
        println!(
            "| {} | {:.1} MB (+{:.1} MB) | {:.1} | {:.1} |",
            w.held,
            w.rss_held,
            w.rss_held - w.rss_before,
            w.round_trips(),
            w.mean(|t| t.evalsha as f64)
        );
    }
    println!();
    println!("| dlock, {WAITERS} waiters on one name | server memory per waiter | head wake-up p50 | p99 | first (whole queue behind) |");
    println!("|---|---|---|---|---|");
    for q in &c.queues {
        println!(
            "| {} | {:.0} bytes | {:.0} µs | {:.0} µs | {:.0} µs |",
            q.kind,
            q.bytes_per_waiter,
            us(q.head_p50),
            us(q.head_p99),
            us(q.first)
        );
    }
}

/// The curves as an SVG plot (`--svg FILE`).
pub(super) fn curves_svg(c: &Curves, run: Duration) -> String {
    use super::svg::{plot, Panel, Series};
    let lines = |f: fn(&Contended) -> f64| {
        vec![
            Series {
                label: "dlock".into(),
                color: "#1f77b4",
                points: c
                    .dlock
                    .iter()
                    .map(|p| (p.clients as f64, f(&p.c)))
                    .collect(),
            },
            Series {
                label: "dlock fair".into(),
                color: "#2ca02c",
                points: c.fair.iter().map(|p| (p.clients as f64, f(&p.c))).collect(),
            },
            Series {
                label: "rslock 0.10".into(),
                color: "#d62728",
                points: c
                    .rslock
                    .iter()
                    .map(|p| (p.clients as f64, f(&p.c)))
                    .collect(),
            },
        ]
    };
    let held = |f: fn(&Watchdog) -> f64, label: &str| Series {
        label: label.into(),
        color: "#1f77b4",
        points: c.held.iter().map(|w| (w.held as f64, f(w))).collect(),
    };
    let panels = [
        Panel {
            title: "critical sections/s, one name".into(),
            x_label: "clients".into(),
            y_label: "critical sections/s".into(),
            log_y: false,
            series: lines(|c| c.per_sec),
        },
        Panel {
            title: "wait p99, one name".into(),
            x_label: "clients".into(),
            y_label: "ms (log)".into(),
            log_y: true,
            series: lines(|c| ms(c.p99)),
        },
        Panel {
            title: "dlock watchdog: client RSS".into(),
            x_label: "locks held by one client".into(),
            y_label: "MB".into(),
            log_y: false,
            series: vec![held(|w| w.rss_held, "dlock RSS")],
        },
        Panel {
            title: "dlock watchdog: round trips per renewal tick".into(),
            x_label: "locks held by one client".into(),
            y_label: "round trips (log)".into(),
            log_y: true,
            series: vec![held(|w| w.round_trips(), "dlock")],
        },
    ];
    let mut notes = Vec::new();
    if let Some((d, r)) = &c.names {
        notes.push(format!(
            "{NAMES} names × {PER_NAME} clients: dlock {:.0}/s p99 {:.1} ms, rslock {:.0}/s p99 {:.1} ms.",
            d.per_sec,
            ms(d.p99),
            r.per_sec,
            ms(r.p99)
        ));
    }
    for q in &c.queues {
        notes.push(format!(
            "dlock {}, {WAITERS} waiters on one name: {:.0} bytes of server memory each; head wake-up p50 {:.0} µs, p99 {:.0} µs.",
            q.kind,
            q.bytes_per_waiter,
            us(q.head_p50),
            us(q.head_p99)
        ));
    }
    notes.push(format!(
        "One run of `cargo bench -p distlock-lab --bench peers -- --svg FILE`, {run:?} per point; critical section = GET + SET of a counter."
    ));
    plot("dlock vs rslock: cost as the work grows", &panels, &notes)
}
