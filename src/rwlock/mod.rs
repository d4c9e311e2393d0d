//! Read-write locks: [`Locker::read`](crate::Locker::read) and
//! [`Locker::write`](crate::Locker::write), with [`ReadGuard`] and [`WriteGuard`].
//!
//! Many readers or one writer per key, across every instance that shares the
//! backend. The read-write lock of a key is its own lock: it neither excludes nor
//! waits for the exclusive lock ([`Locker::lock`](crate::Locker::lock)) or a
//! semaphore of the same key string (their backend names differ). Each instance
//! stays cheap under contention:
//!
//! * **Readers of one process share one read lease.** The first local reader of a
//!   key acquires a read lease at the backend, readers that arrive within the
//!   lease's admission window ([`READ_ADMISSION_WINDOW`]) join it in memory, and the
//!   last one to leave releases it: N overlapping local readers cost one acquire and
//!   one release. The lease is renewed once for all of them, and its loss is
//!   signalled to each of them.
//! * **One local writer at a time talks to the backend.** Locally, readers and
//!   writers pass a fair (FIFO) read-write gate per key: a writer waits there for the
//!   local readers to leave, and readers that arrive after a waiting writer queue
//!   behind it (local writer preference).
//! * **Writer preference across instances.** A writer that has to wait registers at
//!   the backend as a waiting writer (an entry that expires unless the writer keeps
//!   asking, so a crashed writer blocks nobody for long). While one is registered,
//!   no new read lease is granted anywhere; a shared read lease admits new local
//!   readers only within its admission window, after which newcomers wait for it to
//!   drain and then ask the backend again (where the writer comes first).
//! * **Wake-ups, not polling.** A waiting instance is woken by a message when a
//!   write lease is released or the last read lease leaves (the backend's pub/sub
//!   channel, like the mutex), with the backend's `retry_in` as a fallback timer.
//!
//! # How long can readers hold off a writer?
//!
//! Once a writer has been told to wait (its registration landed), no new read
//! lease is granted, and every read lease stops admitting newcomers at most
//! [`READ_ADMISSION_WINDOW`] after it was acquired. So the writer gets the lock
//! within **admission window + longest read hold + wake-up latency** (a pub/sub
//! message, or at worst the backend's retry interval: a third of the Redis
//! backend's queue entry TTL, 1 s by default) — unless another *writer* gets it
//! first: writers are not ordered among themselves. Before it registers, a writer
//! passes its own process's gate, behind the local readers that arrived before it
//! (they may take one more read lease, under the same window).
//!
//! Proved by the `a_stream_of_readers_cannot_starve_a_waiting_writer` test: with
//! writer preference or the window turned off, its writer waits 10 s or more.
//!
//! # Fencing
//!
//! [`WriteGuard::fencing_token`] strictly increases across the write leases of a key
//! (`max(last + 1, server time in µs)`, like the mutex's epochs, but from the rw
//! lock's own fence). [`ReadGuard::last_write`] is the token of the last write the
//! read lease observed (the fence at its acquisition; no write can happen while it
//! is held): a reader can tell a resource which version it read.
//!
//! # Reentrancy
//!
//! Not reentrant: a task holding a [`WriteGuard`] that asks for `read` or `write` of
//! the same key waits behind itself until its wait timeout (so does a reader asking
//! for `write`).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockflight::Result<()> {
//! use lockflight::{Locker, MemoryBackend};
//!
//! let locker = Locker::builder(MemoryBackend::new()).build()?;
//! let w = locker.write("catalog").await?;
//! let version = w.fencing_token();
//! w.release().await?;
//!
//! let (a, b) = (locker.read("catalog").await?, locker.read("catalog").await?);
//! assert_eq!(a.last_write(), version);
//! assert!(locker.try_write("catalog").await?.is_none()); // readers hold it
//! drop((a, b));
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::rw::RwBackend;
use crate::backend::{Acquire, LeaseToken, Released};
use crate::error::{Error, Phase, Result};
use crate::guard::{FencingToken, Loss, LossSignal};
use crate::key::LockKey;
use crate::lease::{Lease, LeaseKind};
use crate::locker::{Locker, Shared};

mod share;

use share::{Admit, Arrive, SameLease, Share};

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

