//! The backend interface (feature `unstable-backend-api`, outside semver): what a
//! backend does for the [`Locker`](crate::Locker).
//!
//! A backend answers four questions per key, each in one round trip where the
//! backend is remote:
//!
//! * **acquire-or-enqueue** ([`LockBackend::acquire`]): take the lock with a token,
//!   or join the key's queue of waiting instances and say how long to wait at most;
//! * **release-and-wake-next** ([`LockBackend::release`]): free the lock if the token
//!   still owns it and wake *one* waiting instance;
//! * **extend** ([`LockBackend::extend`]): re-arm the TTL if the token still owns it;
//! * **leave** ([`LockBackend::leave`]): a waiter that gives up leaves the queue.
//!
//! Wake-ups arrive through a [`WakeRegistry`] that the backend fills (for Redis, from
//! the instance's single pub/sub channel). They are registered per [`LockKind`] and
//! key: the mutex, the read-write lock and the semaphore of one key string are
//! independent locks, so a waiter of one is never taken for a waiter of another. A
//! caller that was told to wait starts watching the key only then — an acquire that
//! succeeds at once costs no registration — and compares the key's wake-up
//! generation from before its request with the one after registering, so a wake-up
//! that raced with the reply is never lost (it only causes an immediate retry).
//!
//! Every operation can be repeated with the same token: repeating an acquire whose
//! reply was lost either finds the lock already ours (and mints a new epoch) or
//! competes again; repeating a release whose reply was lost reports the release the
//! first attempt made (where replies can be lost, as with Redis). That is how
//! ambiguous results are reconciled, never by guessing.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use tokio::sync::{Notify, watch};

use super::rw::RwBackend;
use super::semaphore::SemaphoreBackend;
use crate::error::Result;
use crate::key::LockKey;

/// A 128-bit value identifying one lease. Only its holder knows it.
///
/// A backend mints the tokens of its leases ([`LockBackend::new_token`]): fully
/// random by default; the Redis backend puts its instance id in the high 64 bits
/// and 64 random bits in the low ones ([`for_instance`](Self::for_instance)), so
/// that whoever reads a lock key can tell which instance holds it, while the
/// token still cannot be guessed (2⁶⁴ values) by another process that would
/// release or extend it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(u128);

impl LeaseToken {
    /// A fresh token from the thread-local CSPRNG.
    pub fn random() -> Self {
        LeaseToken(rand::random())
    }

    /// A fresh token of the instance `instance`: the instance id in the high 64
    /// bits, 64 random bits (thread-local CSPRNG) in the low ones.
    ///
    /// ```
    /// use lockflight::backend::LeaseToken;
    ///
    /// let t = LeaseToken::for_instance(0x00c0_ffee);
    /// assert_eq!(t.instance(), 0x00c0_ffee);
    /// assert!(t.to_hex().starts_with("0000000000c0ffee"));
    /// assert_ne!(t, LeaseToken::for_instance(0x00c0_ffee));
    /// ```
    pub fn for_instance(instance: u64) -> Self {
        LeaseToken((u128::from(instance) << 64) | u128::from(rand::random::<u64>()))
    }

    /// The high 64 bits: the instance id of a token from
    /// [`for_instance`](Self::for_instance) (of a random token, a random number).
    pub fn instance(self) -> u64 {
        (self.0 >> 64) as u64
    }

    /// The token as 32 lowercase hex digits (what is stored at the lock key).
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// The token written as 32 hex digits (either case), as
    /// [`to_hex`](Self::to_hex) writes it; `None` for anything else.
    ///
    /// ```
    /// use lockflight::backend::LeaseToken;
    ///
    /// let t = LeaseToken::for_instance(7);
    /// assert_eq!(LeaseToken::from_hex(&t.to_hex()), Some(t));
    /// assert_eq!(LeaseToken::from_hex("00c0ffee"), None);
    /// ```
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(hex, 16).ok().map(LeaseToken)
    }
}

impl fmt::Debug for LeaseToken {
    /// Shows only the first 8 hex digits: enough to correlate logs, not to forge.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({:08x}…)", (self.0 >> 96) as u32)
    }
}

/// The safety margin subtracted from every validity window: 1 % of the TTL + 2 ms,
/// for clock drift between this process and the backend. Leases and the quorum
/// backend count validity the same way.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// Which lock of a key string a wake-up is for.
///
/// The mutex, the read-write lock and the semaphore of one key string are three
/// independent locks (with different backend names): a release of one frees nothing
/// of the others. A [`WakeRegistry`] therefore registers waiters and delivers
/// wake-ups per kind and key, and a backend says, with every wake-up, which lock it
/// is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LockKind {
    /// The exclusive lock: [`LockBackend`], [`Locker::lock`](crate::Locker::lock).
    Mutex,
    /// The read-write lock, its readers and writers alike:
    /// [`RwBackend`], [`RwLock::read`](crate::rwlock::RwLock::read) and
    /// [`RwLock::write`](crate::rwlock::RwLock::write).
    ReadWrite,
    /// The semaphore: [`SemaphoreBackend`],
    /// [`Locker::semaphore`](crate::Locker::semaphore).
    Semaphore,
}

impl LockKind {
    /// Every kind, in declaration order.
    pub const ALL: [LockKind; 3] = [LockKind::Mutex, LockKind::ReadWrite, LockKind::Semaphore];

    /// The kind's position in [`ALL`](Self::ALL).
    fn index(self) -> usize {
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

/// The answer to [`LockBackend::acquire`].
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

/// The answer to [`LockBackend::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// `true` if the lock was ours and is now deleted; `false` if the token did not
    /// own it any more (expired, or taken by someone else): nothing was deleted.
    pub released: bool,
    /// How many other instances wait in the key's queue.
    pub waiting: u32,
}

/// The answer to [`LockBackend::extend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extend {
    /// The TTL was re-armed.
    Extended {
        /// How many other instances wait in the key's queue.
        waiting: u32,
    },
    /// The token does not own the lock: the lease is lost.
    NotOwner,
}

/// Which lease of a key a renewal is for: what [`LockBackend::extend_batch`]
/// renews each [`RenewItem`] through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseKind {
    /// The exclusive lock (a mutex): [`LockBackend::extend`].
    Mutex,
    /// A shared read lease of a read-write lock: [`RwBackend::extend_read`].
    Read,
    /// The write lease of a read-write lock: [`RwBackend::extend_write`].
    Write,
    /// One permit of a semaphore: [`SemaphoreBackend::extend_permit`].
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

