//! The acquire half of the lease protocol, the same for every lock kind: how one
//! acquire loop paces its requests ([`Pacer`]), what an error answering a request
//! means for its token ([`Failure`]), and when a reply is a grant ([`grant`]).
//!
//! A kind supplies its backend call and what it does with a grant (the mutex's
//! slot, the shared read lease, the permits handed to local waiters); the loop's
//! shape is:
//!
//! ```text
//! loop {
//!     let sent_at = pacer.sending();           // wake-up generation, send time
//!     match call(token).await {                 // bounded by the caller's deadline
//!         Acquired => grant(…, sent_at) or ask again (a late reply is no grant),
//!         Busy { retry_in } => if pacer.watch() { pacer.woken_or(now + retry_in) },
//!         Err(e) => match Failure::of(&e) {
//!             Retry => sleep(pacer.backoff()),  // same token: reconciles a landed request
//!             Refused => give up, token kept for the cleanup,
//!             Definite => give up, nothing to clean up,
//!         },
//!     }
//! }
//! ```

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{LeaseToken, LockKind, WakeRegistry, Wakeup};
use crate::error::Error;
use crate::key::LockKey;
use crate::lease::renewal::Renewals;
use crate::lease::{Lease, LeaseKind};
use crate::stats::StatsInner;

/// The first pause after an indeterminate error; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause after an indeterminate error.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// What an error answering an acquire means for its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The request may or may not have landed (I/O, a timeout, a quorum not
    /// reached): ask again with the same token, which the backend recognises as
    /// its own; until a definite answer the token stays armed for the cleanup.
    Retry,
    /// The server refused at once (out of memory, a read-only replica, too few
    /// replica acknowledgements, an ACL refusal): give up, but a partly run script
    /// (or an unacknowledged grant) may have written, so the token is released by
    /// the cleanup.
    Refused,
    /// A definite answer with nothing written (a foreign value, bad input, a
    /// mismatched semaphore): give up; there is nothing to clean up, because every
    /// script reads what can fail before it writes.
    Definite,
}

impl Failure {
    /// The one classification every kind's acquire loop uses. Too few replica
    /// acknowledgements (`NOREPLICAS`) is asked again like an indeterminate error:
    /// the grant was written, unacknowledged, and a replica that catches up within
    /// the caller's wait acknowledges the re-grant.
    pub(crate) fn of(e: &Error) -> Failure {
        if e.is_indeterminate() || Failure::unavailable(e) {
            Failure::Retry
        } else if matches!(e, Error::Refused { .. } | Error::NoPermission { .. }) {
            Failure::Refused
        } else {
            Failure::Definite
        }
    }

    /// Whether `e` says that too few nodes answered (a quorum not reached, too few
    /// replica acknowledgements): retried by a waiting acquire, reported at once by
    /// a single attempt (`try_*`).
    pub(crate) fn unavailable(e: &Error) -> bool {
        match e {
            Error::QuorumNotReached { .. } => true,
            Error::Refused { code, .. } => code == "NOREPLICAS",
            _ => false,
        }
    }

    /// Whether the token may hold something at the backend after this error.
    pub(crate) fn may_have_written(self) -> bool {
        self != Failure::Definite
    }
}

/// The pacing of one acquire loop for the `kind` lock of `key`: the wake-up watch
/// (registered only once the loop has to wait, so an acquire that succeeds at once
/// costs no registration), the wake-up generation read before each request (so a
/// wake-up that raced with a busy reply is never missed: it only makes the loop ask
/// again at once), and the backoff after errors.
pub(crate) struct Pacer<'a> {
    wakeups: &'a WakeRegistry,
    kind: LockKind,
    key: &'a LockKey,
    one_at_a_time: bool,
    wakeup: Option<Wakeup>,
    generation: u64,
    backoff: Duration,
}

impl<'a> Pacer<'a> {
    /// A pacer for the `kind` lock of `key`; with `one_at_a_time`, one wake-up
    /// reaches one of the process's loops for the lock
    /// ([`WakeRegistry::watch_one`]), else every one.
    pub(crate) fn new(
        wakeups: &'a WakeRegistry,
        kind: LockKind,
        key: &'a LockKey,
        one_at_a_time: bool,
    ) -> Pacer<'a> {
        Pacer {
            wakeups,
            kind,
            key,
            one_at_a_time,
            wakeup: None,
            generation: 0,
            backoff: FIRST_BACKOFF,
        }
    }

    /// Call right before sending a request: reads the wake-up generation, and
    /// returns the send time, from which a grant's validity counts.
    pub(crate) fn sending(&mut self) -> Instant {
        self.generation = self.wakeups.generation(self.kind, self.key.as_bytes());
        Instant::now()
    }

    /// After a busy answer: resets the backoff and watches for wake-ups (once per
    /// loop). `false` when a wake-up may have arrived since the request was sent:
    /// ask again at once instead of waiting.
    pub(crate) fn watch(&mut self) -> bool {
        self.backoff = FIRST_BACKOFF;
        if self.wakeup.is_some() {
            return true;
        }
        self.wakeup = Some(if self.one_at_a_time {
            self.wakeups.watch_one(self.kind, self.key)
        } else {
            self.wakeups.watch(self.kind, self.key)
        });
        self.wakeups.generation(self.kind, self.key.as_bytes()) == self.generation
    }

    /// Resolves at the next wake-up of the lock (after [`watch`](Self::watch)) or
    /// at `retry_at`, whichever comes first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a one-at-a-time wake-up that arrives as the future is dropped
    /// is kept for the next call (see [`Wakeup::woken`]).
    pub(crate) async fn woken_or(&mut self, retry_at: Instant) {
        match &mut self.wakeup {
            Some(wakeup) => {
                tokio::select! {
                    _ = wakeup.woken() => {}
                    _ = tokio::time::sleep_until(retry_at) => {}
                }
            }
            None => tokio::time::sleep_until(retry_at).await,
        }
    }

    /// After an indeterminate error ([`Failure::Retry`]): the pause before asking
    /// again, doubling from 10 ms up to 500 ms while errors repeat.
    pub(crate) fn backoff(&mut self) -> Duration {
        let pause = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        pause
    }

    /// A definite answer arrived: the next error starts the backoff afresh.
    pub(crate) fn answered(&mut self) {
        self.backoff = FIRST_BACKOFF;
    }
}

