//! [`Leadership`]: the lease of a term, and the leader record it keeps.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::record::LeaderInfo;
use super::signals;
use crate::backend::LockBackend;
use crate::error::Result;
use crate::lease::{FencingToken, Loss, LossSignal};
use crate::locker::{LockGuard, Locker};

/// The leadership of a term, won by [`Election::campaign`](super::Election::campaign).
///
/// While it is held a watchdog renews the lease and refreshes the leader record;
/// [`lost`](Leadership::lost) resolves if the lease is lost, no later than its
/// validity ends. Pass [`fencing_token`](Leadership::fencing_token) with every write to a fenced
/// resource ([`fence`](crate::fence)). Dropping it gives up leadership in the
/// background; [`resign`](Leadership::resign) does it and reports.
#[must_use = "leadership is given up when it is dropped"]
pub struct Leadership {
    /// `None` only once resigned.
    guard: Option<LockGuard>,
    info: LeaderInfo,
    record: Vec<u8>,
    refresher: Option<JoinHandle<()>>,
    /// Woken when leadership is given up (observers of this handle read again).
    changed: Arc<Notify>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("key", self.held().key())
            .field("identity", &self.info.identity)
            .field("term", &self.info.term)
            .field("lost", &self.held().is_lost())
            .finish()
    }
}

impl Leadership {
    /// The leadership of `guard`'s term, named by `info`, whose `record` (its
    /// encoding) was written, or failed to be: refreshes it every renewal interval
    /// of `locker` until the leadership ends or is lost.
    pub(super) fn begin(
        guard: LockGuard,
        info: LeaderInfo,
        record: Vec<u8>,
        locker: &Locker,
        changed: Arc<Notify>,
    ) -> Leadership {
        let refresher = {
            let (backend, ttl, every) =
                (locker.backend(), locker.lease_ttl(), locker.renew_every());
            let (key, record, loss) = (guard.key().clone(), record.clone(), guard.loss_signal());
            let (identity, term) = (info.identity.clone(), info.term);
            crate::runtime::spawn(async move {
                loop {
                    tokio::select! {
                        // Resigning or dropping the leadership aborts this task
                        // first: a loss seen here is a loss.
                        _ = loss.lost() => {
                            let cause = loss.reason().unwrap_or_default();
                            return signals::lost(&key, &identity, term, &cause);
                        }
                        _ = tokio::time::sleep(every) => {}
                    }
                    if let Err(e) = backend.write_leader(&key, &record, ttl).await {
                        tracing::debug!(%key, error = %e, "refreshing the leader record failed");
                    }
                }
            })
        };
        Leadership {
            guard: Some(guard),
            info,
            record,
            refresher,
            changed,
        }
    }

    /// This leader's fencing token: its lease's, strictly increasing across the
    /// election's leaders; the record gives it to observers as the leader's
    /// term ([`LeaderInfo::term`]).
    pub fn fencing_token(&self) -> FencingToken {
        self.info.term
    }

    /// The identity this leader campaigned with.
    pub fn identity(&self) -> &str {
        &self.info.identity
    }

    /// Identity, term and since when, as the leader record says.
    pub fn info(&self) -> &LeaderInfo {
        &self.info
    }

    /// Whether leadership has been lost (the lease's loss, see
    /// [`LockGuard::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.held().is_lost()
    }

    /// How long leadership is known to stay valid without a further renewal
    /// (zero once it is lost).
    pub fn valid_for(&self) -> Duration {
        self.held().valid_for()
    }

    /// Resolves when leadership is lost, no later than the lease's validity ends;
    /// see [`LockGuard::lost`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; it only observes.
    pub fn lost(&self) -> Loss {
        self.held().lost()
    }

    /// A cloneable loss signal that does not borrow `self`.
    pub fn loss_signal(&self) -> LossSignal {
        self.held().loss_signal()
    }

    /// Gives up leadership: deletes the leader record (if still this term's),
    /// then releases the lease, which wakes the next candidate at once (a local
    /// one by handoff, or the next instance by its wake-up).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) if leadership had already
    /// been lost; backend errors of the release (the lease then expires at its
    /// TTL). A record that cannot be deleted expires at its TTL and is not an
    /// error.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the release finishes in the background, as
    /// [`LockGuard::release`]'s does.
    pub async fn resign(mut self) -> Result<()> {
        if let Some(refresher) = self.refresher.take() {
            refresher.abort();
        }
        if !self.held().is_lost() {
            signals::ended(self.held().key(), &self.info, "resigned");
        }
        let backend = self.backend();
        if let Err(e) = backend.clear_leader(self.held().key(), &self.record).await {
            tracing::debug!(key = %self.held().key(), error = %e, "deleting the leader record failed");
        }
        let guard = self.guard.take().expect("held until resigned");
        let released = guard.release().await;
        self.changed.notify_waiters();
        released
    }

    fn held(&self) -> &LockGuard {
        self.guard.as_ref().expect("held until resigned")
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        self.held().backend()
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if self.guard.is_none() {
            return;
        }
        if let Some(refresher) = self.refresher.take() {
            refresher.abort();
            if !self.held().is_lost() {
                signals::ended(self.held().key(), &self.info, "dropped");
            }
            // Not resigned: delete the record in the background.
            let (backend, key, record) = (
                self.backend(),
                self.held().key().clone(),
                std::mem::take(&mut self.record),
            );
            let changed = Arc::clone(&self.changed);
            // Observers re-read once the record is gone.
            crate::runtime::spawn(async move {
                let _ = backend.clear_leader(&key, &record).await;
                changed.notify_waiters();
            });
        } else {
            self.changed.notify_waiters();
        }
    }
}
