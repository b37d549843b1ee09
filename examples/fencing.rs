//! Why fencing tokens: a store that checks them rejects the write of a holder whose lease
//! ended, so a holder that stalled (a GC pause, a stopped process) cannot undo the next
//! holder's work.
//!
//! The store here is a fenced file of crate `distlock-fence` (the token beside the data,
//! checked under `flock(2)`, the file replaced atomically); its Redis, PostgreSQL, MySQL, etcd
//! and ZooKeeper helpers work the same way (docs/fencing.md).
//!
//! `cargo run -p distlock --example fencing`

use distlock_fence::file::FencedFile;
use distlock_fence::{Error, Outcome, Stamp};
use std::time::Duration;

/// The stock as a number.
fn parse(data: Option<&[u8]>) -> Result<i64, Error> {
    let text = String::from_utf8_lossy(data.unwrap_or_default()).into_owned();
    text.trim()
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("the stock file holds `{text}`")))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DLOCK_BACKEND").unwrap_or_else(|_| distlock::DEFAULT_BACKEND.into());
    let client = distlock::connect(&url).await?;
    let dir = std::env::temp_dir().join(format!("dlock-fencing-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let stock = FencedFile::new(dir.join("stock"));
    stock.write_unfenced(b"10")?;

    // The first holder reads the stock under the fence (recording its token) …
    let first = client.lock("example:fencing")?.acquire().await?;
    let old = first.fencing_token();
    let seen = parse(stock.read(Stamp::new(old))?.as_deref())?;
    // … and stalls past its lease: the lock goes on to the next holder.
    first.release().await?;

    let second = client
        .lock("example:fencing")?
        .acquire_timeout(Duration::from_secs(5))
        .await?;
    let new = second.fencing_token();
    let sell = |stamp: Stamp| {
        stock.update(stamp, |data| {
            let left = parse(data)? - 1;
            Ok::<_, Error>((left.to_string().into_bytes(), left))
        })
    };
    // One sale (write 1 of this grant), and its retry after a lost reply: applied once.
    if let Outcome::Applied(left) = sell(Stamp::new(new).seq(1))? {
        println!("token {new} sold one: {left} left");
    }
    assert_eq!(sell(Stamp::new(new).seq(1))?, Outcome::Duplicate);

    // The first holder wakes up and writes what it computed from its read.
    match stock.write(Stamp::new(old), (seen - 1).to_string().as_bytes()) {
        Err(Error::Stale { token, newer }) => {
            println!("token {token} rejected: the store has seen token {newer}")
        }
        other => println!("stale write accepted?! {other:?}"),
    }
    println!("stock: {}", parse(stock.peek()?.as_deref())?);
    second.release().await?;
    stock.remove()?;
    std::fs::remove_dir(&dir)?;
    Ok(())
}
