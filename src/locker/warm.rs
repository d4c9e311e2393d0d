//! Which keys are *warm*: lease caching ([`Handoff::linger`](crate::Handoff::linger))
//! keeps only a lease of a key this locker released at the backend shortly
//! before taking it, so a key locked once (a short-lived program's) is released
//! at once and never left cached when the process exits.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::key::LockKey;
use crate::lease::Lease;

/// A lease taken within this long of the key's last backend release is warm.
pub(crate) const WARM_WINDOW: Duration = Duration::from_secs(1);

/// Slots of the table: a direct-mapped cache of the last backend release per key
/// hash. A collision forgets a key (one release more at the backend), never
/// makes a cold key warm: an entry matches only its own full hash.
const SLOTS: usize = 256;

/// The last backend release of recently released keys, in bounded memory.
pub(crate) struct WarmKeys {
    hasher: RandomState,
    released: Mutex<Vec<Option<(u64, Instant)>>>,
}

impl Default for WarmKeys {
    fn default() -> Self {
        WarmKeys {
            hasher: RandomState::new(),
            released: Mutex::new(Vec::new()),
        }
    }
}

impl WarmKeys {
    fn hash(&self, key: &LockKey) -> u64 {
        self.hasher.hash_one(key)
    }

    /// `key`'s lease is being released at the backend now.
    pub(crate) fn released(&self, key: &LockKey) {
        let h = self.hash(key);
        let mut table = self.released.lock().unwrap_or_else(|e| e.into_inner());
        if table.is_empty() {
            table.resize(SLOTS, None);
        }
        table[(h as usize) % SLOTS] = Some((h, Instant::now()));
    }

    /// Whether `lease` may be cached: its key was released at the backend at most
    /// [`WARM_WINDOW`] before the lease was taken.
    pub(crate) fn is_warm(&self, lease: &Lease) -> bool {
        let h = self.hash(&lease.key);
        let table = self.released.lock().unwrap_or_else(|e| e.into_inner());
        table
            .get((h as usize) % SLOTS)
            .copied()
            .flatten()
            .is_some_and(|(eh, at)| {
                eh == h && at <= lease.acquired_at && lease.acquired_at - at <= WARM_WINDOW
            })
    }
}
