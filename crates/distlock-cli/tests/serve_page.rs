//! The page of `dlock serve` in a real headless browser (Debian's `chromium` driven through
//! `chromedriver` over WebDriver): a lock acquired by another client appears with its name
//! and holder; released, it shows free. Every check polls the page's DOM until a deadline; no
//! sleep stands in for one.

mod ops_common;
use distlock_testkit::http::request;
use distlock_testkit::RedisServer;
use ops_common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(60);
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A WebDriver session on a chromedriver of our own.
struct Browser {
    driver: SocketAddr,
    session: String,
    _process: Killed,
    /// Chromium's profile, removed after the session and the driver end.
    _profile: distlock_testkit::TempDir,
}

impl Browser {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string());
        let r = request(self.driver, method, path, &[], body.as_deref(), PATIENCE)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        assert_eq!(r.status, 200, "WebDriver {method} {path}: {}", r.body);
        v["value"].clone()
    }

    /// Starts chromedriver and a headless Chromium session; `None` when they are missing.
    fn start() -> Option<Browser> {
        for bin in [CHROMIUM, CHROMEDRIVER] {
            if !std::path::Path::new(bin).exists() {
                distlock_testkit::skip_or_fail(
                    "serve_page",
                    &format!("{bin} is missing (apt-get install chromium chromium-driver)"),
                );
                return None;
            }
        }
        let port = distlock_testkit::free_port();
        let process = Killed(
            Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver"),
        );
        let driver: SocketAddr = ([127, 0, 0, 1], port).into();
        let t = Instant::now();
        loop {
            let ready = request(driver, "GET", "/status", &[], None, PATIENCE)
                .ok()
                .and_then(|r| serde_json::from_str::<Value>(&r.body).ok())
                .is_some_and(|v| v["value"]["ready"] == true);
            if ready {
                break;
            }
            assert!(t.elapsed() < PATIENCE, "chromedriver did not get ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = distlock_testkit::TempDir::with_prefix("dlock-chromium").expect("dir");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--no-first-run",
                         format!("--user-data-dir={}", profile.path().display())],
            },
        }}});
        let r = request(
            driver,
            "POST",
            "/session",
            &[],
            Some(&caps.to_string()),
            PATIENCE,
        )
        .expect("new session");
        let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {}", r.body))
            .to_owned();
        Some(Browser {
            driver,
            session,
            _process: process,
            _profile: profile,
        })
    }

    fn open(&self, url: &str) {
        let path = format!("/session/{}/url", self.session);
        self.call("POST", &path, Some(json!({ "url": url })));
    }

    /// Runs `script` in the page (a function body) until its value satisfies `done`, or
    /// fails with the last value after [`PATIENCE`].
    fn until(&self, what: &str, script: &str, done: impl Fn(&Value) -> bool) -> Value {
        let path = format!("/session/{}/execute/sync", self.session);
        let t = Instant::now();
        loop {
            let v = self.call("POST", &path, Some(json!({ "script": script, "args": [] })));
            if done(&v) {
                return v;
            }
            assert!(t.elapsed() < PATIENCE, "{what}: the page shows {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let path = format!("/session/{}", self.session);
        let _ = request(
            self.driver,
            "DELETE",
            &path,
            &[],
            None,
            Duration::from_secs(10),
        );
    }
}

/// `dlock serve` on a free loopback port: the process and its address.
fn serve(url: &str) -> (Killed, SocketAddr) {
    let mut child = Command::new(DLOCK)
        .env("DLOCK_BACKEND", url)
        .args(["serve", "--listen", "127.0.0.1:0", "--refresh", "200ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("dlock serve");
    let out = child.stdout.take().expect("stdout");
    let child = Killed(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).expect("read");
    let addr = line
        .trim()
        .strip_prefix("dlock serve: listening on http://")
        .and_then(|a| a.strip_suffix('/'))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (child, addr)
}

/// What the page's table shows of lock `name`: [held, holder cell], or null when absent.
fn row_script(name: &str) -> String {
    format!(
        "const r = document.querySelector('#locks tbody tr[data-name=\"{name}\"]'); \
         return r ? [r.dataset.held, r.querySelector('td.holder').textContent, \
         r.querySelector('td.token').textContent] : null;"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_lock_held_then_free() {
    let Some(browser) = Browser::start() else {
        return;
    };
    let redis = RedisServer::start().expect("redis");
    let url = redis.url();
    let (_serve, addr) = serve(&url);
    let browser = tokio::task::spawn_blocking(move || {
        browser.open(&format!("http://{addr}/"));
        browser.until(
            "the page loads the backend",
            "return document.getElementById('backend').textContent;",
            |v| v.as_str().is_some_and(|s| s.starts_with("redis")),
        );
        browser
    })
    .await
    .unwrap();

    let (_c, held) = hold(&url, "page-lock", Duration::from_secs(5)).await;
    let owner = held.owner().to_owned();
    let token = held.fencing_token().to_string();
    let script = row_script("page-lock");
    let browser = tokio::task::spawn_blocking(move || {
        let v = browser.until("the lock shows held by its holder", &script, |v| {
            v[0] == "true" && v[1] == owner.as_str()
        });
        assert_eq!(v[2], token.as_str(), "the fencing token: {v}");
        browser
    })
    .await
    .unwrap();

    held.release().await.expect("release");
    let script = row_script("page-lock");
    tokio::task::spawn_blocking(move || {
        browser.until("the lock shows free", &script, |v| {
            v[0] == "false" && v[1] == "free"
        });
        // The event stream fed the timeline's log: the grant and the release.
        browser.until(
            "the events list the grant and the release",
            "return [...document.querySelectorAll('#events li')].map(li => li.textContent).join('\\n');",
            |v| {
                v.as_str().is_some_and(|s| {
                    s.contains("granted page-lock") && s.contains("released page-lock")
                })
            },
        );
    })
    .await
    .unwrap();
}
