//! Fenced MySQL/MariaDB transactions on a real MariaDB, with tokens from real dlock locks on it.
#![cfg(feature = "mysql")]

mod common;

use common::Tally;
use distlock_fence::mysql::MySqlFence;
use distlock_fence::{Decision, Error, Outcome, Stamp};
use distlock_testkit::{DelayProxy, MariaDbServer};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, TxOpts};
use std::time::Duration;

async fn connect(url: &str) -> Conn {
    Conn::new(Opts::from_url(url).expect("url"))
        .await
        .expect("connect")
}

async fn setup(conn: &mut Conn, fence: &MySqlFence) {
    fence.create_table(conn).await.expect("fence table");
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS v (id INT PRIMARY KEY, x VARCHAR(20) NOT NULL, n BIGINT NOT NULL) ENGINE=InnoDB",
    )
    .await
    .expect("table v");
    conn.query_drop("REPLACE INTO v VALUES (1, 'init', 0)")
        .await
        .expect("row");
}

async fn x(conn: &mut Conn) -> (String, i64) {
    conn.query_first("SELECT x, n FROM v WHERE id = 1")
        .await
        .expect("x")
        .expect("row")
}

#[tokio::test]
async fn the_rule_on_its_cases() {
    let db = MariaDbServer::start().expect("mariadb");
    let mut conn = connect(&db.url()).await;
    let fence = MySqlFence::new();
    setup(&mut conn, &fence).await;
    let set = "UPDATE v SET x = ? WHERE id = 1";
    for &(recorded, stamp, expected) in distlock_fence::CASES {
        conn.query_drop("DELETE FROM dlock_write_fences")
            .await
            .expect("reset");
        conn.query_drop("UPDATE v SET x = 'init'")
            .await
            .expect("reset");
        if let Some(r) = recorded {
            let _ = fence
                .execute(&mut conn, "r", r, set, ("before",))
                .await
                .expect("record");
        }
        let got = match fence.execute(&mut conn, "r", stamp, set, ("after",)).await {
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
            x(&mut conn).await.0 == "after",
            expected == Ok(true),
            "{recorded:?} then {stamp:?}"
        );
    }
    let long = "r".repeat(256);
    let e = fence
        .execute(&mut conn, &long, Stamp::new(1), set, ("x",))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

/// A holder paused past its lease (table mode: the lock is a row with a lease) writes after the
/// next holder wrote: rejected, nothing of its transaction commits.
#[tokio::test]
async fn a_holder_paused_past_its_lease_is_rejected() {
    let db = MariaDbServer::start().expect("mariadb");
    let mut conn = connect(&db.url()).await;
    let fence = MySqlFence::new();
    setup(&mut conn, &fence).await;
    let locks = distlock::connect(&format!("{}?mode=table", db.url()))
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
    {
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .expect("begin");
        assert_eq!(
            fence
                .admit(&mut tx, "v", Stamp::new(old))
                .await
                .expect("admit"),
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
            &mut conn,
            "v",
            Stamp::new(new),
            "UPDATE v SET x = 'second' WHERE id = 1",
            (),
        )
        .await
        .expect("the new holder writes");
    assert_eq!(out, Outcome::Applied(1));

    let late = fence
        .execute(
            &mut conn,
            "v",
            Stamp::new(old),
            "UPDATE v SET x = 'stale' WHERE id = 1",
            (),
        )
        .await;
    assert_eq!(
        late.unwrap_err(),
        Error::Stale {
            token: old,
            newer: new
        }
    );
    {
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .expect("begin");
        tx.query_drop("UPDATE v SET n = 99 WHERE id = 1")
            .await
            .expect("write");
        assert!(fence
            .admit(&mut tx, "v", Stamp::new(old))
            .await
            .unwrap_err()
            .is_stale());
        tx.rollback().await.expect("rollback");
    }
    assert_eq!(x(&mut conn).await, ("second".to_owned(), 0));
    assert_eq!(
        fence.recorded(&mut conn, "v").await.expect("recorded"),
        Some(Stamp::new(new))
    );
    second.release().await.expect("release");
}

#[tokio::test]
async fn a_retried_write_of_the_holder_is_applied_once() {
    let db = MariaDbServer::start().expect("mariadb");
    let mut conn = connect(&db.url()).await;
    let fence = MySqlFence::new();
    setup(&mut conn, &fence).await;
    let add = "UPDATE v SET n = n + 1 WHERE id = 1";
    let s1 = Stamp::new(u64::MAX - 7).seq(1);
    assert_eq!(
        fence
            .execute(&mut conn, "c", s1, add, ())
            .await
            .expect("first"),
        Outcome::Applied(1)
    );
    assert_eq!(
        fence
            .execute(&mut conn, "c", s1, add, ())
            .await
            .expect("retry"),
        Outcome::Duplicate
    );
    assert_eq!(
        fence
            .execute(&mut conn, "c", s1.seq(2), add, ())
            .await
            .expect("next"),
        Outcome::Applied(1)
    );
    assert_eq!(x(&mut conn).await.1, 2);
    let bad = fence
        .execute(&mut conn, "c", s1.seq(3), "UPDATE nowhere SET n = 1", ())
        .await;
    assert!(matches!(bad, Err(Error::Store { .. })), "{bad:?}");
    assert_eq!(
        fence.recorded(&mut conn, "c").await.expect("recorded"),
        Some(s1.seq(2))
    );
    assert_eq!(
        fence
            .execute(&mut conn, "c", s1.seq(3), add, ())
            .await
            .expect("retry"),
        Outcome::Applied(1)
    );
    assert_eq!(x(&mut conn).await.1, 3);
}

/// Holders with 200 ms leases behind a delay proxy: each reads under the fence, works, and
/// writes value + 1 under the fence. No accepted write is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_behind_a_delay_proxy_lose_no_update() {
    let db = MariaDbServer::start().expect("mariadb");
    let proxy = DelayProxy::start(db.addr(), Duration::from_millis(20)).expect("proxy");
    let mut setup_conn = connect(&db.url()).await;
    let fence = MySqlFence::new();
    setup(&mut setup_conn, &fence).await;
    let url = db.url().replacen(
        &format!(":{}/", db.addr().port()),
        &format!(":{}/", proxy.port()),
        1,
    );
    assert_ne!(url, db.url(), "through the proxy");
    let locks = distlock::connect(&format!("{url}?mode=table"))
        .await
        .expect("dlock");
    let tasks: Vec<_> = (0..5u64)
        .map(|t| {
            let (locks, fence, url) = (locks.clone(), fence.clone(), url.clone());
            tokio::spawn(async move {
                let mut conn = connect(&url).await;
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
                        let mut tx = conn
                            .start_transaction(TxOpts::default())
                            .await
                            .map_err(|e| Error::store("mysql", "begin", e))?;
                        fence.admit(&mut tx, "v", Stamp::new(token)).await?;
                        let n: i64 = tx
                            .query_first("SELECT n FROM v WHERE id = 1")
                            .await
                            .map_err(|e| Error::store("mysql", "read", e))?
                            .unwrap_or(0);
                        tx.commit()
                            .await
                            .map_err(|e| Error::store("mysql", "commit", e))?;
                        tokio::time::sleep(Duration::from_millis((t * 37 + i * 53) % 260)).await;
                        let _ = fence
                            .execute(
                                &mut conn,
                                "v",
                                Stamp::new(token),
                                "UPDATE v SET n = ? WHERE id = 1",
                                (n + 1,),
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
    let n = x(&mut setup_conn).await.1;
    eprintln!("{applied} increments accepted, {stale} rejected as stale, value {n}");
    assert_eq!(n as u64, applied);
    assert!(applied > 0);
}
