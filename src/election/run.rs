//! One term of [`Election::run`](super::Election::run): the leader's work, stopped
//! by its return or by the loss (as the locker's [`LossPolicy`] says), then the
//! stop hook, then the lease given up.
//!
//! **Order**: work stopped → stop hook → lease released. The work is dropped (or
//! has returned) before the hook starts; the lease is released (on a return) or
//! given up (on a loss) only once the hook has returned, so the hook of a work
//! that returned still holds the lease, renewed, and the record still names it.
//!
//! Why the work sees its loss under [`LossPolicy::Abort`]: the work and the loss
//! are raced in one `select!`, and both become ready at the same instant (the
//! work's [`LossSignal`] and the term's [`Loss`](crate::guard::Loss) watch one
//! lease). Racing alone would drop the work in the poll that sees the loss, before
//! the work is polled again, so its own loss branch would never run. So the work
//! is polled first, and once more after the loss is known: a work that races its
//! `LossSignal` takes its loss branch, up to its first `.await` that does not
//! complete at once, and is then dropped. What it has to do after that, it does
//! in the stop hook.

use std::future::Future;

use futures::FutureExt;

use super::leadership::Leadership;
use super::record::LeaderInfo;
use crate::key::LockKey;
use crate::lease::LossSignal;
use crate::locker::LossPolicy;

/// What the stop hook of [`Election::run_with_stop`](super::Election::run_with_stop)
/// is told when a term's work has stopped.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Stopped {
    /// The term whose work stopped.
    pub leader: LeaderInfo,
    /// Why it stopped.
    pub cause: StopCause,
    /// The term's loss signal, live: [`is_lost`](LossSignal::is_lost) is `false`
    /// while the lease is still held (the hook of a work that returned), and
    /// [`reason`](LossSignal::reason) says why it was lost.
    pub loss: LossSignal,
}

/// Why a term's work stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopCause {
    /// The work returned while leading: the lease is released after the hook.
    Returned,
    /// Leadership was lost: the work was dropped (under
    /// [`LossPolicy::Abort`]) or returned after the loss (under
    /// [`LossPolicy::Signal`]).
    Lost,
}

/// Runs one term: `job` (the work of `leadership`'s term) until it returns or,
/// under [`LossPolicy::Abort`], until the loss; then `on_stop`; then resigns after
/// a return, or drops the lost leadership.
pub(super) async fn term<Fut, S, SFut>(
    key: &LockKey,
    leadership: Leadership,
    job: Fut,
    policy: LossPolicy,
    on_stop: &mut S,
) where
    Fut: Future<Output = ()>,
    S: FnMut(Stopped) -> SFut,
    SFut: Future<Output = ()>,
{
    let loss = leadership.loss_signal();
    let returned = match policy {
        LossPolicy::Signal => {
            job.await;
            true
        }
        LossPolicy::Abort => {
            let lost = leadership.lost();
            // Pinned in this block: dropped at its end, before the hook.
            let mut job = std::pin::pin!(job);
            tokio::select! {
                biased;
                () = job.as_mut() => true,
                () = lost => {
                    // The loss is marked now: the work's own signal is ready.
                    if job.as_mut().now_or_never().is_none() {
                        tracing::debug!(%key, "leadership lost; work dropped");
                    }
                    false
                }
            }
        }
    };
    let cause = if returned && !loss.is_lost() {
        StopCause::Returned
    } else {
        StopCause::Lost
    };
    on_stop(Stopped {
        leader: leadership.info().clone(),
        cause,
        loss,
    })
    .await;
    match cause {
        StopCause::Returned => {
            if let Err(e) = leadership.resign().await {
                tracing::debug!(%key, error = %e, "resigning after the work failed");
            }
        }
        StopCause::Lost => drop(leadership),
    }
}
