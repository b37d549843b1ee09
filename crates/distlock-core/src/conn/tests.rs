use super::*;
use std::time::Duration;

fn ok(url: &str) -> ConnectionString {
    ConnectionString::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
}

fn err(url: &str) -> String {
    match ConnectionString::parse(url) {
        Ok(cs) => panic!("{url} parsed: {cs:?}"),
        Err(e) => {
            assert!(matches!(e, Error::InvalidUrl { .. }), "{url}: {e:?}");
            e.to_string()
        }
    }
}

#[test]
fn every_backend_form() {
    let cs = ok("redis://127.0.0.1:6379");
    assert_eq!(cs.scheme(), "redis");
    assert_eq!(cs.hosts(), [Host::new("127.0.0.1", Some(6379))]);
    assert_eq!(cs.user(), None);
    assert!(cs.password().is_none());
    assert_eq!(cs.raw_path(), "");

    let cs = ok("rediss://:pw@h/3?namespace=shop&wait_replicas=1&wait_timeout=150ms");
    assert_eq!(cs.user(), Some(""));
    assert_eq!(cs.password().map(Password::expose), Some("pw"));
    assert_eq!(cs.endpoints(6379), "h:6379");
    assert_eq!(cs.path().unwrap(), "/3");
    assert_eq!(cs.param("namespace"), Some("shop"));
    assert_eq!(cs.u32("wait_replicas").unwrap(), Some(1));
    assert_eq!(
        cs.duration("wait_timeout").unwrap(),
        Some(Duration::from_millis(150))
    );

    let cs = ok("redlock://u:p%40ss@a:1,b:2,c?node_timeout=20ms");
    assert_eq!(cs.password().map(Password::expose), Some("p@ss"));
    assert_eq!(cs.endpoints(6379), "a:1,b:2,c:6379");
    assert_eq!(cs.redacted(), "redlock://u:***@a:1,b:2,c?node_timeout=20ms");

    let cs = ok("redlocks://[::1]:7000,[::1]:7001,[::1]/3?ca_file=/x");
    assert_eq!(cs.hosts()[0], Host::new("::1", Some(7000)));
    assert!(cs.hosts()[2].is_ipv6());
    assert_eq!(cs.hosts()[2].endpoint(6379), "[::1]:6379");
    assert_eq!(cs.param("ca_file"), Some("/x"));

    let cs = ok("etcd://u:p%40ss@h1:2379,h2/shop%2Fa/");
    assert_eq!(cs.endpoints(2379), "h1:2379,h2:2379");
    assert_eq!(cs.path().unwrap(), "/shop/a/");
    assert_eq!(cs.raw_path(), "/shop%2Fa/");

    let cs = ok("zk://a:1,b:2,c/app/locks/?namespace=shop&session_timeout=10s");
    assert_eq!(cs.endpoints(2181), "a:1,b:2,c:2181");
    assert_eq!(cs.path().unwrap(), "/app/locks/");
    cs.check_params(&["namespace", "session_timeout"]).unwrap();

    let cs = ok("postgres:///db?host=/run/postgresql&user=u");
    assert!(cs.hosts().is_empty());
    assert_eq!(cs.param("host"), Some("/run/postgresql"));
    let cs = ok("postgresql://u@h/db?options=-c%20search_path%3Dx%2By&application_name=a+b");
    assert_eq!(cs.param("options"), Some("-c search_path=x+y"));
    assert_eq!(cs.param("application_name"), Some("a b"));
    let cs = ok("postgres://%2Frun%2Fpostgresql/db");
    assert_eq!(cs.hosts()[0].host, "%2Frun%2Fpostgresql");

    let cs = ok("mysql://u:pw@127.0.0.1:7000/db?namespace=shop&mode=table");
    assert_eq!(
        cs.choice("mode", &["session", "table"]).unwrap(),
        Some("table")
    );
    assert_eq!(cs.endpoints(3306), "127.0.0.1:7000");

    let cs = ok("file://");
    assert!(cs.hosts().is_empty() && cs.raw_path().is_empty());
    let cs = ok("FILE://localhost/a%20b/");
    assert_eq!(cs.scheme(), "file");
    assert_eq!(cs.hosts()[0].host, "localhost");
    assert_eq!(cs.path_bytes().unwrap(), b"/a b/");
    let cs = ok("file:///var/%FF");
    assert_eq!(cs.path_bytes().unwrap(), b"/var/\xff");
    assert!(cs.path().is_err());
    let e = ok("file:///a%zz").path_bytes().unwrap_err().to_string();
    assert!(e.contains("%25"), "{e}");
    assert_eq!(ok("x://h#frag").fragment(), Some("frag"));
    assert_eq!(
        ok("redis://h:1").single_host("x").unwrap().endpoint(6379),
        "h:1"
    );
    let no_host = ok("redis://u:pw@/0");
    assert_eq!(
        no_host
            .single_host("redis://host:port")
            .unwrap_err()
            .to_string(),
        "invalid backend URL `redis://u:***@/0`: no host; write redis://host:port"
    );
}

