//! `dlock serve`: the JSON API, the event stream, `/metrics` and the page, over one
//! [`Monitor`].

use crate::model::{kind_name, parse_kind, Change, Event, Sort};
use crate::monitor::Monitor;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use distlock_core::{Error, LockKind};
use futures_util::stream::Stream;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

const INDEX: &str = include_str!("../page/index.html");
const SCRIPT: &str = include_str!("../page/app.js");
const STYLE: &str = include_str!("../page/style.css");

/// The header that carries the release token: `Authorization: Bearer TOKEN`.
pub const TOKEN_HEADER: &str = "authorization";

/// How `dlock serve` serves.
#[derive(Clone, Default)]
pub struct ServeOptions {
    refresh: Option<Duration>,
    metrics_names: Vec<String>,
    release_token: Option<String>,
    prometheus: Option<PrometheusHandle>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("refresh", &self.refresh)
            .field("metrics_names", &self.metrics_names)
            .field("release_allowed", &self.release_token.is_some())
            .finish_non_exhaustive()
    }
}

impl ServeOptions {
    /// Read-only, a look every second, no per-name metrics, no client metrics.
    pub fn new() -> Self {
        ServeOptions::default()
    }

    /// Looks at the backend every `every` (the event stream's resolution; default 1 s).
    pub fn refresh(mut self, every: Duration) -> Self {
        self.refresh = Some(every);
        self
    }

    /// Per-name series on `/metrics` for these locks (a bounded set: a label per lock of an
    /// unbounded namespace would grow the scrape without end).
    pub fn metrics_names(mut self, names: Vec<String>) -> Self {
        self.metrics_names = names;
        self
    }

    /// Allows forced releases (`DELETE /api/locks/{name}`, the page's release button) to
    /// requests that carry `token` (`Authorization: Bearer TOKEN`). Off by default.
    pub fn allow_release(mut self, token: impl Into<String>) -> Self {
        self.release_token = Some(token.into());
        self
    }

    /// Appends this recorder's series (the process's client metrics: waits, holds,
    /// renewals, losses) to `/metrics`.
    pub fn prometheus(mut self, handle: PrometheusHandle) -> Self {
        self.prometheus = Some(handle);
        self
    }

    fn every(&self) -> Duration {
        self.refresh.unwrap_or(Duration::from_secs(1))
    }
}

struct App {
    monitor: Arc<Monitor>,
    opts: ServeOptions,
    stop: watch::Receiver<bool>,
}

/// The routes of `dlock serve` over `monitor` (for embedding in a server of one's own; the
/// event stream ends when `stop` turns true).
pub fn router(monitor: Arc<Monitor>, opts: ServeOptions, stop: watch::Receiver<bool>) -> Router {
    let app = Arc::new(App {
        monitor,
        opts,
        stop,
    });
    Router::new()
        .route(
            "/",
            get(|| async { page("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/app.js",
            get(|| async { page("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/style.css",
            get(|| async { page("text/css; charset=utf-8", STYLE) }),
        )
        .route("/api/locks", get(locks))
        .route("/api/locks/{name}", get(detail).delete(release))
        .route("/api/history", get(history))
        .route("/api/events", get(events))
        .route("/metrics", get(metrics))
        .with_state(app)
}

/// Serves on `listener` until `shutdown` resolves: looks at the backend every refresh
/// interval (the events come from there) and answers the routes of [`router`].
///
/// # Errors
/// The listener's I/O errors.
pub async fn serve(
    listener: TcpListener,
    monitor: Arc<Monitor>,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop) = watch::channel(false);
    let every = opts.every();
    let poller = {
        let monitor = monitor.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => return,
                }
                if let Err(e) = monitor.refresh(Sort::Contention).await {
                    tracing::warn!(error = %e, "looking at the locks failed; trying again");
                }
            }
        })
    };
    let app = router(monitor, opts, stop);
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        })
        .await;
    poller.abort();
    served
}

fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn problem(status: StatusCode, message: impl std::fmt::Display) -> Response {
    (status, Json(json!({ "error": message.to_string() }))).into_response()
}

/// The status of a library error: the caller's mistake, or the backend's trouble.
fn failed(e: &Error) -> Response {
    let status = match e {
        Error::InvalidArgument(_) | Error::Unsupported { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::BAD_GATEWAY,
    };
    problem(status, e)
}

/// The value of `key` in a query string, percent-decoded (`+` is a space).
fn param(query: Option<&str>, key: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k) == key).then(|| decode(v))
    })
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit));
                match hex.and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn locks(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
    let sort = match param(q.as_deref(), "sort") {
        None => Sort::Contention,
        Some(s) => match Sort::parse(&s) {
            Ok(s) => s,
            Err(e) => return problem(StatusCode::BAD_REQUEST, e),
        },
    };
    let mut snap = match app.monitor.refresh(sort).await {
        Ok(s) => s,
        Err(e) => return failed(&e),
    };
    if let Some(p) = param(q.as_deref(), "prefix") {
        snap.retain_prefix(&p);
    }
    let mut v = json!(snap);
    if let Some(o) = v.as_object_mut() {
        o.insert("prefix".into(), app.monitor.prefix().into());
        o.insert("sort".into(), sort.as_str().into());
        o.insert(
            "release_allowed".into(),
            app.opts.release_token.is_some().into(),
        );
    }
    Json(v).into_response()
}

