//! The release of a lease, the same for every lock kind: one backend call per
//! kind ([`send`]), the attempts of the schedule in
//! [`backend::schedule`](crate::backend), the job that runs them to completion
//! even when its caller goes away ([`Release`]), and what a holder learns
//! ([`End::into_release`], [`outcome`]).
//!
//! A kind supplies only what it does once the backend answered ([`Settle`]: the
//! mutex lets its slot's next waiter lead, the read-write lock lets go of its
//! local gate). How often a release is sent, which errors are repeated, what a
//! failed release leaves behind, the background spawn and its count are decided
//! here, once.
//!
//! # Invariants
//!
//! 1. A release job ends in exactly one [`Settle::settle`] call: [`Ran::Sent`]
//!    after its attempts, or [`Ran::Unrun`] when it is dropped before (no runtime,
//!    or its runtime shut down first).
//! 2. A job whose future is dropped half-way is re-run in the background,
//!    continuing its schedule ([`Attempts`] travels with it).
//! 3. A release that fails after its attempts may have deleted nothing, or a copy
//!    may still be on the wire: its token is retired ([`release_token`], once more
//!    in the background); no kind acquires a token again after a release of it
//!    was sent.
//! 4. Every job and retirement in the background is counted in the engine's
//!    [`BackgroundWork`](crate::lease::engine::BackgroundWork) (via
//!    [`Engine::spawn_background`]), so `shutdown` and the last `Locker` wait for
//!    them, whatever the kind.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::schedule::{RELEASE_ATTEMPTS, RELEASE_BACKOFF, RELEASE_WINDOW};
use crate::backend::{LeaseToken, LockBackend, Renewal};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::engine::Engine;
use crate::lease::failure::Failure;
use crate::lease::{Lease, LeaseKind};
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

/// One backend release of `token`, the lease of `kind` of `key`: whether the
/// backend deleted it (now or at an earlier attempt). `requeue`: fair mode, the
/// arrival of this instance's oldest waiting task, which keeps its place in the
/// mutex's queue.
pub(crate) async fn send(
    backend: &dyn LockBackend,
    kind: LeaseKind,
    key: &LockKey,
    token: LeaseToken,
    requeue: Option<Instant>,
) -> Result<bool> {
    let unsupported = |what| Error::Unsupported {
        key: key.clone(),
        what,
    };
    match kind {
        LeaseKind::Mutex => {
            let reply = match requeue {
                None => backend.release(key, token).await,
                Some(at) => {
                    let age = Instant::now().saturating_duration_since(at);
                    backend.release_fair(key, token, age).await
                }
            };
            reply.map(|r| r.released)
        }
        LeaseKind::Read | LeaseKind::Write => {
            let rw = backend
                .rw()
                .ok_or_else(|| unsupported("read-write locks"))?;
            let reply = if kind == LeaseKind::Read {
                rw.release_read(key, token).await
            } else {
                rw.release_write(key, token).await
            };
            reply.map(|r| r.released)
        }
        LeaseKind::Permit => {
            let sem = backend
                .semaphore()
                .ok_or_else(|| unsupported("semaphores"))?;
            sem.release_permit(key, token).await
        }
    }
}

/// One renewal of the mutex `lease` with `ttl`, instead of its release
/// ([`Release::keeping`]): whether the backend still held it.
async fn keep(backend: &dyn LockBackend, lease: &Lease, ttl: Duration) -> Result<bool> {
    if lease.kind != LeaseKind::Mutex {
        return Err(Error::Unsupported {
            key: lease.key.clone(),
            what: "keeping a lease other than a mutex's",
        });
    }
    Ok(matches!(
        backend.renew(&lease.key, lease.token, ttl).await?,
        Renewal::Renewed { .. }
    ))
}

