//! Broken pipes: `dlock list | head -1`, `dlock completions bash | true`.
//!
//! Standard output going away is how a reader says it has read enough. dlock then ends as the
//! classic Unix tools do, killed by SIGPIPE (status 141 in a shell), after its destructors
//! ran (locks released, worker processes killed), never with a panic message and exit 101.
//! Rust ignores SIGPIPE, so a write to a closed pipe is an error, and `println!` panics on
//! it; [`catch`] turns that panic (in dlock or in a crate it uses) into the SIGPIPE ending.
//! Standard error going away ends nothing: dlock's `eprintln!` ignores write errors.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the panic hook when a panic was a write to a closed pipe.
static BROKEN: AtomicBool = AtomicBool::new(false);

/// True for the message of a panic caused by writing to a closed pipe (`println!`'s
/// "failed printing to stdout: Broken pipe (os error 32)", or an `expect` on the
/// `io::Error`, whose debug form names `BrokenPipe`).
fn is_broken_pipe(payload: &(dyn std::any::Any + Send)) -> bool {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("");
    text.contains("Broken pipe") || text.contains("BrokenPipe")
}

/// Runs `main`; a panic from writing to a closed pipe ends the process by SIGPIPE, quietly.
/// Any other panic goes on as a panic.
pub fn catch(main: impl FnOnce() -> u8 + std::panic::UnwindSafe) -> u8 {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if is_broken_pipe(info.payload()) {
            BROKEN.store(true, Ordering::SeqCst);
        } else {
            default(info);
        }
    }));
    match std::panic::catch_unwind(main) {
        Ok(code) => code,
        Err(_) if BROKEN.load(Ordering::SeqCst) => die_of_sigpipe(),
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

/// Writes `bytes` to standard output; a closed pipe ends the process as SIGPIPE would.
pub fn write_stdout(bytes: &[u8]) -> u8 {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => die_of_sigpipe(),
        Err(e) => {
            eprintln!("dlock: cannot write to standard output: {e}");
            crate::EXIT_ERROR
        }
    }
}

/// Ends the process by SIGPIPE (its default action restored), as a tool that never ignored
/// it would have ended; exit status 141 if the signal does not end it.
fn die_of_sigpipe() -> ! {
    // SAFETY: restoring a signal's default action and raising it in this process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE)
}