/// The read-write locks of one locker, per key.
#[derive(Debug, Default)]
pub(crate) struct RwLocks {
    keys: Mutex<HashMap<LockKey, (Arc<KeyRw>, usize)>>,
}

impl RwLocks {
    fn lock(&self) -> MutexGuard<'_, HashMap<LockKey, (Arc<KeyRw>, usize)>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One key's local state: the gate, the shared read lease, and its wake-ups.
#[derive(Debug, Default)]
struct KeyRw {
    gate: Arc<RwLock<()>>,
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
    shared: Arc<Shared>,
    key: LockKey,
    rw: Arc<KeyRw>,
}

impl Entry {
    fn enter(shared: &Arc<Shared>, key: &LockKey) -> Entry {
        let mut keys = shared.rw.lock();
        let (rw, users) = keys.entry(key.clone()).or_default();
        *users += 1;
        Entry {
            shared: Arc::clone(shared),
            key: key.clone(),
            rw: Arc::clone(rw),
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut keys = self.shared.rw.lock();
        if let Some((_, users)) = keys.get_mut(&self.key) {
            *users -= 1;
            if *users == 0 {
                keys.remove(&self.key);
            }
        }
    }
}

/// The local gate a guard holds.
enum Gate {
    Read(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
    Write(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
}

fn unsupported(key: &LockKey) -> Error {
    Error::Unsupported {
        key: key.clone(),
        what: "read-write locks",
    }
}

/// `start + wait`, or a far future when that overflows.
fn deadline_after(start: Instant, wait: Duration) -> Instant {
    start
        .checked_add(wait)
        .unwrap_or_else(|| start + Duration::from_secs(86_400 * 365 * 30))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

impl Kind {
    fn lease_kind(self) -> LeaseKind {
        match self {
            Kind::Read => LeaseKind::Read,
            Kind::Write => LeaseKind::Write,
        }
    }
}

async fn acquire_call(
    rw: &dyn RwBackend,
    kind: Kind,
    key: &LockKey,
    token: LeaseToken,
    ttl: Duration,
    queue: bool,
) -> Result<Acquire> {
    match kind {
        Kind::Read => rw.acquire_read(key, token, ttl, queue).await,
        Kind::Write => rw.acquire_write(key, token, ttl, queue).await,
    }
}

async fn release_call(
    rw: &dyn RwBackend,
    kind: Kind,
    key: &LockKey,
    token: LeaseToken,
) -> Result<Released> {
    match kind {
        Kind::Read => rw.release_read(key, token).await,
        Kind::Write => rw.release_write(key, token).await,
    }
}

/// Releases `token` (an acquire that may have landed, or a writer's registration) in
/// the background, keeping `hold` (the key's local state and gate) until it is done.
fn cleanup(
    shared: &Arc<Shared>,
    kind: Kind,
    key: &LockKey,
    token: LeaseToken,
    hold: impl Send + 'static,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let shared = Arc::clone(shared);
    let key = key.clone();
    handle.spawn(async move {
        let _hold = hold;
        if let Some(rw) = shared.backend.rw() {
            shared.stats.release();
            if let Err(e) = release_call(rw, kind, &key, token).await {
                tracing::debug!(%key, error = %e, "releasing an abandoned read-write acquire failed");
            }
        }
    });
}

/// The one local task acquiring a lease at the backend. Dropped unfinished, it
/// lets the next local reader lead (for a read) and releases its token in the
/// background (an acquire that may have landed; a writer's registration).
struct Leading {
    entry: Option<Entry>,
    gate: Option<Gate>,
    kind: Kind,
    token: LeaseToken,
    /// A request may have landed (or registered a waiting writer).
    armed: bool,
}

impl Drop for Leading {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else {
            return;
        };
        if self.kind == Kind::Read {
            entry.rw.share().abandoned();
            entry.rw.changed.notify_waiters();
        }
        if self.armed {
            let shared = Arc::clone(&entry.shared);
            let key = entry.key.clone();
            cleanup(
                &shared,
                self.kind,
                &key,
                self.token,
                (entry, self.gate.take()),
            );
        }
    }
}

/// A backend release still to be done. Dropped (its task never ran, or the release
/// finished), it stops the lease's renewal; the lease then expires at its TTL if it
/// was not released.
struct ReleaseJob {
    kind: Kind,
    lease: Arc<Lease>,
    // Held until the backend release is done, so the next local user does not meet
    // this lease at the backend.
    _gate: Gate,
    entry: Entry,
}

impl Drop for ReleaseJob {
    fn drop(&mut self) {
        self.entry.shared.renewals.forget(&self.lease);
    }
}

/// Re-runs a release in the background if the future running it is dropped.
struct Rearm(Option<ReleaseJob>);

impl Drop for Rearm {
    fn drop(&mut self) {
        if let Some(job) = self.0.take() {
            job.spawn();
        }
    }
}

impl ReleaseJob {
    async fn run(self) -> Result<()> {
        let span = tracing::debug_span!("lockflight.rw_release", key = %self.lease.key);
        let mut rearm = Rearm(Some(self));
        let job = rearm.0.as_ref().expect("armed");
        let result = job.release().instrument(span).await;
        drop(rearm.0.take());
        result
    }

    async fn release(&self) -> Result<()> {
        let shared = &self.entry.shared;
        let lease = &self.lease;
        shared.renewals.forget(lease);
        crate::stats::histograms::renewals(lease.kind, lease.renewed.load(Ordering::Relaxed));
        let rw = shared.backend.rw().ok_or_else(|| unsupported(&lease.key))?;
        let mut attempt = 0u32;
        let released = loop {
            shared.stats.release();
            match release_call(rw, self.kind, &lease.key, lease.token).await {
                Err(Error::Backend { .. } | Error::Connect { .. }) if attempt < 2 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20) * attempt).await;
                }
                other => break other?,
            }
        };
        // A retry after an attempt whose reply was lost finds the lease gone; that
        // is the first attempt's release unless the lease was known lost.
        if released.released || (attempt > 0 && !lease.is_lost()) {
            return Ok(());
        }
        Err(Error::LeaseLost {
            key: lease.key.clone(),
            phase: Phase::Releasing,
            reason: if lease.is_lost() {
                lease.lost_reason()
            } else {
                "the lease was no longer held (expired or deleted); nothing was released".into()
            },
        })
    }

