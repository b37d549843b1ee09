//! dlock's ZooKeeper mutex and Apache Curator's `InterProcessMutex` on the same path exclude
//! each other, in both directions: dlock's nodes follow Curator's recipe (ephemeral sequential
//! `_c_<id>-lock-<seq>` children, lowest sequence holds), so each sees the other's node in its
//! queue. Curator itself runs in a JVM (`tests/curator/Holder.java`, launched as a single
//! source file) with the jars of Debian's `libcurator-recipes-java`; the test is skipped, saying
//! so, when `java` or a jar is missing.

use distlock_core::{Client, LockKind};
use distlock_testkit::conformance::{fast_opts, unique_name, wait_for_waiters};
use distlock_testkit::ZkEnsemble;
use distlock_zookeeper::lock_dir;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::sync::mpsc;

mod common;
use common::{released, shared_client};

/// Where Debian installs the jars, and the ones Curator's mutex needs at run time.
const JAR_DIR: &str = "/usr/share/java";
const JARS: &[&str] = &[
    "curator-recipes.jar",
    "curator-framework.jar",
    "curator-client.jar",
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "guava.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
];

/// The `java` binary, as the test kit's ZooKeeper servers use it.
fn java() -> String {
    std::env::var(distlock_testkit::ZOOKEEPER_JAVA_ENV).unwrap_or_else(|_| "java".into())
}

/// The class path, or why the test cannot run.
fn class_path() -> Result<String, String> {
    let java = java();
    match Command::new(&java)
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(format!("`{java} -version` failed ({s})")),
        Err(e) => return Err(format!("no `{java}` ({e})")),
    }
    let mut paths = Vec::new();
    for jar in JARS {
        let p = Path::new(JAR_DIR).join(jar);
        if !p.exists() {
            return Err(format!(
                "{} is missing (Debian package libcurator-recipes-java, zookeeper, libslf4j-java)",
                p.display()
            ));
        }
        paths.push(p.display().to_string());
    }
    Ok(paths.join(":"))
}

/// One Curator process holding `InterProcessMutex` on a path; killed when dropped.
struct Holder {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Holder {
    fn start(class_path: &str, connect: &str, path: &str, hold: Duration) -> Holder {
        let source: PathBuf = [
            env!("CARGO_MANIFEST_DIR"),
            "tests",
            "curator",
            "Holder.java",
        ]
        .iter()
        .collect();
        let mut child = Command::new(java())
            .arg("-cp")
            .arg(class_path)
            .arg(&source)
            .arg(connect)
            .arg(path)
            .arg(hold.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the Curator holder");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Holder {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for the line `want` (at most `within`).
    async fn expect(&mut self, want: &str, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while !self.seen.iter().any(|l| l == want) {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => self.seen.push(line),
                Ok(None) => panic!("the Curator holder ended before `{want}`: {:?}", self.seen),
                Err(_) => panic!(
                    "no `{want}` from Curator within {within:?}: {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Whether the holder said `line` so far.
    fn said(&mut self, line: &str) -> bool {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        self.seen.iter().any(|l| l == line)
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        tokio::task::block_in_place(|| self.child.wait()).expect("wait")
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn client() -> Client {
    shared_client(fast_opts()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_dlock_exclude_each_other() {
    let class_path = match class_path() {
        Ok(cp) => cp,
        Err(why) => {
            distlock_testkit::skip_or_fail("curator_and_dlock_exclude_each_other", &why);
            return;
        }
    };
    let ensemble = ZkEnsemble::shared();
    let a = client().await;
    let b = client().await;
    let name = unique_name("curator");
    // The path Curator's recipe is given: dlock's lock directory of the mutex `name`.
    let path = lock_dir("dlock", &name, LockKind::Mutex).expect("dir");

    // dlock holds: Curator queues and waits.
    let g = a
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    let mut curator = Holder::start(
        &class_path,
        &ensemble.connect_string(),
        &path,
        Duration::from_secs(4),
    );
    // A JVM starting on a loaded machine: generous.
    curator.expect("WAITING", Duration::from_secs(60)).await;
    // Curator's node is in dlock's queue, behind dlock's.
    wait_for_waiters(&b, &name, LockKind::Mutex, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !curator.said("ACQUIRED"),
        "Curator took the mutex while dlock held it"
    );
    let t1 = g.fencing_token();
    released(g).await;
    curator.expect("ACQUIRED", Duration::from_secs(10)).await;

    // Curator holds (for 4 s): dlock's try fails, and its wait queues behind Curator.
    let lock = b.lock(&name).expect("lock");
    let info = b.inspect(&name).await.expect("inspect");
    if let Some(early) = lock.try_acquire().await.expect("try") {
        // Only right if Curator's 4 s were over already (a very slow machine): then its
        // release came before our look at the queue.
        curator.expect("RELEASED", Duration::from_secs(10)).await;
        eprintln!("Curator released before dlock's try (a slow run): exclusion not checked");
        drop(early);
    } else {
        assert_eq!(info.holders.len(), 1, "{info:?}");
        assert_ne!(info.holders[0].owner, lock.owner(), "{info:?}");
    }
    let g2 = lock
        .acquire_timeout(Duration::from_secs(20))
        .await
        .expect("dlock gets the mutex after Curator");
    assert!(curator.said("RELEASED"), "granted before Curator released");
    assert!(g2.fencing_token() > t1);
    assert!(curator.wait_exit().success(), "the Curator holder failed");
    released(g2).await;
}
