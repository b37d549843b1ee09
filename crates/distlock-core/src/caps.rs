//! [`Capabilities`]: what a backend implements, declared once and checked by the core.

use crate::backend::LockKind;
use crate::error::{Error, Result};

/// What a backend implements, from [`Backend::capabilities`](crate::Backend::capabilities).
///
/// The core checks every lock kind against it before it calls the backend (acquire, inspect,
/// forced release, permits) and answers the one standard [`Error::Unsupported`] —
/// `lock kind fair is not supported by the mysql backend` — so a backend never sees a kind it
/// did not declare and needs no check of its own. The operator flags are checked the same
/// way by [`Client::list`](crate::Client::list), [`Client::force_release`](crate::Client::force_release)
/// and [`Client::diagnose`](crate::Client::diagnose).
///
/// ```
/// use distlock_core::backend::Capabilities;
/// use distlock_core::LockKind;
/// let caps = Capabilities::kinds(&[LockKind::Mutex, LockKind::Fair])
///     .note("etcd's recipe makes every mutex fair");
/// assert!(caps.supports(LockKind::Fair));
/// let e = caps.check("etcd", LockKind::Read).unwrap_err();
/// assert!(e.is_unsupported());
/// assert_eq!(
///     e.to_string(),
///     "lock kind read (etcd's recipe makes every mutex fair) is not supported by the etcd backend"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Capabilities {
    kinds: u8,
    lease_expiry: bool,
    listing: bool,
    forced_release: bool,
    diagnosis: bool,
    note: Option<&'static str>,
}

const ALL_KINDS: u8 = 0b1_1111;

const fn bit(kind: LockKind) -> u8 {
    match kind {
        LockKind::Mutex => 1,
        LockKind::Read => 2,
        LockKind::Write => 4,
        LockKind::Fair => 8,
        LockKind::Semaphore { .. } => 16,
        LockKind::Election => 32,
    }
}

impl Default for Capabilities {
    /// [`Capabilities::all`].
    fn default() -> Self {
        Capabilities::all()
    }
}

impl Capabilities {
    /// Every lock kind and every operator command; leases expire. Elections are not lock
    /// kinds in this sense: a backend declares them with `.with(LockKind::Election)` once it
    /// implements [`Backend::proclaim`](crate::Backend::proclaim) and
    /// [`Backend::observe`](crate::Backend::observe) too.
    pub const fn all() -> Self {
        Capabilities {
            kinds: ALL_KINDS,
            lease_expiry: true,
            listing: true,
            forced_release: true,
            diagnosis: true,
            note: None,
        }
    }

    /// Only the lock kinds `kinds` (a semaphore stands for every permit count); the rest as
    /// [`Capabilities::all`].
    pub fn kinds(kinds: &[LockKind]) -> Self {
        Capabilities {
            kinds: kinds.iter().fold(0, |acc, k| acc | bit(*k)),
            ..Capabilities::all()
        }
    }

    /// The same, with lock kind `kind` supported too.
    pub const fn with(self, kind: LockKind) -> Self {
        Capabilities {
            kinds: self.kinds | bit(kind),
            ..self
        }
    }

    /// The same, without lock kind `kind`.
    pub const fn without(self, kind: LockKind) -> Self {
        Capabilities {
            kinds: self.kinds & !bit(kind),
            ..self
        }
    }

    /// Whether a hold is kept by its lease on the server, so that a holder that stops
    /// renewing loses it when the lease ends and a hold left to run out outlives its
    /// process until then ([`LockGuard::release_after`](crate::LockGuard::release_after)
    /// relies on it). Default true; false where a hold lasts as long as the holding process
    /// or its session or connection (`file://`, ZooKeeper, the session modes of PostgreSQL
    /// and MySQL).
    pub const fn lease_expiry(self, yes: bool) -> Self {
        Capabilities {
            lease_expiry: yes,
            ..self
        }
    }

    /// Whether [`Operator::list`](crate::Operator::list) is implemented (default true).
    pub const fn listing(self, yes: bool) -> Self {
        Capabilities {
            listing: yes,
            ..self
        }
    }

    /// Whether [`Operator::force_release`](crate::Operator::force_release) is implemented
    /// (default true).
    pub const fn forced_release(self, yes: bool) -> Self {
        Capabilities {
            forced_release: yes,
            ..self
        }
    }