    fn spawn(self) {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = self.run().await {
                    tracing::debug!(error = %e, "background read-write release failed");
                }
            });
        }
        // Without a runtime the job is dropped: renewal stops, the lease expires.
    }
}

fn lost_error(lease: &Lease, phase: Phase) -> Error {
    Error::LeaseLost {
        key: lease.key.clone(),
        phase,
        reason: lease.lost_reason(),
    }
}

/// A shared read lock of a key: other readers (of this and other instances) may
/// hold it too, no writer does.
///
/// Release it with [`release`](ReadGuard::release) to learn whether the lease was
/// still held; dropping it releases in the background. The read lease is shared by
/// the overlapping readers of this process and released by the last of them; the
/// watchdog renews it while any of them holds it, and its loss is signalled to each.
#[must_use = "the read lock is released when the guard is dropped"]
pub struct ReadGuard {
    lease: Arc<Lease>,
    entry: Option<Entry>,
    gate: Option<OwnedRwLockReadGuard<()>>,
    granted_at: Instant,
}

impl fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadGuard")
            .field("key", &self.lease.key)
            .field("last_write", &self.last_write())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl ReadGuard {
    /// The lock key.
    pub fn key(&self) -> &LockKey {
        &self.lease.key
    }

    /// The fencing token of the last write lease of the key when the read lease was
    /// acquired (`FencingToken::default()`, epoch 0, if the backend recorded none):
    /// what this reader sees is what that write left. No write happens while the
    /// read lease is held.
    ///
    /// With Redis the record is kept for at least a minute (ten lease TTLs if
    /// longer) after the last use of the lock.
    pub fn last_write(&self) -> FencingToken {
        FencingToken {
            epoch: self.lease.epoch,
            seq: 0,
        }
    }

    /// A cloneable loss signal of the shared read lease.
    pub fn loss_signal(&self) -> LossSignal {
        LossSignal {
            lease: Arc::clone(&self.lease),
        }
    }

    /// Whether the read lease has been lost: the loss was signalled, or its validity
    /// window has ended on the monotonic clock.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// How long the read lease is known to stay valid without a further renewal.
    pub fn valid_for(&self) -> Duration {
        self.lease.remaining()
    }

    /// Resolves when the read lease is lost (see
    /// [`LockGuard::lost`](crate::LockGuard::lost)); every local reader sharing the
    /// lease sees it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; it only observes.
    pub fn lost(&self) -> Loss {
        Loss::new(&self.lease)
    }

    /// Leaves the shared read lease; the last local reader releases it at the
    /// backend, which wakes the instances waiting for the key.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost (it expired, or the backend no
    /// longer held it): the read may have overlapped a write. Backend errors of the
    /// last reader's release after brief retries (the lease then expires at its TTL).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before the backend answered, the release is re-run
    /// to completion in a background task; only its result is lost.
    pub async fn release(mut self) -> Result<()> {
        let lost = self.lease.is_lost();
        let result = match self.leave() {
            Some(job) => job.run().await,
            None => Ok(()),
        };
        match result {
            Ok(()) if lost => Err(lost_error(&self.lease, Phase::Releasing)),
            other => other,
        }
    }

    /// Leaves the share; the backend release to run when this was the last holder.
    fn leave(&mut self) -> Option<ReleaseJob> {
        let entry = self.entry.take()?;
        let gate = self.gate.take()?;
        crate::stats::histograms::hold(crate::lease::LeaseKind::Read, self.granted_at.elapsed());
        let last = entry.rw.share().leave(&self.lease);
        if !last {
            return None;
        }
        entry.rw.changed.notify_waiters();
        Some(ReleaseJob {
            kind: Kind::Read,
            lease: Arc::clone(&self.lease),
            _gate: Gate::Read(gate),
            entry,
        })
    }
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        if let Some(job) = self.leave() {
            job.spawn();
        }
    }
}

