//! Where locks live: the [`LockBackend`] trait and its implementations.
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
//! the instance's single pub/sub channel). A caller that was told to wait starts
//! watching the key only then — an acquire that succeeds at once costs no
//! registration — and compares the key's wake-up generation from before its request
//! with the one after registering, so a wake-up that raced with the reply is never
//! lost (it only causes an immediate retry).
//!
//! Every operation can be repeated with the same token: repeating an acquire whose
//! reply was lost either finds the lock already ours (and mints a new epoch) or
//! competes again; repeating a release whose reply was lost reports the release the
//! first attempt made (where replies can be lost, as with Redis). That is how
//! ambiguous results are reconciled, never by guessing.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use tokio::sync::{Notify, watch};

use crate::error::Result;
use crate::key::LockKey;

pub mod memory;
pub mod redis;
pub mod redlock;
pub mod rw;
pub(crate) mod schedule;
pub mod semaphore;

pub use memory::MemoryBackend;
pub use redis::{RedisBackend, RedisBackendBuilder};
pub use redlock::{RedlockBackend, RedlockBackendBuilder};
use rw::RwBackend;
use semaphore::SemaphoreBackend;

/// A random 128-bit value identifying one lease. Only its holder knows it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(u128);

impl LeaseToken {
    /// A fresh token from the thread-local CSPRNG.
    pub fn random() -> Self {
        LeaseToken(rand::random())
    }

    /// The token as 32 lowercase hex digits (what is stored at the lock key).
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
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

/// A store of distributed locks: Redis, Redlock, or in-process memory.
///
/// Implementations must be safe to call concurrently and must keep these
/// semantics, which the [`Locker`](crate::Locker) and the tests rely on:
///
/// 1. At most one token owns a key at a time; ownership ends at the TTL unless
///    extended.
/// 2. `acquire` with the token that already owns the key re-arms the TTL and returns
///    `Acquired` with a **newly minted** epoch, greater than the one it replaces (a
///    retry after a lost reply, or a new leader that reuses the token of a release
///    that failed: each critical section gets its own, greater fencing epoch).
/// 3. Epochs of one key strictly increase across acquisitions, same-token ones
///    included.
/// 4. `release` and `extend` change nothing unless the token owns the key. A
///    backend whose replies can be lost reports a repeated release of a token it
///    has just released as `released: true`.
/// 5. After a release, a waiting instance is woken through its
///    [`wakeups`](LockBackend::wakeups) registry: [`WakeRegistry::wake`] for the key.
///    A spurious wake-up is harmless.
///
/// # Cancel safety
///
/// Dropping any of the futures may leave the operation done or not done; because
/// every operation is idempotent per token, the caller repeats it (or releases) to
/// reconcile.
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// Acquire-or-enqueue `key` for `token` with a TTL of `ttl`. With `queue` false
    /// a busy lock is reported without joining the key's queue (`try_lock`).
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        queue: bool,
    ) -> Result<Acquire>;

    /// Fair-mode acquire-or-enqueue (see [`LockerBuilder::fair`](crate::LockerBuilder::fair)):
    /// like [`acquire`](LockBackend::acquire), but the caller speaks for a local
    /// waiter that arrived `age` ago (the oldest one of this instance), and the lock
    /// goes in order of arrival:
    ///
    /// * this instance's queue entry is (re)placed at the arrival time, *now − age*,
    ///   in the backend's clock, each time it asks (so a new leader of the instance
    ///   takes its own place, not its predecessor's);
    /// * a free lock (no holder, no claim given to another instance) is taken only
    ///   if no other live queue entry arrived earlier; otherwise the answer is
    ///   `Busy` (and, with `queue`, the instance is queued), even after a TTL
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
        queue: bool,
        age: Duration,
    ) -> Result<Acquire> {
        let _ = (token, ttl, queue, age);
        Err(crate::Error::Unsupported {
            key: key.clone(),
            what: "fair mode",
        })
    }

    /// Whether [`acquire_fair`](LockBackend::acquire_fair) is implemented.
    fn supports_fair(&self) -> bool {
        false
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

    /// Leave the queue of `key` (this instance no longer wants it) and pass on any
    /// claim this instance was given.
    async fn leave(&self, key: &LockKey) -> Result<()>;

    /// The registry through which this backend delivers wake-ups for the keys this
    /// instance waits for.
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
}

