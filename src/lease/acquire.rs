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

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Acquire, LeaseToken, LockKind, Signals, Wakeup, WhenBusy};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::engine::{Engine, deadline_after};
use crate::lease::failure::Failure;
use crate::lease::{Lease, LeaseKind};

/// The first pause after an indeterminate error; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause after an indeterminate error.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// The pacing of one acquire loop for the `kind` lock of `key`: the wake-up watch
/// (registered only once the loop has to wait, so an acquire that succeeds at once
/// costs no registration), the wake-up generation read before each request (so a
/// wake-up that raced with a busy reply is never missed: it only makes the loop ask
/// again at once), and the backoff after errors.
pub(crate) struct Pacer<'a> {
    wakeups: &'a Signals,
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
    /// ([`Signals::watch_one`]), else every one.
    pub(crate) fn new(
        wakeups: &'a Signals,
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

/// A lease a reply granted: what the request asked for (`key`, `kind`, `token`,
/// `ttl`) and what the reply said (`epoch`, the `waiting` count), with the send
/// time `sent_at` from which its validity counts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewLease<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) kind: LeaseKind,
    pub(crate) token: LeaseToken,
    pub(crate) ttl: Duration,
    pub(crate) epoch: u64,
    pub(crate) sent_at: Instant,
    pub(crate) waiting: u32,
    /// The call's own hold limit ([`Call::hold_limit`]).
    pub(crate) hold_limit: Option<Duration>,
}

/// What a grant gives: the lease (counted as acquired and watched by the renewal
/// watchdog from `sent_at`), or `None` when the reply came back after the lease's
/// validity had already ended, which is not a grant (the caller asks again with
/// the same token, which re-arms the lease if it still exists, or releases the
/// token).
pub(crate) fn grant(engine: &Engine, new: NewLease<'_>) -> Option<Arc<Lease>> {
    grant_within(engine, new, new.ttl)
}

/// [`grant`], for a lease the server keeps for `window` (at most its TTL) from the
/// request sent at `sent_at` until its first renewal: a grant by another
/// instance's release (`Signals::take_grant`). Its validity counts `window` from
/// `sent_at`, and its first renewal is due a third of the way through it, not a
/// renewal interval after.
fn grant_within(engine: &Engine, new: NewLease<'_>, window: Duration) -> Option<Arc<Lease>> {
    let NewLease {
        key,
        kind,
        token,
        ttl,
        epoch,
        sent_at,
        waiting,
        hold_limit,
    } = new;
    let lease = Lease::new(
        key.clone(),
        token,
        epoch,
        ttl,
        sent_at,
        waiting,
        Arc::clone(&engine.stats),
    )
    .with_kind(kind);
    let window = window.min(ttl);
    if window < ttl {
        lease.granted_for(window, sent_at);
    }
    let own_end = hold_limit.map(|limit| deadline_after(lease.acquired_at, limit));
    let end = match (engine.renewals.hold_end(lease.acquired_at), own_end) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if let Some(end) = end {
        lease.limit_hold(end);
    }
    if Instant::now() >= lease.valid_until() {
        tracing::debug!(%key, ?kind, "the grant's reply arrived after the lease's validity");
        return None;
    }
    let lease = Arc::new(lease);
    engine.stats.acquired();
    if window < ttl {
        engine.renewals.watch_soon(&lease, sent_at + window / 3);
    } else {
        engine.renewals.watch(&lease, sent_at);
    }
    Some(lease)
}

/// What one call of any kind asks: when it started (its wait is measured from
/// here), its deadline, whether it waits, and the TTL of the lease it acquires.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    pub(crate) start: Instant,
    pub(crate) deadline: Instant,
    /// `Queue`: the call waits for the lock until its deadline, woken by the
    /// backend's messages. `Return`: one attempt; busy is an answer, and too few
    /// nodes answering is reported at once.
    pub(crate) mode: WhenBusy,
    pub(crate) ttl: Duration,
    /// The latest end of the lease from its request, besides the locker's hold
    /// limit (a scheduled job's `at_most`).
    pub(crate) hold_limit: Option<Duration>,
}

impl Call {
    /// A call starting now that waits at most `wait`.
    pub(crate) fn new(wait: Duration, ttl: Duration, mode: WhenBusy) -> Call {
        let start = Instant::now();
        Call {
            start,
            deadline: deadline_after(start, wait),
            mode,
            ttl,
            hold_limit: None,
        }
    }

    /// The call's wait for `key` ran out in `phase` (counted).
    pub(crate) fn timed_out(&self, engine: &Engine, key: &LockKey, phase: Phase) -> Error {
        engine.stats.timeout();
        Error::timeout(key, phase, self.start.elapsed())
    }
}

