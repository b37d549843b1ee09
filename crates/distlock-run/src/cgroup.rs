//! A cgroup v2 of the command's own, where one can be made. `cgroup.kill` ends everything in
//! it at once, a fork racing the kill included and whatever user a process runs as, and
//! `cgroup.events` says when nothing is left in it.
//!
//! Where: a child of the host's own cgroup (`/proc/self/cgroup`, `0::PATH`, under the cgroup2
//! mount `/proc/self/mountinfo` shows), named `dlock-PID-N`. Only where that directory can
//! be written (root, or a cgroup delegated to the user) and only when no systemd manages it
//! without having delegated it (systemd is the only writer of its tree unless a unit has
//! `Delegate=yes`, which it marks with the `trusted.delegate` or `user.delegate` extended
//! attribute). Without a cgroup the guard's /proc walk alone finds the command's processes
//! (see `crate::tree`); nothing fails for the want of one.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// One cgroup v2 directory made for one command.
#[derive(Debug)]
pub(crate) struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// Makes a cgroup for one command under this process's own; `None` where none can or may
    /// be made (see the module docs).
    pub(crate) fn create() -> Option<Cgroup> {
        let cg = Cgroup {
            dir: make_dir(&parent()?)?,
        };
        // cgroup.kill came with Linux 5.14; without it only the walk could stop the command,
        // and the cgroup would add nothing.
        if !cg.dir.join("cgroup.kill").exists() || cg.open_procs().is_err() {
            cg.remove();
            return None;
        }
        Some(cg)
    }

    /// The cgroup at `dir`, made by [`Cgroup::create`] in another process.
    pub(crate) fn at(dir: PathBuf) -> Cgroup {
        Cgroup { dir }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// `cgroup.procs`, open for writing: a process that writes `0` to it moves there.
    pub(crate) fn open_procs(&self) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"))
    }

    /// SIGKILLs every process in the cgroup (and its sub-cgroups).
    pub(crate) fn kill(&self) {
        if let Ok(mut f) = OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.kill"))
        {
            let _ = f.write_all(b"1");
        }
    }

    /// True while a process is in the cgroup (or a sub-cgroup). A cgroup that cannot be read
    /// (removed) holds nothing.
    pub(crate) fn populated(&self) -> bool {
        std::fs::read_to_string(self.dir.join("cgroup.events"))
            .is_ok_and(|s| s.lines().any(|l| l.trim() == "populated 1"))
    }

    /// Removes the (empty) cgroup; whoever of the host and the guard comes second finds it
    /// gone, which is fine.
    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The next `N` of this process's cgroups (`dlock-PID-N`).
static NEXT: AtomicU32 = AtomicU32::new(0);

/// This process's own cgroup v2 directory, where dlock may make one below it (see the module
/// docs); `None` elsewhere.
fn parent() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = own_path(&own)?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let parent = mounts.lines().find_map(|l| cgroup2_dir(l, &own))?;
    (parent.is_dir() && (!systemd_manages() || delegated(&parent))).then_some(parent)
}

/// Makes `PARENT/dlock-PID-N` for this process's next `N`. A directory of that name already
/// there was left by an earlier process with this PID (PIDs are reused; it is dead, the PID is
/// ours), killed before it could remove it: it is removed if empty and passed over if not, so
/// a leftover never keeps a command out of a cgroup.
fn make_dir(parent: &Path) -> Option<PathBuf> {
    for _ in 0..64 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("dlock-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Some(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if std::fs::remove_dir(&dir).is_ok() && std::fs::create_dir(&dir).is_ok() {
                    return Some(dir);
                }
            }
            Err(_) => return None,
        }
    }
    None
}

/// The cgroup v2 path in a `/proc/PID/cgroup` text (the `0::PATH` line); `None` without one
/// or for a cgroup that was removed.
fn own_path(text: &str) -> Option<String> {
    let p = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    (p.starts_with('/') && !p.ends_with(" (deleted)")).then(|| p.to_owned())
}

