//! What a holder sees of its lease, whatever the lock kind: the
//! [`FencingToken`], the [`LossSignal`] and the [`Loss`] future, and the
//! [`LockInfo`] that guarded work receives. Public as
//! [`lockflight::guard`](crate::guard).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::error::{Error, Phase};
use crate::key::LockKey;
use crate::lease::Lease;

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
/// let a = FencingToken::new(7, 3);
/// let b = FencingToken::new(8, 0);
/// assert!(a < b);
/// assert!(FencingToken::new(7, 4) > a);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub struct FencingToken {
    /// The lease's epoch from the backend.
    pub epoch: u64,
    /// The handoff sequence within the lease (0 for the task that acquired it).
    pub seq: u64,
}

impl FencingToken {
    /// The token `epoch.seq`: what a resource stored, read back to compare with
    /// a guard's (tokens are compared by epoch, then by sequence).
    pub const fn new(epoch: u64, seq: u64) -> FencingToken {
        FencingToken { epoch, seq }
    }
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
#[non_exhaustive]
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
/// The methods every holder of a lease offers to observe its loss (the guards,
/// the permit, [`LossSignal`]), written once; `$held` names what is held in their
/// docs ("lease", "read lease", "permit", …). With `signal`, also `loss_signal`.
/// The type needs a field `lease: Arc<Lease>`.
macro_rules! observe_lease {
    ($held:literal) => {
        #[doc = concat!("Whether the ", $held, " has been lost: the loss was signalled (the")]
        #[doc = "backend no longer held it), or its validity window has ended on the"]
        #[doc = "monotonic clock (whatever the renewal task has done)."]
        pub fn is_lost(&self) -> bool {
            self.lease.is_lost()
        }

        #[doc = concat!("How long the ", $held, " is known to stay valid without a further")]
        #[doc = "renewal (zero once it is lost)."]
        pub fn valid_for(&self) -> std::time::Duration {
            self.lease.remaining()
        }

        #[doc = concat!("Resolves when the ", $held, " is lost: the backend said it is no longer")]
        #[doc = "held, or its validity ran out before a renewal succeeded. It has its own"]
        #[doc = "timer at the end of the validity window, so it resolves then even if the"]
        #[doc = concat!("renewal task is late or gone; it never resolves for a ", $held, " that")]
        #[doc = "stays held. The future owns what it needs: it does not borrow `self`."]
        #[doc = ""]
        #[doc = "# Cancel safety"]
        #[doc = ""]
        #[doc = "Cancel safe; it only observes."]
        pub fn lost(&self) -> $crate::lease::Loss {
            $crate::lease::Loss::new(&self.lease)
        }
    };
    ($held:literal, signal) => {
        #[doc = concat!("A cloneable loss signal of the ", $held, " that does not borrow `self`.")]
        pub fn loss_signal(&self) -> $crate::lease::LossSignal {
            $crate::lease::LossSignal::new(&self.lease)
        }

        $crate::lease::observe_lease!($held);
    };
}
pub(crate) use observe_lease;

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
    pub(crate) fn new(lease: &Arc<Lease>) -> LossSignal {
        LossSignal {
            lease: Arc::clone(lease),
        }
    }

    observe_lease!("lease");

    /// Why the lease was lost, once it is.
    pub fn reason(&self) -> Option<String> {
        self.is_lost().then(|| self.lease.lost_reason())
    }
}

/// The loss of a lease, as a future: resolves when the lease is lost; see [`LockGuard::lost`](crate::LockGuard::lost). Owns what it needs, so it
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

    /// The loss of any of several leases (a [`MultiGuard`](crate::guard::MultiGuard)'s):
    /// resolves with the first of `losses`; never, if there are none.
    pub(crate) fn any(losses: Vec<Loss>) -> Loss {
        Loss {
            inner: Box::pin(async move {
                if losses.is_empty() {
                    return std::future::pending().await;
                }
                futures::future::select_all(losses).await;
            }),
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

/// What every guard (lock, read, write, permit) shows of its lease: their public
/// `fencing_token`, `loss_signal`, `lost` and loss errors are one-line calls to
/// these, to [`LossSignal::new`] and to [`Loss::new`].
impl Lease {
    /// The token of the critical section that holds this lease as handoff `seq`.
    pub(crate) fn fencing_token(&self, seq: u64) -> FencingToken {
        FencingToken {
            epoch: self.epoch,
            seq,
        }
    }

    /// [`Error::LeaseLost`] for this lease, found lost in `phase`.
    pub(crate) fn lost_error(&self, phase: Phase) -> Error {
        Error::LeaseLost {
            key: self.key.clone(),
            phase,
            reason: self.lost_reason(),
        }
    }
}
