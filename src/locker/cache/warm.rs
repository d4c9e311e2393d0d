//! Which keys are *warm*: lease caching ([`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for))
//! keeps only a lease that was asked for within the linger of its key's last
//! backend release by this locker (caching that lease would have served this
//! request), so a key locked once (a short-lived program's) or now and then is
//! released at once and never left cached when the process exits; and not a key whose
//! cached lease another instance wanted lately (it was revoked while idle, or
//! expired unused while another instance waited): where instances take turns
//! on a key (keys spread over instances with no affinity), caching would only
//! turn a free key into a held one.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::key::LockKey;

/// A key whose cached lease another instance wanted is not cached for this long.
pub(crate) const COOL_DOWN: Duration = Duration::from_secs(1);

/// Slots of the table: a direct-mapped cache of recent history per key hash. A
/// collision forgets a key (one release more at the backend, or one caching
/// more), never makes a cold key warm: an entry matches only its own full hash.
const SLOTS: usize = 256;

/// One key's recent history: its hash, its last backend release, and when a
/// cached lease of it was last wanted by another instance.
#[derive(Clone, Copy)]
struct Entry {
    hash: u64,
    released_at: Option<Instant>,
    cooled_at: Option<Instant>,
}

impl Entry {
    fn is_cooled(&self) -> bool {
        self.cooled_at
            .is_some_and(|at| Instant::now().saturating_duration_since(at) <= COOL_DOWN)
    }
}

/// The recent history of recently released keys, in bounded memory.
pub(crate) struct WarmKeys {
    hasher: RandomState,
    table: Mutex<Vec<Option<Entry>>>,
    /// The clock's origin for `last_cool`.
    base: Instant,
    /// When a key was last cooled, in ns after `base`, plus one (0: never): while
    /// no key was cooled in the last [`COOL_DOWN`], [`is_cooled`](Self::is_cooled)
    /// answers without hashing the key or taking the table's lock (every release
    /// of a cacheable lease asks). Relaxed: cooling only decides what is cached,
    /// never who holds a key.
    last_cool: AtomicU64,
}

impl Default for WarmKeys {
    fn default() -> Self {
        WarmKeys {
            hasher: RandomState::new(),
            table: Mutex::new(Vec::new()),
            base: Instant::now(),
            last_cool: AtomicU64::new(0),
        }
    }
}

impl WarmKeys {
    /// Runs `f` on `key`'s entry (a fresh one if the slot holds another key).
    fn with_entry<R>(&self, key: &LockKey, f: impl FnOnce(&mut Entry) -> R) -> R {
        let hash = self.hasher.hash_one(key);
        let mut table: MutexGuard<'_, _> = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if table.is_empty() {
            table.resize(SLOTS, None);
        }
        let slot = &mut table[(hash as usize) % SLOTS];
        let entry = match slot {
            Some(e) if e.hash == hash => e,
            _ => slot.insert(Entry {
                hash,
                released_at: None,
                cooled_at: None,
            }),
        };
        f(entry)
    }

    /// `key`'s entry, if the table has one.
    fn entry(&self, key: &LockKey) -> Option<Entry> {
        let hash = self.hasher.hash_one(key);
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        table
            .get((hash as usize) % SLOTS)
            .copied()
            .flatten()
            .filter(|e| e.hash == hash)
    }

    /// `key`'s lease is being released at the backend now.
    pub(crate) fn released(&self, key: &LockKey) {
        self.with_entry(key, |e| e.released_at = Some(Instant::now()));
    }

    /// Another instance wanted `key`'s cached lease: do not cache the key for
    /// [`COOL_DOWN`].
    pub(crate) fn cool(&self, key: &LockKey) {
        let now = Instant::now();
        self.with_entry(key, |e| e.cooled_at = Some(now));
        let at = self.since_base(now).saturating_add(1);
        self.last_cool.fetch_max(at, Ordering::Relaxed);
    }

    /// Nanoseconds from `base` to `at` (saturating).
    fn since_base(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether a lease of `key` asked for at `asked` may be cached for `linger`:
    /// asked for at most `linger` after the key's last backend release (caching
    /// that lease would have served this request; measured from the request, not
    /// the grant, so an instance that waits for its turn on a key is as warm as
    /// one that gets it at once), and the key not cooled in the last
    /// [`COOL_DOWN`].
    pub(crate) fn is_warm(&self, key: &LockKey, asked: Instant, linger: Duration) -> bool {
        self.entry(key).is_some_and(|e| {
            e.released_at
                .is_some_and(|at| at <= asked && asked - at <= linger)
                && !e.is_cooled()
        })
    }

    /// Whether `key` was cooled in the last [`COOL_DOWN`].
    pub(crate) fn is_cooled(&self, key: &LockKey) -> bool {
        let last = self.last_cool.load(Ordering::Relaxed);
        if last == 0 {
            return false;
        }
        let since = self.since_base(Instant::now()).saturating_sub(last - 1);
        if u128::from(since) > COOL_DOWN.as_nanos() {
            return false;
        }
        self.entry(key).is_some_and(|e| e.is_cooled())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_key_is_warm_when_asked_for_within_the_linger_of_its_release() {
        let warm = WarmKeys::default();
        let (k, linger) = (LockKey::from("k"), Duration::from_millis(20));
        assert!(!warm.is_warm(&k, Instant::now(), linger), "never released");
        warm.released(&k);
        tokio::time::advance(Duration::from_millis(5)).await;
        assert!(warm.is_warm(&k, Instant::now(), linger));
        assert!(
            !warm.is_warm(&LockKey::from("other"), Instant::now(), linger),
            "another key is warm"
        );
        tokio::time::advance(Duration::from_millis(20)).await;
        assert!(!warm.is_warm(&k, Instant::now(), linger), "asked too late");
        // A request made before the release is not served by it.
        let asked = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        warm.released(&k);
        assert!(!warm.is_warm(&k, asked, linger));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cooled_key_is_not_warm_for_the_cool_down() {
        let warm = WarmKeys::default();
        let (k, linger) = (LockKey::from("k"), Duration::from_millis(20));
        warm.released(&k);
        warm.cool(&k);
        assert!(warm.is_cooled(&k));
        assert!(!warm.is_warm(&k, Instant::now(), linger));
        tokio::time::advance(COOL_DOWN + Duration::from_millis(1)).await;
        warm.released(&k);
        assert!(!warm.is_cooled(&k));
        assert!(warm.is_warm(&k, Instant::now(), linger));
    }

    #[tokio::test(start_paused = true)]
    async fn a_collision_forgets_a_key_and_never_warms_another() {
        let warm = WarmKeys::default();
        let linger = Duration::from_secs(1);
        // More keys than slots: some share a slot with the first.
        let keys: Vec<LockKey> = (0..4 * SLOTS)
            .map(|i| LockKey::from(format!("k{i}")))
            .collect();
        warm.released(&keys[0]);
        for k in &keys[1..] {
            if !warm.is_warm(&keys[0], Instant::now(), linger) {
                break;
            }
            warm.released(k);
        }
        // Whatever was forgotten, a key never released is never warm.
        assert!(!warm.is_warm(&LockKey::from("never"), Instant::now(), linger));
        let table = warm.table.lock().unwrap();
        assert_eq!(table.len(), SLOTS, "the table grew");
    }
}
