//! Client CPU: this process's CPU time (getrusage: the redis-servers are other processes), and
//! `--profile dlock|rslock [PAIRS]`, a loop of acquire+release pairs of one library alone on a
//! current-thread runtime, to count its instructions with callgrind:
//!
//! ```sh
//! b=$(cargo bench -p distlock-lab --bench peers --no-run 2>&1 | grep -o 'target/.*peers-[0-9a-f]*')
//! for n in 200 1200; do valgrind --tool=callgrind --callgrind-out-file=cg.$n $b --profile dlock $n; done
//! # instructions per pair: (total of cg.1200 - total of cg.200) / 1000
//! ```

use super::*;

/// CPU time (user + system) of this process so far.
pub(super) fn cpu_time() -> Duration {
    // SAFETY: getrusage writes the struct it is given; a zeroed rusage is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// `--profile LIB [PAIRS]`: `PAIRS` (default 1,000) acquire+release pairs of `LIB` after a
/// warm-up, on a current-thread runtime, then the client CPU they took.
pub(super) fn profile(lib: &str, pairs: usize) -> Res<()> {
    let server = RedisServer::start()?;
    let one = [server.url()];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let cpu = rt.block_on(async {
        match lib {
            "dlock" => pairs_alone(&Dlock, &one, pairs).await,
            "rslock" => pairs_alone(&Rslock, &one, pairs).await,
            other => Err(format!("--profile dlock|rslock, not {other:?}").into()),
        }
    })?;
    println!(
        "{lib}: {pairs} pairs, client CPU {:.1} µs per pair",
        us(cpu) / pairs.max(1) as f64
    );
    Ok(())
}

async fn pairs_alone<P: Peer>(peer: &P, nodes: &[String], pairs: usize) -> Res<Duration> {
    let l = solo(peer, nodes).await?;
    let before = cpu_time();
    for _ in 0..pairs {
        pair(&l).await?;
    }
    Ok(cpu_time().saturating_sub(before))
}
