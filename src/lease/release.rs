//! The release of a lease, the same for every lock kind: the attempts of the
//! schedule in [`backend::schedule`](crate::backend), and what their answer means.
//!
//! A kind supplies only the backend call (`release`, `release_read`, …); how often
//! it is sent, which errors are repeated, and when "not released" is a loss are
//! decided here, once.

use std::future::Future;

use tokio::time::Instant;

use crate::backend::schedule::{RELEASE_ATTEMPTS, RELEASE_BACKOFF, RELEASE_WINDOW};
use crate::error::{Error, Phase, Result};
use crate::lease::Lease;
use crate::stats::StatsInner;

/// Where one release is in its schedule. Kept with the release job, so that a
/// release re-run in the background (its caller dropped the future) continues the
/// schedule instead of starting a new window.
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    first: Option<Instant>,
    sent: u32,
}

impl Attempts {
    /// Sends the release (`send`: the kind's backend call, answering whether the
    /// backend deleted the lease, now or at an earlier attempt) until it gets a
    /// definite answer, the attempts run out, or the window closes; returns the
    /// last answer.
    pub(crate) async fn send<F, Fut>(&mut self, stats: &StatsInner, mut send: F) -> Result<bool>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<bool>>,
    {
        loop {
            let first = *self.first.get_or_insert_with(Instant::now);
            self.sent += 1;
            stats.release();
            let answer = send().await;
            match answer {
                Err(e) if e.is_indeterminate() && self.sent < RELEASE_ATTEMPTS => {
                    let pause = RELEASE_BACKOFF * self.sent;
                    if (Instant::now() + pause).saturating_duration_since(first) > RELEASE_WINDOW {
                        return Err(e);
                    }
                    tokio::time::sleep(pause).await;
                }
                other => return other,
            }
        }
    }
}

/// What the caller of a release learns: `Ok` if the backend deleted the lease
/// (so it was held until then: nobody else can have had it), else
/// [`Error::LeaseLost`] with the reason the lease was lost, if it is known.
pub(crate) fn outcome(lease: &Lease, released: bool) -> Result<()> {
    if released {
        return Ok(());
    }
    let reason = if lease.is_lost() {
        lease.lost_reason()
    } else {
        "the backend no longer held the lease (it expired, or was deleted or taken over); \
         nothing was released"
            .into()
    };
    Err(Error::LeaseLost {
        key: lease.key.clone(),
        phase: Phase::Releasing,
        reason,
    })
}