/// Releases `token` of `kind` on the shared schedule, for a token that may hold
/// something at the backend and that nobody holds locally: an abandoned acquire
/// that may have landed, a release that failed. Errors are logged: the lease then
/// expires at its TTL.
pub(crate) async fn release_token(
    engine: &Engine,
    kind: LeaseKind,
    key: &LockKey,
    token: LeaseToken,
) {
    let sent = Attempts::default()
        .send(&engine.stats, || {
            send(&*engine.backend, kind, key, token, None)
        })
        .await;
    if let Err(e) = sent {
        tracing::debug!(%key, ?kind, error = %e, "releasing a token in the background failed");
    }
}

/// [`release_token`] in a background task ([`Engine::spawn_background`]).
pub(crate) fn retire(engine: &Arc<Engine>, kind: LeaseKind, key: &LockKey, token: LeaseToken) {
    let (task_engine, key) = (Arc::clone(engine), key.clone());
    engine.spawn_background(async move {
        release_token(&task_engine, kind, &key, token).await;
    });
}

/// How a release job ended, for its kind's [`Settle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ran {
    /// Its attempts ran (whatever they answered). `requeued`: the release asked
    /// the backend to keep this instance queued ([`Settle::requeue`]).
    Sent { requeued: bool },
    /// Dropped before it was sent (no runtime, or its runtime shut down first):
    /// the lease expires at its TTL.
    Unrun,
}

/// What a kind does when one of its releases ends: the local state the release
/// kept (the mutex's slot, the read-write lock's gate) is let go.
pub(crate) trait Settle: Send + 'static {
    /// Fair mode: the arrival of the oldest local waiter, sent with the release
    /// so that the backend keeps this instance's place in the queue.
    fn requeue(&self) -> Option<Instant> {
        None
    }

    /// The release ended (invariant 1: once).
    fn settle(self, how: Ran);
}

/// Nothing to settle (a permit).
impl Settle for () {
    fn settle(self, _: Ran) {}
}

/// A backend release still to be done; it completes even if its caller goes away.
pub(crate) struct Release<S: Settle> {
    engine: Arc<Engine>,
    lease: Arc<Lease>,
    attempts: Attempts,
    settle: Option<S>,
    /// Renewal stopped and the renewals counted (once, however often it runs).
    forgotten: bool,
    /// Not a release: the lease is left at the backend to expire `keep` from now
    /// (a mutex lease renewed once with that TTL; see [`Release::keeping`]).
    keep: Option<Duration>,
}

impl<S: Settle> Release<S> {
    /// The release of `lease`, from its first attempt; `settle` is let go when it
    /// ends.
    pub(crate) fn new(engine: Arc<Engine>, lease: Arc<Lease>, settle: S) -> Release<S> {
        Release {
            engine,
            lease,
            attempts: Attempts::default(),
            settle: Some(settle),
            forgotten: false,
            keep: None,
        }
    }

    /// Instead of a release, the mutex `lease` is left at the backend until `ttl`
    /// from now (a scheduled job's `at_least`): one renewal with that TTL, then
    /// the lease is forgotten here as after a release. The lease's TTL was at
    /// least as long when it was last granted or renewed, so a keep that fails
    /// leaves it held longer, never shorter; it is not retried, and its token is
    /// not retired (a release would end it early).
    pub(crate) fn keeping(
        engine: Arc<Engine>,
        lease: Arc<Lease>,
        settle: S,
        ttl: Duration,
    ) -> Release<S> {
        let mut job = Release::new(engine, lease, settle);
        job.keep = Some(ttl);
        job
    }

    fn forget(&mut self) {
        if !std::mem::replace(&mut self.forgotten, true) {
            self.engine.renewals.forget(&self.lease);
            crate::lease::histograms::renewals(
                self.lease.kind,
                self.lease.renewed.load(Ordering::Relaxed),
            );
        }
    }

