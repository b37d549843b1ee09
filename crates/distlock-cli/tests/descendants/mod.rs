//! Shared by `run_guard.rs` (`dlock run`) and `elect.rs` (`dlock elect`): every process the
//! command starts, whatever process group or session it moves to, is gone before the lock
//! (or the leadership) is released, reported lost, or can go to another owner.
//!
//! Each scenario runs the four ways a process leaves the command's process group at once,
//! each under its own lock name: coreutils `timeout` (its own group), `setsid` (its own
//! session), a daemon (double fork + `setsid`, ignoring SIGTERM) and a shell with job control
//! (`bash -m`: every job its own group). Every one ends in `sleep TAG`, with a TAG unique to
//! the case; a survivor is any live process with TAG as an argument (TAG only ever reaches
//! argv through `$DLOCK_TEST_TAG`, so dlock's and the guard's own command lines never carry
//! it). "Another owner cannot get the lock while one runs" is checked by the next owner's
//! own command: the test looks for survivors the moment that command has started.
//!
//! Half the cases run with `DLOCK_CGROUP=off` (the /proc tree walk alone), half with the
//! default (a cgroup where this machine allows one, checked).
#![allow(dead_code)] // each test binary uses its own subset

use distlock_testkit::{DelayProxy, RedisServer, TempDir};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long to wait for what must happen: far above what it takes on a loaded machine; it
/// only costs time when the test fails anyway.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The binary under test: this build, or `DLOCK_TEST_BIN` (to run these tests against another
/// build, e.g. the one before a fix, and see them fail).
pub fn bin() -> String {
    std::env::var("DLOCK_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_dlock").to_string())
}

/// `dlock run` or `dlock elect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    Run,
    Elect,
}

impl Cmd {
    fn sub(self) -> &'static str {
        match self {
            Cmd::Run => "run",
            Cmd::Elect => "elect",
        }
    }

    /// The Redis key of its grant.
    fn key(self, name: &str) -> String {
        match self {
            Cmd::Run => format!("dlock:{{{name}}}"),
            Cmd::Elect => format!("dlock:{{{name}}}:election"),
        }
    }
}

/// How the command's last process gets out of the command's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `timeout 60 …`: coreutils `timeout` puts itself in a group of its own.
    Timeout,
    /// `setsid …`: a session of its own.
    Setsid,
    /// A daemon: `(setsid … &) &`, double fork and a new session, ignoring SIGTERM.
    Daemon,
    /// `bash -m`: job control, every background job in a group of its own. (`bash -m -c`
    /// without a terminal turns job control off again, so the script says `set -m`, which is
    /// what `bash -m` does under a terminal.)
    Jobs,
}

pub const SHAPES: [Shape; 4] = [Shape::Timeout, Shape::Setsid, Shape::Daemon, Shape::Jobs];

impl Shape {
    /// The shape as shell text that starts `$DLOCK_TEST_LEAF` (and returns at once when put
    /// in the background).
    fn shell(self) -> &'static str {
        match self {
            Shape::Timeout => r#"timeout 60 sh -c "$DLOCK_TEST_LEAF""#,
            Shape::Setsid => r#"setsid sh -c "$DLOCK_TEST_LEAF""#,
            Shape::Daemon => r#"(setsid sh -c "$DLOCK_TEST_LEAF" &)"#,
            Shape::Jobs => r#"bash -c 'set -m; sh -c "$DLOCK_TEST_LEAF" & wait'"#,
        }
    }
}