/// One lease to renew in a [`LockBackend::extend_batch`] call.
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
}

impl<'a> RenewItem<'a> {
    /// The `kind` lease `token` of `key`, to be re-armed to `ttl`.
    pub fn new(kind: LeaseKind, key: &'a LockKey, token: LeaseToken, ttl: Duration) -> Self {
        RenewItem {
            kind,
            key,
            token,
            ttl,
        }
    }
}

/// Renews `item` through the per-lease call of its kind (what the default
/// [`LockBackend::extend_batch`] does for each item).
pub(crate) async fn extend_one<B: LockBackend + ?Sized>(
    backend: &B,
    item: &RenewItem<'_>,
) -> Result<Extend> {
    let (key, token, ttl) = (item.key, item.token, item.ttl);
    match item.kind {
        LeaseKind::Mutex => backend.extend(key, token, ttl).await,
        LeaseKind::Read | LeaseKind::Write => match backend.rw() {
            Some(rw) if item.kind == LeaseKind::Read => rw.extend_read(key, token, ttl).await,
            Some(rw) => rw.extend_write(key, token, ttl).await,
            None => Err(crate::Error::Unsupported {
                key: key.clone(),
                what: "read-write locks",
            }),
        },
        LeaseKind::Permit => match backend.semaphore() {
            Some(sem) => sem.extend_permit(key, token, ttl).await,
            None => Err(crate::Error::Unsupported {
                key: key.clone(),
                what: "semaphores",
            }),
        },
    }
}