/// The directory of cgroup `own` if mountinfo line `line` is a cgroup2 mount that shows it.
fn cgroup2_dir(line: &str, own: &str) -> Option<PathBuf> {
    let (left, right) = line.split_once(" - ")?;
    if right.split(' ').next()? != "cgroup2" {
        return None;
    }
    let f: Vec<&str> = left.split(' ').collect();
    let (root, mount) = (unescape(f.get(3)?), unescape(f.get(4)?));
    let rel = if root == "/" {
        own
    } else {
        own.strip_prefix(root.as_str())
            .filter(|r| r.is_empty() || r.starts_with('/'))?
    };
    Some(Path::new(&mount).join(rel.trim_start_matches('/')))
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let esc = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match esc {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// True when systemd runs this machine (or container): `sd_booted()`'s test.
fn systemd_manages() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// True if systemd delegated cgroup `dir` (a unit with `Delegate=yes`).
fn delegated(dir: &Path) -> bool {
    let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    ["trusted.delegate", "user.delegate"].iter().any(|attr| {
        let Ok(name) = CString::new(*attr) else {
            return false;
        };
        let mut buf = [0u8; 8];
        // SAFETY: both strings are NUL-terminated; getxattr writes at most buf.len() bytes.
        let n = unsafe {
            libc::getxattr(
                path.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        usize::try_from(n).is_ok_and(|n| buf.get(..n) == Some(b"1"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cgroup_path() {
        let hybrid = "9:name=systemd:/\n4:memory:/x\n0::/a/b\n";
        assert_eq!(own_path(hybrid).as_deref(), Some("/a/b"));
        assert_eq!(own_path("4:memory:/x\n"), None);
        assert_eq!(own_path("0::/gone (deleted)\n"), None);
    }

    #[test]
    fn cgroup2_mounts() {
        let l = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        assert_eq!(
            cgroup2_dir(l, "/a/b"),
            Some(PathBuf::from("/sys/fs/cgroup/unified/a/b"))
        );
        assert_eq!(
            cgroup2_dir(l, "/"),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        // A mount of a subtree: the path is taken relative to its root.
        let sub = "50 31 0:38 /a /mnt/my\\040cg rw - cgroup2 cgroup2 rw";
        assert_eq!(
            cgroup2_dir(sub, "/a/b"),
            Some(PathBuf::from("/mnt/my cg/b"))
        );
        assert_eq!(cgroup2_dir(sub, "/ab"), None);
        assert_eq!(cgroup2_dir(sub, "/c"), None);
        let v1 = "30 25 0:26 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids";
        assert_eq!(cgroup2_dir(v1, "/"), None);
    }

    /// A cgroup left by an earlier process that had this PID (killed with its guard, so
    /// neither removed it) does not keep the next command out of one: the name is taken
    /// over when empty and passed over when not.
    #[test]
    fn a_leftover_of_an_earlier_process_with_this_pid_is_no_obstacle() {
        let Some(parent) = parent() else {
            eprintln!("no cgroup v2 can be made here");
            return;
        };
        let next = NEXT.load(Ordering::Relaxed);
        let leftovers: Vec<PathBuf> = (next..next + 3)
            .map(|n| parent.join(format!("dlock-{}-{n}", std::process::id())))
            .collect();
        if leftovers.iter().any(|d| std::fs::create_dir(d).is_err()) {
            eprintln!("no cgroup v2 can be made here");
            return;
        }
        let cg = Cgroup::create();
        let made = cg.as_ref().map(|c| c.path().to_owned());
        if let Some(c) = &cg {
            c.remove();
        }
        for d in &leftovers {
            let _ = std::fs::remove_dir(d);
        }
        assert!(
            made.is_some(),
            "a leftover dlock-{}-{next} kept dlock from making a cgroup",
            std::process::id()
        );
    }

    /// Where this machine allows a cgroup (as the CI machine does), one is made, takes a
    /// process, kills it and goes; elsewhere `create` just says no.
    #[test]
    fn a_cgroup_takes_a_process_and_kills_it() {
        let Some(cg) = Cgroup::create() else {
            eprintln!("no cgroup v2 can be made here; only the walk is tested");
            return;
        };
        assert!(!cg.populated());
        let procs = cg.open_procs().expect("procs");
        use std::os::fd::AsRawFd;
        let fd = procs.as_raw_fd();
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("60");
        // SAFETY: write(2) is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                libc::write(fd, b"0".as_ptr().cast(), 1);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("sleep");
        assert!(cg.populated());
        cg.kill();
        let st = child.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGKILL)
        );
        assert!(!cg.populated());
        cg.remove();
        assert!(!cg.path().exists());
    }
}
