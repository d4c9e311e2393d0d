//! Read-write locks: [`RwLock::read`](crate::rwlock::RwLock::read) and
//! [`RwLock::write`](crate::rwlock::RwLock::write), with [`ReadGuard`] and [`WriteGuard`].
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
//! let w = locker.rwlock("catalog").write().await?;
//! let version = w.fencing_token();
//! w.release().await?;
//!
//! let (a, b) = (locker.rwlock("catalog").read().await?, locker.rwlock("catalog").read().await?);
//! assert_eq!(a.last_write(), version);
//! assert!(locker.rwlock("catalog").try_write().await?.is_none()); // readers hold it
//! drop((a, b));
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock as TokioRwLock};
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::rw::RwBackend;
use crate::backend::{Acquire, LeaseToken, Released};
use crate::engine::{Engine, deadline_after};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::release::{self, Attempts};
use crate::lease::{Lease, LeaseKind};

mod acquire;
mod guards;
mod share;

use share::{Admit, SameLease, Share};

pub use crate::locker::RwLock;
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

/// The read-write locks of one locker, per key, over the locker's engine (which
/// it derefs to).
#[derive(Debug)]
pub(crate) struct RwLocks {
    engine: Arc<Engine>,
    keys: Mutex<HashMap<LockKey, (Arc<KeyRw>, usize)>>,
}

impl Deref for RwLocks {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
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

/// One key's local state: the gate, the shared read lease, and its wake-ups.
#[derive(Debug, Default)]
struct KeyRw {
    gate: Arc<TokioRwLock<()>>,
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
    locks: &Arc<RwLocks>,
    kind: Kind,
    key: &LockKey,
    token: LeaseToken,
    hold: impl Send + 'static,
) {
    let engine: &Engine = locks;
    let locks = Arc::clone(locks);
    let key = key.clone();
    engine.spawn_background(async move {
        let _hold = hold;
        if let Some(rw) = locks.backend.rw() {
            let sent = Attempts::default()
                .send(&locks.stats, || async {
                    release_call(rw, kind, &key, token).await.map(|r| r.released)
                })
                .await;
            if let Err(e) = sent {
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
            let locks = Arc::clone(&entry.locks);
            let key = entry.key.clone();
            cleanup(
                &locks,
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
    attempts: Attempts,
}

impl Drop for ReleaseJob {
    fn drop(&mut self) {
        self.entry.locks.renewals.forget(&self.lease);
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
        let job = rearm.0.as_mut().expect("armed");
        let result = job.release().instrument(span).await;
        drop(rearm.0.take());
        result
    }

    /// Releases on the shared schedule ([`Attempts`]); the backend's release record
    /// makes a repeated attempt report what the first one did.
    async fn release(&mut self) -> Result<()> {
        let locks = Arc::clone(&self.entry.locks);
        let lease = Arc::clone(&self.lease);
        locks.renewals.forget(&lease);
        crate::lease::histograms::renewals(lease.kind, lease.renewed.load(Ordering::Relaxed));
        let rw = locks.backend.rw().ok_or_else(|| unsupported(&lease.key))?;
        let kind = self.kind;
        let released = self
            .attempts
            .send(&locks.stats, || async {
                let reply = release_call(rw, kind, &lease.key, lease.token).await;
                reply.map(|r| r.released)
            })
            .await?;
        release::outcome(&lease, released)
    }

    fn spawn(self) {
        let locks = Arc::clone(&self.entry.locks);
        // Without a runtime the job is dropped: renewal stops, the lease expires.
        locks.spawn_background(async move {
            if let Err(e) = self.run().await {
                tracing::debug!(error = %e, "background read-write release failed");
            }
        });
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

    fn timed_out(&self, engine: &Engine, key: &LockKey, phase: Phase) -> Error {
        engine.stats.timeout();
        Error::Timeout {
            key: key.clone(),
            phase,
            waited: self.start.elapsed(),
        }
    }
}