    /// Whether [`Operator::diagnose`](crate::Operator::diagnose) is implemented (default true).
    pub const fn diagnosis(self, yes: bool) -> Self {
        Capabilities {
            diagnosis: yes,
            ..self
        }
    }

    /// A hint added in parentheses to every "not supported" message, e.g. `lease mode does
    /// mutexes only`: `lock kind read (lease mode does mutexes only) is not supported by the
    /// postgres backend`.
    pub const fn note(self, note: &'static str) -> Self {
        Capabilities {
            note: Some(note),
            ..self
        }
    }

    /// True if lock kind `kind` is implemented (any permit count for a semaphore).
    pub fn supports(&self, kind: LockKind) -> bool {
        self.kinds & bit(kind) != 0
    }

    /// The implemented lock kinds, in the order mutex, read, write, fair, semaphore, election
    /// (a semaphore is given as one permit of one).
    pub fn supported_kinds(&self) -> Vec<LockKind> {
        [
            LockKind::Mutex,
            LockKind::Read,
            LockKind::Write,
            LockKind::Fair,
            LockKind::Semaphore {
                permits: 1,
                limit: 1,
            },
            LockKind::Election,
        ]
        .into_iter()
        .filter(|k| self.supports(*k))
        .collect()
    }

    /// See [`Capabilities::lease_expiry`] (the setter).
    pub fn expires_leases(&self) -> bool {
        self.lease_expiry
    }

    /// See [`Capabilities::listing`] (the setter).
    pub fn can_list(&self) -> bool {
        self.listing
    }

    /// See [`Capabilities::forced_release`] (the setter).
    pub fn can_force_release(&self) -> bool {
        self.forced_release
    }

    /// See [`Capabilities::diagnosis`] (the setter).
    pub fn can_diagnose(&self) -> bool {
        self.diagnosis
    }

