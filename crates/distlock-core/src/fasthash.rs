//! A fast hasher for the core's internal maps: this client's holds (one entry per lock it
//! holds) and a subscription table's waiting attempts (keyed by our own random attempt ids).
//! SipHash's resistance to chosen keys buys nothing there — nobody outside the process picks
//! the keys of a process's own holds or attempts — and it cost a few hundred instructions per
//! lookup on the acquire/release path. The mix is rustc-hash's (FxHash), with a folded multiply at the end.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// FxHash: add each word, multiply by an odd constant; the finish folds the well-mixed high
/// bits down to where the table takes its bucket index.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

const K: u64 = 0xf135_7aea_2e62_a9c5;

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = self.0.wrapping_add(word).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.add(u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        // A folded multiply: the high half of the product carries every bit of the input, so
        // the low bits (the bucket index) do too.
        let full = u128::from(self.0) * u128::from(K);
        (full as u64) ^ ((full >> 64) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{AttemptId, HoldKey, LockKind};

    #[test]
    fn maps_of_ids_and_keys_work_and_spread() {
        let mut m: FastMap<AttemptId, u64> = FastMap::default();
        let ids: Vec<AttemptId> = (0..1000).map(|_| AttemptId::new()).collect();
        for (i, id) in ids.iter().enumerate() {
            m.insert(id.clone(), i as u64);
        }
        assert!(ids.iter().enumerate().all(|(i, id)| m[id] == i as u64));
        assert_eq!(m.get("not an id"), None);
        let mut holds: FastMap<HoldKey, u32> = FastMap::default();
        holds.insert(HoldKey::new("a", "o", LockKind::Mutex), 1);
        holds.insert(HoldKey::new("a", "o", LockKind::Fair), 2);
        holds.insert(HoldKey::new("ab", "o", LockKind::Mutex), 3);
        assert_eq!(holds[&HoldKey::new("a", "o", LockKind::Fair)], 2);
        assert_eq!(holds.len(), 3);
        // Names that differ in one byte land in different low bits (the bucket index).
        let low = |s: &str| {
            let mut h = FastHasher::default();
            h.write(s.as_bytes());
            h.finish() & 0xff
        };
        let spread: std::collections::HashSet<u64> =
            (0..64).map(|i| low(&format!("lock:{i}"))).collect();
        assert!(spread.len() > 32, "{}", spread.len());
    }
}
