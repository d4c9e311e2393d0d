//! What a task holds: [`LockGuard`] (or a [`MultiGuard`] over several keys), the
//! [`FencingToken`] it carries, and how it learns of a loss: [`LossSignal`] and
//! the [`Loss`] future. [`LockInfo`] is what guarded work receives.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

pub use crate::multi::MultiGuard;

use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::locker::Shared;
use crate::slot::Slot;

/// A totally ordered token that strictly increases across every critical section
/// of a key: `(epoch, seq)`, compared lexicographically.
///
/// `epoch` is minted by the backend for each acquisition (`max(last + 1, server time
/// in µs)`), `seq` counts local handoffs within that lease. Hand both to the guarded
/// resource and let it reject writers whose token is not newer than the last one it
/// accepted:
///
/// ```sql
/// UPDATE stock SET qty = qty - ?, fence_epoch = ?, fence_seq = ?
///  WHERE sku = ? AND (fence_epoch, fence_seq) < (?, ?)
/// ```
///
/// ```
/// use lockflight::FencingToken;
///
/// let a = FencingToken { epoch: 7, seq: 3 };
/// let b = FencingToken { epoch: 8, seq: 0 };
/// assert!(a < b);
/// assert!(FencingToken { epoch: 7, seq: 4 } > a);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken {
    /// The lease's epoch from the backend.
    pub epoch: u64,
    /// The handoff sequence within the lease (0 for the task that acquired it).
    pub seq: u64,
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch, self.seq)
    }
}

/// The key, fencing token and loss signal of a held lock, for code that does not
/// hold the guard itself (the closure of [`Locker::with_lock`](crate::Locker::with_lock),
/// handlers behind the tower layer, which find it in the request's extensions).
///
/// Two infos are equal when they name the same key and fencing token.
#[derive(Clone, Debug)]
pub struct LockInfo {
    /// The lock key.
    pub key: LockKey,
    /// The fencing token of this critical section.
    pub fencing_token: FencingToken,
    /// Observes the loss of the lease: what work running under
    /// [`LossPolicy::Signal`](crate::LossPolicy::Signal) watches.
    pub loss: LossSignal,
}

impl PartialEq for LockInfo {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.fencing_token == other.fencing_token
    }
}

impl Eq for LockInfo {}

/// A cloneable view of one lease's loss, detached from the guard.
///
/// Work that runs under [`LossPolicy::Signal`](crate::LossPolicy::Signal) (or that
/// wants to stop early on its own terms) checks [`is_lost`](Self::is_lost) before
/// each write, or races its work against [`lost`](Self::lost):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockflight::Result<()> {
/// use lockflight::{Locker, LossPolicy, MemoryBackend};
///
/// let locker = Locker::builder(MemoryBackend::new())
///     .on_loss(LossPolicy::Signal)
///     .build()?;
/// let wrote = locker
///     .with_lock("sku:555", |info| async move {
///         tokio::select! {
///             _ = info.loss.lost() => false, // stop before writing unprotected
///             _ = std::future::ready(()) => !info.loss.is_lost(),
///         }
///     })
///     .await?;
/// assert!(wrote);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LossSignal {
    pub(crate) lease: Arc<Lease>,
}

impl fmt::Debug for LossSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossSignal")
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LossSignal {
    /// Whether the lease is lost: the loss was signalled, or its validity window
    /// has ended on the monotonic clock (whatever the renewal task has done).
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// How long the lease is known to stay valid without a further renewal (zero
    /// once it is lost).
    pub fn valid_for(&self) -> Duration {
        self.lease.remaining()
    }

    /// Resolves when the lease is lost; see [`LockGuard::lost`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; it only observes.
    pub fn lost(&self) -> Loss {
        Loss::new(&self.lease)
    }

    /// Why the lease was lost, once it is.
    pub fn reason(&self) -> Option<String> {
        self.is_lost().then(|| self.lease.lost_reason())
    }
}

