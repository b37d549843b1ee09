use super::*;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

fn key(s: &str) -> String {
    s.to_owned()
}

async fn soon(w: &mut Subscription<String>) -> Result<Wake> {
    tokio::time::timeout(Duration::from_secs(10), w.changed())
        .await
        .expect("the watch never woke")
}

async fn silent(w: &mut Subscription<String>) {
    let r = tokio::time::timeout(Duration::from_millis(30), w.changed()).await;
    assert!(r.is_err(), "the watch woke: {r:?}");
}

#[tokio::test]
async fn a_release_before_the_first_changed_is_not_missed() {
    let subs = Subscriptions::new("redis", "h:1");
    let a = AttemptId::new();
    let (mut w, first) = subs.subscribe(key("k"), &a);
    assert!(first);
    assert!(subs.notify_released(&key("k")));
    assert_eq!(soon(&mut w).await.expect("wake"), Wake::Released);
    // Seen once: no second wake-up for the same release.
    silent(&mut w).await;
    // A later watch does not see releases from before it.
    let (mut w2, first) = subs.subscribe(key("k"), &AttemptId::new());
    assert!(!first, "the key was subscribed already");
    silent(&mut w2).await;
    assert!(!subs.notify_released(&key("other")));
}

#[tokio::test]
async fn a_handoff_wakes_only_its_attempt() {
    let subs = Subscriptions::new("redis", "h:1");
    let (a, b) = (AttemptId::new(), AttemptId::new());
    let (mut wa, _) = subs.subscribe(key("k"), &a);
    let (mut wb, _) = subs.subscribe(key("k"), &b);
    assert!(subs.notify_handoff(&key("k"), b.as_str(), 42));
    assert_eq!(
        soon(&mut wb).await.expect("wake"),
        Wake::HandedOver { token: 42 }
    );
    silent(&mut wa).await;
    // A handoff to an attempt that does not wait here wakes nobody.
    assert!(!subs.notify_handoff(&key("k"), "someone-else", 43));
    silent(&mut wa).await;
    silent(&mut wb).await;
    // notify() routes both kinds.
    assert!(subs.notify(&key("k"), a.as_str(), Wake::HandedOver { token: 44 }));
    assert_eq!(
        soon(&mut wa).await.expect("wake"),
        Wake::HandedOver { token: 44 }
    );
    assert!(subs.notify(&key("k"), "", Wake::Released));
    assert_eq!(soon(&mut wa).await.expect("wake"), Wake::Released);
    assert_eq!(soon(&mut wb).await.expect("wake"), Wake::Released);
    // Handoffs reported as releases (the waiter confirms the grant itself).
    subs.handoffs_as_releases(true);
    assert!(subs.notify_handoff(&key("k"), a.as_str(), 45));
    assert_eq!(soon(&mut wa).await.expect("wake"), Wake::Released);
}

#[tokio::test]
async fn a_sleeping_watch_wakes_on_a_later_notice() {
    let subs = Subscriptions::new("postgres", "h:5432");
    let (mut w, _) = subs.subscribe(key("k"), &AttemptId::new());
    let s2 = subs.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        s2.notify_released(&key("k"));
    });
    assert_eq!(soon(&mut w).await.expect("wake"), Wake::Released);
}