/// One call's acquire of a lease of `kind` of `key` at the backend: what
/// [`acquire`] needs besides the request itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ask<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) kind: LeaseKind,
    pub(crate) token: LeaseToken,
    pub(crate) call: Call,
    /// One wake-up reaches one of the process's loops for the lock, not every one
    /// (a mutex without coalescing).
    pub(crate) one_at_a_time: bool,
}

/// What a request may have left at the backend under the token of an acquire
/// in flight: the kind keeps it armed for the cleanup of an abandoned acquire.
pub(crate) trait InFlight {
    /// A request is about to be sent: it may land, and in [`WhenBusy::Queue`] it may
    /// queue this instance.
    fn sending(&mut self, mode: WhenBusy);
    /// A definite answer: `holds` says whether the token may still hold something
    /// at the backend (a lease, a waiting writer's registration).
    fn answered(&mut self, holds: bool);
}

/// A lease granted by [`acquire`], with what the backend said when it granted it.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) lease: Arc<Lease>,
    /// When the granting request was sent; for a grant by message, the anchor of
    /// `earliest_other` (see `take_grant` in [`acquire`]).
    pub(crate) sent_at: Instant,
    pub(crate) waiting: u32,
    /// Fair mode: how long before `sent_at` the earliest other waiting instance
    /// arrived, at the latest.
    pub(crate) earliest_other: Option<Duration>,
}