/// One command shape under one lock name.
pub struct Case {
    pub cmd: Cmd,
    pub shape: Shape,
    pub name: String,
    /// The unique `sleep` argument of this case's processes.
    pub tag: String,
    /// Whether dlock may use a cgroup (else `DLOCK_CGROUP=off`).
    pub cgroup: bool,
    /// `--kind write` for `dlock run` on a read-write lock (its own file on `file://`), or
    /// nothing (a mutex; an election).
    pub kind: &'static [&'static str],
    dir: PathBuf,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The four shapes for `cmd`, files under `dir`; cgroups on for half of them (the other half
/// for the other command).
pub fn cases(cmd: Cmd, dir: &Path) -> Vec<Case> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, &shape)| {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let name = format!("tree-{}-{i}-{seq}", cmd.sub());
            let cdir = dir.join(&name);
            std::fs::create_dir_all(&cdir).expect("case dir");
            Case {
                cmd,
                shape,
                tag: format!("300.{:07}{:03}{i}", std::process::id(), seq % 1000),
                cgroup: (i + cmd as usize).is_multiple_of(2),
                kind: &[],
                name,
                dir: cdir,
            }
        })
        .collect()
}

/// A holding dlock: SIGKILLed and reaped on drop.
pub struct Holder {
    pub child: Child,
    stderr: PathBuf,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Holder {
    /// Its exit code, waiting at most [`PATIENCE`].
    pub fn wait(&mut self) -> Option<i32> {
        wait_exit(&mut self.child)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling a process this test started.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }
}

/// The next owner: a `dlock run/elect --wait` whose command marks that it started and then
/// waits to be told to end.
pub struct Next {
    child: Child,
    started: PathBuf,
    done: PathBuf,
}

impl Drop for Next {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_exit(c: &mut Child) -> Option<i32> {
    let t = Instant::now();
    loop {
        if let Some(st) = c.try_wait().expect("try_wait") {
            return st.code();
        }
        assert!(t.elapsed() < PATIENCE, "dlock did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Case {
    fn pidfile(&self) -> PathBuf {
        self.dir.join("pids")
    }

    /// The last process of the shape: records its pid, then becomes `sleep TAG`.
    fn leaf(&self) -> String {
        let trap = if self.shape == Shape::Daemon {
            "trap '' TERM; "
        } else {
            ""
        };
        format!(
            "{trap}echo $$ >> {}; exec sleep \"$DLOCK_TEST_TAG\"",
            self.pidfile().display()
        )
    }

    /// The command while it keeps running: the shape itself where the command's own process
    /// moves (`timeout`, `setsid`), else a shell that starts the shape and sleeps on.
    pub fn running(&self) -> Vec<String> {
        let leaf = self.leaf();
        let v: Vec<&str> = match self.shape {
            Shape::Timeout => vec!["timeout", "60", "sh", "-c", &leaf],
            Shape::Setsid => vec!["setsid", "sh", "-c", &leaf],
            Shape::Daemon => vec![
                "sh",
                "-c",
                r#"(setsid sh -c "$DLOCK_TEST_LEAF" &) & exec sleep "$DLOCK_TEST_TAG""#,
            ],
            Shape::Jobs => vec!["bash", "-c", r#"set -m; sh -c "$DLOCK_TEST_LEAF" & wait"#],
        };
        v.into_iter().map(String::from).collect()
    }

    fn go(&self) -> PathBuf {
        self.dir.join("go")
    }

    /// The command that starts the shape, waits for [`Case::release`] and exits 3, leaving
    /// the shape's process running.
    pub fn leaving(&self) -> Vec<String> {
        let script = format!(
            "{shape} & while [ ! -s {p} ]; do sleep 0.01; done; \
             while [ ! -e {g} ]; do sleep 0.01; done; exit 3",
            shape = self.shape.shell(),
            p = self.pidfile().display(),
            g = self.go().display(),
        );
        vec!["sh".into(), "-c".into(), script]
    }

    /// Lets a [`Case::leaving`] command exit.
    pub fn release(&self) {
        std::fs::write(self.go(), b"").expect("go");
    }

    fn dlock(&self, url: &str) -> Command {
        let mut c = Command::new(bin());
        c.env("DLOCK_BACKEND", url)
            .env("DLOCK_TEST_LEAF", self.leaf())
            .env("DLOCK_TEST_TAG", &self.tag)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if !self.cgroup {
            c.env("DLOCK_CGROUP", "off");
        }
        c
    }

    /// `dlock run/elect ARGS… NAME -- command`, its stderr to a file (a pipe would stay open
    /// as long as a survivor does).
    pub fn hold(&self, url: &str, args: &[&str], command: &[String]) -> Holder {
        let stderr = self.dir.join("holder.err");
        let child = self
            .dlock(url)
            .arg(self.cmd.sub())
            .args(self.kind)
            .args(args)
            .arg(&self.name)
            .arg("--")
            .args(command)
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("dlock");
        Holder { child, stderr }
    }

    /// Waits until the shape's last process runs; returns the cgroup it runs in, for
    /// [`Case::check_cgroup`] once the behaviour was checked.
    pub fn wait_ready(&self) -> String {
        wait_until(&format!("{:?} to start", self.shape), || {
            self.pids().iter().any(|&p| alive(p))
        });
        cgroup_of(self.pids()[0])
    }

    /// The shape ran in a cgroup of dlock's where this machine allows one and dlock may use
    /// it, else not.
    pub fn check_cgroup(&self, cg: &str) {
        let in_ours = cg
            .rsplit('/')
            .next()
            .is_some_and(|c| c.starts_with("dlock-"));
        if !self.cgroup {
            assert!(
                !in_ours,
                "DLOCK_CGROUP=off, yet {:?} ran in cgroup {cg}",
                self.shape
            );
        } else if cgroups_here() {
            assert!(
                in_ours,
                "cgroups can be made here, yet {:?} ran in {cg}",
                self.shape
            );
        }
    }

    fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.pidfile())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Live processes with this case's TAG as an argument: `pid cmdline` each.
    pub fn survivors(&self) -> Vec<String> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return out;
        };
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            if args.contains(&self.tag.as_bytes()) && alive(pid) {
                out.push(format!(
                    "{pid} {}",
                    String::from_utf8_lossy(&cmdline).replace('\0', " ")
                ));
            }
        }
        out
    }