#[tokio::test]
async fn fail_all_ends_every_watch_with_a_connection_error() {
    let subs = Subscriptions::new("redis", "h:1");
    let (mut w1, _) = subs.subscribe(key("a"), &AttemptId::new());
    let (mut w2, _) = subs.subscribe(key("b"), &AttemptId::new());
    let waiting = tokio::spawn(async move { soon(&mut w2).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(subs.fail_all("the subscriber connection closed"), 2);
    let e = soon(&mut w1).await.expect_err("failed watch");
    assert!(e.is_connection(), "{e:?}");
    assert_eq!(
        e.to_string(),
        "cannot talk to redis at h:1: the subscriber connection closed"
    );
    let e = waiting.await.expect("task").expect_err("failed watch");
    assert!(e.is_connection());
    assert!(subs.is_empty());
    // A new subscription starts afresh; the old watch's drop does not touch it.
    let (mut w3, first) = subs.subscribe(key("a"), &AttemptId::new());
    assert!(first);
    drop(w1);
    assert_eq!(subs.watched(), 1);
    subs.notify_released(&key("a"));
    assert_eq!(soon(&mut w3).await.expect("wake"), Wake::Released);
}

#[tokio::test]
async fn fail_one_key() {
    let subs = Subscriptions::new("postgres", "h");
    let (mut wa, _) = subs.subscribe(key("a"), &AttemptId::new());
    let (mut wb, _) = subs.subscribe(key("b"), &AttemptId::new());
    assert!(subs.fail(&key("a"), "LISTEN failed"));
    assert!(!subs.fail(&key("a"), "again"));
    let e = soon(&mut wa).await.expect_err("failed");
    assert!(e.to_string().contains("LISTEN failed"), "{e}");
    silent(&mut wb).await;
    assert_eq!(subs.len(), 1);
}

#[tokio::test]
async fn refcounted_unsubscribe_with_the_hook() {
    let subs = Subscriptions::new("redis", "h:1");
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    assert!(subs.on_unused(move || {
        c2.fetch_add(1, Ordering::SeqCst);
    }));
    assert!(!subs.on_unused(|| {}), "a second hook replaced the first");
    let a = AttemptId::new();
    let (w1, first1) = subs.subscribe(key("k"), &a);
    let (w2, first2) = subs.subscribe(key("k"), &a);
    assert!(first1 && !first2);
    drop(w1);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "unused while a watch remains"
    );
    assert!(subs.take_unused().is_empty());
    drop(w2);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(subs.len(), 1, "still subscribed on the server until taken");
    assert_eq!(subs.watched(), 0);
    // A new waiter before the unsubscribe reuses the subscription: nothing to send.
    let (w3, first3) = subs.subscribe(key("k"), &AttemptId::new());
    assert!(!first3);
    assert!(subs.take_unused().is_empty());
    drop(w3);
    assert_eq!(subs.take_unused(), vec![key("k")]);
    assert!(subs.is_empty());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_dropped_attempt_takes_its_handoff_with_it() {
    let subs = Subscriptions::new("redis", "h:1");
    let a = AttemptId::new();
    let (w, _) = subs.subscribe(key("k"), &a);
    let (mut other, _) = subs.subscribe(key("k"), &AttemptId::new());
    assert!(subs.notify_handoff(&key("k"), a.as_str(), 9));
    drop(w);
    // The attempt no longer waits: a handoff to it now is not ours.
    assert!(!subs.notify_handoff(&key("k"), a.as_str(), 10));
    silent(&mut other).await;
    // A new watch of the same attempt starts with an empty mailbox.
    let (mut again, _) = subs.subscribe(key("k"), &a);
    silent(&mut again).await;
}

#[tokio::test]
async fn no_watch_never_fires() {
    let mut w = NoWatch;
    let r = tokio::time::timeout(Duration::from_millis(20), w.changed()).await;
    assert!(r.is_err(), "NoWatch woke: {r:?}");
}

#[tokio::test]
async fn watch_subscribes_on_the_server_once_and_in_order() {
    let subs: Subscriptions<String> = Subscriptions::new("postgres", "db");
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let sub = |log: Arc<Mutex<Vec<String>>>| {
        move |k: String| async move {
            log.lock().expect("log").push(format!("LISTEN {k}"));
            Ok(())
        }
    };
    let a = AttemptId::new();
    let w1 = subs
        .watch(key("k"), &a, sub(log.clone()))
        .await
        .expect("watch");
    let w2 = subs
        .watch(key("k"), &a, sub(log.clone()))
        .await
        .expect("watch");
    assert_eq!(*log.lock().expect("log"), vec!["LISTEN k".to_string()]);
    drop((w1, w2));
    let l2 = log.clone();
    let n = subs
        .unsubscribe_unused(move |k| {
            let l2 = l2.clone();
            async move {
                l2.lock().expect("log").push(format!("UNLISTEN {k}"));
                Ok(())
            }
        })
        .await
        .expect("unsubscribe");
    assert_eq!(n, 1);
    assert_eq!(log.lock().expect("log").len(), 2);
    // Subscribed again afresh.
    let _w = subs
        .watch(key("k"), &a, sub(log.clone()))
        .await
        .expect("watch");
    assert_eq!(
        log.lock().expect("log").last().map(String::as_str),
        Some("LISTEN k")
    );
    // A failing server subscription fails the watch and forgets the key.
    let e = subs
        .watch(key("bad"), &a, |_| async {
            Err(Error::connection("postgres", "db", "LISTEN failed"))
        })
        .await
        .expect_err("failed LISTEN");
    assert!(e.is_connection());
    assert_eq!(subs.len(), 1, "the failed key stayed");
}

#[tokio::test]
async fn a_pinned_key_stays_subscribed_without_watches() {
    let subs = Subscriptions::new("redis", "h:1");
    let hooks = Arc::new(AtomicUsize::new(0));
    let h = hooks.clone();
    subs.on_unused(move || {
        h.fetch_add(1, Ordering::SeqCst);
    });
    assert!(
        subs.pin(key("wake")),
        "a new key: subscribe it on the server"
    );
    assert!(!subs.pin(key("wake")), "pinned twice, subscribed once");
    assert_eq!(
        subs.watched(),
        0,
        "a pinned key without waiters is not watched"
    );
    assert_eq!(subs.in_use(), 0);
    let a = AttemptId::new();
    let (mut w, first) = subs.subscribe(key("wake"), &a);
    assert!(!first, "no SUBSCRIBE for a pinned key");
    assert_eq!(subs.watched(), 1);
    assert_eq!(subs.in_use(), 1);
    assert!(subs.notify_handoff(&key("wake"), a.as_str(), 7));
    assert_eq!(
        soon(&mut w).await.expect("wake"),
        Wake::HandedOver { token: 7 }
    );
    drop(w);
    assert_eq!(hooks.load(Ordering::SeqCst), 0, "no unsubscribe asked for");
    assert!(
        subs.take_unused().is_empty(),
        "a pinned key is never unused"
    );
    assert_eq!(subs.len(), 1, "the pinned key is still subscribed");
    assert_eq!(subs.watched(), 0);
    // A broken connection forgets it like any key: the next connection pins it again.
    assert_eq!(subs.fail_all("closed"), 1);
    assert!(subs.is_empty(), "the pinned key went with the connection");
    assert!(subs.pin(key("wake")));
}