/// A held lock.
///
/// Release it with [`release`](LockGuard::release) to learn whether the lease was
/// still held; dropping it releases (or hands off) in the background. While it is
/// held a watchdog renews the lease; [`lost`](LockGuard::lost) resolves if the lease
/// is lost, no later than its validity ends.
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    shared: Arc<Shared>,
    slot: Option<Arc<Slot>>,
    lease: Arc<Lease>,
    seq: u64,
    done: bool,
    granted_at: tokio::time::Instant,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lease.key)
            .field("fencing_token", &self.fencing_token())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(
        shared: Arc<Shared>,
        slot: Option<Arc<Slot>>,
        lease: Arc<Lease>,
        seq: u64,
    ) -> LockGuard {
        LockGuard {
            shared,
            slot,
            lease,
            seq,
            done: false,
            granted_at: tokio::time::Instant::now(),
        }
    }

    /// The lock key.
    pub fn key(&self) -> &LockKey {
        &self.lease.key
    }

    /// This critical section's fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        FencingToken {
            epoch: self.lease.epoch,
            seq: self.seq,
        }
    }

    /// Key, fencing token and loss signal, as a cloneable value.
    pub fn info(&self) -> LockInfo {
        LockInfo {
            key: self.lease.key.clone(),
            fencing_token: self.fencing_token(),
            loss: self.loss_signal(),
        }
    }

    /// A cloneable loss signal that does not borrow the guard.
    pub fn loss_signal(&self) -> LossSignal {
        LossSignal {
            lease: Arc::clone(&self.lease),
        }
    }

    /// Whether the lease has been lost: the loss was signalled, or its validity
    /// window has ended on the monotonic clock.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// How long the lease is known to stay valid without a further renewal.
    pub fn valid_for(&self) -> Duration {
        self.lease.remaining()
    }

    /// Resolves when the lease is lost: the backend said it is no longer ours, or
    /// its validity ran out before a renewal succeeded. It has its own timer at the
    /// end of the validity window, so it resolves then even if the renewal task is
    /// late or gone. It never resolves for a lease that stays held. The future does
    /// not borrow the guard.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; it only observes.
    pub fn lost(&self) -> Loss {
        Loss::new(&self.lease)
    }

    pub(crate) fn lost_error(&self) -> Error {
        Error::LeaseLost {
            key: self.lease.key.clone(),
            phase: Phase::Renewing,
            reason: self.lease.lost_reason(),
        }
    }

    /// Releases the lock: hands it to a local waiter (with handoff on and within its
    /// budget) or deletes it at the backend and wakes the next waiting instance.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the backend no longer held this lease (it expired or
    /// was taken over; nothing was deleted); backend errors after brief retries (the
    /// lock then expires at its TTL).
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before the backend answered, the release is re-run
    /// to completion in a background task (it is idempotent); only its result is lost.
    pub async fn release(mut self) -> Result<()> {
        self.done = true;
        crate::stats::histograms::hold(crate::lease::LeaseKind::Lock, self.granted_at.elapsed());
        let job = self
            .shared
            .finish(self.slot.take(), Arc::clone(&self.lease), self.seq);
        match job {
            None => Ok(()),
            Some(job) => job.run().await,
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        crate::stats::histograms::hold(crate::lease::LeaseKind::Lock, self.granted_at.elapsed());
        if let Some(job) = self
            .shared
            .finish(self.slot.take(), Arc::clone(&self.lease), self.seq)
        {
            job.spawn();
        }
    }
}

/// The loss of a lease, as a future: resolves when the lease is lost; see [`LockGuard::lost`]. Owns what it needs, so it
/// can outlive the guard.
#[must_use = "futures do nothing unless polled"]
pub struct Loss {
    inner: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Loss {
    pub(crate) fn new(lease: &Arc<Lease>) -> Loss {
        Loss {
            inner: Box::pin(Arc::clone(lease).lost()),
        }
    }
}

impl fmt::Debug for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loss").finish_non_exhaustive()
    }
}

impl Future for Loss {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.inner.as_mut().poll(cx)
    }
}