/// The acquire loop of every kind (its shape is in the module's header): sends
/// `request(token, mode, sent_at)` until a grant, a busy answer in
/// [`WhenBusy::Return`] (`Ok(None)`), an error that is not retried, or the deadline
/// ([`Error::Timeout`]). `in_flight` is told what the token may hold after each
/// answer. On success the lease is being renewed.
///
/// # Cancel safety
///
/// Dropping the future leaves the token as `in_flight` last recorded it: armed
/// from each send until its definite answer.
pub(crate) async fn acquire<F, Fut>(
    engine: &Engine,
    ask: Ask<'_>,
    in_flight: &mut impl InFlight,
    mut request: F,
) -> Result<Option<Granted>>
where
    F: FnMut(LeaseToken, WhenBusy, Instant) -> Fut,
    Fut: Future<Output = Result<Acquire>>,
{
    let Ask {
        key, kind, token, ..
    } = ask;
    let Call {
        start,
        deadline,
        mode,
        ttl,
        hold_limit,
    } = ask.call;
    // The last attempt that failed rather than found the lock busy: a wait that
    // runs out after it names it (a refusal's cause must not become a bare
    // timeout).
    let mut last_error: Option<Error> = None;
    let timed_out = |last_error: &mut Option<Error>| {
        engine.stats.timeout();
        Error::Timeout {
            key: key.clone(),
            phase: Phase::Acquiring,
            waited: start.elapsed(),
            last_error: last_error.take().map(Box::new),
        }
    };
    let mut pacer = Pacer::new(
        engine.backend.signals(),
        kind.lock_kind(),
        key,
        ask.one_at_a_time,
    );
    // A waiting mutex acquire, or a waiting writer, may be granted the lock by
    // another instance's release, on the server (`Signals::grants`): from its
    // first busy answer
    // (`busy_sent`) its token may hold the lock without another reply, so it stays
    // armed, and a grant message for it is a grant whose validity counts from the
    // send of the ask it was made from, which the message echoes (see "The grant"
    // in ARCHITECTURE.md).
    let grantable = matches!(kind, LeaseKind::Mutex | LeaseKind::Write)
        && mode == WhenBusy::Queue
        && engine.backend.signals().grants();
    let lock_kind = kind.lock_kind();
    let mut busy_sent: Option<Instant> = None;
    // A writer registers for its grant before its first ask, not after its
    // first busy answer as a mutex acquire does: the notifier gives back a
    // write grant nobody here waits for with the write release of its token,
    // which retires the token, so a grant message that overtakes the busy reply
    // must find this loop registered (a mutex grant goes back without a record,
    // and the waiter's next ask only finds the key again).
    let mut grant_watch = (grantable && kind == LeaseKind::Write).then(|| {
        engine
            .backend
            .signals()
            .watch_grant(lock_kind, key.as_bytes(), token)
    });
    // What this loop's request asked for, with what a reply or grant said.
    let new_lease = |epoch: u64, sent_at: Instant, waiting: u32| NewLease {
        key,
        kind,
        token,
        ttl,
        epoch,
        sent_at,
        waiting,
        hold_limit,
    };
    // Takes a grant for this token, if one came: `Some(granted)`, where `None`
    // means it came too late to use (ask again: the token still holds the lock
    // or its grant expired).
    let take_grant = |busy_sent: Option<Instant>| {
        busy_sent?;
        let g = engine
            .backend
            .signals()
            .take_grant(lock_kind, key.as_bytes(), token)?;
        // The granted ask's own send, echoed: not the last busy answer's, which
        // may be a later ask's (a grant read after it expired and the token was
        // answered busy again).
        let sent_at = g.sent;
        let lease = grant_within(engine, new_lease(g.epoch, sent_at, g.waiting), g.window);
        if lease.is_some() {
            engine.stats.grant_taken();
        }
        // Fair mode's hand-on bound, which an acquire reply gives as `sent_at`
        // less `earliest_other`: here the earliest other instance arrived the
        // message's offset after the ask arrived, and the ask was sent before
        // it arrived, so `sent_at` plus the offset is never later than that
        // instance's arrival (with nobody waiting, `sent_at` itself: a later
        // waiter arrived after the grant, which came after the ask).
        let (anchor, earliest_other) = match g.earliest_after_ask {
            None => (sent_at, None),
            Some(us) => {
                let offset = Duration::from_micros(us.unsigned_abs());
                let at = if us >= 0 {
                    sent_at.checked_add(offset)
                } else {
                    sent_at.checked_sub(offset)
                };
                match at {
                    Some(at) => (at, Some(Duration::ZERO)),
                    None => (sent_at, None),
                }
            }
        };
        Some(lease.map(|lease| Granted {
            lease,
            sent_at: anchor,
            waiting: g.waiting,
            earliest_other,
        }))
    };
    loop {
        let sent_at = pacer.sending();
        in_flight.sending(mode);
        engine.stats.acquire_attempt();
        let reply = tokio::time::timeout_at(deadline, request(token, mode, sent_at))
            .await
            .map_err(|_| timed_out(&mut last_error))?;
        match reply {
            Ok(Acquire::Acquired {
                epoch,
                waiting,
                earliest_other,
            }) => {
                if epoch == 0 && kind.is_fenced() && engine.backend.fencing() {
                    return Err(Error::backend(
                        key,
                        Phase::Acquiring,
                        "the backend granted the lock without a fencing epoch",
                    ));
                }
                let granted = grant(engine, new_lease(epoch, sent_at, waiting));
                let Some(lease) = granted else {
                    // Not held: ask again with the same token, which re-arms it if
                    // it still exists.
                    if Instant::now() >= deadline {
                        return Err(timed_out(&mut last_error));
                    }
                    continue;
                };
                in_flight.answered(false);
                return Ok(Some(Granted {
                    lease,
                    sent_at,
                    waiting,
                    earliest_other,
                }));
            }
            Ok(Acquire::Busy { retry_in }) => {
                // Busy is an answer: a wait that runs out from here ran out on
                // contention, not on the failure before.
                last_error = None;
                // Busy: nothing held but a waiting writer's registration, which a
                // write that waits may have left.
                // Or, where releases grant, the lock itself from now on.
                let registered = kind == LeaseKind::Write && mode == WhenBusy::Queue;
                if grantable {
                    busy_sent = Some(sent_at);
                }
                in_flight.answered(registered || grantable);
                if mode == WhenBusy::Return {
                    return Ok(None);
                }
                if grantable && grant_watch.is_none() {
                    grant_watch = Some(engine.backend.signals().watch_grant(
                        lock_kind,
                        key.as_bytes(),
                        token,
                    ));
                }
                // A grant that came while the request was in flight is taken now;
                // one that comes later wakes this loop through `grant_watch`.
                let ready = busy_sent.is_some()
                    && engine
                        .backend
                        .signals()
                        .has_grant(lock_kind, key.as_bytes(), token);
                if !ready && pacer.watch() {
                    let granted = async {
                        match &grant_watch {
                            Some(watch) => watch.granted().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = pacer.woken_or(Instant::now() + retry_in) => {}
                        _ = granted => {}
                        _ = tokio::time::sleep_until(deadline) => return Err(timed_out(&mut last_error)),
                    }
                }
                match take_grant(busy_sent) {
                    Some(Some(granted)) => {
                        in_flight.answered(false);
                        return Ok(Some(granted));
                    }
                    // Too late to use: ask again with the token.
                    Some(None) => busy_sent = None,
                    None => {}
                }
            }
            Err(e) => match Failure::of(&e) {
                // A single attempt reports too few nodes answering at once: they
                // answered.
                Failure::Retry if mode == WhenBusy::Queue || !Failure::unavailable(&e) => {
                    // The token stays armed: a retry (or the cleanup) reconciles it.
                    tracing::debug!(%key, ?kind, error = %e, "acquire failed; retrying");
                    let pause = pacer.backoff();
                    if Instant::now() + pause >= deadline {
                        return Err(e);
                    }
                    tokio::time::sleep(pause).await;
                    last_error = Some(e);
                }
                failure => {
                    // A refusal keeps the token armed for the cleanup, which releases
                    // whatever a partly run script (or an unacknowledged grant)
                    // wrote; a definite answer wrote nothing.
                    if !failure.may_have_written() && busy_sent.is_none() {
                        in_flight.answered(false);
                    }
                    return Err(e);
                }
            },
        }
    }
}

/// What an acquire in flight may have left at the backend, for whoever settles it:
/// its tokens (armed from each send until a definite answer says nothing of them
/// remains) and, for a mutex, this instance's place in the key's backend queue.
/// Every kind's acquire keeps one. Dropped unsettled, it releases the armed tokens
/// in the background on the shared schedule
/// ([`release_token`](crate::lease::release::release_token)) and leaves the queue
/// (unless another task of this process still waits for that lock: the place is
/// the process's), keeping `local` (local state that must outlive the release)
/// until then. A mutex leader hands what is left to the key's next local waiter
/// instead, when there is one ([`disarm`](Self::disarm)).
pub(crate) struct Armed<H: Send + 'static = ()> {
    engine: Arc<Engine>,
    kind: LeaseKind,
    key: LockKey,
    tokens: Vec<LeaseToken>,
    armed: bool,
    /// A waiting mutex acquire may have queued this instance.
    queued: bool,
    local: Option<H>,
}

