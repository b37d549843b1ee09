//! `dlock seckill` end to end: the real program, real worker processes, a real file directory
//! and a real redis-server.

mod common;

use common::{check_strategies, dlock, file_backend, left_in, n, row, seckill_json, text};
use distlock_testkit::RedisServer;
use serde_json::Value;

const KEYS: [&str; 15] = [
    "strategy",
    "backend",
    "stock",
    "buyers",
    "processes",
    "sold",
    "oversold",
    "failed",
    "elapsed_ms",
    "p50_wait_us",
    "p99_wait_us",
    "lost_updates",
    "late_writes",
    "fenced_rejections",
    "paused_buyer",
];

/// What every strategy guarantees, whatever the timing, and the shape of the rows.
fn check_all(rows: &[Value], backend: &str) {
    check_strategies(rows, backend);
    for r in rows {
        let obj = r.as_object().expect("object");
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        assert_eq!(keys, KEYS, "{r}");
        assert_eq!(n(r, "stock"), 10);
        assert_eq!(n(r, "buyers"), 30);
        assert_eq!(n(r, "processes"), 3);
        assert!(r["elapsed_ms"].as_f64().is_some_and(|e| e > 0.0), "{r}");
    }
    // Waits are reported exactly for the strategies with a lock.
    for s in ["local", "trylock", "lock", "fenced"] {
        let r = row(rows, s);
        assert!(
            r["p50_wait_us"].is_u64() && r["p99_wait_us"].is_u64(),
            "{r}"
        );
        assert!(n(r, "p50_wait_us") <= n(r, "p99_wait_us"), "{r}");
    }
    for s in ["none", "optimistic"] {
        let r = row(rows, s);
        assert!(
            r["p50_wait_us"].is_null() && r["p99_wait_us"].is_null(),
            "{r}"
        );
    }
}

#[test]
fn file_backend_all_strategies() {
    let (dir, url) = file_backend("distlock-lab-seckill");
    let rows = seckill_json(&url, &["--strategy", "all"]);
    check_all(&rows, "file");
    // The store files and the lock files are gone afterwards.
    let left = left_in(&dir);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn redis_backend_all_strategies() {
    let redis = RedisServer::start().expect("redis-server");
    let rows = seckill_json(&redis.url(), &["--strategy", "all"]);
    check_all(&rows, "redis");
    // Stock, version, orders and the locks' fencing counters are gone afterwards.
    assert_eq!(redis.command(&["DBSIZE"]).expect("DBSIZE"), "0");
}

/// `--strategy lock,fenced --pause 2500ms --lease 1s`: a buyer holding the lock is stopped past
/// its lease; the lock goes on to the others; it comes back and writes the stock it read.
/// `lock` lets that write land, `fenced` rejects it and sells exactly the stock.
fn paused_holder(url: &str, backend: &str, extra: &[&str]) {
    let mut args = vec![
        "--strategy",
        "lock,fenced",
        "--pause",
        "2500ms",
        "--lease",
        "1s",
    ];
    args.extend_from_slice(extra);
    let rows = seckill_json(url, &args);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(r["backend"], backend, "{r}");
        assert!(r["paused_buyer"].is_u64(), "a buyer was paused: {r}");
        assert!(
            n(r, "late_writes") >= 1,
            "the paused buyer wrote after its lease: {r}"
        );
    }
    let lock = row(&rows, "lock");
    assert!(
        n(lock, "lost_updates") > 0,
        "the late write of `lock` overwrote the others' decrements: {lock}"
    );
    assert!(n(lock, "oversold") > 0, "and so oversold: {lock}");
    assert_eq!(n(lock, "fenced_rejections"), 0, "{lock}");
    let fenced = row(&rows, "fenced");
    assert!(n(fenced, "fenced_rejections") >= 1, "{fenced}");
    assert_eq!(
        (
            n(fenced, "sold"),
            n(fenced, "oversold"),
            n(fenced, "lost_updates")
        ),
        (10, 0, 0),
        "{fenced}"
    );
}

