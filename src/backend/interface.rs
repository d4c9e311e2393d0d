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
//! * **renew** ([`LockBackend::renew`]): re-arm the TTL if the token still owns it;
//! * **leave** ([`LockBackend::leave`]): a waiter that gives up leaves the queue.
//!
//! Wake-ups arrive through a [`Signals`] that the backend fills (for Redis, from
//! the instance's single pub/sub channel). They are registered per [`LockKind`](super::LockKind) and
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
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::protocol::{
    Acquire, LeaseKind, RecordFence, RecordState, Released, RenewItem, Renewal, WhenBusy,
};
use super::rw::RwBackend;
use super::semaphore::SemaphoreBackend;
use super::signals::Signals;
use super::token::LeaseToken;
use crate::error::{Error, Result};
use crate::key::LockKey;

/// Renews `item` through the per-lease call of its kind (what the default
/// [`LockBackend::renew_batch`] does for each item).
pub(crate) async fn renew_one<B: LockBackend + ?Sized>(
    backend: &B,
    item: &RenewItem<'_>,
) -> Result<Renewal> {
    let (key, token, ttl) = (item.key, item.token, item.ttl);
    match item.kind {
        LeaseKind::Mutex => backend.renew(key, token, ttl).await,
        LeaseKind::Read | LeaseKind::Write => match backend.rw() {
            Some(rw) if item.kind == LeaseKind::Read => rw.renew_read(key, token, ttl).await,
            Some(rw) => rw.renew_write(key, token, ttl).await,
            None => Err(Error::Unsupported {
                key: key.clone(),
                what: "read-write locks",
            }),
        },
        LeaseKind::Permit => match backend.semaphore() {
            Some(sem) => sem.renew_permit(key, token, ttl).await,
            None => Err(Error::Unsupported {
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
///    renewed.
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
/// 4. `release` and `renew` change nothing unless the token owns the key. A
///    backend whose replies can be lost reports a repeated release of a token it
///    has just released as `released: true`.
/// 5. After a release, a waiting instance is woken through its
///    [`signals`](LockBackend::signals) registry: [`Signals::wake`] for
///    [`LockKind::Mutex`](super::LockKind::Mutex) and the key (the read-write locks and semaphores wake their
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
    /// [`Error::Unsupported`](Error::Unsupported), and report `false` from
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
        Err(Error::Unsupported {
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
    async fn renew(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal>;

    /// Renews many held leases, of any kinds, at once: the renewal watchdog's call
    /// (one per scan of a locker's due leases).
    ///
    /// Returns one result per item, in the order of `items`, and each must be what
    /// the item's own call would return ([`renew`](LockBackend::renew),
    /// [`renew_read`](RwBackend::renew_read),
    /// [`renew_write`](RwBackend::renew_write) or
    /// [`renew_permit`](SemaphoreBackend::renew_permit)): `Renewed` only if that
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
    async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Vec<Result<Renewal>> {
        futures::future::join_all(items.iter().map(|item| renew_one(self, item))).await
    }

    /// Leave the queue of `key` (this instance no longer wants it) and pass on any
    /// claim this instance was given.
    async fn leave(&self, key: &LockKey) -> Result<()>;

    /// The registry through which this backend delivers what it hears for this
    /// instance: wake-ups for the keys it waits for, of every [`LockKind`](super::LockKind) the
    /// backend has, revocations, leader changes, takeovers and restarts.
    fn signals(&self) -> &Signals;

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
    /// The default refuses with [`Error::Unsupported`](Error::Unsupported).
    async fn write_leader(&self, key: &LockKey, record: &[u8], ttl: Duration) -> Result<bool> {
        let _ = (record, ttl);
        Err(Error::Unsupported {
            key: key.clone(),
            what: "leader election",
        })
    }

    /// The leader record of the election `key`, if one is stored and has not
    /// expired.
    ///
    /// The default refuses with [`Error::Unsupported`](Error::Unsupported).
    async fn read_leader(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        Err(Error::Unsupported {
            key: key.clone(),
            what: "leader election",
        })
    }

    /// Deletes the leader record of the election `key` if it is still `record`
    /// (a newer leader's record stays). Returns whether it was deleted.
    ///
    /// The default refuses with [`Error::Unsupported`](Error::Unsupported).
    async fn clear_leader(&self, key: &LockKey, record: &[u8]) -> Result<bool> {
        let _ = record;
        Err(Error::Unsupported {
            key: key.clone(),
            what: "leader election",
        })
    }

    /// Registers this instance as an observer of the leader record of the
    /// election `key` for `ttl`, or refreshes its registration: until it lapses,
    /// every change of the record ([`write_leader`](LockBackend::write_leader)
    /// writing another record, [`clear_leader`](LockBackend::clear_leader)
    /// deleting one), by any instance, is announced to this instance's
    /// [`signals`](LockBackend::signals) registry with
    /// [`Signals::leader_changed`]. An observer refreshes it more often than
    /// `ttl` and reads the record after each registration, so a change made
    /// before it registered is read, not missed.
    ///
    /// An announcement may be lost (a dropped connection); the registry's
    /// [`wake_all`](Signals::wake_all) after a reconnect and the
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

    /// Fences the idempotency record of `key` for the executor whose lease on the
    /// mutex of `key` has the fencing token `fence` (see
    /// [`IdempotencyLayer`](crate::layer::IdempotencyLayer)), in one step: if a
    /// response is stored, returns it ([`RecordState::Stored`]); else, unless the
    /// record's fence holds a newer token ([`RecordState::Stale`]), advances the
    /// fence to `fence` and keeps the record for `retention`
    /// ([`RecordState::Fenced`]). From then on, a
    /// [`store_record`](LockBackend::store_record) of an older token is refused.
    ///
    /// The default refuses with [`Error::Unsupported`](Error::Unsupported).
    async fn fence_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        retention: Duration,
    ) -> Result<RecordState> {
        let _ = (fence, retention);
        Err(Error::Unsupported {
            key: key.clone(),
            what: "idempotency records",
        })
    }

    /// Stores `response` in the idempotency record of `key` for `retention`, with
    /// the fence `fence`, unless the record's fence holds a newer token. Returns
    /// whether it was stored. A store and a [`fence_record`](LockBackend::fence_record)
    /// of one record never interleave.
    ///
    /// The default refuses with [`Error::Unsupported`](Error::Unsupported).
    async fn store_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        response: &[u8],
        retention: Duration,
    ) -> Result<bool> {
        let _ = (fence, response, retention);
        Err(Error::Unsupported {
            key: key.clone(),
            what: "idempotency records",
        })
    }

    /// The response stored in the idempotency record of `key`, if one is stored
    /// and its retention has not ended. Changes nothing.
    ///
    /// The default refuses with [`Error::Unsupported`](Error::Unsupported).
    async fn read_record(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        Err(Error::Unsupported {
            key: key.clone(),
            what: "idempotency records",
        })
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
    async fn renew(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal> {
        (**self).renew(key, token, ttl).await
    }
    async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Vec<Result<Renewal>> {
        (**self).renew_batch(items).await
    }
    async fn leave(&self, key: &LockKey) -> Result<()> {
        (**self).leave(key).await
    }
    fn signals(&self) -> &Signals {
        (**self).signals()
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
    async fn fence_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        retention: Duration,
    ) -> Result<RecordState> {
        (**self).fence_record(key, fence, retention).await
    }
    async fn store_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        response: &[u8],
        retention: Duration,
    ) -> Result<bool> {
        (**self).store_record(key, fence, response, retention).await
    }
    async fn read_record(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        (**self).read_record(key).await
    }
    fn rw(&self) -> Option<&dyn RwBackend> {
        (**self).rw()
    }
    fn semaphore(&self) -> Option<&dyn SemaphoreBackend> {
        (**self).semaphore()
    }
}