    /// Releases at the backend on the shared schedule ([`Attempts`]), retires the
    /// token if that failed, settles, and says what the holder learns (see
    /// [`outcome`]). If this future is dropped before it finishes, the release is
    /// re-run in the background, continuing the same schedule.
    pub(crate) async fn run(self) -> Result<()> {
        // One async layer, the span only around the backend calls: this future is
        // moved whole into its caller's, so each layer costs a copy of it.
        let mut rearm = Rearm(Some(self));
        let job = rearm.0.as_mut().expect("armed");
        job.forget();
        let requeue = job.settle.as_ref().and_then(S::requeue);
        let (engine, lease) = (Arc::clone(&job.engine), Arc::clone(&job.lease));
        if let Some(ttl) = job.keep {
            let mut job = rearm.0.take().expect("armed");
            let result = keep(&*engine.backend, &lease, ttl).await;
            if let Some(settle) = job.settle.take() {
                settle.settle(Ran::Sent { requeued: false });
            }
            return outcome(&lease, result?);
        }
        let span = tracing::debug_span!("lockflight.release", key = %lease.key, kind = ?lease.kind);
        let result = job
            .attempts
            .send(&engine.stats, || {
                send(
                    &*engine.backend,
                    lease.kind,
                    &lease.key,
                    lease.token,
                    requeue,
                )
            })
            .instrument(span)
            .await;
        let mut job = rearm.0.take().expect("armed");
        if let Err(e) = &result
            && Failure::of(e).may_have_written()
        {
            // Invariant 3: the lock may still be held, and a copy of the release may
            // still be on the wire; the token is never acquired again.
            retire(&engine, lease.kind, &lease.key, lease.token);
        }
        if let Some(settle) = job.settle.take() {
            settle.settle(Ran::Sent {
                requeued: requeue.is_some(),
            });
        }
        outcome(&lease, result?)
    }

    /// Runs in a background task ([`Engine::spawn_background`]). Dropped unrun
    /// (no runtime here, or it shuts down first), the job settles as
    /// [`Ran::Unrun`]: the lease expires at its TTL, the local state moves on.
    pub(crate) fn spawn(self) {
        let engine = Arc::clone(&self.engine);
        engine.spawn_background(async move {
            if let Err(e) = self.run().await {
                tracing::debug!(error = %e, "background release failed");
            }
        });
    }
}

impl<S: Settle> Drop for Release<S> {
    fn drop(&mut self) {
        if let Some(settle) = self.settle.take() {
            self.forget();
            settle.settle(Ran::Unrun);
        }
    }
}

/// Re-runs a release in the background if the future running it is dropped.
struct Rearm<S: Settle>(Option<Release<S>>);

impl<S: Settle> Drop for Rearm<S> {
    fn drop(&mut self) {
        if let Some(job) = self.0.take() {
            job.spawn();
        }
    }
}

/// The end of a holder's use of a lease: kept locally (handed to the next local
/// holder, cached, or still shared by other local readers), or a release to run.
pub(crate) enum End<S: Settle> {
    /// No backend release: the lease stays in this process.
    Kept,
    /// This holder's release goes to the backend.
    Release(Release<S>),
}

impl<S: Settle> End<S> {
    /// The backend release to run ([`Release::run`] gives the holder its
    /// [`outcome`]), or, when the lease stays here, what the holder learns now:
    /// whether a loss of it was known as it let go. A guard's `release` is
    /// `match end.into_release(&lease)? { Some(job) => job.run().await, None =>
    /// Ok(()) }`: awaiting the job itself, not a future around it, spares a copy
    /// of the release's future.
    pub(crate) fn into_release(self, lease: &Lease) -> Result<Option<Release<S>>> {
        match self {
            End::Release(job) => Ok(Some(job)),
            End::Kept if lease.is_lost() => Err(lease.lost_error(Phase::Releasing)),
            End::Kept => Ok(None),
        }
    }

    /// The same, in the background (a guard's drop).
    pub(crate) fn in_background(self) {
        if let End::Release(job) = self {
            job.spawn();
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