    /// An error naming the survivors if any process of this case still runs.
    pub fn gone(&self, when: &str, holder: &Holder) -> Result<(), String> {
        let left = self.survivors();
        if left.is_empty() {
            return Ok(());
        }
        Err(format!(
            "dlock {}{} / {:?} (cgroup {}): still running {when}: {left:?}; dlock said: {:?}",
            self.cmd.sub(),
            self.kind
                .iter()
                .map(|k| format!(" {k}"))
                .collect::<String>(),
            self.shape,
            if self.cgroup { "allowed" } else { "off" },
            holder.stderr()
        ))
    }

    /// The next owner of the same lock (election), waiting up to [`PATIENCE`].
    pub fn next(&self, url: &str) -> Next {
        let started = self.dir.join("next-started");
        let done = self.dir.join("next-done");
        let script = format!(
            "touch {s}; while [ ! -e {d} ]; do sleep 0.02; done",
            s = started.display(),
            d = done.display()
        );
        let child = Command::new(bin())
            .env("DLOCK_BACKEND", url)
            .arg(self.cmd.sub())
            .args(self.kind)
            .args(["--wait", "60s", &self.name, "--", "sh", "-c"])
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("next owner");
        Next {
            child,
            started,
            done,
        }
    }

    /// Waits until `next` got the lock and runs its command; no process of this case may be
    /// alive by then (else the error). Then lets it end (exit 0).
    pub fn check_next(&self, next: &mut Next, holder: &Holder) -> Result<(), String> {
        wait_until("the next owner to run its command", || {
            next.started.exists()
        });
        let r = self.gone("when another owner got the lock", holder);
        std::fs::write(&next.done, b"").expect("done");
        assert_eq!(wait_exit(&mut next.child), Some(0), "the next owner");
        r
    }
}

/// Panics with every error, if any.
fn all_ok(errors: Vec<Result<(), String>>) {
    let errors: Vec<String> = errors.into_iter().filter_map(Result::err).collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

impl Drop for Case {
    fn drop(&mut self) {
        // A failed run leaves its processes: stop them (they carry our unique tag).
        for line in self.survivors() {
            if let Some(pid) = line.split(' ').next().and_then(|p| p.parse::<i32>().ok()) {
                // SAFETY: a process this test's dlock started (it carries our unique tag).
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The cgroup v2 path of `pid` (`0::PATH`), or "".
fn cgroup_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        .unwrap_or_default()
}

/// True if this process could make a cgroup v2 child of its own cgroup with `cgroup.kill`
/// (and no systemd runs the machine: under systemd dlock only uses a delegated cgroup).
fn cgroups_here() -> bool {
    if Path::new("/run/systemd/system").is_dir() {
        return false;
    }
    let own = cgroup_of(std::process::id());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Some(mount) = mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let f: Vec<&str> = left.split(' ').collect();
        (right.starts_with("cgroup2 ") && f.get(3) == Some(&"/")).then(|| f[4].to_owned())
    }) else {
        return false;
    };
    let probe = Path::new(&mount)
        .join(own.trim_start_matches('/'))
        .join(format!("dlock-test-probe-{}", std::process::id()));
    if std::fs::create_dir(&probe).is_err() {
        return false;
    }
    let kill = probe.join("cgroup.kill").exists();
    let _ = std::fs::remove_dir(&probe);
    kill
}

/// The four shapes' holders, started and running.
struct Scenario {
    cases: Vec<Case>,
    holders: Vec<Holder>,
    /// The cgroup each shape's last process ran in.
    cgroups: Vec<String>,
}

impl Scenario {
    /// `dlock CMD ARGS… NAME -- command` for each shape at `url`; returns once every shape's
    /// last process runs.
    fn start(
        cmd: Cmd,
        dir: &TempDir,
        url: &str,
        args: &[&str],
        command: fn(&Case) -> Vec<String>,
    ) -> Scenario {
        Scenario::start_cases(cases(cmd, dir.path()), url, args, command)
    }

    fn start_cases(
        cases: Vec<Case>,
        url: &str,
        args: &[&str],
        command: fn(&Case) -> Vec<String>,
    ) -> Scenario {
        let holders = cases
            .iter()
            .map(|c| c.hold(url, args, &command(c)))
            .collect();
        let cgroups = cases.iter().map(Case::wait_ready).collect();
        Scenario {
            cases,
            holders,
            cgroups,
        }
    }

    /// The next owner of each lock at `url`, waiting.
    fn nexts(&self, url: &str) -> Vec<Next> {
        self.cases.iter().map(|c| c.next(url)).collect()
    }

    /// Each next owner gets the lock, and no process of its shape runs by then.
    fn check_nexts(&self, nexts: &mut [Next]) {
        all_ok(
            (self
                .cases
                .iter()
                .zip(nexts.iter_mut())
                .zip(self.holders.iter()))
            .map(|((c, n), h)| c.check_next(n, h))
            .collect(),
        );
    }

    /// Waits for every holder to exit: no process of any shape may be left by then, and each
    /// exits with `code`; then checks the cgroups.
    fn end(mut self, when: &str, code: Option<i32>) {
        let codes: Vec<Option<i32>> = self.holders.iter_mut().map(Holder::wait).collect();
        all_ok(
            (self.cases.iter().zip(self.holders.iter()))
                .map(|(c, h)| c.gone(when, h))
                .collect(),
        );
        for (got, h) in codes.iter().zip(&self.holders) {
            assert_eq!(*got, code, "{}", h.stderr());
        }
        for (c, cg) in self.cases.iter().zip(&self.cgroups) {
            c.check_cgroup(cg);
        }
    }
}

fn file_url(dir: &TempDir) -> String {
    format!("file://{}", dir.path().join("locks").display())
}

/// The lock is deleted on the server: dlock exits 76, and only once nothing of any shape is
/// left.
pub fn lost_lock(cmd: Cmd) {
    let server = RedisServer::start().expect("redis");
    let dir = TempDir::new().expect("tempdir");
    let args = ["--lease", "2s", "--grace", "300ms"];
    let s = Scenario::start(cmd, &dir, &server.url(), &args, Case::running);
    for c in &s.cases {
        server.command(&["DEL", &cmd.key(&c.name)]).expect("del");
    }
    s.end("after dlock reported the lock lost", Some(76));
}

/// Renewals stop getting through (a blackholed proxy); another owner gets the lock once the
/// lease ran out on the server: by then every process of every shape is gone.
pub fn renewals_fail(cmd: Cmd) {
    let server = RedisServer::start().expect("redis");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let via_proxy = format!("redis://127.0.0.1:{}", proxy.port());
    let dir = TempDir::new().expect("tempdir");
    let args = ["--lease", "2s", "--grace", "300ms"];
    let s = Scenario::start(cmd, &dir, &via_proxy, &args, Case::running);
    proxy.set_blackhole(true);
    let mut nexts = s.nexts(&server.url());
    s.check_nexts(&mut nexts);
    s.end("after dlock exited", Some(76));
}

/// Where a scenario's lock lives.
#[derive(Debug, Clone, Copy)]
pub enum Where {
    Redis,
    File,
}

/// The command exits (3) and leaves a process of each shape behind; the next owner is already
/// waiting: it gets the lock only once they are all gone, and dlock exits 3.
pub fn normal_exit(cmd: Cmd, at: Where) {
    let dir = TempDir::new().expect("tempdir");
    let server = match at {
        Where::Redis => Some(RedisServer::start().expect("redis")),
        Where::File => None,
    };
    let url = server.as_ref().map_or_else(|| file_url(&dir), |s| s.url());
    let args = ["--lease", "5s", "--grace", "300ms"];
    let s = Scenario::start(cmd, &dir, &url, &args, Case::leaving);
    let mut nexts = s.nexts(&url);
    for c in &s.cases {
        c.release();
    }
    s.check_nexts(&mut nexts);
    s.end("after dlock exited", Some(3));
}

/// dlock itself is signalled (`sig`: SIGKILL, or SIGTERM that it forwards) on `file://`, with
/// the next owner waiting: the lock goes to it only once every process of every shape is gone.
pub fn dlock_killed_on_file(cmd: Cmd, sig: i32) {
    let dir = TempDir::new().expect("tempdir");
    let url = file_url(&dir);
    let s = Scenario::start(cmd, &dir, &url, &["--grace", "300ms"], Case::running);
    let mut nexts = s.nexts(&url);
    for h in &s.holders {
        h.signal(sig);
    }
    s.check_nexts(&mut nexts);
    // SIGKILLed: no code. SIGTERM: forwarded to the command's own process (or, for the
    // daemon, the shell in the group), which dies of it: 128 + 15.
    let code = (sig != libc::SIGKILL).then_some(128 + sig);
    s.end("after dlock exited", code);
}

/// The pid of `holder`'s guard (`dlock __guard`, its child).
fn guard_of(holder: &Holder) -> i32 {
    let host = holder.child.id().to_string();
    let mut found = None;
    wait_until("the guard", || {
        found = std::fs::read_dir("/proc").ok().and_then(|d| {
            d.flatten().find_map(|e| {
                let pid: i32 = e.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let guard = cmdline.split(|&b| b == 0).any(|a| a == b"__guard");
                (ppid == host && guard).then_some(pid)
            })
        });
        found.is_some()
    });
    found.unwrap_or_default()
}

/// Holds process `pid` in a ptrace stop (a stop that neither SIGCONT nor the kernel's
/// SIGHUP+SIGCONT to an orphaned process group ends) until [`release_traced`]; `false` if
/// this process may not trace it. Must be called from the thread that releases it.
fn hold_traced(pid: i32) -> bool {
    let none = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: ptrace with PTRACE_SEIZE / PTRACE_INTERRUPT takes no memory from us.
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, none, none) } != 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, pid, none, none) };
    let mut st = 0;
    // SAFETY: waitpid writes only into `st`; as its tracer we may wait for it.
    let rc = unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
    rc == pid && libc::WIFSTOPPED(st)
}

