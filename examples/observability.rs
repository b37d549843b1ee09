//! The library's metrics to Prometheus and its tracing to OpenTelemetry, and `dlock serve`'s
//! routes embedded in the application (docs/observability.md).
//!
//! `cargo run -p distlock --example observability` (embedded file backend), or
//! `DLOCK_BACKEND=redis://127.0.0.1:6379 cargo run -p distlock --example observability`.
//!
//! - Metrics: the library records through the `metrics` facade; installing the
//!   `metrics-exporter-prometheus` recorder makes them Prometheus series (`handle.render()`
//!   is the text a scrape gets; serve it on your own `/metrics`, or give the handle to
//!   `distlock_observe::ServeOptions::prometheus`, as below).
//! - Tracing: the library's spans and events go to whatever `tracing` subscriber is
//!   installed; `tracing-opentelemetry` turns them into OpenTelemetry spans. This example
//!   exports them to stdout; swap in an OTLP exporter (crate `opentelemetry-otlp`) to send
//!   them to a collector, Jaeger, Tempo or Honeycomb.

use opentelemetry::trace::TracerProvider as _;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;
use tracing_subscriber::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. Metrics: one recorder per process, installed before the first lock is taken.
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;

    // 2. Tracing: the library's spans as OpenTelemetry spans (here printed to stdout).
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    let tracer = provider.tracer("dlock-example");
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .init();

    let url = std::env::var("DLOCK_BACKEND").unwrap_or_else(|_| distlock::DEFAULT_BACKEND.into());
    let client = distlock::connect(&url).await?;

    // Some locking, in a span of the application's: the library's events are its children.
    async {
        let lock = client.lock("example:nightly-report")?;
        let guard = lock.acquire_timeout(Duration::from_secs(10)).await?;
        tracing::info!(token = guard.fencing_token(), "report running");
        guard.release().await?;
        Ok::<_, distlock::Error>(())
    }
    .instrument(tracing::info_span!("nightly-report"))
    .await?;

    // 3. The same metrics a scrape would get: dlock_acquire_wait_seconds, dlock_hold_seconds…
    prometheus.run_upkeep();
    println!("--- /metrics ---\n{}", prometheus.render());

    // 4. `dlock serve` inside the application: the API, the page, and /metrics with both the
    //    server-side state and these client metrics. Served for a moment here.
    let monitor = Arc::new(distlock_observe::Monitor::new(client, "example:"));
    let listener = distlock_observe::server::bind(([127, 0, 0, 1], 0).into()).await?;
    println!("serving on http://{}/ for a moment", listener.local_addr()?);
    let opts = distlock_observe::ServeOptions::new().prometheus(prometheus);
    distlock_observe::server::serve(listener, monitor, opts, async {
        tokio::time::sleep(Duration::from_millis(300)).await;
    })
    .await?;

    provider.shutdown()?;
    Ok(())
}