impl<H: Send + 'static> Armed<H> {
    /// Unarmed tokens of `kind` of `key`, keeping `local` until they are settled.
    pub(crate) fn new(
        engine: &Arc<Engine>,
        kind: LeaseKind,
        key: &LockKey,
        tokens: Vec<LeaseToken>,
        local: H,
    ) -> Armed<H> {
        Armed {
            engine: Arc::clone(engine),
            kind,
            key: key.clone(),
            tokens,
            armed: false,
            queued: false,
            local: Some(local),
        }
    }

    /// What an earlier acquire left, taken over: its tokens armed (`armed`: a
    /// request with them may have landed) and its place in the queue (`queued`).
    pub(crate) fn inheriting(mut self, armed: bool, queued: bool) -> Armed<H> {
        self.armed = armed;
        self.queued = queued;
        self
    }

    /// Armed: a request with the tokens may have landed.
    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    /// Disarmed: nothing of the tokens remains at the backend, or something else
    /// owns them now (a grant, the next local leader).
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
        self.queued = false;
    }

    /// What is left to settle: the first token if armed (a guard of one token),
    /// and whether the instance may be queued.
    pub(crate) fn left(&self) -> (Option<LeaseToken>, bool) {
        let token = self.tokens.first().copied().filter(|_| self.armed);
        (token, self.queued)
    }

    /// What it keeps, taken back (a leader that holds the lease now).
    pub(crate) fn take_local(&mut self) -> Option<H> {
        self.local.take()
    }

    /// What it keeps.
    pub(crate) fn local(&self) -> Option<&H> {
        self.local.as_ref()
    }
}

impl<H: Send + 'static> InFlight for Armed<H> {
    fn sending(&mut self, mode: WhenBusy) {
        self.arm();
        // Only the mutex's waiting acquire queues the instance (a waiting
        // writer's registration is its token).
        self.queued |= mode == WhenBusy::Queue && self.kind == LeaseKind::Mutex;
    }

    fn answered(&mut self, holds: bool) {
        self.armed = holds;
    }
}

impl<H: Send + 'static> Drop for Armed<H> {
    fn drop(&mut self) {
        let local = self.local.take();
        let signals = self.engine.backend.signals();
        let leave = self.queued && !signals.is_watched(self.kind.lock_kind(), self.key.as_bytes());
        let release = self.armed && !self.tokens.is_empty();
        if !release && !leave {
            return;
        }
        let (engine, kind, key) = (Arc::clone(&self.engine), self.kind, self.key.clone());
        let tokens = if release {
            std::mem::take(&mut self.tokens)
        } else {
            Vec::new()
        };
        self.engine.spawn_background(async move {
            let _local = local;
            for token in tokens {
                crate::lease::release::release_token(&engine, kind, &key, token).await;
            }
            if leave {
                engine.stats.left();
                if let Err(e) = engine.backend.leave(&key).await {
                    tracing::debug!(%key, error = %e, "leaving the queue failed");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::LockKey;

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_between_the_request_and_the_watch_is_not_missed() {
        let wakeups = Signals::new();
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
        let wakeups = Signals::new();
        let key = LockKey::from("k");
        let mut pacer = Pacer::new(&wakeups, LockKind::Mutex, &key, false);
        let pauses: Vec<u64> = (0..8).map(|_| pacer.backoff().as_millis() as u64).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 500, 500]);
        pacer.answered();
        assert_eq!(pacer.backoff(), FIRST_BACKOFF);
    }
}
