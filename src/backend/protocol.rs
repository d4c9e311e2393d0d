//! The values the backend interface speaks (feature `unstable-backend-api`,
//! outside semver): which lock of a key string ([`LockKind`]), what a busy lock
//! asks of an acquire ([`WhenBusy`]), the replies of the four questions
//! ([`Acquire`], [`Released`], [`Renewal`]), a renewal's item ([`RenewItem`]) and
//! the idempotency record's fence and state ([`RecordFence`], [`RecordState`]).
//! Every backend trait ([`LockBackend`](super::LockBackend), the read-write and
//! semaphore traits) and the signals take them from here, so none of those
//! files imports another.

use std::time::Duration;

use super::token::LeaseToken;
use crate::key::LockKey;
/// Which lock of a key string a wake-up is for.
///
/// The mutex, the read-write lock and the semaphore of one key string are three
/// independent locks (with different backend names): a release of one frees nothing
/// of the others. A [`Signals`](super::Signals) therefore registers waiters and delivers
/// wake-ups per kind and key, and a backend says, with every wake-up, which lock it
/// is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LockKind {
    /// The exclusive lock: [`LockBackend`](super::LockBackend), [`Locker::lock`](crate::Locker::lock).
    Mutex,
    /// The read-write lock, its readers and writers alike:
    /// [`RwBackend`](super::rw::RwBackend), [`RwLock::read`](crate::rwlock::RwLock::read) and
    /// [`RwLock::write`](crate::rwlock::RwLock::write).
    ReadWrite,
    /// The semaphore: [`SemaphoreBackend`](super::semaphore::SemaphoreBackend),
    /// [`Locker::semaphore`](crate::Locker::semaphore).
    Semaphore,
}

impl LockKind {
    /// Every kind, in declaration order.
    pub const ALL: [LockKind; 3] = [LockKind::Mutex, LockKind::ReadWrite, LockKind::Semaphore];

    /// The kind's position in [`ALL`](Self::ALL).
    pub(crate) fn index(self) -> usize {
        match self {
            LockKind::Mutex => 0,
            LockKind::ReadWrite => 1,
            LockKind::Semaphore => 2,
        }
    }
}

/// What an acquire asks of the backend when the key is busy: to queue this instance
/// for the key (it is woken when the key frees; fair mode serves the queue in
/// arrival order), or only to answer `Busy`. A call that waits for the lock sends
/// `Queue`; a single attempt (`try_*`) sends `Return`, and its busy answer leaves no
/// queue entry behind. Either way a free key is granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WhenBusy {
    /// Join the key's wait queue (a call that waits).
    Queue,
    /// Answer `Busy` and queue nothing (a single attempt).
    Return,
}

/// The answer to [`LockBackend::acquire`](super::LockBackend::acquire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// The lock is ours.
    Acquired {
        /// The fencing epoch minted for this lease: strictly greater than every
        /// epoch minted before for the key (0 when the backend has no fencing).
        epoch: u64,
        /// How many *other* instances wait in the key's queue.
        waiting: u32,
        /// Fair mode: how long before the backend answered the earliest waiter of
        /// the other waiting instances arrived (its age in the fair queue), when
        /// another instance waits; `None` when none waits, outside fair mode, or
        /// when the backend does not tell. A local task that arrived more than this
        /// long before the request was sent arrived before every other instance's
        /// waiter, so fair mode may hand the lease to it.
        earliest_other: Option<Duration>,
    },
    /// Someone else holds (or has a claim on) the lock; we are queued.
    Busy {
        /// Ask again after this long at the latest, even without a wake-up
        /// (the remaining TTL, bounded by the queue entry's refresh interval).
        retry_in: Duration,
    },
}

/// The answer to [`LockBackend::release`](super::LockBackend::release).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// `true` if the lock was ours and is now deleted; `false` if the token did not
    /// own it any more (expired, or taken by someone else): nothing was deleted.
    pub released: bool,
    /// How many other instances wait in the key's queue.
    pub waiting: u32,
}

/// The answer to [`LockBackend::renew`](super::LockBackend::renew).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The TTL was re-armed.
    Renewed {
        /// How many other instances wait in the key's queue.
        waiting: u32,
    },
    /// The token does not own the lock: the lease is lost.
    NotOwner,
}