/// A store of distributed locks: Redis, Redlock, or in-process memory.
///
/// Implementations must be safe to call concurrently and must keep these
/// semantics, which the [`Locker`](crate::Locker) and the tests rely on:
///
/// 1. At most one token owns a key at a time; ownership ends at the TTL unless
///    extended.
/// 2. `acquire` with the token that already owns the key re-arms the TTL and returns
///    `Acquired` with a **newly minted** epoch, greater than the one it replaces (a
///    retry after a lost reply, or a new leader that inherits the token of an
///    acquire that may have landed: each critical section gets its own, greater
///    fencing epoch). The lockers never acquire with a token once a release of it
///    was sent; a backend whose requests can be delayed or re-sent refuses such an
///    acquire (a late copy) rather than grant a lease nobody holds (the Redis
///    scripts read the token's release record).
/// 3. Epochs of one key strictly increase across acquisitions, same-token ones
///    included.
/// 4. `release` and `extend` change nothing unless the token owns the key. A
///    backend whose replies can be lost reports a repeated release of a token it
///    has just released as `released: true`.
/// 5. After a release, a waiting instance is woken through its
///    [`wakeups`](LockBackend::wakeups) registry: [`WakeRegistry::wake`] for
///    [`LockKind::Mutex`] and the key (the read-write locks and semaphores wake their
///    own kinds). A spurious wake-up is harmless.
///
/// # Cancel safety
///
/// Dropping any of the futures may leave the operation done or not done; because
/// every operation is idempotent per token, the caller repeats it (or releases) to
/// reconcile.
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// Acquire-or-enqueue `key` for `token` with a TTL of `ttl`. With
    /// [`WhenBusy::Return`] a busy lock is reported without joining the key's queue
    /// (`try_lock`).
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire>;

    /// Fair-mode acquire-or-enqueue (see [`Contention::Fair`](crate::Contention::Fair)):
    /// like [`acquire`](LockBackend::acquire), but the caller speaks for a local
    /// waiter that arrived `age` ago (the oldest one of this instance), and the lock
    /// goes in order of arrival:
    ///
    /// * this instance's queue entry is (re)placed at the arrival time, *now − age*,
    ///   in the backend's clock, each time it asks (so a new leader of the instance
    ///   takes its own place, not its predecessor's);
    /// * a free lock (no holder, no claim given to another instance) is taken only
    ///   if no other live queue entry arrived earlier; otherwise the answer is
    ///   `Busy` (and, with [`WhenBusy::Queue`], the instance is queued), even after a TTL
    ///   expiry: no barging;
    /// * the token that owns the key re-arms it, as with `acquire`.
    ///
    /// Backends that cannot order waiters keep the default, which refuses with
    /// [`Error::Unsupported`](crate::Error::Unsupported), and report `false` from
    /// [`supports_fair`](LockBackend::supports_fair); the locker then refuses
    /// to build in fair mode.
    async fn acquire_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
        age: Duration,
    ) -> Result<Acquire> {
        let _ = (token, ttl, when_busy, age);
        Err(crate::Error::Unsupported {
            key: key.clone(),
            what: "fair mode",
        })
    }

    /// Whether [`acquire_fair`](LockBackend::acquire_fair) is implemented.
    fn supports_fair(&self) -> bool {
        false
    }

    /// The callers that wait for `key` ask again at `pace` at the latest, not more
    /// often than the backend needs them to (`None`: the backend's own cadence
    /// again). An election candidate sets it to a third of its lease TTL, so that
    /// behind a lease whose holder died it asks a few times per TTL, not once per
    /// queue refresh: a backend that keeps a waiter's place by the waiter's asks
    /// (Redis: every third of `queue_entry_ttl`) keeps that place longer instead.
    /// Calls nest: each `Some` is undone by one `None`. The default does nothing;
    /// a backend that wraps another should forward it.
    fn pace_waits(&self, key: &LockKey, pace: Option<Duration>) {
        let _ = (key, pace);
    }

    /// A fresh token for a lease of this backend ([`LeaseToken::random`] unless the
    /// backend marks its tokens, as the Redis backend does with its instance id:
    /// a revocation of a cached lease is addressed by it). A backend that wraps
    /// another should forward it.
    fn new_token(&self) -> LeaseToken {
        LeaseToken::random()
    }

    /// Release `key` if `token` owns it, then wake the next waiting instance.
    async fn release(&self, key: &LockKey, token: LeaseToken) -> Result<Released>;

    /// Fair-mode release, when this instance has another local waiter that arrived
    /// `next_waiter_age` ago: like [`release`](LockBackend::release), but first
    /// (re)queues this instance at that waiter's arrival time, so the instance to
    /// wake is chosen in order of arrival with it included (it may be this one).
    /// The default is a plain release (enough for a backend whose waiters all
    /// compete again after a release, as the memory backend's do).
    async fn release_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        next_waiter_age: Duration,
    ) -> Result<Released> {
        let _ = next_waiter_age;
        self.release(key, token).await
    }

    /// Re-arm the TTL of `key` to `ttl` if `token` owns it.
    async fn extend(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Extend>;

    /// Renews many held leases, of any kinds, at once: the renewal watchdog's call
    /// (one per scan of a locker's due leases).
    ///
    /// Returns one result per item, in the order of `items`, and each must be what
    /// the item's own call would return ([`extend`](LockBackend::extend),
    /// [`extend_read`](RwBackend::extend_read),
    /// [`extend_write`](RwBackend::extend_write) or
    /// [`extend_permit`](SemaphoreBackend::extend_permit)): `Extended` only if that
    /// lease was re-armed, `NotOwner` if it is not held by its token, the same
    /// errors otherwise. A failure that stops a whole group (a connection error)
    /// is that error for each lease of the group. Leases of one batch are
    /// independent: one lease's answer never changes another's.
    ///
    /// The default makes the per-lease calls concurrently. A backend whose calls
    /// have a fixed cost per request overrides it to group them: the Redis backend
    /// renews up to a chunk of leases per script call (on a Cluster, per cluster
    /// slot).
    ///
    /// # Cancel safety
    ///
    /// As the per-lease calls: dropping the future may leave some leases renewed
    /// and others not.
    async fn extend_batch(&self, items: &[RenewItem<'_>]) -> Vec<Result<Extend>> {
        futures::future::join_all(items.iter().map(|item| extend_one(self, item))).await
    }

    /// Leave the queue of `key` (this instance no longer wants it) and pass on any
    /// claim this instance was given.
    async fn leave(&self, key: &LockKey) -> Result<()>;

    /// The registry through which this backend delivers wake-ups for the keys this
    /// instance waits for, of every [`LockKind`] the backend has.
    fn wakeups(&self) -> &WakeRegistry;

    /// Whether epochs are fencing tokens (strictly increasing per key). `false` for
    /// backends that cannot promise it.
    fn fencing(&self) -> bool {
        true
    }

    /// The backend's read-write locks, if it has them.
    fn rw(&self) -> Option<&dyn RwBackend> {
        None
    }

    /// The backend's semaphores, if it has them.
    fn semaphore(&self) -> Option<&dyn SemaphoreBackend> {
        None
    }

    /// Writes the leader record of the election `key` (who leads it: see
    /// [`Locker::election`](crate::Locker::election)) with a TTL of `ttl`, unless
    /// the record stored now is newer. Records are ordered by their first 40 bytes
    /// (the term, as decimal digits); a record whose first 40 bytes compare greater
    /// is kept. Returns whether `record` was written.
    ///
    /// The default refuses with [`Error::Unsupported`](crate::Error::Unsupported).
    async fn write_leader(&self, key: &LockKey, record: &[u8], ttl: Duration) -> Result<bool> {
        let _ = (record, ttl);
        Err(crate::Error::Unsupported {
            key: key.clone(),
            what: "leader election",
        })
    }

    /// The leader record of the election `key`, if one is stored and has not
    /// expired.
    ///
    /// The default refuses with [`Error::Unsupported`](crate::Error::Unsupported).
    async fn read_leader(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        Err(crate::Error::Unsupported {
            key: key.clone(),
            what: "leader election",
        })
    }

    /// Deletes the leader record of the election `key` if it is still `record`
    /// (a newer leader's record stays). Returns whether it was deleted.
    ///
    /// The default refuses with [`Error::Unsupported`](crate::Error::Unsupported).
    async fn clear_leader(&self, key: &LockKey, record: &[u8]) -> Result<bool> {
        let _ = record;
        Err(crate::Error::Unsupported {
            key: key.clone(),
            what: "leader election",
        })
    }

    /// Registers this instance as an observer of the leader record of the
    /// election `key` for `ttl`, or refreshes its registration: until it lapses,
    /// every change of the record ([`write_leader`](LockBackend::write_leader)
    /// writing another record, [`clear_leader`](LockBackend::clear_leader)
    /// deleting one), by any instance, is announced to this instance's
    /// [`wakeups`](LockBackend::wakeups) registry with
    /// [`WakeRegistry::leader_changed`]. An observer refreshes it more often than
    /// `ttl` and reads the record after each registration, so a change made
    /// before it registered is read, not missed.
    ///
    /// An announcement may be lost (a dropped connection); the registry's
    /// [`wake_all`](WakeRegistry::wake_all) after a reconnect and the
    /// observer's own periodic re-read cover that: the record is the truth, a
    /// message only says "read it again". An expiry of the record is not
    /// announced.
    ///
    /// The default does nothing and returns `Ok(())`: the backend announces no
    /// changes, and observers rely on their periodic re-read alone. A backend
    /// whose own writes change the record in this process announces them to its
    /// registry itself and keeps the default (the memory backend).
    async fn observe_leader(&self, key: &LockKey, ttl: Duration) -> Result<()> {
        let _ = (key, ttl);
        Ok(())
    }
}

#[async_trait]
impl<B: LockBackend + ?Sized> LockBackend for Arc<B> {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        (**self).acquire(key, token, ttl, when_busy).await
    }
    async fn acquire_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
        age: Duration,
    ) -> Result<Acquire> {
        (**self).acquire_fair(key, token, ttl, when_busy, age).await
    }
    fn supports_fair(&self) -> bool {
        (**self).supports_fair()
    }
    fn new_token(&self) -> LeaseToken {
        (**self).new_token()
    }
    fn pace_waits(&self, key: &LockKey, pace: Option<Duration>) {
        (**self).pace_waits(key, pace);
    }
    async fn release(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        (**self).release(key, token).await
    }
    async fn release_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        next_waiter_age: Duration,
    ) -> Result<Released> {
        (**self).release_fair(key, token, next_waiter_age).await
    }
    async fn extend(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Extend> {
        (**self).extend(key, token, ttl).await
    }
    async fn extend_batch(&self, items: &[RenewItem<'_>]) -> Vec<Result<Extend>> {
        (**self).extend_batch(items).await
    }
    async fn leave(&self, key: &LockKey) -> Result<()> {
        (**self).leave(key).await
    }
    fn wakeups(&self) -> &WakeRegistry {
        (**self).wakeups()
    }
    fn fencing(&self) -> bool {
        (**self).fencing()
    }
    async fn write_leader(&self, key: &LockKey, record: &[u8], ttl: Duration) -> Result<bool> {
        (**self).write_leader(key, record, ttl).await
    }
    async fn read_leader(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        (**self).read_leader(key).await
    }
    async fn clear_leader(&self, key: &LockKey, record: &[u8]) -> Result<bool> {
        (**self).clear_leader(key, record).await
    }
    async fn observe_leader(&self, key: &LockKey, ttl: Duration) -> Result<()> {
        (**self).observe_leader(key, ttl).await
    }
    fn rw(&self) -> Option<&dyn RwBackend> {
        (**self).rw()
    }
    fn semaphore(&self) -> Option<&dyn SemaphoreBackend> {
        (**self).semaphore()
    }
}

type Watchers = DashMap<LockKey, watch::Sender<u64>>;

/// The one-at-a-time watchers of a key: the `Notify` they wait on and how many
/// handles exist.
type OneWatchers = DashMap<LockKey, (Arc<Notify>, usize)>;

/// Number of wake-up generation counters per kind; keys share them by hash.
const STRIPES: usize = 64;

/// The watchers and wake-up generations of one [`LockKind`].
struct Table {
    watchers: Watchers,
    ones: OneWatchers,
    generations: [AtomicU64; STRIPES],
}

impl Default for Table {
    fn default() -> Self {
        Table {
            watchers: DashMap::new(),
            ones: DashMap::new(),
            generations: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Table {
    fn stripe(&self, key: &[u8]) -> &AtomicU64 {
        &self.generations[crate::key::key_hash(key) as usize % STRIPES]
    }

    fn is_watched(&self, key: &[u8]) -> bool {
        self.watchers.contains_key(key) || self.ones.contains_key(key)
    }
}

/// One [`Table`] per [`LockKind`], at [`LockKind::index`].
type Tables = [Table; LockKind::ALL.len()];

/// Per-kind, per-key wake-up fan-in for one backend instance.
///
/// A backend calls [`wake`](WakeRegistry::wake) when it learns that a lock may be
/// free (a pub/sub message, an in-process release); callers wait on a [`Wakeup`].
/// Registrations are per [`LockKind`] and key: the mutex, the read-write lock and
/// the semaphore of one key string are independent locks, so a wake-up of one
/// reaches none of the others' handles, and a handle of one is not counted
/// ([`watchers`](WakeRegistry::watchers), [`is_watched`](WakeRegistry::is_watched))
/// as a waiter of another.
///
/// A handle from [`watch`](WakeRegistry::watch) sees every wake-up of its lock; of
/// the handles from [`watch_one`](WakeRegistry::watch_one), one wake-up reaches one
/// (the longest waiting), so that tasks which each compete at the backend on their
/// own do not all ask again at every release. Entries exist only while someone
/// watches, so the registry stays as small as the set of locks being waited for.
/// Every wake-up also bumps a generation counter shared by the keys of one stripe
/// (per kind), so a caller that starts watching late can tell whether it may have
/// missed one.
///
/// Besides the locks, it carries two per-key signals that are not wake-ups: the
/// revocations of a cached mutex lease ([`watch_revocation`](WakeRegistry::watch_revocation))
/// and the changes of an election's leader record
/// ([`watch_leader`](WakeRegistry::watch_leader)).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use lockflight::LockKey;
/// use lockflight::backend::{LockKind, WakeRegistry};
///
/// let registry = WakeRegistry::new();
/// let key = LockKey::from("sku:555");
/// let before = registry.generation(LockKind::Mutex, key.as_bytes());
/// let mut mutex = registry.watch(LockKind::Mutex, &key);
/// let _semaphore = registry.watch(LockKind::Semaphore, &key);
///
/// // A semaphore wake-up of the same key string is not the mutex's.
/// assert!(registry.wake(LockKind::Semaphore, key.as_bytes()));
/// assert_eq!(registry.generation(LockKind::Mutex, key.as_bytes()), before);
/// assert_eq!(registry.watchers(LockKind::Mutex, key.as_bytes()), 1);
///
/// assert!(registry.wake(LockKind::Mutex, key.as_bytes()));
/// mutex.woken().await; // kept for the handle until it asks
/// # }
/// ```
#[derive(Clone)]
pub struct WakeRegistry {
    tables: Arc<Tables>,
    /// The keys whose mutex lease this instance keeps cached, idle: a revocation
    /// (another instance queued for the key) ends the caching at once.
    revocations: Arc<Watchers>,
    /// The leases this instance holds, by token: a takeover (a forced release
    /// deleted one) marks that lease lost at once.
    held: Arc<HeldLeases>,
    /// The election keys whose leader this instance observes: an announced change
    /// of the leader record (or a reconnect) has their observers read it again.
    leaders: Arc<Watchers>,
}

/// The leases of one instance that a takeover can name, by token.
type HeldLeases = DashMap<LeaseToken, Weak<dyn Held>>;

/// A lease held by this instance, as the [`WakeRegistry`] knows it: what a
/// takeover message ([`WakeRegistry::take_over`]) does to it. The locker's leases
/// implement it (`lease/mod.rs`); the registry keeps only a `Weak` reference, so
/// it never keeps a lease alive.
pub(crate) trait Held: Send + Sync {
    /// The backend deleted this lease behind its holder's back (an operator's
    /// forced release): it is lost, now.
    fn taken_over(&self);
    /// The server that granted this lease restarted without its data (or was
    /// flushed): it is lost, now.
    fn restarted(&self);
    /// The key of the lease.
    fn key(&self) -> &LockKey;
}

impl Default for WakeRegistry {
    fn default() -> Self {
        WakeRegistry {
            tables: Arc::new(std::array::from_fn(|_| Table::default())),
            revocations: Arc::new(DashMap::new()),
            held: Arc::new(DashMap::new()),
            leaders: Arc::new(DashMap::new()),
        }
    }
}

impl fmt::Debug for WakeRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeRegistry")
            .field("watched", &self.len())
            .finish()
    }
}

impl WakeRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn table(&self, kind: LockKind) -> &Table {
        &self.tables[kind.index()]
    }

    /// The wake-up generation of the `kind` lock of `key`: it changes whenever that
    /// lock (or another key's lock of the same kind and stripe) is woken, never by a
    /// wake-up of another kind. Read it before asking the backend; if it changed by
    /// the time you watch, a wake-up may have been missed: ask again at once.
    pub fn generation(&self, kind: LockKind, key: &[u8]) -> u64 {
        self.table(kind).stripe(key).load(Ordering::Acquire)
    }

    /// Starts watching the `kind` lock of `key`; every wake-up of it from now on is
    /// seen by the returned handle.
    pub fn watch(&self, kind: LockKind, key: &LockKey) -> Wakeup {
        let rx = self
            .table(kind)
            .watchers
            .entry(key.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Wakeup {
            rx: Some(Rx::All(rx)),
            kind,
            key: key.clone(),
            tables: Arc::clone(&self.tables),
        }
    }

    /// Starts watching the `kind` lock of `key` one at a time: a wake-up reaches one
    /// of the handles from `watch_one` for it (the one waiting longest; kept for the
    /// next `woken` call if none is waiting). A handle that is dropped passes one
    /// wake-up on to the others, so whoever leaves the wait (it got the lock, gave
    /// up or was cancelled) lets the next one ask.
    pub fn watch_one(&self, kind: LockKind, key: &LockKey) -> Wakeup {
        let notify = {
            let mut entry = self
                .table(kind)
                .ones
                .entry(key.clone())
                .or_insert_with(|| (Arc::new(Notify::new()), 0));
            entry.1 += 1;
            Arc::clone(&entry.0)
        };
        Wakeup {
            rx: Some(Rx::One(notify)),
            kind,
            key: key.clone(),
            tables: Arc::clone(&self.tables),
        }
    }

    /// Wakes every [`watch`](Self::watch) handle of the `kind` lock of `key` and
    /// one [`watch_one`](Self::watch_one) handle; the other kinds' handles of the
    /// same key bytes are left alone. Returns `false` if nobody watches that lock.
    pub fn wake(&self, kind: LockKind, key: &[u8]) -> bool {
        let table = self.table(kind);
        table.stripe(key).fetch_add(1, Ordering::AcqRel);
        let mut watched = false;
        if let Some(tx) = table.watchers.get(key) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
            watched = true;
        }
        if let Some(one) = table.ones.get(key) {
            one.0.notify_one();
            watched = true;
        }
        watched
    }

    /// Wakes every watcher of every lock, one-at-a-time handles included, and every
    /// observer of a leader ([`watch_leader`](Self::watch_leader)): after a lost
    /// notification connection, when messages may have been missed.
    pub fn wake_all(&self) {
        for tx in self.leaders.iter() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        for table in self.tables.iter() {
            for g in table.generations.iter() {
                g.fetch_add(1, Ordering::AcqRel);
            }
            for tx in table.watchers.iter() {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
            for one in table.ones.iter() {
                one.0.notify_waiters();
                // And one kept for a handle that is not waiting right now.
                one.0.notify_one();
            }
        }
    }

    /// Starts watching for revocations of this instance's mutex lease of `key`:
    /// every [`revoke`](Self::revoke) of `key` from now on is seen by the handle,
    /// also one that comes before the handle is awaited. The locker takes the
    /// handle before it asks for a lease it may cache
    /// ([`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for)), so a revocation that comes
    /// while the lease is in use is seen too.
    pub fn watch_revocation(&self, key: &LockKey) -> Revocation {
        Revocation(Signal::watch(&self.revocations, key))
    }

    /// Another instance queued for the mutex of `key` while this instance holds
    /// its lease: ends the caching of that lease if it is cached here (a backend
    /// calls it on a revocation message). Returns `false` if no
    /// [`Revocation`] handle watches `key`.
    pub fn revoke(&self, key: &[u8]) -> bool {
        Signal::send(&self.revocations, key)
    }

    /// Starts observing the leader record of the election `key`: every
    /// [`leader_changed`](Self::leader_changed) of `key` and every
    /// [`wake_all`](Self::wake_all) from now on is seen by the handle, also one that
    /// comes before the handle is awaited. An observer takes the handle before it
    /// reads the record, so a change announced during the read is not missed.
    pub fn watch_leader(&self, key: &LockKey) -> LeaderChange {
        LeaderChange(Signal::watch(&self.leaders, key))
    }

    /// The leader record of the election `key` changed (a new leader, a new term,
    /// or none any more): its observers here read it again (a backend calls it on
    /// a leader message, or when its own write or deletion changed the record).
    /// Returns `false` if no [`LeaderChange`] handle watches `key`.
    pub fn leader_changed(&self, key: &[u8]) -> bool {
        Signal::send(&self.leaders, key)
    }

    /// Registers `lease`, held under `token`, for [`take_over`](Self::take_over)
    /// until the returned handle is dropped. A later registration of the same
    /// token (a re-grant: an acquire asked again after an answer that came too
    /// late) replaces this one, and dropping this handle then leaves it in place.
    pub(crate) fn hold(&self, token: LeaseToken, lease: Weak<dyn Held>) -> Holding {
        self.held.insert(token, Weak::clone(&lease));
        Holding {
            token,
            lease,
            map: Arc::clone(&self.held),
        }
    }

    /// The backend deleted the lease `token` of this instance on an operator's
    /// order (a forced release; a backend calls it on a takeover message): the
    /// lease registered under `token`, if one is, is marked lost at once, with a
    /// reason that says so. Other leases, of the same key too, are not touched.
    /// Returns `false` if no live lease of this instance holds `token` (it was
    /// released meanwhile, or the token is not this instance's).
    ///
    /// A token names one lease at the backend (a token is never granted again
    /// once a release of it was sent), so a late message never reaches a later
    /// lease.
    pub fn take_over(&self, token: LeaseToken) -> bool {
        // Upgraded outside the map's shard lock: marking a lease lost wakes its
        // observers.
        let lease = self
            .held
            .get(&token)
            .map(|entry| Weak::clone(entry.value()));
        match lease.and_then(|lease| lease.upgrade()) {
            Some(lease) => {
                lease.taken_over();
                true
            }
            None => false,
        }
    }

    /// The backend's server restarted without its data (a backend calls it when
    /// it hears a new life of its server: `redis/life.rs`): every lease
    /// registered here whose key `lost_there` names (on a Cluster, those of the
    /// restarted slot) is marked lost at once, with a reason that says so.
    /// Returns how many live leases were.
    pub fn restarted(&self, lost_there: impl Fn(&LockKey) -> bool) -> usize {
        // Collected first: marking a lease lost wakes its observers, outside the
        // map's shard locks.
        let leases: Vec<_> = self
            .held
            .iter()
            .filter_map(|entry| entry.value().upgrade())
            .filter(|lease| lost_there(lease.key()))
            .collect();
        for lease in &leases {
            lease.restarted();
        }
        leases.len()
    }

    /// Number of handles currently watching the `kind` lock of `key`.
    pub fn watchers(&self, kind: LockKind, key: &[u8]) -> usize {
        let table = self.table(kind);
        table.watchers.get(key).map_or(0, |tx| tx.receiver_count())
            + table.ones.get(key).map_or(0, |one| one.1)
    }

    /// Whether anyone watches the `kind` lock of `key` (a watcher of another kind
    /// of the same key bytes does not count).
    pub fn is_watched(&self, kind: LockKind, key: &[u8]) -> bool {
        self.table(kind).is_watched(key)
    }

    /// Number of locks (kind and key) currently watched.
    pub fn len(&self) -> usize {
        self.tables
            .iter()
            .map(|table| {
                table.watchers.len()
                    + table
                        .ones
                        .iter()
                        .filter(|one| !table.watchers.contains_key(one.key()))
                        .count()
            })
            .sum()
    }

    /// Whether no lock is watched.
    pub fn is_empty(&self) -> bool {
        self.tables
            .iter()
            .all(|table| table.watchers.is_empty() && table.ones.is_empty())
    }
}

/// One key's entry in a per-key signal map (revocations, leader changes), held
/// by one handle: it sees every signal of the key sent after it was made, and
/// the map's entry goes with the key's last handle.
#[derive(Debug)]
struct Signal {
    rx: Option<watch::Receiver<u64>>,
    key: LockKey,
    map: Arc<Watchers>,
}

impl Signal {
    /// A handle on `key`'s entry of `map` (made if it is the first).
    fn watch(map: &Arc<Watchers>, key: &LockKey) -> Signal {
        let rx = map
            .entry(key.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Signal {
            rx: Some(rx),
            key: key.clone(),
            map: Arc::clone(map),
        }
    }

    /// Signals every handle of `key` in `map`; `false` if there is none.
    fn send(map: &Watchers, key: &[u8]) -> bool {
        match map.get(key) {
            Some(tx) => {
                tx.send_modify(|n| *n = n.wrapping_add(1));
                true
            }
            None => false,
        }
    }

    /// Whether a signal came that this handle has not awaited yet.
    fn has_changed(&self) -> bool {
        self.rx
            .as_ref()
            .is_some_and(|rx| rx.has_changed().unwrap_or(false))
    }

    /// Resolves at the first signal this handle has not awaited yet.
    async fn changed(&mut self) {
        match self.rx.as_mut() {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    // The map's entry is gone (it never is while a handle
                    // lives): never signalled.
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
}

impl Clone for Signal {
    /// A handle that has seen what this one has.
    fn clone(&self) -> Self {
        Signal {
            rx: self.rx.clone(),
            key: self.key.clone(),
            map: Arc::clone(&self.map),
        }
    }
}

impl Drop for Signal {
    fn drop(&mut self) {
        drop(self.rx.take());
        // Under the shard lock, so a concurrent `watch` either sees the entry and
        // subscribes before this check, or inserts a fresh one after the removal.
        self.map
            .remove_if(&self.key, |_, tx| tx.receiver_count() == 0);
    }
}

/// Interest in the revocations of one key's cached mutex lease
/// ([`WakeRegistry::watch_revocation`]); dropping it ends the interest.
#[derive(Debug)]
pub struct Revocation(Signal);

impl Clone for Revocation {
    /// A handle that has seen what this one has: a revocation this one has not
    /// seen yet is new to the clone too.
    fn clone(&self) -> Self {
        Revocation(self.0.clone())
    }
}

impl Revocation {
    /// Whether a revocation came since this handle was made (or since the one
    /// it was cloned from last awaited [`revoked`](Self::revoked)).
    pub fn is_revoked(&self) -> bool {
        self.0.has_changed()
    }

    /// Resolves at the first revocation of the key since this handle was made.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a revocation that came while no call was waiting is seen by
    /// the next call.
    pub async fn revoked(&mut self) {
        self.0.changed().await;
    }
}

/// Interest in the changes of one election's leader record
/// ([`WakeRegistry::watch_leader`]); dropping it ends the interest.
#[derive(Debug)]
pub struct LeaderChange(Signal);

impl LeaderChange {
    /// The election key this handle observes.
    pub fn key(&self) -> &LockKey {
        &self.0.key
    }

    /// Resolves at the first announced change of the key's leader record (or
    /// [`wake_all`](WakeRegistry::wake_all)) since this handle was made or since
    /// the previous `changed` returned. Several changes before a call are seen
    /// as one.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a change that came while no call was waiting is seen by the
    /// next call.
    pub async fn changed(&mut self) {
        self.0.changed().await;
    }
}

/// A lease's registration for takeovers ([`WakeRegistry::hold`]); dropping it
/// ends the registration, unless a newer lease of the same token replaced it.
pub(crate) struct Holding {
    token: LeaseToken,
    lease: Weak<dyn Held>,
    map: Arc<HeldLeases>,
}

impl fmt::Debug for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holding")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.map
            .remove_if(&self.token, |_, lease| Weak::ptr_eq(lease, &self.lease));
    }
}

#[derive(Debug)]
enum Rx {
    All(watch::Receiver<u64>),
    One(Arc<Notify>),
}

/// Interest in the wake-ups of one lock (a kind and a key); dropping it ends the
/// interest.
pub struct Wakeup {
    rx: Option<Rx>,
    kind: LockKind,
    key: LockKey,
    tables: Arc<Tables>,
}

impl fmt::Debug for Wakeup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeup")
            .field("kind", &self.kind)
            .field("key", &self.key)
            .field("one_at_a_time", &matches!(self.rx, Some(Rx::One(_))))
            .finish()
    }
}

impl Wakeup {
    /// The kind of lock this handle watches.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// The key this handle watches.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// Resolves at the first wake-up since this handle was created or since the
    /// previous `woken` returned (for a one-at-a-time handle: at the first wake-up
    /// given to it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a wake-up that arrives while no call is pending is kept for the
    /// next call (for a one-at-a-time handle, for the next call of any handle of the
    /// lock), and one given to a call that is dropped before it returns passes to
    /// the next waiting handle.
    pub async fn woken(&mut self) {
        let closed = match self.rx.as_mut() {
            // The sender lives in the registry until every receiver is gone, so
            // `changed` can only fail if the registry itself was dropped.
            Some(Rx::All(rx)) => rx.changed().await.is_err(),
            Some(Rx::One(notify)) => {
                notify.notified().await;
                false
            }
            None => false,
        };
        if closed {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Wakeup {
    fn drop(&mut self) {
        let table = &self.tables[self.kind.index()];
        match self.rx.take() {
            Some(Rx::All(rx)) => {
                drop(rx);
                // Under the shard lock, so a concurrent `watch` either sees the entry
                // and subscribes before this check, or inserts a fresh one after the
                // removal.
                table
                    .watchers
                    .remove_if(&self.key, |_, tx| tx.receiver_count() == 0);
            }
            Some(Rx::One(_)) => {
                if let dashmap::Entry::Occupied(mut entry) = table.ones.entry(self.key.clone()) {
                    entry.get_mut().1 -= 1;
                    if entry.get().1 == 0 {
                        entry.remove();
                    } else {
                        // The next one asks now: this one no longer will.
                        entry.get().0.notify_one();
                    }
                }
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: LockKind = LockKind::Mutex;

    /// A revocation before the handle is awaited is kept; a `revoked()` dropped
    /// before it resolved loses nothing (the next call sees the revocation); other
    /// keys' revocations are not seen; the entry goes with the last handle.
    #[tokio::test]
    async fn revocations_are_kept_across_dropped_waits_and_entries_are_removed() {
        let short = Duration::from_millis(20);
        let reg = WakeRegistry::new();
        let key = LockKey::from("k");
        assert!(!reg.revoke(b"k"), "nobody watches yet");
        let mut early = reg.watch_revocation(&key);
        assert!(reg.revoke(b"k"));
        tokio::time::timeout(short, early.revoked())
            .await
            .expect("a revocation before the first poll is kept");

        let mut late = reg.watch_revocation(&key);
        assert!(
            tokio::time::timeout(short, late.revoked()).await.is_err(),
            "an earlier revocation is not seen by a later handle"
        );
        assert!(!reg.revoke(b"other"), "another key");
        assert!(tokio::time::timeout(short, late.revoked()).await.is_err());
        // Revoked while no call waits (the previous one was dropped).
        assert!(reg.revoke(b"k"));
        tokio::time::timeout(short, late.revoked())
            .await
            .expect("seen by the next call");

        drop((early, late));
        assert!(!reg.revoke(b"k"), "the entry went with the last handle");
    }

    /// A leader change before the handle is awaited is kept; several are seen as
    /// one; another key's are not seen; `wake_all` reaches every observer; the
    /// entry goes with the last handle.
    #[tokio::test]
    async fn leader_changes_reach_the_key_s_observers_and_wake_all_reaches_all() {
        let short = Duration::from_millis(20);
        let reg = WakeRegistry::new();
        let (key, other) = (LockKey::from("k"), LockKey::from("other"));
        assert!(!reg.leader_changed(b"k"), "nobody observes yet");
        let mut seen = reg.watch_leader(&key);
        let mut elsewhere = reg.watch_leader(&other);
        assert_eq!(seen.key(), &key);
        assert!(reg.leader_changed(b"k"));
        assert!(reg.leader_changed(b"k"));
        tokio::time::timeout(short, seen.changed())
            .await
            .expect("a change before the first poll is kept");
        assert!(
            tokio::time::timeout(short, seen.changed()).await.is_err(),
            "two changes before a call are one"
        );
        assert!(
            tokio::time::timeout(short, elsewhere.changed())
                .await
                .is_err(),
            "another key's change"
        );
        // A second observer of the key, made later, sees only later changes.
        let mut late = reg.watch_leader(&key);
        assert!(tokio::time::timeout(short, late.changed()).await.is_err());

        reg.wake_all();
        for handle in [&mut seen, &mut elsewhere, &mut late] {
            tokio::time::timeout(short, handle.changed())
                .await
                .expect("wake_all reaches every observer");
        }
        drop((seen, late));
        assert!(!reg.leader_changed(b"k"), "the entry went with its handles");
        assert!(reg.leader_changed(b"other"));
        drop(elsewhere);
        assert!(reg.leaders.is_empty());
    }

    /// A lease marked by `taken_over`.
    #[derive(Default)]
    struct Marked(std::sync::atomic::AtomicBool);

    impl Held for Marked {
        fn taken_over(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
        fn restarted(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
        fn key(&self) -> &LockKey {
            static KEY: std::sync::LazyLock<LockKey> =
                std::sync::LazyLock::new(|| LockKey::from("marked"));
            &KEY
        }
    }

    impl Marked {
        fn is_marked(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// A takeover reaches exactly the lease registered under its token; a newer
    /// registration of the same token replaces the older one (whose handle then
    /// leaves it in place); a dropped registration or lease is not reached.
    #[test]
    fn a_takeover_marks_exactly_the_lease_of_its_token() {
        let reg = WakeRegistry::new();
        let (t1, t2) = (LeaseToken::for_instance(1), LeaseToken::for_instance(1));
        let (first, other) = (Arc::new(Marked::default()), Arc::new(Marked::default()));
        let weak = |m: &Arc<Marked>| Arc::downgrade(m) as Weak<dyn Held>;
        let h1 = reg.hold(t1, weak(&first));
        let h2 = reg.hold(t2, weak(&other));
        assert!(
            !reg.take_over(LeaseToken::for_instance(1)),
            "nobody's token"
        );
        assert!(reg.take_over(t1));
        assert!(first.is_marked() && !other.is_marked(), "only t1's lease");

        // t1 granted again to a new lease (an inherited token): the old handle's
        // drop leaves the new registration.
        let renewed = Arc::new(Marked::default());
        let h3 = reg.hold(t1, weak(&renewed));
        drop(h1);
        assert!(reg.take_over(t1));
        assert!(renewed.is_marked());
        drop(h3);
        assert!(!reg.take_over(t1), "the registration went with its handle");

        // A lease dropped while registered is not reached.
        drop(other);
        assert!(!reg.take_over(t2));
        drop(h2);
        assert!(reg.held.is_empty());
    }

    #[tokio::test]
    async fn a_wake_before_waiting_is_kept_and_entries_are_removed() {
        let reg = WakeRegistry::new();
        let key = LockKey::from("k");
        let before = reg.generation(M, b"k");
        assert!(!reg.wake(M, b"k"), "nobody watches yet");
        assert_ne!(
            reg.generation(M, b"k"),
            before,
            "an unwatched wake-up still counts"
        );
        let mut a = reg.watch(M, &key);
        let mut b = reg.watch(M, &key);
        assert!(reg.wake(M, b"k"));
        // Both see the wake-up that happened before they started waiting.
        a.woken().await;
        b.woken().await;
        drop(a);
        assert_eq!(reg.len(), 1);
        drop(b);
        assert!(reg.is_empty());
        assert!(!reg.wake(M, b"k"));
    }

    #[tokio::test]
    async fn one_wake_up_reaches_one_handle_and_a_dropped_handle_passes_it_on() {
        use std::time::Duration;
        use tokio::time::timeout;

        let reg = WakeRegistry::new();
        let key = LockKey::from("k");
        let mut a = reg.watch_one(M, &key);
        let mut b = reg.watch_one(M, &key);
        let mut all = reg.watch(M, &key);
        assert_eq!(reg.watchers(M, b"k"), 3);
        assert_eq!(reg.len(), 1);
        assert!(reg.wake(M, b"k"));
        // The broadcast handle sees it, and exactly one of the two others.
        all.woken().await;
        a.woken().await;
        let short = Duration::from_millis(20);
        assert!(timeout(short, b.woken()).await.is_err(), "b was woken too");
        // `a` stops waiting: its leaving passes one wake-up on to `b`.
        drop(a);
        timeout(Duration::from_secs(5), b.woken())
            .await
            .expect("the dropped handle passed its turn on");
        // A wake-up given to a `woken` call that is dropped before it returns goes
        // to the next waiting handle (the call is cancel safe).
        let mut c = reg.watch_one(M, &key);
        {
            let mut wait_b = Box::pin(b.woken());
            let mut wait_c = Box::pin(c.woken());
            assert!(futures::poll!(&mut wait_b).is_pending());
            assert!(futures::poll!(&mut wait_c).is_pending());
            assert!(reg.wake(M, b"k"));
            // b has waited longest: the wake-up is b's, not c's.
            assert!(futures::poll!(&mut wait_c).is_pending());
            drop(wait_b);
            timeout(Duration::from_secs(5), wait_c)
                .await
                .expect("a dropped call passed its wake-up on");
        }
        // A reconnect wakes every waiting handle.
        {
            let mut wait_b = std::pin::pin!(b.woken());
            let mut wait_c = std::pin::pin!(c.woken());
            assert!(futures::poll!(&mut wait_b).is_pending());
            assert!(futures::poll!(&mut wait_c).is_pending());
            reg.wake_all();
            timeout(Duration::from_secs(5), wait_b).await.unwrap();
            timeout(Duration::from_secs(5), wait_c).await.unwrap();
        }
        drop((b, c, all));
        assert!(reg.is_empty());
        assert!(!reg.wake(M, b"k"));
    }

    /// A wake-up of one kind reaches neither the watchers nor the generation of
    /// another kind's lock of the same key bytes; each kind's watchers and entries
    /// are counted and removed on their own.
    #[tokio::test]
    async fn kinds_of_one_key_are_woken_and_counted_apart() {
        use std::time::Duration;
        use tokio::time::timeout;

        let reg = WakeRegistry::new();
        let key = LockKey::from("k");
        let short = Duration::from_millis(20);
        let mut mutex = reg.watch(LockKind::Mutex, &key);
        let mut rw = reg.watch_one(LockKind::ReadWrite, &key);
        assert!(!reg.is_watched(LockKind::Semaphore, b"k"));
        assert_eq!(reg.watchers(LockKind::Semaphore, b"k"), 0);
        assert_eq!(reg.watchers(LockKind::Mutex, b"k"), 1);
        assert_eq!(reg.watchers(LockKind::ReadWrite, b"k"), 1);
        assert_eq!(reg.len(), 2);

        let generations = |reg: &WakeRegistry| LockKind::ALL.map(|k| reg.generation(k, b"k"));
        let before = generations(&reg);
        assert!(
            !reg.wake(LockKind::Semaphore, b"k"),
            "nobody watches the semaphore"
        );
        let after = generations(&reg);
        assert_eq!(after[..2], before[..2], "other kinds' generations moved");
        assert_ne!(after[2], before[2], "an unwatched wake-up still counts");
        assert!(timeout(short, mutex.woken()).await.is_err(), "mutex woken");
        assert!(timeout(short, rw.woken()).await.is_err(), "rw woken");

        assert!(reg.wake(LockKind::Mutex, b"k"));
        mutex.woken().await;
        assert!(timeout(short, rw.woken()).await.is_err(), "rw woken");
        assert_eq!(generations(&reg)[1], before[1]);

        assert!(reg.wake(LockKind::ReadWrite, b"k"));
        rw.woken().await;
        assert!(timeout(short, mutex.woken()).await.is_err(), "mutex woken");

        // A reconnect wakes every kind.
        reg.wake_all();
        mutex.woken().await;
        rw.woken().await;
        assert!(
            generations(&reg)
                .iter()
                .zip(after)
                .all(|(now, then)| *now != then),
            "wake_all moves every kind's generation"
        );

        drop(mutex);
        assert!(!reg.is_watched(LockKind::Mutex, b"k"));
        assert!(reg.is_watched(LockKind::ReadWrite, b"k"));
        assert_eq!(reg.len(), 1);
        drop(rw);
        assert!(reg.is_empty());
    }

    #[test]
    fn a_kind_indexes_its_place_in_all() {
        for (i, kind) in LockKind::ALL.iter().enumerate() {
            assert_eq!(kind.index(), i, "{kind:?}");
        }
    }

    #[test]
    fn token_hex_is_32_digits_and_debug_hides_most() {
        let t = LeaseToken::random();
        assert_eq!(t.to_hex().len(), 32);
        assert!(format!("{t:?}").len() < 30);
    }
}
