//! The clock leases are measured with.
//!
//! A server's lease runs in real time, also while this machine is suspended. `std::time::Instant`
//! is CLOCK_MONOTONIC on Linux, which stops during suspend: a holder that slept through its
//! lease would wake up believing it still had all of it. [`Instant`] reads CLOCK_BOOTTIME on
//! Linux (and Android), which keeps counting during suspend, and the monotonic clock elsewhere.
//! Every lease deadline in dlock (the lost signal, the watchdog, a grant's start) is one of these.
//!
//! Timers still sleep on tokio's clock, which stops during a suspend, so a timer fires late
//! after one. Every check compares with this clock, so a late timer never makes a lost lock
//! look held (`is_lost()` is exact); and while a client has holds its keeper looks at this
//! clock at least once a second, so a lease that ran out during a suspend fires its lost signal
//! (and resolves `lost()`) within a second of the resume.

use std::ops::{Add, Sub};
use std::time::Duration;

/// True where [`Instant::as_boottime`] is the machine-wide CLOCK_BOOTTIME (Linux, Android):
/// values from two processes of one machine can be compared.
pub const SHARED_ACROSS_PROCESSES: bool = cfg!(any(target_os = "linux", target_os = "android"));

/// A point in time on the lease clock (CLOCK_BOOTTIME on Linux). Opaque: compare, add
/// durations and measure intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(Duration);

impl Instant {
    /// Now.
    pub fn now() -> Instant {
        Instant(read() + suspended())
    }

    /// Time since `earlier`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// Time since this instant.
    pub fn elapsed(self) -> Duration {
        Instant::now().saturating_duration_since(self)
    }

    /// `self + d`, or `None` on overflow.
    pub fn checked_add(self, d: Duration) -> Option<Instant> {
        self.0.checked_add(d).map(Instant)
    }

    /// `self - d`, or `None` before the clock's origin.
    pub fn checked_sub(self, d: Duration) -> Option<Instant> {
        self.0.checked_sub(d).map(Instant)
    }

    /// The raw clock value: on Linux (and Android) CLOCK_BOOTTIME, which is the same in every
    /// process of the machine, so it can be sent to another process and compared with its own
    /// [`Instant::now`] there ([`Instant::from_boottime`]). Elsewhere the process-local
    /// monotonic fallback, **not** comparable across processes (see [`SHARED_ACROSS_PROCESSES`]).
    ///
    /// ```
    /// use distlock_core::clock::Instant;
    /// let now = Instant::now();
    /// assert_eq!(Instant::from_boottime(now.as_boottime()), now);
    /// ```
    pub fn as_boottime(self) -> Duration {
        self.0
    }

    /// The instant whose raw clock value is `d` (see [`Instant::as_boottime`]).
    pub fn from_boottime(d: Duration) -> Instant {
        Instant(d)
    }

    /// The same moment on tokio's timer clock, for sleeping until it (a moment already past
    /// is "now").
    pub fn to_tokio(self) -> tokio::time::Instant {
        let now = Instant::now();
        let tnow = tokio::time::Instant::now();
        match self.0.checked_sub(now.0) {
            Some(ahead) => tnow.checked_add(ahead).unwrap_or(tnow),
            None => tnow,
        }
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d))
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(d))
    }
}

#[cfg(test)]
thread_local! {
    /// Test seam: how far this thread's reads are ahead of the real clock. A suspend cannot be
    /// made in a test; [`suspend_for_test`] stands in for one: this clock jumps on, tokio's
    /// timers (the monotonic clock) do not.
    static SUSPENDED: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// Test seam: makes every later read on this thread `d` later, as a suspend of `d` would
/// (CLOCK_BOOTTIME moves on, CLOCK_MONOTONIC and so tokio's timers do not). Per thread, so
/// tests running side by side are not affected; a test using it runs on a current-thread
/// runtime, where the keeper and every timer of its client run on its thread.
#[cfg(test)]
pub(crate) fn suspend_for_test(d: Duration) {
    SUSPENDED.with(|s| s.set(s.get() + d));
}

#[cfg(test)]
fn suspended() -> Duration {
    SUSPENDED.with(std::cell::Cell::get)
}

#[cfg(not(test))]
fn suspended() -> Duration {
    Duration::ZERO
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn read() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on every Linux since
    // 2.6.39, and clock_gettime only writes through the pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return fallback();
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn read() -> Duration {
    fallback()
}

/// The monotonic clock, from a process-wide origin.
fn fallback() -> Duration {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_forward_with_the_monotonic_clock() {
        let a = Instant::now();
        let m = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let b = Instant::now();
        assert!(b > a);
        let d = b.saturating_duration_since(a);
        // Without a suspend in between both clocks agree closely.
        let md = m.elapsed();
        assert!(
            d + Duration::from_millis(5) >= Duration::from_millis(20),
            "{d:?}"
        );
        assert!(d <= md + Duration::from_millis(5), "{d:?} vs {md:?}");
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
        assert_eq!((a + d).saturating_duration_since(a), d);
        assert!(a.checked_sub(Duration::from_secs(u64::MAX)).is_none());
    }

    #[test]
    fn raw_values_round_trip_and_match_the_system_clock() {
        let a = Instant::now();
        let raw = a.as_boottime();
        assert_eq!(Instant::from_boottime(raw), a);
        assert!(Instant::from_boottime(raw + Duration::from_secs(1)) > a);
        assert_eq!(
            SHARED_ACROSS_PROCESSES,
            cfg!(any(target_os = "linux", target_os = "android"))
        );
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            // The raw value is CLOCK_BOOTTIME itself: as read by this process's libc call.
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: a valid, writable timespec; see `read`.
            assert_eq!(
                unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) },
                0
            );
            let sys = Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
            assert!(
                sys >= raw && sys - raw < Duration::from_secs(5),
                "{sys:?} vs {raw:?}"
            );
        }
    }

    #[tokio::test]
    async fn tokio_deadline_matches() {
        let target = Instant::now() + Duration::from_millis(30);
        tokio::time::sleep_until(target.to_tokio()).await;
        assert!(Instant::now() >= target);
    }
}