/// Which lease of a key a renewal is for: what [`LockBackend::renew_batch`](super::LockBackend::renew_batch)
/// renews each [`RenewItem`] through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseKind {
    /// The exclusive lock (a mutex): [`LockBackend::renew`](super::LockBackend::renew).
    Mutex,
    /// A shared read lease of a read-write lock: [`RwBackend::renew_read`](super::rw::RwBackend::renew_read).
    Read,
    /// The write lease of a read-write lock: [`RwBackend::renew_write`](super::rw::RwBackend::renew_write).
    Write,
    /// One permit of a semaphore: [`SemaphoreBackend::renew_permit`](super::semaphore::SemaphoreBackend::renew_permit).
    Permit,
}

impl LeaseKind {
    /// The lock this lease is of (its wake-ups and queue).
    pub(crate) fn lock_kind(self) -> LockKind {
        match self {
            LeaseKind::Mutex => LockKind::Mutex,
            LeaseKind::Read | LeaseKind::Write => LockKind::ReadWrite,
            LeaseKind::Permit => LockKind::Semaphore,
        }
    }

    /// Whether its grant mints a fencing epoch (on a backend with fencing).
    pub(crate) fn is_fenced(self) -> bool {
        matches!(self, LeaseKind::Mutex | LeaseKind::Write)
    }
}

/// One lease to renew in a [`LockBackend::renew_batch`](super::LockBackend::renew_batch) call.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RenewItem<'a> {
    /// Which lease of `key` it is.
    pub kind: LeaseKind,
    /// The lock's key.
    pub key: &'a LockKey,
    /// The lease's token.
    pub token: LeaseToken,
    /// The TTL to re-arm it to.
    pub ttl: Duration,
    /// Whether the lease's fence (the key its fencing epochs are minted from) is
    /// due: a renewal with `fence_due` keeps the fence alive at least
    /// [`FENCE_TTL_FACTOR`](Self::FENCE_TTL_FACTOR) × `ttl` from the moment it runs; without it, a backend
    /// may leave the fence's TTL as it is (the Redis batch renewal does). `true`
    /// unless the caller knows when the fence was last re-armed (the watchdog).
    pub fence_due: bool,
}

impl<'a> RenewItem<'a> {
    /// A renewal with [`fence_due`](Self::fence_due) keeps the fence alive for at
    /// least this many lease TTLs.
    pub const FENCE_TTL_FACTOR: u32 = 10;

    /// The `kind` lease `token` of `key`, to be re-armed to `ttl`, its fence
    /// re-armed too.
    pub fn new(kind: LeaseKind, key: &'a LockKey, token: LeaseToken, ttl: Duration) -> Self {
        RenewItem {
            kind,
            key,
            token,
            ttl,
            fence_due: true,
        }
    }

    /// With [`fence_due`](Self::fence_due) set to `due`.
    #[must_use]
    pub fn with_fence_due(mut self, due: bool) -> Self {
        self.fence_due = due;
        self
    }
}

/// A fencing token as a backend stores it beside an idempotency record: the
/// lease's epoch, then its handoff sequence, compared in that order (the
/// backend's side of [`FencingToken`](crate::FencingToken), which it does not
/// import).
// Public with `unstable-backend-api`, crate-wide without it, as every type here;
// the lint takes a public alias re-exported to the crate only for unreachable.
#[cfg_attr(not(feature = "unstable-backend-api"), allow(unreachable_pub))]
pub type RecordFence = (u64, u64);

/// The reply of [`LockBackend::fence_record`](super::LockBackend::fence_record):
/// the record as the fencing executor finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// No response is stored: the record's fence now holds the executor's token,
    /// so every store of an older token is refused from now on.
    Fenced,
    /// A response is stored (these bytes); nothing changed.
    Stored(Vec<u8>),
    /// The record's fence holds a newer token than the executor's: a newer
    /// executor has fenced the record (this one's lease was lost); nothing
    /// changed.
    Stale,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_indexes_its_place_in_all() {
        for (i, kind) in LockKind::ALL.iter().enumerate() {
            assert_eq!(kind.index(), i, "{kind:?}");
        }
    }
}
