//! What one backend instance tells its lockers, per key: wake-ups per kind and
//! key (`wakeup.rs`), revocations of a cached mutex lease (`revocation.rs`),
//! changes of an election's leader record (`leader.rs`), and the leases it
//! holds, by token, which a takeover or a restart of the server marks lost at
//! once (`leases.rs`). A backend fills them (for Redis, from the instance's one
//! pub/sub channel); [`Signals`] is the one registry of them all.

mod grants;
mod keyed;
mod leader;
mod leases;
mod revocation;
mod wakeup;

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use dashmap::DashMap;

pub(crate) use grants::{Grant, send_stamp, stamp_instant};
use keyed::{KeySignal, Watchers};
#[cfg(feature = "unstable-backend-api")]
pub use leader::LeaderChange;
use leases::Registrations;
pub(crate) use leases::{Losable, Registration};
#[cfg(feature = "unstable-backend-api")]
pub use revocation::Revocation;
#[cfg(not(feature = "unstable-backend-api"))]
pub(crate) use revocation::Revocation;
#[cfg(feature = "unstable-backend-api")]
pub use wakeup::Wakeup;
#[cfg(not(feature = "unstable-backend-api"))]
pub(crate) use wakeup::Wakeup;
use wakeup::{Table, Tables};

/// What one backend instance tells its lockers, per key: wake-ups per kind,
/// revocations of a cached lease, leader changes, and the end of a lease by a
/// takeover or a restart of its server.
///
/// A backend calls [`wake`](Signals::wake) when it learns that a lock may be
/// free (a pub/sub message, an in-process release); callers wait on a [`Wakeup`].
/// Registrations are per [`LockKind`](crate::backend::LockKind) and key: the mutex, the read-write lock and
/// the semaphore of one key string are independent locks, so a wake-up of one
/// reaches none of the others' handles, and a handle of one is not counted
/// ([`watchers`](Signals::watchers), [`is_watched`](Signals::is_watched))
/// as a waiter of another.
///
/// A handle from [`watch`](Signals::watch) sees every wake-up of its lock; of
/// the handles from [`watch_one`](Signals::watch_one), one wake-up reaches one
/// (the longest waiting), so that tasks which each compete at the backend on their
/// own do not all ask again at every release. Entries exist only while someone
/// watches, so the registry stays as small as the set of locks being waited for.
/// Every wake-up also bumps a generation counter shared by the keys of one stripe
/// (per kind), so a caller that starts watching late can tell whether it may have
/// missed one.
///
/// Besides the locks, it carries two per-key signals that are not wake-ups: the
/// revocations of a cached mutex lease ([`watch_revocation`](Signals::watch_revocation))
/// and the changes of an election's leader record
/// ([`watch_leader`](Signals::watch_leader)); and, by token, the leases this
/// instance holds, which a takeover ([`take_over`](Signals::take_over)) or a
/// restart of the server ([`restarted`](Signals::restarted)) marks lost at once.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use lockflight::LockKey;
/// use lockflight::backend::{LockKind, Signals};
///
/// let signals = Signals::new();
/// let key = LockKey::from("sku:555");
/// let before = signals.generation(LockKind::Mutex, key.as_bytes());
/// let mut mutex = signals.watch(LockKind::Mutex, &key);
/// let _semaphore = signals.watch(LockKind::Semaphore, &key);
///
/// // A semaphore wake-up of the same key string is not the mutex's.
/// assert!(signals.wake(LockKind::Semaphore, key.as_bytes()));
/// assert_eq!(signals.generation(LockKind::Mutex, key.as_bytes()), before);
/// assert_eq!(signals.watchers(LockKind::Mutex, key.as_bytes()), 1);
///
/// assert!(signals.wake(LockKind::Mutex, key.as_bytes()));
/// mutex.woken().await; // kept for the handle until it asks
/// # }
/// ```
#[derive(Clone)]
pub struct Signals {
    tables: Arc<Tables>,
    /// The keys whose mutex lease this instance keeps cached, idle: a revocation
    /// (another instance queued for the key) ends the caching at once.
    revocations: Arc<Watchers>,
    /// The leases this instance holds, by token: a takeover (a forced release
    /// deleted one) marks that lease lost at once.
    registered: Arc<Registrations>,
    /// The election keys whose leader this instance observes: an announced change
    /// of the leader record (or a reconnect) has their observers read it again.
    leaders: Arc<Watchers>,
    /// The grants of a key's mutex or write lease to this instance not taken
    /// yet, by lock kind and key, and the tokens whose grant was taken
    /// (`grants.rs`).
    granted: Arc<Mutex<grants::Granted>>,
    /// The acquire loops waiting with a token that a grant may name, by lock
    /// kind, key and token (`grants.rs`).
    grant_watches: Arc<grants::GrantWatches>,
    /// Whether the backend's releases grant (`grants.rs`).
    grants: Arc<AtomicBool>,
}

impl Default for Signals {
    fn default() -> Self {
        Signals {
            tables: Arc::new(std::array::from_fn(|_| Table::default())),
            revocations: Arc::new(DashMap::new()),
            registered: Arc::new(DashMap::new()),
            leaders: Arc::new(DashMap::new()),
            granted: Arc::default(),
            grant_watches: Arc::new(DashMap::new()),
            grants: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl fmt::Debug for Signals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signals")
            .field("watched", &self.len())
            .finish()
    }
}

impl Signals {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes every watcher of every lock, one-at-a-time handles included, and every
    /// observer of a leader ([`watch_leader`](Self::watch_leader)): after a lost
    /// notification connection, when messages may have been missed.
    pub fn wake_all(&self) {
        KeySignal::send_all(&self.leaders);
        for table in self.tables.iter() {
            table.wake_all();
        }
    }
}
