//! [`Deadline`]: the end of a wait, or none.

use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The end of a wait: a point in time, or none (wait as long as it takes).
///
/// It is on the monotonic clock (`std::time::Instant`), the clock of the `deadline` that
/// [`Backend::acquire_wait`](crate::Backend::acquire_wait) receives, so a backend converts
/// with [`Deadline::from`] and back with [`Deadline::instant`] for free. (Lease deadlines are on
/// the lease clock, [`clock::Instant`](crate::clock::Instant); a wait's end is not a lease.)
/// Sleeps go through tokio's timer.
///
/// ```
/// use distlock_core::backend::Deadline;
/// use std::time::Duration;
/// let d = Deadline::after(Duration::from_secs(60));
/// assert!(!d.passed());
/// assert_eq!(d.cap(Duration::from_millis(5)), Duration::from_millis(5));
/// assert!(Deadline::never().left().is_none());
/// assert!(Deadline::after(Duration::ZERO).passed());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// No deadline: [`passed`](Deadline::passed) is never true.
    pub const fn never() -> Deadline {
        Deadline(None)
    }

    /// At `at`.
    pub const fn at(at: Instant) -> Deadline {
        Deadline(Some(at))
    }

    /// `wait` from now (no deadline if that overflows the clock).
    pub fn after(wait: Duration) -> Deadline {
        Deadline(Instant::now().checked_add(wait))
    }

    /// The instant, or `None` without a deadline.
    pub const fn instant(self) -> Option<Instant> {
        self.0
    }

    /// True for [`Deadline::never`].
    pub const fn is_never(self) -> bool {
        self.0.is_none()
    }

    /// Time left (zero once passed); `None` without a deadline.
    pub fn left(self) -> Option<Duration> {
        self.0.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// True once the deadline is reached (never without one).
    pub fn passed(self) -> bool {
        self.0.is_some_and(|d| Instant::now() >= d)
    }

    /// `d`, shortened to the time left: how long a sleep of `d` may last.
    pub fn cap(self, d: Duration) -> Duration {
        match self.left() {
            Some(left) => d.min(left),
            None => d,
        }
    }

    /// The earlier of the two (a missing deadline is the later one).
    pub fn earlier(self, other: Deadline) -> Deadline {
        match (self.0, other.0) {
            (Some(a), Some(b)) => Deadline(Some(a.min(b))),
            (a, b) => Deadline(a.or(b)),
        }
    }

    /// The earlier of this deadline and `d` from now.
    pub fn within(self, d: Duration) -> Deadline {
        self.earlier(Deadline::after(d))
    }

    /// Resolves when the deadline is reached; never without one.
    ///
    /// # Cancel safety
    /// Cancel safe: it only sleeps.
    ///
    /// # Errors
    /// None.
    pub async fn reached(self) {
        match self.0 {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    }

    /// Sleeps `pause`, shortened to the time left; `true` if the wait may go on afterwards
    /// (time is left and `cancel` did not fire), `false` at once if the deadline has passed
    /// or `cancel` has fired, and `false` when either happens during the sleep.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use distlock_core::backend::Deadline;
    /// use std::time::Duration;
    /// let cancel = tokio_util::sync::CancellationToken::new();
    /// let d = Deadline::after(Duration::from_millis(10));
    /// assert!(!d.sleep(Duration::from_secs(60), &cancel).await); // cut to 10 ms, then over
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only sleeps.
    ///
    /// # Errors
    /// None: the answer is the `bool`.
    pub async fn sleep(self, pause: Duration, cancel: &CancellationToken) -> bool {
        if self.passed() || cancel.is_cancelled() {
            return false;
        }
        tokio::select! {
            _ = tokio::time::sleep(self.cap(pause)) => !self.passed(),
            _ = cancel.cancelled() => false,
        }
    }
}

impl Deadline {
    /// Runs `fut` until it completes (`Some(output)`), or until the deadline passes or
    /// `cancel` fires (`None`, and `fut` is dropped): the `select!` every wait writes around
    /// a lock, a watch event or a server call.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use distlock_core::backend::Deadline;
    /// use std::time::Duration;
    /// let cancel = tokio_util::sync::CancellationToken::new();
    /// let d = Deadline::after(Duration::from_millis(10));
    /// assert_eq!(d.or_stop(&cancel, async { 7 }).await, Some(7));
    /// assert_eq!(d.or_stop(&cancel, std::future::pending::<u8>()).await, None);
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// As cancel safe as `fut`.
    ///
    /// # Errors
    /// None: `None` means stopped.
    pub async fn or_stop<F: std::future::Future>(
        self,
        cancel: &CancellationToken,
        fut: F,
    ) -> Option<F::Output> {
        tokio::select! {
            out = fut => Some(out),
            _ = self.reached() => None,
            _ = cancel.cancelled() => None,
        }
    }
}

impl From<Option<Instant>> for Deadline {
    fn from(d: Option<Instant>) -> Deadline {
        Deadline(d)
    }
}

impl From<Instant> for Deadline {
    fn from(d: Instant) -> Deadline {
        Deadline(Some(d))
    }
}

impl From<Deadline> for Option<Instant> {
    fn from(d: Deadline) -> Option<Instant> {
        d.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic() {
        let never = Deadline::never();
        assert!(never.is_never() && !never.passed());
        assert_eq!(never.left(), None);
        assert_eq!(never.cap(Duration::from_secs(9)), Duration::from_secs(9));
        let past = Deadline::at(Instant::now());
        assert!(past.passed());
        assert_eq!(past.left(), Some(Duration::ZERO));
        assert_eq!(past.cap(Duration::from_secs(9)), Duration::ZERO);
        let far = Deadline::after(Duration::from_secs(3600));
        assert!(!far.passed());
        let left = far.left().expect("a deadline");
        assert!(left <= Duration::from_secs(3600) && left > Duration::from_secs(3590));
        assert_eq!(far.cap(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(far.earlier(never), far);
        assert_eq!(never.earlier(far), far);
        assert_eq!(far.earlier(past), past);
        assert_eq!(never.earlier(never), never);
        assert!(far.within(Duration::ZERO).passed());
        assert!(never.within(Duration::from_secs(5)).left().is_some());
        assert!(Deadline::after(Duration::MAX).is_never());
        let i = Instant::now();
        assert_eq!(Deadline::from(i).instant(), Some(i));
        assert_eq!(Option::<Instant>::from(Deadline::from(Some(i))), Some(i));
    }

    #[tokio::test]
    async fn sleep_stops_at_the_deadline_and_on_cancel() {
        let cancel = CancellationToken::new();
        let start = Instant::now();
        let d = Deadline::after(Duration::from_millis(40));
        // The pause is cut to the time left, and then the wait may not go on.
        assert!(!d.sleep(Duration::from_secs(30), &cancel).await);
        assert!(start.elapsed() >= Duration::from_millis(40));
        assert!(start.elapsed() < Duration::from_secs(10));
        // Time left after a short pause: the wait goes on.
        let far = Deadline::after(Duration::from_secs(30));
        assert!(far.sleep(Duration::from_millis(5), &cancel).await);
        assert!(
            Deadline::never()
                .sleep(Duration::from_millis(1), &cancel)
                .await
        );
        // A cancel during the sleep ends it at once.
        let c2 = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            c2.cancel();
        });
        let t = Instant::now();
        assert!(
            !Deadline::never()
                .sleep(Duration::from_secs(30), &cancel)
                .await
        );
        assert!(t.elapsed() < Duration::from_secs(10));
        // Already cancelled: false without sleeping.
        assert!(!far.sleep(Duration::from_secs(30), &cancel).await);
    }

    #[tokio::test]
    async fn or_stop_ends_at_the_deadline_or_on_cancel() {
        let cancel = CancellationToken::new();
        let far = Deadline::after(Duration::from_secs(30));
        assert_eq!(far.or_stop(&cancel, async { 1 }).await, Some(1));
        let t = Instant::now();
        let near = Deadline::after(Duration::from_millis(20));
        assert_eq!(
            near.or_stop(&cancel, std::future::pending::<u8>()).await,
            None
        );
        assert!(t.elapsed() >= Duration::from_millis(20));
        let c2 = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            c2.cancel();
        });
        let r = Deadline::never().or_stop(&cancel, std::future::pending::<u8>());
        let r = tokio::time::timeout(Duration::from_secs(10), r).await;
        assert_eq!(r.expect("cancel did not stop it"), None);
    }

    #[tokio::test]
    async fn reached_resolves_at_the_deadline() {
        let start = Instant::now();
        Deadline::after(Duration::from_millis(30)).reached().await;
        assert!(start.elapsed() >= Duration::from_millis(30));
        let never = tokio::time::timeout(Duration::from_millis(20), Deadline::never().reached());
        assert!(never.await.is_err(), "a missing deadline was reached");
    }
}
