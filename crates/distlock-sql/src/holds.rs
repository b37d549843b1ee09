//! The hold map: one entry per acquisition attempt, each with its dialect state.

use distlock_core::{AttemptId, HoldKey, LockKind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard};

/// What a dialect keeps per attempt (a connection that holds, or may hold, the lock).
pub trait HoldState: Default + Send + 'static {
    /// Nothing held: the entry may be forgotten.
    fn is_idle(&self) -> bool;
    /// The attempt holds a grant (read without the async lock, e.g. by an upgrade check).
    fn is_granted(&self) -> bool;
    /// The state is moot (its connection is gone, and its locks with it): an entry nobody
    /// uses may be swept out of the map.
    fn is_gone(&self) -> bool;
}

/// One attempt's entry.
#[non_exhaustive]
pub struct Hold<S> {
    /// The attempt.
    pub attempt: AttemptId,
    /// The lock's name.
    pub name: Arc<str>,
    /// The owner asking.
    pub owner: Arc<str>,
    /// The kind asked for.
    pub kind: LockKind,
    /// The dialect's state; requests of the attempt lock it for all of their work.
    pub state: tokio::sync::Mutex<S>,
    granted: AtomicBool,
}

impl<S: HoldState> Hold<S> {
    fn new(attempt: &AttemptId, key: &HoldKey) -> Self {
        Hold {
            attempt: attempt.clone(),
            name: key.name.clone(),
            owner: key.owner.clone(),
            kind: key.kind,
            state: tokio::sync::Mutex::new(S::default()),
            granted: AtomicBool::new(false),
        }
    }

    /// Replaces the state (keeping [`Hold::granted`] in step).
    pub fn set(&self, st: &mut S, new: S) {
        self.granted.store(new.is_granted(), Ordering::SeqCst);
        *st = new;
    }

    /// Brings [`Hold::granted`] in step with `st` after the state was changed in place.
    pub fn sync(&self, st: &S) {
        self.granted.store(st.is_granted(), Ordering::SeqCst);
    }

    /// Moves a state whose connection is gone (and its locks with it) to the default (idle).
    pub fn settle(&self, st: &mut S) {
        if !st.is_idle() && st.is_gone() {
            self.set(st, S::default());
        }
    }

    /// True while the state is granted (as of its last [`Hold::set`] or [`Hold::sync`]).
    pub fn granted(&self) -> bool {
        self.granted.load(Ordering::SeqCst)
    }
}

/// Sweep finished attempts out of the map once it grows past this many entries.
const SWEEP_AT: usize = 256;

/// The attempts of one backend.
#[derive(Default)]
pub struct HoldMap<S> {
    map: StdMutex<HashMap<AttemptId, Arc<Hold<S>>>>,
}

impl<S: HoldState> HoldMap<S> {
    fn lock(&self) -> MutexGuard<'_, HashMap<AttemptId, Arc<Hold<S>>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry of `attempt`, made if new.
    pub fn entry(&self, attempt: &AttemptId, key: &HoldKey) -> Arc<Hold<S>> {
        let mut map = self.lock();
        if map.len() >= SWEEP_AT && !map.contains_key(attempt) {
            // Drops entries nobody uses whose state is idle or gone: what is left of attempts
            // whose caller stopped asking (a release that kept failing).
            map.retain(|_, h| {
                let done = h.state.try_lock().is_ok_and(|s| s.is_idle() || s.is_gone());
                Arc::strong_count(h) > 1 || !done
            });
        }
        map.entry(attempt.clone())
            .or_insert_with(|| Arc::new(Hold::new(attempt, key)))
            .clone()
    }

    /// The entry of `attempt`, if there is one.
    pub fn existing(&self, attempt: &AttemptId) -> Option<Arc<Hold<S>>> {
        self.lock().get(attempt).cloned()
    }

    /// The entries matching `f` (a snapshot).
    pub fn matching(&self, f: impl Fn(&Hold<S>) -> bool) -> Vec<Arc<Hold<S>>> {
        self.lock().values().filter(|h| f(h)).cloned().collect()
    }

    /// True if some entry matches `f`.
    pub fn any(&self, f: impl Fn(&Hold<S>) -> bool) -> bool {
        self.lock().values().any(|h| f(h))
    }

    /// Forgets an idle entry nobody else is using (`hold` is the caller's reference, the map
    /// has the other; a new user clones it under the map lock, which this holds).
    pub fn tidy(&self, hold: Arc<Hold<S>>) {
        let mut map = self.lock();
        let ours = map
            .get(&hold.attempt)
            .is_some_and(|h| Arc::ptr_eq(h, &hold));
        if ours
            && Arc::strong_count(&hold) == 2
            && hold.state.try_lock().is_ok_and(|st| st.is_idle())
        {
            map.remove(&hold.attempt);
        }
    }
}