#[test]
fn typed_getters_name_the_parameter() {
    let cs = ok("x://h?d=soon&n=-1&b=maybe&m=x&on=YES&last=1&last=2&empty");
    let cases = [
        (cs.duration("d").unwrap_err(), "d=`soon` is not a duration"),
        (cs.u32("n").unwrap_err(), "n=`-1` is not a whole number"),
        (cs.bool("b").unwrap_err(), "b=`maybe` is not on or off"),
        (
            cs.choice("m", &["session", "lease"]).unwrap_err(),
            "m=`x` is not one of: session, lease",
        ),
    ];
    for (e, want) in cases {
        assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
        assert!(e.to_string().contains(want), "{e}");
    }
    assert_eq!(cs.bool("on").unwrap(), Some(true));
    assert_eq!(cs.u32("last").unwrap(), Some(2));
    assert_eq!(cs.param("empty"), Some(""));
    assert_eq!(cs.duration("absent").unwrap(), None);
    let e = cs.check_params(&["d", "n"]).unwrap_err().to_string();
    assert!(e.contains("unknown parameter `b` (known: d, n)"), "{e}");
    let e = ok("etcd://h?x=1")
        .check_params(&[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown parameter `x`") && e.contains("etcd://"),
        "{e}"
    );
    ok("etcd://h").check_params(&[]).unwrap();
}

#[test]
fn malformed_host_lists() {
    for (url, want) in [
        ("localhost:6379", "no scheme"),
        ("://h", "not a scheme"),
        ("1x://h", "not a scheme"),
        ("zk://a:1,,b:2", "empty entry"),
        ("zk://a:1,", "empty entry"),
        ("redis://h:x", "not a port"),
        ("redis://h:0", "not a port"),
        ("redis://h:65536", "not a port"),
        ("redis://h:", "not a port"),
        ("redis://::1", "brackets"),
        ("redis://[::1", "unclosed"),
        ("redis://[::1]x", "expected `:port`"),
        ("redis://[]:1", "not an IPv6"),
        ("redis://[zz]:1", "not an IPv6"),
        ("redis://h%20 x", "not host[:port]"),
        ("redis://u:pa/ss@h", "percent-encode"),
        ("redis://u:1/0?x=a@b", "percent-encode"),
        ("redis://u:p%FFx@h", "not UTF-8"),
    ] {
        let e = err(url);
        assert!(e.contains(want), "{url}: {e}");
    }
}

#[test]
fn the_password_is_never_shown() {
    for url in [
        "redis://u:hunter2@h:1/0",
        "redis://:hunter2@h",
        "redlock://u:hunter2@a,b,c?x=1",
        "postgres://u@h/db?password=hunter2&mode=lease",
        "postgres://u@h/db?PassWord=hunter2",
        "mysql://u:hunter2@h:x/d",
        "etcd://u:hunter2@h:0",
        "redis://u:hunt/er2@h",
        "redis://u:hunter2@h?token=hunter2#frag",
        "redis://u:hunt?er2@h",
        "redis://u:hunt#er2@h",
        "redis://u:hunter2@[::1",
        "no scheme u:hunter2@h",
        "redis://u:hunter2@h:1,,",
    ] {
        let shown = redact(url);
        assert!(
            !shown.contains("hunter2") && !shown.contains("er2"),
            "{url} → {shown}"
        );
        match ConnectionString::parse(url) {
            Ok(cs) => {
                for text in [cs.redacted().to_owned(), format!("{cs:?}"), cs.to_string()] {
                    assert!(!text.contains("er2"), "{url} → {text}");
                }
                if let Some(p) = cs.password() {
                    assert_eq!(format!("{p} {p:?}"), "*** Password(***)");
                }
                let e = cs.invalid("x").to_string();
                assert!(!e.contains("er2"), "{e}");
            }
            Err(e) => assert!(!e.to_string().contains("er2"), "{url}: {e}"),
        }
    }
    assert_eq!(
        redact("redis://u@h/db?application_name=x@y"),
        "redis://u@h/db?application_name=x@y"
    );
    assert_eq!(redact("file:///tmp/a@b"), "file:///tmp/a@b");
    assert_eq!(ok("file:///tmp/a:b@c").path().unwrap(), "/tmp/a:b@c");
    assert_eq!(redact("redis://do/main:pw@h"), "redis://do/main:***@h");
}

#[test]
fn edits_rebuild_the_url() {
    let mut node = ok("redlock://u:p%40ss@a:1,[::1]:2?namespace=shop&node_timeout=20ms#f");
    let second = node.hosts()[1].clone();
    node.set_scheme("redis");
    node.set_hosts(vec![second]);
    node.retain_params(|k, _| k == "namespace");
    assert_eq!(node.expose_url(), "redis://u:p%40ss@[::1]:2?namespace=shop");
    assert_eq!(node.redacted(), "redis://u:***@[::1]:2?namespace=shop");
    let again = ok(node.expose_url());
    assert_eq!(again.password().map(Password::expose), Some("p@ss"));
    let mut pg = ok("postgres://u@h/db?mode=lease&options=-c%20a%3Db");
    pg.retain_params(|k, _| k != "mode");
    assert_eq!(pg.expose_url(), "postgres://u@h/db?options=-c%20a%3Db");
    assert_eq!(ok("x://h/p?a=1").expose_url(), "x://h/p?a=1");
    assert_eq!(
        ok("RedLock://h/p?a=1#F").expose_url(),
        "redlock://h/p?a=1#F"
    );
}

/// Random and hand-made garbage: parsing and redaction must never panic.
#[test]
fn never_panics() {
    let pieces = [
        "://",
        ":",
        "@",
        "/",
        "?",
        "#",
        "&",
        "=",
        ",",
        "[",
        "]",
        "%",
        "%4",
        "%41",
        "%ZZ",
        "%FF",
        "+",
        "::1",
        "h",
        "0",
        "65535",
        "99999",
        "é",
        "\u{0}",
        " ",
        "redis",
        "x",
        "pass",
        "word",
        "password=",
        "\n",
        "]:",
        "[::",
        "@@",
        ",,",
        "π",
    ];
    let mut rng = fastrand::Rng::with_seed(13);
    let mut inputs: Vec<String> = vec![
        String::new(),
        "://".into(),
        "a://".into(),
        "a://@".into(),
        "a://:@".into(),
        "a://[".into(),
        "a://]".into(),
        "a://[]".into(),
        "a://?".into(),
        "a://#".into(),
        "a://%".into(),
        "a://h?%".into(),
        "a://h?=%".into(),
        "a://u:%@h".into(),
        "a:///%".into(),
        "a://é:é@é/é?é=é#é".into(),
    ];
    for _ in 0..20_000 {
        let n = rng.usize(0..12);
        let mut s = String::new();
        if rng.bool() {
            s.push_str("redis://");
        }
        for _ in 0..n {
            s.push_str(pieces[rng.usize(0..pieces.len())]);
        }
        inputs.push(s);
    }
    for s in &inputs {
        let _ = redact(s);
        let _ = scheme_of(s);
        if let Ok(mut cs) = ConnectionString::parse(s) {
            let _ = (cs.path(), cs.path_bytes(), cs.endpoints(1), cs.u32("a"));
            let _ = (cs.duration("a"), cs.bool("a"), cs.choice("a", &["x"]));
            let _ = (cs.scrub(s), cs.single_host("x").is_ok(), cs.invalid("x"));
            cs.retain_params(|_, _| true);
            let again = ConnectionString::parse(cs.expose_url());
            assert!(again.is_ok(), "{s:?} → {:?}: {again:?}", cs.expose_url());
        }
    }
}

#[test]
fn scrubs_messages_written_from_the_raw_url() {
    let cs = ok("redis://u:p%40ssw0rd@h/db?token=t0k3n-x&a=1");
    let text = "bad `redis://u:p%40ssw0rd@h` (p@ssw0rd) t0k3n-x";
    assert_eq!(cs.scrub(text), "bad `redis://u:***@h` (***) ***");
    let e = cs.scrub_error(Error::InvalidUrl {
        url: "redis://u:p%40ssw0rd@h".into(),
        reason: "host p@ssw0rd".into(),
    });
    assert_eq!(
        e.to_string(),
        "invalid backend URL `redis://u:***@h`: host ***"
    );
    let e = cs.scrub_error(Error::Connection {
        backend: "redis",
        endpoint: "h:6379".into(),
        source: "driver saw p@ssw0rd".into(),
    });
    assert_eq!(
        e.to_string(),
        "cannot talk to redis at h:6379: driver saw ***"
    );
    // Too short to search for: messages stay readable.
    let cs = ok("redis://u:a@h");
    assert_eq!(cs.scrub("a b"), "a b");
}
