//! [`Future`] types: the response future of [`LockService`](super::LockService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use pin_project::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tower::util::Oneshot;
use tower_service::Service;

use super::edge;
use super::request::WithLockInfo;
use super::ticket::Ticket;
use crate::error::{Error, Result};
use crate::guard::{LockGuard, Loss};
use crate::key::LockKey;
use crate::locker::{LockOptions, Locker, LossPolicy};
use crate::reentry::{self, HeldKeys};
use tower::BoxError;

type LockFuture = Pin<Box<dyn Future<Output = Result<LockGuard>> + Send>>;

/// Response future of [`LockService`](super::LockService): waits for the lock,
/// then drives its own clone of the inner service to readiness and calls it while
/// holding the lock, and releases the lock when done.
///
/// It owns the guard: dropping it drops the inner future and releases (or hands
/// off) the lock in the background. If the lock is not obtained, the inner service
/// is never polled. The lock call inside it is boxed (its future has no name).
///
/// Under [`lock_in_handler`](super::LockLayer::lock_in_handler) the handler's
/// [`Locked`](super::Locked) extractor takes the lock, and this future takes the
/// guard from it after each poll of the handler, and then owns it as above.
///
/// # Cancel safety
///
/// Dropping it at any point leaves nothing behind: a lock not yet granted is
/// given up as [`Locker::lock`](crate::Locker::lock) gives it up, a held one is
/// released (or handed off) in the background.
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    #[pin]
    state: State<S, Req>,
}

#[pin_project(project = StateProj)]
enum State<S, Req>
where
    S: Service<Req>,
{
    Locking {
        lock: LockFuture,
        call: Option<(S, Req)>,
        abort_on_loss: bool,
        locker: usize,
    },
    /// The lock is held: the inner clone is polled ready, then called, as a
    /// holder of the key (a nested lock of the same key fails at once).
    Running {
        #[pin]
        fut: TaskLocalFuture<HeldKeys, Oneshot<S, Req>>,
        #[pin]
        lost: Option<Loss>,
        guard: Option<LockGuard>,
    },
    /// The handler takes the lock itself (its `Locked<_>` extractor, through the
    /// ticket); the future then owns the guard and watches for its loss.
    InHandler {
        #[pin]
        fut: TaskLocalFuture<HeldKeys, Oneshot<S, Req>>,
        #[pin]
        lost: Option<Loss>,
        guard: Option<LockGuard>,
        ticket: Ticket,
        abort_on_loss: bool,
        route: String,
        warned_unlocked: Arc<AtomicBool>,
    },
    /// No key, and the policy lets the request through without a lock.
    Passing {
        #[pin]
        fut: Oneshot<S, Req>,
    },
    Failed {
        error: Option<Error>,
    },
    Done,
}

