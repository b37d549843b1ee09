//! [`LostRegistry`]: the lost signals of the grants one session or connection carries.

use crate::backend::AttemptId;
use crate::lost::{LostReason, LostSignal};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};

/// The lost signals of the grants that live on one session or connection (a ZooKeeper
/// session, an SQL connection holding advisory locks), keyed by attempt (or any key), fired
/// together when it ends.
///
/// Once [`fire_all`](LostRegistry::fire_all) has run, the registry is *ended*: a signal
/// registered afterwards fires at once with the same reason — a grant recorded just after its
/// session ended is lost, not held.
///
/// ```
/// use distlock_core::backend::{AttemptId, LostRegistry};
/// use distlock_core::{LostReason, LostSignal};
/// let session: LostRegistry = LostRegistry::new();
/// let (a, lost) = (AttemptId::new(), LostSignal::new());
/// assert!(session.register(a.clone(), lost.clone()));
/// assert_eq!(session.fire_all(LostReason::SessionEnded("closed".into())), 1);
/// assert_eq!(lost.reason(), Some(LostReason::SessionEnded("closed".into())));
/// ```
#[derive(Debug)]
pub struct LostRegistry<K = AttemptId> {
    inner: Mutex<State<K>>,
}

#[derive(Debug)]
struct State<K> {
    signals: HashMap<K, LostSignal>,
    ended: Option<LostReason>,
}

impl<K: Eq + Hash> Default for LostRegistry<K> {
    fn default() -> Self {
        LostRegistry {
            inner: Mutex::new(State {
                signals: HashMap::new(),
                ended: None,
            }),
        }
    }
}

impl<K: Eq + Hash> LostRegistry<K> {
    /// An empty registry of a live session.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        // Updates are single map operations: a poisoned lock still holds a whole map.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the grant `key` lives here: `lost` fires when the session ends. Returns
    /// `true`; if the session has ended already, `lost` fires at once with its reason and
    /// the result is `false`. Registering a key again replaces its signal.
    pub fn register(&self, key: K, lost: LostSignal) -> bool {
        let mut st = self.state();
        if let Some(reason) = st.ended.clone() {
            drop(st);
            lost.fire(reason);
            return false;
        }
        st.signals.insert(key, lost);
        true
    }

    /// Forgets `key` (its grant was released or moved elsewhere) without firing it; its
    /// signal, if it was registered.
    pub fn remove(&self, key: &K) -> Option<LostSignal> {
        self.state().signals.remove(key)
    }

    /// Fires the signal of `key` alone (its grant is gone, the session lives on) and forgets
    /// it; false if it was not registered.
    pub fn fire(&self, key: &K, reason: LostReason) -> bool {
        let lost = self.remove(key);
        match lost {
            Some(l) => {
                l.fire(reason);
                true
            }
            None => false,
        }
    }

    /// The session ended: fires every registered signal with `reason`, forgets them, and
    /// ends the registry (later registrations fire at once; the first reason stays).
    /// Returns how many signals fired.
    pub fn fire_all(&self, reason: LostReason) -> usize {
        let signals: Vec<LostSignal> = {
            let mut st = self.state();
            st.ended.get_or_insert(reason.clone());
            st.signals.drain().map(|(_, s)| s).collect()
        };
        // Fired outside the lock: whoever wakes may call back into the registry.
        for s in &signals {
            s.fire(reason.clone());
        }
        signals.len()
    }

    /// Takes out (without firing) every signal whose key matches `pred`, e.g. the grants on
    /// one node that was deleted, to be fired later (after a grace period).
    pub fn take_where(&self, mut pred: impl FnMut(&K) -> bool) -> Vec<LostSignal> {
        let mut st = self.state();
        let mut taken = Vec::new();
        st.signals.retain(|k, s| {
            if pred(k) {
                taken.push(s.clone());
                false
            } else {
                true
            }
        });
        taken
    }

    /// Why the session ended, once [`fire_all`](LostRegistry::fire_all) ran.
    pub fn ended(&self) -> Option<LostReason> {
        self.state().ended.clone()
    }

    /// True if `key` is registered.
    pub fn contains(&self, key: &K) -> bool {
        self.state().signals.contains_key(key)
    }

    /// Registered signals.
    pub fn len(&self) -> usize {
        self.state().signals.len()
    }

    /// True when no signal is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fire_all_fires_each_once_and_ends_the_registry() {
        let reg: LostRegistry = LostRegistry::new();
        let (a, b, c) = (AttemptId::new(), AttemptId::new(), AttemptId::new());
        let (la, lb, lc) = (LostSignal::new(), LostSignal::new(), LostSignal::new());
        assert!(reg.register(a.clone(), la.clone()));
        assert!(reg.register(b.clone(), lb.clone()));
        assert!(reg.register(c.clone(), lc.clone()));
        assert_eq!(reg.len(), 3);
        // Released grants leave without firing.
        assert!(reg.remove(&c).is_some());
        assert!(reg.remove(&c).is_none());
        assert!(!reg.contains(&c));
        let why = LostReason::SessionEnded("expired".into());
        assert_eq!(reg.fire_all(why.clone()), 2);
        assert_eq!(la.reason(), Some(why.clone()));
        assert_eq!(lb.reason(), Some(why.clone()));
        assert!(!lc.is_lost(), "a removed grant's signal fired");
        assert!(reg.is_empty());
        assert_eq!(reg.ended(), Some(why.clone()));
        // A grant recorded after the end is lost at once, with the session's reason.
        let late = LostSignal::new();
        assert!(!reg.register(AttemptId::new(), late.clone()));
        assert_eq!(late.reason(), Some(why.clone()));
        assert!(reg.is_empty());
        // A second end keeps the first reason and fires nothing more.
        assert_eq!(reg.fire_all(LostReason::NotHeld), 0);
        assert_eq!(reg.ended(), Some(why));
    }

    #[test]
    fn fire_one_and_take_where() {
        let reg: LostRegistry<(String, u64)> = LostRegistry::new();
        let sigs: Vec<LostSignal> = (0..4).map(|_| LostSignal::new()).collect();
        for (i, s) in sigs.iter().enumerate() {
            assert!(reg.register((format!("/n{}", i % 2), i as u64), s.clone()));
        }
        assert!(reg.fire(&("/n0".into(), 0), LostReason::NotHeld));
        assert!(!reg.fire(&("/n0".into(), 0), LostReason::NotHeld));
        assert_eq!(sigs[0].reason(), Some(LostReason::NotHeld));
        // The grants on node /n1 are taken out, not fired.
        let taken = reg.take_where(|(path, _)| path == "/n1");
        assert_eq!(taken.len(), 2);
        assert!(taken.iter().all(|s| !s.is_lost()));
        assert_eq!(reg.len(), 1);
        assert!(reg.contains(&("/n0".into(), 2)));
        assert!(reg.ended().is_none());
    }
}