    /// The hint given with "not supported" messages.
    pub fn get_note(&self) -> Option<&'static str> {
        self.note
    }

    /// `Ok` if lock kind `kind` is implemented, else the standard [`Error::Unsupported`] of
    /// backend `backend` (its [`Backend::kind`](crate::Backend::kind)).
    pub fn check(&self, backend: &'static str, kind: LockKind) -> Result<()> {
        if self.supports(kind) {
            return Ok(());
        }
        Err(self.unsupported(backend, format!("lock kind {}", kind.as_str())))
    }

    /// `Ok(())` if `yes`, else the standard [`Error::Unsupported`] for `operation`.
    pub(crate) fn check_op(&self, backend: &'static str, yes: bool, operation: &str) -> Result<()> {
        if yes {
            return Ok(());
        }
        Err(self.unsupported(backend, operation.to_owned()))
    }

    fn unsupported(&self, backend: &'static str, operation: String) -> Error {
        match self.note {
            Some(note) => Error::unsupported(backend, format!("{operation} ({note})")),
            None => Error::unsupported(backend, operation),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_messages() {
        let all = Capabilities::default();
        assert_eq!(all, Capabilities::all());
        assert_eq!(all.supported_kinds().len(), 5);
        let sem = LockKind::Semaphore {
            permits: 3,
            limit: 9,
        };
        assert!(all.supports(sem) && all.check("redis", LockKind::Write).is_ok());
        let mutex = Capabilities::kinds(&[LockKind::Mutex]);
        assert_eq!(mutex.supported_kinds(), vec![LockKind::Mutex]);
        assert!(!mutex.supports(sem));
        let e = mutex.check("mysql", LockKind::Fair).unwrap_err();
        assert!(e.is_unsupported());
        assert_eq!(
            e.to_string(),
            "lock kind fair is not supported by the mysql backend"
        );
        let rw = mutex
            .with(LockKind::Read)
            .with(LockKind::Write)
            .without(LockKind::Mutex);
        assert!(rw.supports(LockKind::Read) && !rw.supports(LockKind::Mutex));
        let noted = mutex.note("lease mode does mutexes only");
        let e = noted.check("postgres", sem).unwrap_err();
        assert_eq!(
            e.to_string(),
            "lock kind semaphore (lease mode does mutexes only) is not supported by the postgres backend"
        );
        assert_eq!(noted.get_note(), Some("lease mode does mutexes only"));
    }

    /// A mutex-only backend that cannot list, counting the calls that reach it.
    struct MutexOnly(std::sync::atomic::AtomicU32);

    #[async_trait::async_trait]
    impl crate::Backend for MutexOnly {
        fn kind(&self) -> &'static str {
            "mysql"
        }
        fn endpoint(&self) -> String {
            "db:3306".into()
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::kinds(&[LockKind::Mutex])
                .note("MySQL/MariaDB do mutexes only")
                .listing(false)
        }
        async fn acquire(&self, _: &crate::AcquireRequest) -> Result<crate::AcquireReply> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(crate::AcquireReply::Held { ttl: None })
        }
        async fn watch(&self, _: &crate::AcquireRequest) -> Result<Box<dyn crate::ReleaseWatch>> {
            Err(Error::unsupported("mysql", "watching"))
        }
        async fn give_up(&self, _: &crate::AcquireRequest) -> Result<()> {
            Ok(())
        }
        async fn release(&self, _: &crate::GrantRef) -> Result<crate::ReleaseOutcome> {
            Ok(crate::ReleaseOutcome::Expired)
        }
        async fn renew(
            &self,
            h: &[(crate::GrantRef, std::time::Duration)],
        ) -> Result<Vec<crate::RenewOutcome>> {
            Ok(vec![crate::RenewOutcome::NotHeld; h.len()])
        }
        async fn inspect(&self, name: &str, _: LockKind) -> Result<crate::LockInfo> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(crate::LockInfo::new(name))
        }
        fn operator(&self) -> Option<&dyn crate::Operator> {
            Some(self)
        }
    }

    #[async_trait::async_trait]
    impl crate::Operator for MutexOnly {
        async fn list(&self, _: &str) -> Result<Vec<crate::ListedLock>> {
            panic!("the core called list on a backend that cannot list");
        }
        async fn force_release(&self, _: &str, _: LockKind) -> Result<crate::ForceReleased> {
            panic!("the core called force_release with an undeclared kind");
        }
        async fn diagnose(&self) -> Result<Vec<crate::Finding>> {
            Ok(Vec::new())
        }
    }

    #[tokio::test]
    async fn the_client_checks_kinds_before_the_backend_sees_them() {
        let backend = std::sync::Arc::new(MutexOnly(Default::default()));
        let client =
            crate::Client::new(backend.clone(), crate::ClientOptions::default()).expect("client");
        let want =
            "lock kind read (MySQL/MariaDB do mutexes only) is not supported by the mysql backend";
        let rw = client
            .rw_lock("n")
            .expect("a handle: the check is at acquire");
        let e = rw.read().try_acquire().await.expect_err("read side");
        assert_eq!(e.to_string(), want);
        let e = rw
            .read()
            .acquire_timeout(std::time::Duration::from_secs(1))
            .await;
        assert!(e.expect_err("read side").is_unsupported());
        let e = client
            .fair_lock("n")
            .expect("h")
            .acquire()
            .await
            .expect_err("fair");
        assert!(e.to_string().starts_with("lock kind fair "), "{e}");
        let e = client.semaphore("n", 2).expect("h").try_acquire(1).await;
        assert!(e.expect_err("semaphore").is_unsupported());
        let e = client
            .inspect_kind("n", LockKind::Read)
            .await
            .expect_err("inspect");
        assert_eq!(e.to_string(), want);
        let e = client
            .force_release("n", LockKind::Write)
            .await
            .expect_err("force");
        assert!(e.is_unsupported());
        let e = client.list("").await.expect_err("list");
        assert_eq!(
            e.to_string(),
            "listing locks (MySQL/MariaDB do mutexes only) is not supported by the mysql backend"
        );
        assert_eq!(
            backend.0.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "the backend was called"
        );
        // Declared kinds go through.
        assert!(client
            .lock("n")
            .expect("h")
            .try_acquire()
            .await
            .expect("mutex")
            .is_none());
        assert!(!client.inspect("n").await.expect("inspect").held());
        assert_eq!(backend.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn flags() {
        let c = Capabilities::all()
            .lease_expiry(false)
            .listing(false)
            .forced_release(false)
            .diagnosis(false);
        assert!(
            !c.expires_leases() && !c.can_list() && !c.can_force_release() && !c.can_diagnose()
        );
        let e = c
            .check_op("file", c.can_list(), "listing locks")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "listing locks is not supported by the file backend"
        );
        assert!(Capabilities::all().check_op("file", true, "x").is_ok());
        assert!(Capabilities::all().expires_leases());
    }
}
