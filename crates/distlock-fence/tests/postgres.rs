//! Fenced PostgreSQL transactions on a real server, with tokens from real dlock locks on it.
#![cfg(feature = "postgres")]

mod common;

use common::Tally;
use distlock_fence::postgres::PgFence;
use distlock_fence::{Decision, Error, Outcome, Stamp};
use distlock_testkit::{DelayProxy, PostgresServer};
use std::str::FromStr;
use std::time::Duration;
use tokio_postgres::{Client, NoTls};

async fn connect(url: &str) -> Client {
    let config = tokio_postgres::Config::from_str(url).expect("url");
    let (client, connection) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

async fn setup(client: &Client, fence: &PgFence) {
    fence.create_table(client).await.expect("fence table");
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS v (id int PRIMARY KEY, x text NOT NULL, n bigint NOT NULL);
             INSERT INTO v VALUES (1, 'init', 0) ON CONFLICT (id) DO UPDATE SET x = 'init', n = 0",
        )
        .await
        .expect("table v");
}

async fn x(client: &Client) -> (String, i64) {
    let row = client
        .query_one("SELECT x, n FROM v WHERE id = 1", &[])
        .await
        .expect("x");
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn the_rule_on_its_cases() {
    let pg = PostgresServer::start().expect("postgres");
    let mut client = connect(&pg.url()).await;
    let fence = PgFence::new();
    setup(&client, &fence).await;
    let set = "UPDATE v SET x = $1 WHERE id = 1";
    for &(recorded, stamp, expected) in distlock_fence::CASES {
        client
            .batch_execute("DELETE FROM dlock_write_fences; UPDATE v SET x = 'init'")
            .await
            .expect("reset");
        if let Some(r) = recorded {
            let _ = fence
                .execute(&mut client, "r", r, set, &[&"before"])
                .await
                .expect("record");
        }
        let got = match fence
            .execute(&mut client, "r", stamp, set, &[&"after"])
            .await
        {
            Ok(Outcome::Applied(1)) => Ok(true),
            Ok(Outcome::Duplicate) => Ok(false),
            Err(Error::Stale { token, newer }) => {
                assert_eq!(token, stamp.token);
                Err(newer)
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(got, expected, "{recorded:?} then {stamp:?}");
        assert_eq!(
            x(&client).await.0 == "after",
            expected == Ok(true),
            "{recorded:?} then {stamp:?}"
        );
    }
    assert!(PgFence::with_table("x; DROP TABLE v").is_err());
    assert!(PgFence::with_table("app.fences").is_ok());
}

/// A holder paused past its lease (lease mode: the lock is a row with a lease) writes after
/// the next holder wrote: rejected, nothing of its transaction commits.
#[tokio::test]
async fn a_holder_paused_past_its_lease_is_rejected() {
    let pg = PostgresServer::start().expect("postgres");
    let mut client = connect(&pg.url()).await;
    let fence = PgFence::new();
    setup(&client, &fence).await;
    let locks = distlock::connect(&format!("{}?mode=lease", pg.url()))
        .await
        .expect("dlock");

    let first = locks
        .lock("v")
        .expect("lock")
        .lease(Duration::from_millis(300))
        .expect("lease")
        .acquire()
        .await
        .expect("acquire");
    let old = first.fencing_token();
    // Its fenced read: the fence raised in the reading transaction.
    {
        let tx = client.transaction().await.expect("begin");
        assert_eq!(
            fence.admit(&tx, "v", Stamp::new(old)).await.expect("admit"),
            Decision::Apply
        );
        tx.commit().await.expect("commit");
    }
    let second = locks
        .lock("v")
        .expect("lock")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("the next holder gets the lock after the lease");
    assert!(first.is_lost());
    let new = second.fencing_token();
    assert!(new > old);
    let out = fence
        .execute(
            &mut client,
            "v",
            Stamp::new(new),
            "UPDATE v SET x = 'second' WHERE id = 1",
            &[],
        )
        .await
        .expect("the new holder writes");
    assert_eq!(out, Outcome::Applied(1));

    let late = fence
        .execute(
            &mut client,
            "v",
            Stamp::new(old),
            "UPDATE v SET x = 'stale' WHERE id = 1",
            &[],
        )
        .await;
    assert_eq!(
        late.unwrap_err(),
        Error::Stale {
            token: old,
            newer: new
        }
    );
    // In a transaction of its own: admit refuses, the caller's earlier write rolls back.
    {
        let tx = client.transaction().await.expect("begin");
        tx.execute("UPDATE v SET n = 99 WHERE id = 1", &[])
            .await
            .expect("write");
        assert!(fence
            .admit(&tx, "v", Stamp::new(old))
            .await
            .unwrap_err()
            .is_stale());
    }
    assert_eq!(x(&client).await, ("second".to_owned(), 0));
    assert_eq!(
        fence.recorded(&client, "v").await.expect("recorded"),
        Some(Stamp::new(new))
    );
    second.release().await.expect("release");
}

#[tokio::test]
async fn a_retried_write_of_the_holder_is_applied_once() {
    let pg = PostgresServer::start().expect("postgres");
    let mut client = connect(&pg.url()).await;
    let fence = PgFence::new();
    setup(&client, &fence).await;
    let add = "UPDATE v SET n = n + 1 WHERE id = 1";
    let s1 = Stamp::new(1_764_650_000_123_456).seq(1);
    assert_eq!(
        fence
            .execute(&mut client, "c", s1, add, &[])
            .await
            .expect("first"),
        Outcome::Applied(1)
    );
    assert_eq!(
        fence
            .execute(&mut client, "c", s1, add, &[])
            .await
            .expect("retry"),
        Outcome::Duplicate
    );
    assert_eq!(
        fence
            .execute(&mut client, "c", s1.seq(2), add, &[])
            .await
            .expect("next"),
        Outcome::Applied(1)
    );
    assert_eq!(x(&client).await.1, 2);
    // A statement that fails rolls the fence back too: the retry is applied.
    let bad = fence
        .execute(&mut client, "c", s1.seq(3), "UPDATE nowhere SET n = 1", &[])
        .await;
    assert!(matches!(bad, Err(Error::Store { .. })), "{bad:?}");
    assert_eq!(
        fence.recorded(&client, "c").await.expect("recorded"),
        Some(s1.seq(2))
    );
    assert_eq!(
        fence
            .execute(&mut client, "c", s1.seq(3), add, &[])
            .await
            .expect("retry"),
        Outcome::Applied(1)
    );
    assert_eq!(x(&client).await.1, 3);
}

/// Holders with 200 ms leases behind a delay proxy (lock and store traffic delayed): each reads
/// under the fence, works, and writes value + 1 under the fence. No accepted write is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_behind_a_delay_proxy_lose_no_update() {
    let pg = PostgresServer::start().expect("postgres");
    let proxy = DelayProxy::start(pg.addr(), Duration::from_millis(20)).expect("proxy");
    let setup_client = connect(&pg.url()).await;
    let fence = PgFence::new();
    setup(&setup_client, &fence).await;
    let url = pg.url();
    let lock_url = {
        let mut cfg = url.clone();
        cfg = cfg.replacen(
            &format!(":{}/", pg.addr().port()),
            &format!(":{}/", proxy.port()),
            1,
        );
        format!("{cfg}?mode=lease")
    };
    let locks = distlock::connect(&lock_url).await.expect("dlock");
    let tasks: Vec<_> = (0..5u64)
        .map(|t| {
            let (locks, fence, url) = (locks.clone(), fence.clone(), url.clone());
            tokio::spawn(async move {
                let mut client = connect(&url).await;
                let mut tally = Tally::default();
                for i in 0..4u64 {
                    let guard = locks
                        .lock("v")
                        .expect("lock")
                        .lease(Duration::from_millis(200))
                        .expect("lease")
                        .acquire_timeout(Duration::from_secs(60))
                        .await
                        .expect("acquire");
                    let token = guard.fencing_token();
                    let r: Result<(), Error> = async {
                        let tx = client
                            .transaction()
                            .await
                            .map_err(|e| Error::store("postgres", "begin", e))?;
                        fence.admit(&tx, "v", Stamp::new(token)).await?;
                        let n: i64 = tx
                            .query_one("SELECT n FROM v WHERE id = 1", &[])
                            .await
                            .map_err(|e| Error::store("postgres", "read", e))?
                            .get(0);
                        tx.commit()
                            .await
                            .map_err(|e| Error::store("postgres", "commit", e))?;
                        tokio::time::sleep(Duration::from_millis((t * 37 + i * 53) % 260)).await;
                        let _ = fence
                            .execute(
                                &mut client,
                                "v",
                                Stamp::new(token),
                                "UPDATE v SET n = $1 WHERE id = 1",
                                &[&(n + 1)],
                            )
                            .await?;
                        Ok(())
                    }
                    .await;
                    tally.record(r);
                    drop(guard);
                }
                tally
            })
        })
        .collect();
    let Tally { applied, stale, .. } = Tally::sum(tasks).await;
    let n = x(&setup_client).await.1;
    eprintln!("{applied} increments accepted, {stale} rejected as stale, value {n}");
    assert_eq!(n as u64, applied);
    assert!(applied > 0);
}