/// What a grant of `kind` for `token` with `epoch` gives, to a request sent at
/// `sent_at` with lease TTL `ttl`: the lease (counted as acquired and watched by
/// the renewal watchdog from `sent_at`), or `None` when the reply came back after
/// the lease's validity had already ended, which is not a grant (the caller asks
/// again with the same token, which re-arms the lease if it still exists, or
/// releases the token).
#[allow(clippy::too_many_arguments)]
pub(crate) fn grant(
    renewals: &Arc<Renewals>,
    stats: &Arc<StatsInner>,
    key: &LockKey,
    kind: LeaseKind,
    token: LeaseToken,
    epoch: u64,
    ttl: Duration,
    sent_at: Instant,
    waiting: u32,
) -> Option<Arc<Lease>> {
    let lease = Lease::new(
        key.clone(),
        token,
        epoch,
        ttl,
        sent_at,
        waiting,
        Arc::clone(stats),
    )
    .with_kind(kind);
    if let Some(end) = renewals.hold_end(lease.acquired_at) {
        lease.limit_hold(end);
    }
    if Instant::now() >= lease.valid_until() {
        tracing::debug!(%key, ?kind, "the grant's reply arrived after the lease's validity");
        return None;
    }
    let lease = Arc::new(lease);
    stats.acquired();
    renewals.watch(&lease, sent_at);
    Some(lease)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::LockKey;

    #[test]
    fn one_classification_of_acquire_errors() {
        let key = LockKey::from("k");
        let io = Error::backend(&key, crate::error::Phase::Acquiring, "reset");
        assert_eq!(Failure::of(&io), Failure::Retry);
        let refused = Error::Refused {
            key: key.clone(),
            phase: crate::error::Phase::Acquiring,
            code: "OOM".into(),
            source: Arc::new(std::io::Error::other("oom")),
        };
        assert_eq!(Failure::of(&refused), Failure::Refused);
        assert!(Failure::of(&refused).may_have_written());
        let unacknowledged = Error::Refused {
            key: key.clone(),
            phase: crate::error::Phase::Acquiring,
            code: "NOREPLICAS".into(),
            source: Arc::new(std::io::Error::other("too few replicas")),
        };
        assert_eq!(Failure::of(&unacknowledged), Failure::Retry);
        assert!(Failure::unavailable(&unacknowledged));
        let bad = key_error();
        assert_eq!(Failure::of(&bad), Failure::Definite);
        assert!(!Failure::of(&bad).may_have_written());
    }

    fn key_error() -> Error {
        LockKey::from("").validate().unwrap_err()
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_between_the_request_and_the_watch_is_not_missed() {
        let wakeups = WakeRegistry::new();
        let key = LockKey::from("k");
        let mut pacer = Pacer::new(&wakeups, LockKind::Mutex, &key, false);
        pacer.sending();
        // The release's wake-up arrives before the busy reply is handled.
        wakeups.wake(LockKind::Mutex, key.as_bytes());
        assert!(!pacer.watch(), "a wake-up was missed: ask again at once");
        // Registered now: the next wake-up ends the wait long before the timer.
        pacer.sending();
        assert!(pacer.watch());
        let start = Instant::now();
        let waker = {
            let wakeups = wakeups.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                wakeups.wake(LockKind::Mutex, b"k");
            })
        };
        pacer.woken_or(start + Duration::from_secs(60)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(10));
        waker.await.unwrap();
        // Another kind's wake-up of the same key does not end the wait.
        pacer.sending();
        assert!(pacer.watch());
        wakeups.wake(LockKind::Semaphore, key.as_bytes());
        let start = Instant::now();
        pacer.woken_or(start + Duration::from_millis(250)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(250));
    }

    #[test]
    fn the_backoff_doubles_to_its_bound_and_restarts_after_an_answer() {
        let wakeups = WakeRegistry::new();
        let key = LockKey::from("k");
        let mut pacer = Pacer::new(&wakeups, LockKind::Mutex, &key, false);
        let pauses: Vec<u64> = (0..8).map(|_| pacer.backoff().as_millis() as u64).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 500, 500]);
        pacer.answered();
        assert_eq!(pacer.backoff(), FIRST_BACKOFF);
    }
}
