//! The read-write lock's local state: the shared read lease of each key
//! (`share.rs`), the local lock, the one local task acquiring at the backend
//! (`acquire.rs`) and the guards (`guards.rs`). Its public path and its docs are
//! [`lockflight::rwlock`](crate::rwlock), with the handle
//! [`RwLock`](crate::rwlock::RwLock), which lives with the [`Locker`](crate::Locker)
//! it keeps.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock as TokioRwLock};

use crate::backend::{LeaseToken, WhenBusy};
use crate::error::Error;
use crate::key::LockKey;
use crate::lease::acquire::{Armed, InFlight};
use crate::lease::engine::Engine;
use crate::lease::release::{Ran, Settle};
use crate::lease::{Lease, LeaseKind};

mod acquire;
mod guards;
mod share;

use share::{Admit, SameLease, Share};

pub use guards::{ReadGuard, WriteGuard};

/// How long a shared read lease admits new local readers after it was acquired.
///
/// Readers that arrive later wait for the lease to drain (its last holder
/// releases it) and then acquire a new read lease at the backend, where a waiting
/// writer is preferred. This bounds how long the readers of one process can hold
/// off a waiting writer: window + longest read hold + wake-up latency. A lease also
/// stops admitting as soon as a renewal reports a waiting writer.
pub const READ_ADMISSION_WINDOW: Duration = Duration::from_millis(100);

impl SameLease for Arc<Lease> {
    fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(self, other)
    }
}

/// The read-write locks of one locker, per key, over the locker's engine.
#[derive(Debug)]
pub(crate) struct RwLocks {
    engine: Arc<Engine>,
    keys: Mutex<HashMap<LockKey, (Arc<KeyRw>, usize)>>,
}

impl RwLocks {
    pub(crate) fn new(engine: Arc<Engine>) -> RwLocks {
        RwLocks {
            engine,
            keys: Mutex::default(),
        }
    }

    /// Number of keys with local read-write activity.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<LockKey, (Arc<KeyRw>, usize)>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One key's local state: the local lock, the shared read lease, and its wake-ups.
#[derive(Debug, Default)]
struct KeyRw {
    local_lock: Arc<TokioRwLock<()>>,
    share: Mutex<Share<Arc<Lease>>>,
    changed: Notify,
}

impl KeyRw {
    fn share(&self) -> MutexGuard<'_, Share<Arc<Lease>>> {
        self.share.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A use of a key's local state (a call, a guard, a release in flight); the state
/// is removed with its last use, so nothing outlives the work.
struct Entry {
    locks: Arc<RwLocks>,
    key: LockKey,
    rw: Arc<KeyRw>,
}

impl Entry {
    fn enter(locks: &Arc<RwLocks>, key: &LockKey) -> Entry {
        let mut keys = locks.lock();
        let (rw, users) = keys.entry(key.clone()).or_default();
        *users += 1;
        Entry {
            locks: Arc::clone(locks),
            key: key.clone(),
            rw: Arc::clone(rw),
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut keys = self.locks.lock();
        if let Some((_, users)) = keys.get_mut(&self.key) {
            *users -= 1;
            if *users == 0 {
                keys.remove(&self.key);
            }
        }
    }
}

/// The local lock a guard holds.
enum LocalLock {
    Read(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
    Write(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
}

fn unsupported(key: &LockKey) -> Error {
    Error::Unsupported {
        key: key.clone(),
        what: "read-write locks",
    }
}

/// What a read-write acquire or release keeps until it is done: the key's local
/// state and the local lock (the next local user does not meet this lease at the
/// backend).
struct RwLocal {
    _entry: Entry,
    _local_lock: LocalLock,
}

/// A read-write release lets go of its local lock and local state; nothing else.
impl Settle for RwLocal {
    fn settle(self, _: Ran) {}
}

/// The one local task acquiring a lease at the backend. Dropped unfinished, it
/// lets the next local reader lead (for a read), and its token, if a request may
/// have landed (an acquire, a writer's registration), is released in the
/// background while the local lock stays held ([`Armed`]).
struct RwLeading {
    kind: LeaseKind,
    token: LeaseToken,
    armed: Armed<(Entry, LocalLock)>,
}

impl RwLeading {
    fn new(
        locks: &Arc<RwLocks>,
        kind: LeaseKind,
        entry: Entry,
        local_lock: LocalLock,
    ) -> RwLeading {
        let token = locks.engine.backend.new_token();
        let key = entry.key.clone();
        RwLeading {
            kind,
            token,
            armed: Armed::new(&locks.engine, kind, &key, vec![token], (entry, local_lock)),
        }
    }

    fn entry(&self) -> &Entry {
        &self.armed.local().expect("held until granted").0
    }
}

impl InFlight for RwLeading {
    fn sending(&mut self, mode: WhenBusy) {
        self.armed.sending(mode);
    }

    fn answered(&mut self, holds: bool) {
        self.armed.answered(holds);
    }
}

impl Drop for RwLeading {
    fn drop(&mut self) {
        if self.kind == LeaseKind::Read
            && let Some((entry, _)) = self.armed.local()
        {
            entry.rw.share().abandoned();
            entry.rw.changed.notify_waiters();
        }
    }
}

/// Whether a newcomer may join the shared read `lease`. A reader that waited for
/// the acquisition in flight (it arrived before the lease existed) joins whatever
/// the window says.
fn admit(lease: &Lease, waited_for_acquire: bool) -> Admit {
    if lease.is_lost() {
        Admit::Replace
    } else if (waited_for_acquire || lease.acquired_at.elapsed() < READ_ADMISSION_WINDOW)
        && lease.waiting.load(Ordering::Relaxed) == 0
    {
        Admit::Join
    } else {
        Admit::Wait
    }
}
