//! Inner services with chosen readiness, and a drop flag.

use super::*;

/// An inner service that becomes ready only after `pending` polls, and refuses
/// calls on an instance that was not polled ready.
#[derive(Clone)]
pub(crate) struct Picky {
    pending: usize,
    ready: bool,
    polls: Arc<AtomicUsize>,
}

impl Picky {
    /// A service ready after `pending` polls, and the count of its polls.
    pub(crate) fn new(pending: usize) -> (Picky, Arc<AtomicUsize>) {
        let polls = Arc::new(AtomicUsize::new(0));
        let picky = Picky {
            pending,
            ready: false,
            polls: Arc::clone(&polls),
        };
        (picky, polls)
    }
}

impl Service<Request<()>> for Picky {
    type Response = &'static str;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<&'static str, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        if self.pending > 0 {
            self.pending -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<()>) -> Self::Future {
        assert!(self.ready, "called an instance that was not polled ready");
        self.ready = false;
        Box::pin(async { Ok("ok") })
    }
}

/// An inner service whose readiness fails.
#[derive(Clone)]
pub(crate) struct Broken;

impl Service<Request<()>> for Broken {
    type Response = ();
    type Error = &'static str;
    type Future = std::future::Ready<Result<(), &'static str>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
        Poll::Ready(Err("inner not ready"))
    }

    fn call(&mut self, _req: Request<()>) -> Self::Future {
        unreachable!("never ready")
    }
}

/// `tower::limit::ConcurrencyLimit` with one permit (the crate is built without
/// tower's `limit` feature): `poll_ready` takes the permit, the call's future keeps
/// it, clones start without one.
pub(crate) struct OnePermit<S> {
    inner: S,
    semaphore: tokio_util::sync::PollSemaphore,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<S> OnePermit<S> {
    pub(crate) fn new(inner: S) -> Self {
        OnePermit {
            inner,
            semaphore: tokio_util::sync::PollSemaphore::new(Arc::new(tokio::sync::Semaphore::new(
                1,
            ))),
            permit: None,
        }
    }
}

impl<S: Clone> Clone for OnePermit<S> {
    fn clone(&self) -> Self {
        OnePermit {
            inner: self.inner.clone(),
            semaphore: self.semaphore.clone(),
            permit: None,
        }
    }
}

impl<S, Req> Service<Req> for OnePermit<S>
where
    S: Service<Req>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if self.permit.is_none() {
            match self.semaphore.poll_acquire(cx) {
                Poll::Ready(permit) => self.permit = permit,
                Poll::Pending => return Poll::Pending,
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let permit = self.permit.take().expect("called before poll_ready");
        let fut = self.inner.call(req);
        Box::pin(async move {
            let out = fut.await;
            drop(permit);
            out
        })
    }
}

/// Sets a flag when dropped: proves the handler's future was dropped.
pub(crate) struct DropFlag(pub(crate) Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}