#[test]
fn file_backend_pause_lock_and_fenced() {
    let (dir, url) = file_backend("distlock-lab-pause");
    let svg_path = dir.path().join("pause.svg");
    let svg_arg = svg_path.to_str().expect("utf-8 path").to_owned();
    paused_holder(&url, "file", &["--timeline", svg_arg.as_str()]);
    // The timeline shows the pause, the lost lease, the late write that landed (`lock`) and
    // the one the fence rejected (`fenced`).
    let svg = std::fs::read_to_string(&svg_path).expect("timeline written");
    assert_eq!(
        svg.matches(r#"class="pause""#).count(),
        2,
        "one pause per strategy"
    );
    assert_eq!(svg.matches(r#"class="mark lease-lost""#).count(), 2);
    assert!(svg.matches(r#"class="mark late-write""#).count() >= 1);
    assert!(svg.matches(r#"class="mark rejected""#).count() >= 1);
    std::fs::remove_file(&svg_path).expect("remove the timeline");
    let left = left_in(&dir);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn redis_backend_pause_lock_and_fenced() {
    let redis = RedisServer::start().expect("redis-server");
    paused_holder(&redis.url(), "redis", &[]);
    assert_eq!(redis.command(&["DBSIZE"]).expect("DBSIZE"), "0");
}

#[test]
fn timeline_svg() {
    let (dir, url) = file_backend("distlock-lab-timeline");
    let svg_path = dir.path().join("run.svg");
    let svg_arg = svg_path.to_str().expect("utf-8 path").to_owned();
    let rows = seckill_json(
        &url,
        &["--strategy", "none,lock", "--timeline", svg_arg.as_str()],
    );
    assert_eq!(rows.len(), 2);
    let oversold = n(row(&rows, "none"), "oversold");
    assert!(oversold > 0);
    assert_eq!(n(row(&rows, "lock"), "oversold"), 0);

    let svg = std::fs::read_to_string(&svg_path).expect("timeline written");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<g").count(), svg.matches("</g>").count());
    // One block per strategy, one lane per worker process in each.
    assert_eq!(svg.matches(r#"class="block""#).count(), 2);
    assert!(svg.contains(r#"data-strategy="none""#) && svg.contains(r#"data-strategy="lock""#));
    assert_eq!(svg.matches(r#"class="lane""#).count(), 6);
    // Every order is marked; the oversold ones in red.
    let sold: u64 = rows.iter().map(|r| n(r, "sold")).sum();
    assert_eq!(svg.matches(r#"class="order"#).count() as u64, sold);
    assert_eq!(
        svg.matches(r#"class="order oversold""#).count() as u64,
        oversold
    );
    assert!(svg.contains("#d62728"));
    // Bars: the unprotected windows of `none`, the holds of `lock` (one per buyer).
    assert!(svg.contains(r#"class="window""#));
    assert_eq!(svg.matches(r#"class="hold""#).count(), 30);
    assert!(svg.contains("legend"));
}

#[test]
fn table_output() {
    let (_dir, url) = file_backend("distlock-lab-table");
    let out = dlock(
        &url,
        &["seckill", "--strategy", "none,lock", "--work-ms", "20"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("stock 10, 30 buyers in 3 processes"),
        "{stdout}"
    );
    assert!(stdout.contains("wait p99 µs"), "{stdout}");
    let line = |s: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(s))
            .unwrap_or_else(|| panic!("no `{s}` row in\n{stdout}"))
            .to_owned()
    };
    assert!(line("none ").ends_with("OVERSOLD"), "{stdout}");
    assert!(line("lock ").ends_with("sold out"), "{stdout}");
    assert!(
        line("none ").contains(" - "),
        "no wait for `none`: {stdout}"
    );
    // No progress bar when stderr is not a terminal.
    assert!(!text(&out.stderr).contains('#'), "{}", text(&out.stderr));
}

#[test]
fn zero_stock_sells_nothing() {
    let (_dir, url) = file_backend("distlock-lab-zero");
    let args = ["seckill", "--json", "--stock", "0", "--buyers", "6"];
    let rows = common::json_lines(&url, &[&args[..], &["--work-ms", "1"]].concat());
    assert_eq!(rows.len(), 6);
    for r in &rows {
        assert_eq!(
            (n(r, "sold"), n(r, "oversold"), n(r, "failed")),
            (0, 0, 6),
            "{r}"
        );
    }
}

#[test]
fn fewer_buyers_than_processes() {
    let (_dir, url) = file_backend("distlock-lab-few");
    let args = ["seckill", "--json", "--buyers", "2", "--processes", "5"];
    let rows = common::json_lines(&url, &[&args[..], &["--strategy", "lock"]].concat());
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!((n(r, "processes"), n(r, "sold")), (2, 2), "{r}");
}

#[test]
fn bad_input() {
    let (_dir, url) = file_backend("distlock-lab-bad");

    let out = dlock(&url, &["seckill", "--processes", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--processes"),
        "{}",
        text(&out.stderr)
    );

    let out = dlock(&url, &["seckill", "--strategy", "none,pessimistic"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("unknown strategy `pessimistic`"), "{err}");
    assert!(err.contains("optimistic, trylock, lock"), "{err}");

    let out = dlock(&url, &["seckill", "--buyers", "0"]);
    assert_eq!(out.status.code(), Some(2));

    // A lease the watchdog cannot keep, a pause of nothing: refused before any worker starts.
    let out = dlock(&url, &["seckill", "--lease", "10ms"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("--lease") && err.contains("too short"),
        "{err}"
    );
    let out = dlock(&url, &["seckill", "--pause", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--pause must be above zero"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());

    // A scheme without a store (postgres:// etc. have one with their feature: tests/stores.rs).
    let out = dlock("nope://db.invalid/shop", &["seckill"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("nope://") && err.contains("no store"), "{err}");
    assert!(out.stdout.is_empty());

    // An unreachable Redis: a clear error, exit 1, no hang.
    let port = distlock_testkit::free_port();
    let out = dlock(
        &format!("redis://127.0.0.1:{port}"),
        &["seckill", "--strategy", "none"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("dlock: seckill"),
        "{}",
        text(&out.stderr)
    );
}
