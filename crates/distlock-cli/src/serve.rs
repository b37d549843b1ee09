//! `dlock serve --listen 127.0.0.1:PORT`: the JSON API, server-sent events, `/metrics` and a
//! live page over the locks of one backend.

use clap::Args;
use distlock_observe::{Monitor, ServeOptions};
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default: the API shows who holds what; port 0
    /// picks a free one, printed at start).
    #[arg(long, default_value = "127.0.0.1:8087")]
    listen: SocketAddr,
    /// Only locks whose name starts with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// How often to look at the backend (the resolution of the event stream).
    #[arg(long, default_value = "1s", value_parser = crate::duration_arg)]
    refresh: Duration,
    /// Per-lock series on /metrics for these names only (comma-separated; a bounded set, as
    /// a label per lock of an unbounded namespace would grow every scrape).
    #[arg(long, value_delimiter = ',')]
    metrics_names: Vec<String>,
    /// Allow forced releases from the page and the API (DELETE /api/locks/NAME), to
    /// requests that carry the release token (`Authorization: Bearer TOKEN`).
    #[arg(long)]
    allow_release: bool,
    /// With --allow-release: the release token, 16 characters at least (default: a random
    /// one, printed on stderr at start).
    #[arg(long, env = "DLOCK_RELEASE_TOKEN", hide_env_values = true)]
    release_token: Option<String>,
}

pub async fn serve(url: &str, args: ServeArgs) -> u8 {
    // Bad input first, before any connection.
    let token = if args.allow_release {
        match args.release_token {
            Some(t) if t.trim().len() >= 16 => Some(t.trim().to_owned()),
            Some(_) => {
                eprintln!("dlock: --release-token must be at least 16 characters");
                return crate::EXIT_USAGE;
            }
            None => {
                let t = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
                eprintln!("dlock serve: release token {t}");
                Some(t)
            }
        }
    } else {
        None
    };
    // The process's own client metrics (the library's series) for /metrics.
    let prometheus = match metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()
    {
        Ok(h) => Some(h),
        Err(e) => {
            eprintln!("dlock: client metrics unavailable: {e}");
            None
        }
    };
    let client = match crate::connect(url, distlock::ClientOptions::default()).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut opts = ServeOptions::new()
        .refresh(args.refresh)
        .metrics_names(args.metrics_names);
    if let Some(h) = prometheus {
        opts = opts.prometheus(h);
    }
    if let Some(t) = token {
        opts = opts.allow_release(t);
    }
    let listener = match distlock_observe::server::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("dlock: cannot listen on {}: {e}", args.listen);
            return crate::EXIT_ERROR;
        }
    };
    let addr = listener.local_addr().unwrap_or(args.listen);
    if !addr.ip().is_loopback() {
        eprintln!("dlock serve: listening beyond loopback: anyone who reaches {addr} sees every lock and its holders");
    }
    println!("dlock serve: listening on http://{addr}/");
    let monitor = std::sync::Arc::new(Monitor::new(client, args.prefix));
    // SIGTERM, SIGINT, SIGHUP: stop serving, end the event streams, exit 0.
    let mut signals = distlock_run::forwarded_signals();
    let shutdown = async move {
        let n = distlock_run::recv_any(&mut signals).await;
        tracing::info!(signal = n, "stopping on a signal");
    };
    match distlock_observe::server::serve(listener, monitor, opts, shutdown).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dlock: serving failed: {e}");
            crate::EXIT_ERROR
        }
    }
}
