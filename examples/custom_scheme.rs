//! A URL scheme of one's own: `applocks://` opens the embedded file backend in the
//! application's lock directory, with a subdirectory per path and a `?dir=` override.
//!
//! `cargo run -p distlock --example custom_scheme`

use distlock::conn::ConnectionString;
use distlock::ClientOptions;

/// The file backend behind `applocks:///SUBDIR[?dir=/base]`.
async fn open_applocks(
    url: ConnectionString,
    opts: ClientOptions,
) -> distlock::Result<distlock::file::FileBackend> {
    url.check_params(&["dir"])?;
    if !url.hosts().is_empty() {
        return Err(url.invalid("applocks:// takes no host; write applocks:///subdir"));
    }
    let base = match url.param("dir") {
        Some(dir) => dir.to_owned(),
        None => std::env::temp_dir()
            .join("applocks-example")
            .display()
            .to_string(),
    };
    let dir = format!("{base}{}", url.path()?);
    std::fs::create_dir_all(&dir)
        .map_err(|e| url.invalid(format!("cannot create `{dir}`: {e}")))?;
    distlock::file::FileBackend::from_url(&format!("file://{dir}"), &opts)
}

#[tokio::main]
async fn main() -> distlock::Result<()> {
    distlock::register("applocks", open_applocks)?;
    println!("schemes: {}", distlock::registry().schemes().join(", "));

    let client = distlock::connect("applocks:///jobs").await?;
    let guard = client.lock("nightly-report")?.try_acquire().await?;
    match guard {
        Some(g) => {
            println!("holding with fencing token {}", g.fencing_token());
            g.release().await?;
        }
        None => println!("another process runs the report"),
    }

    // Errors name the parameter, and never show a password.
    let err = distlock::connect("applocks://user:s3cret@/jobs?dri=/x")
        .await
        .expect_err("unknown parameter");
    println!("{err}");
    Ok(())
}