/// The exclusive write lock of a key: no other writer and no reader, in any
/// instance, holds it.
///
/// Release it with [`release`](WriteGuard::release) to learn whether the lease was
/// still held; dropping it releases in the background. The watchdog renews the
/// lease while it is held.
#[must_use = "the write lock is released when the guard is dropped"]
pub struct WriteGuard {
    lease: Arc<Lease>,
    job: Option<(Entry, OwnedRwLockWriteGuard<()>)>,
    granted_at: Instant,
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGuard")
            .field("key", &self.lease.key)
            .field("fencing_token", &self.fencing_token())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl WriteGuard {
    /// The lock key.
    pub fn key(&self) -> &LockKey {
        &self.lease.key
    }

    /// This write's fencing token: strictly greater than the token of every
    /// earlier write lease of the key (`seq` is always 0).
    pub fn fencing_token(&self) -> FencingToken {
        FencingToken {
            epoch: self.lease.epoch,
            seq: 0,
        }
    }

    /// A cloneable loss signal of the write lease.
    pub fn loss_signal(&self) -> LossSignal {
        LossSignal {
            lease: Arc::clone(&self.lease),
        }
    }

    /// Whether the write lease has been lost: the loss was signalled, or its
    /// validity window has ended on the monotonic clock.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// How long the write lease is known to stay valid without a further renewal.
    pub fn valid_for(&self) -> Duration {
        self.lease.remaining()
    }

    /// Resolves when the write lease is lost (see
    /// [`LockGuard::lost`](crate::LockGuard::lost)).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; it only observes.
    pub fn lost(&self) -> Loss {
        Loss::new(&self.lease)
    }

    /// Releases the write lock at the backend, which wakes the instances waiting
    /// for the key.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost (it expired, or the backend no
    /// longer held it; nothing was deleted). Backend errors after brief retries
    /// (the lease then expires at its TTL).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before the backend answered, the release is re-run
    /// to completion in a background task; only its result is lost.
    pub async fn release(mut self) -> Result<()> {
        let lost = self.lease.is_lost();
        let result = match self.leave() {
            Some(job) => job.run().await,
            None => Ok(()),
        };
        match result {
            Ok(()) if lost => Err(lost_error(&self.lease, Phase::Releasing)),
            other => other,
        }
    }

    fn leave(&mut self) -> Option<ReleaseJob> {
        let (entry, gate) = self.job.take()?;
        crate::stats::histograms::hold(crate::lease::LeaseKind::Write, self.granted_at.elapsed());
        Some(ReleaseJob {
            kind: Kind::Write,
            lease: Arc::clone(&self.lease),
            _gate: Gate::Write(gate),
            entry,
        })
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        if let Some(job) = self.leave() {
            job.spawn();
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

/// What one call asks.
#[derive(Clone, Copy)]
struct Call {
    start: Instant,
    deadline: Instant,
    /// Wait when busy (`false`: `try_read` / `try_write`).
    wait: bool,
}

impl Call {
    fn new(wait: Duration, waits: bool) -> Call {
        let start = Instant::now();
        Call {
            start,
            deadline: deadline_after(start, wait),
            wait: waits,
        }
    }

    fn timed_out(&self, shared: &Shared, key: &LockKey, phase: Phase) -> Error {
        shared.stats.timeout();
        Error::Timeout {
            key: key.clone(),
            phase,
            waited: self.start.elapsed(),
        }
    }
}

/// Read-write locks.
impl Locker {
    /// Takes a shared read lock of `key`, waiting up to the configured wait timeout.
    ///
    /// Overlapping readers of this process share one read lease (one backend acquire
    /// and one release for all of them, see the [module docs](crate::rwlock)); a
    /// reader that arrives after the shared lease's admission window, or while a
    /// writer waits, waits for the lease to drain and for the writers.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let a = locker.read("catalog").await?;
    /// let b = locker.read("catalog").await?; // shares a's lease
    /// a.release().await?;
    /// b.release().await?; // the last reader releases the lease
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for an empty or oversized key; [`Error::Unsupported`]
    /// at once on a backend without read-write locks (Redlock); [`Error::Timeout`]
    /// when the wait timeout passes; [`Error::ForeignValue`],
    /// [`Error::NoPermission`], [`Error::Refused`] and [`Error::Backend`] from the
    /// backend (transient errors are retried until the deadline).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A dropped waiter leaves nothing behind; a dropped reader that was
    /// acquiring for the others lets the next local reader lead, and releases its
    /// request (which may have landed) in the background.
    pub async fn read(&self, key: impl Into<LockKey>) -> Result<ReadGuard> {
        self.read_within(key, self.shared().config.wait_timeout)
            .await
    }

    /// Like [`read`](Self::read) with an explicit wait timeout (`Duration::MAX`:
    /// as long as it takes).
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn read_within(&self, key: impl Into<LockKey>, wait: Duration) -> Result<ReadGuard> {
        let key = key.into();
        key.validate()?;
        let call = Call::new(wait, true);
        let span = tracing::debug_span!("lockflight.read", key = %key);
        let guard = self.read_inner(key.clone(), call).instrument(span).await?;
        guard.ok_or_else(|| Error::backend(&key, Phase::Acquiring, "busy reply to a waiting read"))
    }

    /// Takes a shared read lock of `key` if that needs no waiting: `None` when a
    /// writer holds the key or waits for it (here or in another instance), or when
    /// this process's shared read lease no longer admits readers. At most one backend
    /// request; it waits only for another local reader's acquire in flight.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read), except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn try_read(&self, key: impl Into<LockKey>) -> Result<Option<ReadGuard>> {
        let key = key.into();
        key.validate()?;
        let call = Call::new(self.shared().config.wait_timeout, false);
        self.read_inner(key, call).await
    }

    /// Takes the exclusive write lock of `key`, waiting up to the configured wait
    /// timeout.
    ///
    /// While it waits at the backend it is registered as a waiting writer: no new
    /// read lease is granted to any instance, so a stream of readers cannot starve
    /// it (see the [module docs](crate::rwlock) for the bound).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let first = locker.write("catalog").await?.fencing_token();
    /// let second = locker.write("catalog").await?;
    /// assert!(second.fencing_token() > first);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A dropped writer leaves the local queue; if it was talking to
    /// the backend, its registration as a waiting writer and any request that may
    /// have landed are released in the background (readers blocked by it are woken).
    pub async fn write(&self, key: impl Into<LockKey>) -> Result<WriteGuard> {
        self.write_within(key, self.shared().config.wait_timeout)
            .await
    }

    /// Like [`write`](Self::write) with an explicit wait timeout.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write).
    ///
    /// # Cancel safety
    ///
    /// As [`write`](Self::write).
    pub async fn write_within(
        &self,
        key: impl Into<LockKey>,
        wait: Duration,
    ) -> Result<WriteGuard> {
        let key = key.into();
        key.validate()?;
        let call = Call::new(wait, true);
        let span = tracing::debug_span!("lockflight.write", key = %key);
        let guard = self.write_inner(key.clone(), call).instrument(span).await?;
        guard.ok_or_else(|| Error::backend(&key, Phase::Acquiring, "busy reply to a waiting write"))
    }

    /// Takes the write lock of `key` if it is free right now: `None` when a local
    /// task holds or waits for the key's gate, or the backend reports readers or a
    /// writer. One backend request at most; it does not register as a waiting writer.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write), except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`write`](Self::write).
    pub async fn try_write(&self, key: impl Into<LockKey>) -> Result<Option<WriteGuard>> {
        let key = key.into();
        key.validate()?;
        let call = Call::new(self.shared().config.wait_timeout, false);
        self.write_inner(key, call).await
    }

    /// Number of keys with local read-write activity (a reader, a writer, a waiter
    /// or a release in flight). Zero when every task is done.
    pub fn active_rw_keys(&self) -> usize {
        self.shared().rw.lock().len()
    }

    async fn read_inner(&self, key: LockKey, call: Call) -> Result<Option<ReadGuard>> {
        let shared = self.shared();
        if shared.backend.rw().is_none() {
            return Err(unsupported(&key));
        }
        let entry = Entry::enter(shared, &key);
        let gate = if call.wait {
            tokio::time::timeout_at(call.deadline, Arc::clone(&entry.rw.gate).read_owned())
                .await
                .map_err(|_| call.timed_out(shared, &key, Phase::WaitingLocally))?
        } else {
            match Arc::clone(&entry.rw.gate).try_read_owned() {
                Ok(gate) => gate,
                Err(_) => return Ok(None),
            }
        };
        let mut waited_for_acquire = false;
        loop {
            let rw = Arc::clone(&entry.rw);
            let notified = rw.changed.notified();
            let arrive = entry
                .rw
                .share()
                .arrive(|lease| admit(lease, waited_for_acquire));
            waited_for_acquire = matches!(arrive, Arrive::WaitAcquire);
            match arrive {
                Arrive::Join(lease) => {
                    crate::stats::histograms::wait(
                        crate::lease::LeaseKind::Read,
                        call.start.elapsed(),
                    );
                    return Ok(Some(ReadGuard {
                        lease,
                        entry: Some(entry),
                        gate: Some(gate),
                        granted_at: Instant::now(),
                    }));
                }
                Arrive::Lead => break,
                Arrive::WaitDrain if !call.wait => return Ok(None),
                Arrive::WaitAcquire | Arrive::WaitDrain => {
                    shared.stats.local_wait();
                    tokio::time::timeout_at(call.deadline, notified)
                        .await
                        .map_err(|_| call.timed_out(shared, &key, Phase::WaitingLocally))?;
                }
            }
        }
        let leading = Leading {
            entry: Some(entry),
            gate: Some(Gate::Read(gate)),
            kind: Kind::Read,
            token: LeaseToken::random(),
            armed: false,
        };
        let Some((mut leading, lease)) = self.acquire(leading, call).await? else {
            return Ok(None);
        };
        let entry = leading.entry.take().expect("set");
        let Some(Gate::Read(gate)) = leading.gate.take() else {
            unreachable!("a read leader holds the read gate")
        };
        entry.rw.share().acquired(Arc::clone(&lease));
        entry.rw.changed.notify_waiters();
        Ok(Some(ReadGuard {
            lease,
            entry: Some(entry),
            gate: Some(gate),
            granted_at: Instant::now(),
        }))
    }

    async fn write_inner(&self, key: LockKey, call: Call) -> Result<Option<WriteGuard>> {
        let shared = self.shared();
        if shared.backend.rw().is_none() {
            return Err(unsupported(&key));
        }
        let entry = Entry::enter(shared, &key);
        let gate = if call.wait {
            tokio::time::timeout_at(call.deadline, Arc::clone(&entry.rw.gate).write_owned())
                .await
                .map_err(|_| call.timed_out(shared, &key, Phase::WaitingLocally))?
        } else {
            match Arc::clone(&entry.rw.gate).try_write_owned() {
                Ok(gate) => gate,
                Err(_) => return Ok(None),
            }
        };
        let leading = Leading {
            entry: Some(entry),
            gate: Some(Gate::Write(gate)),
            kind: Kind::Write,
            token: LeaseToken::random(),
            armed: false,
        };
        let Some((mut leading, lease)) = self.acquire(leading, call).await? else {
            return Ok(None);
        };
        let entry = leading.entry.take().expect("set");
        let Some(Gate::Write(gate)) = leading.gate.take() else {
            unreachable!("a writer holds the write gate")
        };
        Ok(Some(WriteGuard {
            lease,
            job: Some((entry, gate)),
            granted_at: Instant::now(),
        }))
    }

    /// Acquires `leading`'s lease at the backend, waiting (by wake-up, with the
    /// backend's retry time as a fallback) unless `call.wait` is false. On success
    /// the lease is being renewed, and `leading` is disarmed but still owns the
    /// entry and gate for the caller to take.
    async fn acquire(
        &self,
        mut leading: Leading,
        call: Call,
    ) -> Result<Option<(Leading, Arc<Lease>)>> {
        let shared = self.shared();
        let key = leading.entry.as_ref().expect("set").key.clone();
        let rw = shared.backend.rw().ok_or_else(|| unsupported(&key))?;
        let ttl = shared.config.lease_ttl;
        let token = leading.token;
        let wakeups = shared.backend.wakeups();
        let mut wakeup: Option<crate::backend::Wakeup> = None;
        let mut backoff = Duration::from_millis(10);
        loop {
            let generation = wakeups.generation(key.as_bytes());
            let sent_at = Instant::now();
            leading.armed = true;
            shared.stats.acquire_attempt();
            let reply = tokio::time::timeout_at(
                call.deadline,
                acquire_call(rw, leading.kind, &key, token, ttl, call.wait),
            )
            .await
            .map_err(|_| call.timed_out(shared, &key, Phase::Acquiring))?;
            match reply {
                Ok(Acquire::Acquired { epoch, waiting }) => {
                    if leading.kind == Kind::Write && epoch == 0 && shared.backend.fencing() {
                        return Err(Error::backend(
                            &key,
                            Phase::Acquiring,
                            "the backend granted the write lock without a fencing epoch",
                        ));
                    }
                    let lease = Arc::new(
                        Lease::new(
                            key.clone(),
                            token,
                            epoch,
                            ttl,
                            sent_at,
                            waiting,
                            Arc::clone(&shared.stats),
                        )
                        .with_kind(leading.kind.lease_kind()),
                    );
                    if Instant::now() >= lease.valid_until() {
                        // The reply came after the lease's validity: not held. Ask
                        // again with the same token, which re-arms it.
                        if Instant::now() >= call.deadline {
                            return Err(call.timed_out(shared, &key, Phase::Acquiring));
                        }
                        continue;
                    }
                    shared.stats.acquired();
                    shared.renewals.watch(&lease, sent_at);
                    crate::stats::histograms::wait(lease.kind, call.start.elapsed());
                    leading.armed = false;
                    return Ok(Some((leading, lease)));
                }
                Ok(Acquire::Busy { retry_in }) => {
                    // A busy read registered nothing but the wake-up; a busy write
                    // may have registered the token as a waiting writer (kept armed).
                    if !call.wait {
                        leading.armed = false;
                        return Ok(None);
                    }
                    if leading.kind == Kind::Read {
                        leading.armed = false;
                    }
                    backoff = Duration::from_millis(10);
                    let wakeup = match &mut wakeup {
                        Some(w) => w,
                        None => {
                            let w = wakeup.insert(wakeups.watch(&key));
                            if wakeups.generation(key.as_bytes()) != generation {
                                continue;
                            }
                            w
                        }
                    };
                    tokio::select! {
                        _ = wakeup.woken() => {}
                        _ = tokio::time::sleep(retry_in) => {}
                        _ = tokio::time::sleep_until(call.deadline) => {
                            return Err(call.timed_out(shared, &key, Phase::Acquiring));
                        }
                    }
                }
                Err(e @ (Error::Backend { .. } | Error::Connect { .. })) => {
                    tracing::debug!(%key, error = %e, "read-write acquire failed; retrying");
                    if Instant::now() + backoff >= call.deadline {
                        return Err(e);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e @ (Error::Refused { .. } | Error::NoPermission { .. })) => return Err(e),
                Err(e) => {
                    // A definite refusal: the scripts read before they write.
                    leading.armed = false;
                    return Err(e);
                }
            }
        }
    }
}