impl<S: Service<Req>, Req> fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Locking { .. } => "locking",
            State::Running { .. } => "running",
            State::InHandler { guard: None, .. } => "running, lock not taken yet",
            State::InHandler { .. } => "running, lock taken by the handler",
            State::Passing { .. } => "passing through",
            State::Failed { .. } => "failed",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req> + Send + 'static,
    Req: Send + 'static,
{
    pub(super) fn locking(
        locker: &Locker,
        key: LockKey,
        options: LockOptions,
        service: S,
        req: Req,
    ) -> Self {
        let locker = locker.clone();
        let abort_on_loss = locker.loss_policy() == LossPolicy::Abort;
        let id = locker.id();
        ResponseFuture {
            state: State::Locking {
                lock: Box::pin(async move { edge::acquire(&locker, key, options).await }),
                call: Some((service, req)),
                abort_on_loss,
                locker: id,
            },
        }
    }

    pub(super) fn in_handler(
        locker: &Locker,
        ticket: Ticket,
        service: S,
        req: Req,
        route: String,
        warned_unlocked: Arc<AtomicBool>,
    ) -> Self {
        let fut = reentry::scope(
            locker.id(),
            ticket.key().clone(),
            Oneshot::new(service, req),
        );
        ResponseFuture {
            state: State::InHandler {
                fut,
                lost: None,
                guard: None,
                ticket,
                abort_on_loss: locker.loss_policy() == LossPolicy::Abort,
                route,
                warned_unlocked,
            },
        }
    }

    pub(super) fn passing(service: S, req: Req) -> Self {
        ResponseFuture {
            state: State::Passing {
                fut: Oneshot::new(service, req),
            },
        }
    }

    pub(super) fn failed(error: Error) -> Self {
        ResponseFuture {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    Req: WithLockInfo,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Locking {
                    lock,
                    call,
                    abort_on_loss,
                    locker,
                } => {
                    let guard = match ready!(lock.as_mut().poll(cx)) {
                        Ok(guard) => guard,
                        Err(e) => {
                            state.set(State::Done);
                            return Poll::Ready(Err(e.into()));
                        }
                    };
                    let Some((service, mut req)) = call.take() else {
                        unreachable!("the call is taken only here, once")
                    };
                    req.set_lock_info(guard.info());
                    let lost = abort_on_loss.then(|| guard.lost());
                    let fut =
                        reentry::scope(*locker, guard.key().clone(), Oneshot::new(service, req));
                    state.set(State::Running {
                        fut,
                        lost,
                        guard: Some(guard),
                    });
                }
                StateProj::Running { fut, lost, guard } => {
                    if let Some(lost) = lost.as_pin_mut()
                        && lost.poll(cx).is_ready()
                    {
                        let error = match guard.as_ref() {
                            Some(g) => g.lost_error(),
                            None => unreachable!("the guard lives until the state ends"),
                        };
                        // Drops the inner future before it can do more work.
                        state.set(State::Done);
                        return Poll::Ready(Err(error.into()));
                    }
                    let out = ready!(fut.poll(cx));
                    state.set(State::Done);
                    return Poll::Ready(out.map_err(Into::into));
                }
                StateProj::InHandler {
                    fut,
                    mut lost,
                    guard,
                    ticket,
                    abort_on_loss,
                    route,
                    warned_unlocked,
                } => {
                    if let Some(loss) = lost.as_mut().as_pin_mut()
                        && loss.poll(cx).is_ready()
                    {
                        let error = match guard.as_ref() {
                            Some(g) => g.lost_error(),
                            None => unreachable!("a loss is watched only with its guard"),
                        };
                        state.set(State::Done);
                        return Poll::Ready(Err(error.into()));
                    }
                    if let Poll::Ready(out) = fut.poll(cx) {
                        if ticket.untouched() && !warned_unlocked.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                route = route.as_str(),
                                "lockflight: the lock of this in-handler route was not taken: \
                                 either an extractor before Locked<_> refused the request, or \
                                 the handler has no Locked<_> extractor and ran UNLOCKED \
                                 (logged once per route)"
                            );
                        }
                        state.set(State::Done);
                        return Poll::Ready(out.map_err(Into::into));
                    }
                    if guard.is_none()
                        && let Some(taken) = ticket.take_guard()
                    {
                        if *abort_on_loss {
                            lost.set(Some(taken.lost()));
                        }
                        *guard = Some(taken);
                        // Poll the loss once, so that its waker is registered.
                        continue;
                    }
                    return Poll::Pending;
                }
                StateProj::Passing { fut } => {
                    let out = ready!(fut.poll(cx));
                    state.set(State::Done);
                    return Poll::Ready(out.map_err(Into::into));
                }
                StateProj::Failed { error } => {
                    let error = error.take();
                    state.set(State::Done);
                    return Poll::Ready(Err(match error {
                        Some(e) => e.into(),
                        None => "lockflight: response future polled after completion".into(),
                    }));
                }
                StateProj::Done => {
                    panic!("lockflight: response future polled after completion")
                }
            }
        }
    }
}