fn release_traced(pid: i32) {
    let none = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: PTRACE_DETACH of a tracee in a ptrace stop; takes no memory from us.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, none, none) };
}

/// dlock is SIGKILLed on `file://` while its guard cannot stop the command yet (the test
/// holds the guard in a ptrace stop: a stand-in for a command that takes long to kill). The
/// lock must stay held — through the guard's duplicate of the lock file's descriptor — until
/// the guard has killed everything, and only then go to the next owner.
pub fn dlock_killed_while_its_guard_is_held(cmd: Cmd) {
    let dir = TempDir::new().expect("tempdir");
    let url = file_url(&dir);
    let mut cases = cases(cmd, dir.path());
    if cmd == Cmd::Run {
        // Half of them on the write side of a read-write lock: another file, the same rule.
        for c in cases.iter_mut().skip(1).step_by(2) {
            c.kind = &["--kind", "write"];
        }
    }
    let mut s = Scenario::start_cases(cases, &url, &["--grace", "300ms"], Case::running);
    let guards: Vec<i32> = s.holders.iter().map(guard_of).collect();
    if !guards.iter().all(|&g| hold_traced(g)) {
        guards.iter().for_each(|&g| release_traced(g));
        distlock_testkit::skip_or_fail(
            "dlock_killed_while_its_guard_is_held",
            "this process may not ptrace its grandchildren",
        );
        return;
    }
    for h in s.holders.iter_mut() {
        h.signal(libc::SIGKILL);
        assert_eq!(h.wait(), None, "killed");
    }
    // dlock is gone (its descriptors closed before it could be reaped); the command runs on.
    let mut errors = Vec::new();
    for c in &s.cases {
        let out = Command::new(bin())
            .env("DLOCK_BACKEND", &url)
            .arg(cmd.sub())
            .args(c.kind)
            .args(["--wait", "0", &c.name, "--", "true"])
            .stdin(Stdio::null())
            .output()
            .expect("try");
        if out.status.code() != Some(75) {
            errors.push(Err(format!(
                "dlock {}{} / {:?}: another owner got the lock while the command still ran \
                 (exit {:?}; still running: {:?})",
                cmd.sub(),
                c.kind.iter().map(|k| format!(" {k}")).collect::<String>(),
                c.shape,
                out.status.code(),
                c.survivors()
            )));
        }
    }
    let mut nexts = s.nexts(&url);
    guards.iter().for_each(|&g| release_traced(g));
    all_ok(errors);
    s.check_nexts(&mut nexts);
    s.end("after the guard exited", None);
}

/// The guard is SIGKILLed from outside (the OOM killer's choice, a careless `kill -9`): what
/// the command started is re-parented to dlock (a subreaper too), which kills it before it
/// releases the lock and exits with the guard's status (137).
pub fn guard_killed(cmd: Cmd) {
    let dir = TempDir::new().expect("tempdir");
    let url = file_url(&dir);
    let s = Scenario::start(cmd, &dir, &url, &["--grace", "300ms"], Case::running);
    let mut nexts = s.nexts(&url);
    for h in &s.holders {
        // SAFETY: signalling the guard of a dlock this test started.
        unsafe {
            libc::kill(guard_of(h), libc::SIGKILL);
        }
    }
    s.check_nexts(&mut nexts);
    s.end("after dlock exited", Some(128 + libc::SIGKILL));
}
