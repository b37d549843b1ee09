//! Fenced files with tokens from real `file://` locks.
#![cfg(feature = "file")]

use distlock_fence::file::FencedFile;
use distlock_fence::{Error, Outcome, Stamp};
use distlock_testkit::TempDir;
use std::time::Duration;

fn number(f: &FencedFile) -> i64 {
    let data = f.peek().expect("peek").expect("exists");
    String::from_utf8_lossy(&data).parse().expect("a number")
}

#[tokio::test]
async fn a_stale_holder_is_rejected_after_the_next_holder_wrote() {
    let dir = TempDir::with_prefix("distlock-fence-file").expect("temp dir");
    let url = format!("file://{}", dir.path().join("locks").display());
    let client = distlock::connect(&url).await.expect("connect");
    let stock = FencedFile::new(dir.path().join("stock"));
    stock.write_unfenced(b"10").expect("seed");

    // The first holder reads under the fence, then stalls; its lock goes to the next holder.
    let first = client
        .lock("stock")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let old = first.fencing_token();
    let read = stock.read(Stamp::new(old)).expect("fenced read");
    assert_eq!(read.as_deref(), Some(&b"10"[..]));
    first.release().await.expect("release");

    let second = client
        .lock("stock")
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire");
    let new = second.fencing_token();
    assert!(new > old);
    let out = stock
        .update(Stamp::new(new), |d| {
            let n: i64 = String::from_utf8_lossy(d.unwrap_or_default())
                .parse()
                .unwrap_or(0);
            Ok::<_, Error>(((n - 1).to_string().into_bytes(), n - 1))
        })
        .expect("the new holder writes");
    assert_eq!(out, Outcome::Applied(9));

    // The first holder wakes up and writes what it computed from its read: rejected.
    let late = stock.write(Stamp::new(old), b"9");
    assert_eq!(
        late.unwrap_err(),
        Error::Stale {
            token: old,
            newer: new
        }
    );
    // Its fenced reads too.
    assert!(stock.read(Stamp::new(old)).unwrap_err().is_stale());
    assert_eq!(number(&stock), 9);
    assert_eq!(stock.fence().expect("fence"), Some(Stamp::new(new)));
    second.release().await.expect("release");
    stock.remove().expect("remove");
    assert!(!stock.path().exists() && !stock.lock_path().exists());
}

#[test]
fn a_retried_write_of_the_holder_is_applied_once() {
    let dir = TempDir::with_prefix("distlock-fence-file").expect("temp dir");
    let counter = FencedFile::new(dir.path().join("counter"));
    counter.write_unfenced(b"0").expect("seed");
    let add = |stamp: Stamp| {
        counter.update(stamp, |d| {
            let n: i64 = String::from_utf8_lossy(d.unwrap_or_default())
                .parse()
                .unwrap_or(0);
            Ok::<_, Error>(((n + 1).to_string().into_bytes(), n + 1))
        })
    };
    assert_eq!(
        add(Stamp::new(5).seq(1)).expect("first"),
        Outcome::Applied(1)
    );
    // The same write again (a retry after an unknown outcome): not applied twice.
    assert_eq!(
        add(Stamp::new(5).seq(1)).expect("retry"),
        Outcome::Duplicate
    );
    // The holder's next write, and a late copy of its first one.
    assert_eq!(
        add(Stamp::new(5).seq(2)).expect("second"),
        Outcome::Applied(2)
    );
    assert_eq!(
        add(Stamp::new(5).seq(1)).expect("late copy"),
        Outcome::Duplicate
    );
    // Unsequenced writes of the same grant are applied (for writes that may repeat).
    assert_eq!(
        counter.write(Stamp::new(5), b"7").expect("set"),
        Outcome::Applied(())
    );
    assert_eq!(number(&counter), 7);
}

/// Writers with interleaved tokens in many threads, each a fresh description of the lock
/// file as another process would have: every accepted increment is counted, none lost.
#[test]
fn concurrent_holders_lose_no_update() {
    let dir = TempDir::with_prefix("distlock-fence-file").expect("temp dir");
    let counter = FencedFile::new(dir.path().join("counter")).durable(false);
    counter.write_unfenced(b"0").expect("seed");
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let counter = counter.clone();
            std::thread::spawn(move || {
                let (mut applied, mut stale) = (0u64, 0u64);
                for i in 0..50u64 {
                    // Tokens that rise over time but arrive out of order between threads.
                    let token = 1 + i * 8 + (t * 5) % 8;
                    let stamp = Stamp::new(token).seq(t * 1000 + i + 1);
                    match counter.update(stamp, |d| {
                        let n: u64 = String::from_utf8_lossy(d.unwrap_or_default())
                            .parse()
                            .unwrap_or(0);
                        Ok::<_, Error>(((n + 1).to_string().into_bytes(), ()))
                    }) {
                        Ok(Outcome::Applied(())) => applied += 1,
                        Ok(Outcome::Duplicate) => {}
                        Err(Error::Stale { token: t2, newer }) => {
                            assert!(t2 < newer);
                            stale += 1;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                (applied, stale)
            })
        })
        .collect();
    let (mut applied, mut stale) = (0, 0);
    for t in threads {
        let (a, s) = t.join().expect("thread");
        applied += a;
        stale += s;
    }
    assert_eq!(number(&counter) as u64, applied, "stale {stale}");
    assert!(applied > 0);
}