/// The kind asked for (`?kind=`), else the kind the last look saw the name as, else a mutex.
fn kind_of(app: &App, name: &str, q: Option<&str>) -> Result<LockKind, Box<Response>> {
    match param(q, "kind") {
        Some(k) => {
            let permits = param(q, "permits").and_then(|p| p.parse().ok());
            parse_kind(&k, permits).ok_or_else(|| {
                Box::new(problem(
                    StatusCode::BAD_REQUEST,
                    format!("unknown lock kind `{k}`: use mutex, fair, rw, semaphore or election"),
                ))
            })
        }
        None => Ok(app
            .monitor
            .last()
            .and_then(|s| s.get(name).map(crate::LockRow::lock_kind))
            .unwrap_or_default()),
    }
}

async fn detail(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Response {
    let kind = match kind_of(&app, &name, q.as_deref()) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    match app.monitor.detail(&name, kind).await {
        Ok(row) => Json(row).into_response(),
        Err(e) => failed(&e),
    }
}

/// Equal without telling how much of it matched by how long it took.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn release(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let Some(token) = &app.opts.release_token else {
        return problem(
            StatusCode::FORBIDDEN,
            "forced release is off: start `dlock serve` with --allow-release to allow it",
        );
    };
    let given = headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        None => {
            return problem(
                StatusCode::UNAUTHORIZED,
                "a forced release needs the release token: header `Authorization: Bearer TOKEN`",
            )
        }
        Some(g) if !same(g.trim().as_bytes(), token.as_bytes()) => {
            return problem(StatusCode::UNAUTHORIZED, "wrong release token")
        }
        Some(_) => {}
    }
    let kind = match kind_of(&app, &name, q.as_deref()) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let out = match app.monitor.client().force_release(&name, kind).await {
        Ok(o) => o,
        Err(e) => return failed(&e),
    };
    tracing::warn!(name = %name, removed = out.removed.len(), "forced release from the web page");
    let at_ms = crate::model::unix_ms(SystemTime::now());
    app.monitor.record(
        out.removed
            .iter()
            .map(|h| Event {
                at_ms,
                event: Change::Released,
                name: name.clone(),
                kind: kind_name(kind),
                owner: Some(h.owner.clone()),
                fencing_token: out.fencing_token,
                waiters: None,
            })
            .collect(),
    );
    let removed: Vec<&str> = out.removed.iter().map(|h| h.owner.as_str()).collect();
    Json(json!({ "name": name, "removed": removed, "fencing_token": out.fencing_token }))
        .into_response()
}

async fn history(State(app): State<Arc<App>>) -> Response {
    Json(app.monitor.history()).into_response()
}

async fn events(
    State(app): State<Arc<App>>,
) -> Sse<impl Stream<Item = Result<axum::response::sse::Event, Infallible>>> {
    let rx = app.monitor.subscribe();
    let stop = app.stop.clone();
    let stream = futures_util::stream::unfold((rx, stop), |(mut rx, mut stop)| async move {
        if *stop.borrow() {
            return None;
        }
        let next = tokio::select! {
            e = rx.recv() => e,
            _ = stop.changed() => return None,
        };
        let sse = match next {
            Ok(e) => axum::response::sse::Event::default()
                .event(e.event.as_str())
                .json_data(&e)
                .unwrap_or_default(),
            Err(broadcast::error::RecvError::Lagged(n)) => axum::response::sse::Event::default()
                .event("lagged")
                .data(n.to_string()),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(sse), (rx, stop)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let snap = app.monitor.last();
    let mut body = crate::prom::render(
        snap.as_ref(),
        app.monitor.refresh_stats(),
        app.monitor.client().backend_kind(),
        &app.opts.metrics_names,
    );
    if let Some(h) = &app.opts.prometheus {
        body += &h.render();
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// Binds `addr` (loopback unless told otherwise: the API shows who holds what).
///
/// # Errors
/// The address is taken or not ours.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(
            param(Some("a=1&name=x%3Ay+z"), "name").as_deref(),
            Some("x:y z")
        );
        assert_eq!(param(Some("a=1"), "b"), None);
        assert_eq!(param(Some("a=%zz%"), "a").as_deref(), Some("%zz%"));
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"ab", b"abc"));
    }
}