#[async_trait]
impl<B: LockBackend + ?Sized> LockBackend for Arc<B> {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        queue: bool,
    ) -> Result<Acquire> {
        (**self).acquire(key, token, ttl, queue).await
    }
    async fn acquire_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        queue: bool,
        age: Duration,
    ) -> Result<Acquire> {
        (**self).acquire_fair(key, token, ttl, queue, age).await
    }
    fn supports_fair(&self) -> bool {
        (**self).supports_fair()
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
    async fn leave(&self, key: &LockKey) -> Result<()> {
        (**self).leave(key).await
    }
    fn wakeups(&self) -> &WakeRegistry {
        (**self).wakeups()
    }
    fn fencing(&self) -> bool {
        (**self).fencing()
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

/// Number of wake-up generation counters; keys share them by hash.
const STRIPES: usize = 64;

/// Per-key wake-up fan-in for one backend instance.
///
/// A backend calls [`wake`](WakeRegistry::wake) when it learns that a key may be
/// free (a pub/sub message, an in-process release); callers wait on a [`Wakeup`].
/// A handle from [`watch`](WakeRegistry::watch) sees every wake-up of its key; of
/// the handles from [`watch_one`](WakeRegistry::watch_one), one wake-up reaches one
/// (the longest waiting), so that tasks which each compete at the backend on their
/// own do not all ask again at every release. Entries exist only while someone
/// watches, so the registry stays as small as the set of keys being waited for.
/// Every wake-up also bumps a generation counter shared by the keys of one stripe,
/// so a caller that starts watching late can tell whether it may have missed one.
#[derive(Clone)]
pub struct WakeRegistry {
    watchers: Arc<Watchers>,
    ones: Arc<OneWatchers>,
    generations: Arc<[AtomicU64; STRIPES]>,
}

impl Default for WakeRegistry {
    fn default() -> Self {
        WakeRegistry {
            watchers: Arc::default(),
            ones: Arc::default(),
            generations: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

impl fmt::Debug for WakeRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeRegistry")
            .field("watched_keys", &self.len())
            .finish()
    }
}

impl WakeRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn stripe(&self, key: &[u8]) -> &AtomicU64 {
        &self.generations[crate::routing::key_hash(key) as usize % STRIPES]
    }

    /// The wake-up generation of `key`: it changes whenever `key` (or another key
    /// of its stripe) is woken. Read it before asking the backend; if it changed by
    /// the time you watch, a wake-up may have been missed: ask again at once.
    pub fn generation(&self, key: &[u8]) -> u64 {
        self.stripe(key).load(Ordering::Acquire)
    }

    /// Starts watching `key`; every wake-up from now on is seen by the returned
    /// handle.
    pub fn watch(&self, key: &LockKey) -> Wakeup {
        let rx = self
            .watchers
            .entry(key.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Wakeup {
            rx: Some(Rx::All(rx)),
            key: key.clone(),
            watchers: Arc::clone(&self.watchers),
            ones: Arc::clone(&self.ones),
        }
    }

    /// Starts watching `key` one at a time: a wake-up reaches one of the handles
    /// from `watch_one` (the one waiting longest; kept for the next `woken` call if
    /// none is waiting). A handle that is dropped passes one wake-up on to the
    /// others, so whoever leaves the wait (it got the lock, gave up or was
    /// cancelled) lets the next one ask.
    pub fn watch_one(&self, key: &LockKey) -> Wakeup {
        let notify = {
            let mut entry = self
                .ones
                .entry(key.clone())
                .or_insert_with(|| (Arc::new(Notify::new()), 0));
            entry.1 += 1;
            Arc::clone(&entry.0)
        };
        Wakeup {
            rx: Some(Rx::One(notify)),
            key: key.clone(),
            watchers: Arc::clone(&self.watchers),
            ones: Arc::clone(&self.ones),
        }
    }

    /// Wakes every [`watch`](Self::watch) handle of `key` and one
    /// [`watch_one`](Self::watch_one) handle. Returns `false` if nobody watches it.
    pub fn wake(&self, key: &[u8]) -> bool {
        self.stripe(key).fetch_add(1, Ordering::AcqRel);
        let mut watched = false;
        if let Some(tx) = self.watchers.get(key) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
            watched = true;
        }
        if let Some(one) = self.ones.get(key) {
            one.0.notify_one();
            watched = true;
        }
        watched
    }

    /// Wakes every watcher of every key, one-at-a-time handles included (after a
    /// lost notification connection, when messages may have been missed).
    pub fn wake_all(&self) {
        for g in self.generations.iter() {
            g.fetch_add(1, Ordering::AcqRel);
        }
        for tx in self.watchers.iter() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        for one in self.ones.iter() {
            one.0.notify_waiters();
            // And one kept for a handle that is not waiting right now.
            one.0.notify_one();
        }
    }

    /// Number of handles currently watching `key`.
    pub fn watchers(&self, key: &[u8]) -> usize {
        self.watchers.get(key).map_or(0, |tx| tx.receiver_count())
            + self.ones.get(key).map_or(0, |one| one.1)
    }

    /// Whether anyone watches `key`.
    pub fn is_watched(&self, key: &[u8]) -> bool {
        self.watchers.contains_key(key) || self.ones.contains_key(key)
    }

    /// Number of keys currently watched.
    pub fn len(&self) -> usize {
        self.watchers.len()
            + self
                .ones
                .iter()
                .filter(|one| !self.watchers.contains_key(one.key()))
                .count()
    }

    /// Whether no key is watched.
    pub fn is_empty(&self) -> bool {
        self.watchers.is_empty() && self.ones.is_empty()
    }
}

#[derive(Debug)]
enum Rx {
    All(watch::Receiver<u64>),
    One(Arc<Notify>),
}

/// Interest in the wake-ups of one key; dropping it ends the interest.
#[derive(Debug)]
pub struct Wakeup {
    rx: Option<Rx>,
    key: LockKey,
    watchers: Arc<Watchers>,
    ones: Arc<OneWatchers>,
}

impl Wakeup {
    /// Resolves at the first wake-up since this handle was created or since the
    /// previous `woken` returned (for a one-at-a-time handle: at the first wake-up
    /// given to it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a wake-up that arrives while no call is pending is kept for the
    /// next call (for a one-at-a-time handle, for the next call of any handle of the
    /// key), and one given to a call that is dropped before it returns passes to
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
        match self.rx.take() {
            Some(Rx::All(rx)) => {
                drop(rx);
                // Under the shard lock, so a concurrent `watch` either sees the entry
                // and subscribes before this check, or inserts a fresh one after the
                // removal.
                self.watchers
                    .remove_if(&self.key, |_, tx| tx.receiver_count() == 0);
            }
            Some(Rx::One(_)) => {
                if let dashmap::Entry::Occupied(mut entry) = self.ones.entry(self.key.clone()) {
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

    #[tokio::test]
    async fn a_wake_before_waiting_is_kept_and_entries_are_removed() {
        let reg = WakeRegistry::new();
        let key = LockKey::from("k");
        let before = reg.generation(b"k");
        assert!(!reg.wake(b"k"), "nobody watches yet");
        assert_ne!(
            reg.generation(b"k"),
            before,
            "an unwatched wake-up still counts"
        );
        let mut a = reg.watch(&key);
        let mut b = reg.watch(&key);
        assert!(reg.wake(b"k"));
        // Both see the wake-up that happened before they started waiting.
        a.woken().await;
        b.woken().await;
        drop(a);
        assert_eq!(reg.len(), 1);
        drop(b);
        assert!(reg.is_empty());
        assert!(!reg.wake(b"k"));
    }

    #[tokio::test]
    async fn one_wake_up_reaches_one_handle_and_a_dropped_handle_passes_it_on() {
        use std::time::Duration;
        use tokio::time::timeout;

        let reg = WakeRegistry::new();
        let key = LockKey::from("k");
        let mut a = reg.watch_one(&key);
        let mut b = reg.watch_one(&key);
        let mut all = reg.watch(&key);
        assert_eq!(reg.watchers(b"k"), 3);
        assert_eq!(reg.len(), 1);
        assert!(reg.wake(b"k"));
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
        let mut c = reg.watch_one(&key);
        {
            let mut wait_b = Box::pin(b.woken());
            let mut wait_c = Box::pin(c.woken());
            assert!(futures::poll!(&mut wait_b).is_pending());
            assert!(futures::poll!(&mut wait_c).is_pending());
            assert!(reg.wake(b"k"));
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
        assert!(!reg.wake(b"k"));
    }

    #[test]
    fn token_hex_is_32_digits_and_debug_hides_most() {
        let t = LeaseToken::random();
        assert_eq!(t.to_hex().len(), 32);
        assert!(format!("{t:?}").len() < 30);
    }
}
