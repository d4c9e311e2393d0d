use std::task::{Context, Poll};

use tower_service::Service;

use super::BoxError;
use super::future::ResponseFuture;
use super::layer::MissingKey;
use crate::error::Error;
use crate::guard::LockInfo;
use crate::key::{KeyExtractor, LockKey};
use crate::locker::{LockOptions, Locker};

/// A request type that can carry the [`LockInfo`] of the lock it runs under.
///
/// Implemented for `http::Request<B>` (the info goes into its extensions). Implement
/// it for your own request type to use [`LockService`] outside HTTP; a no-op is fine
/// if the handler needs neither the fencing token nor the loss signal.
pub trait WithLockInfo {
    /// Attaches `info` to the request.
    fn set_lock_info(&mut self, info: LockInfo);
}

impl<B> WithLockInfo for http::Request<B> {
    fn set_lock_info(&mut self, info: LockInfo) {
        self.extensions_mut().insert(info);
    }
}

/// Runs each request while holding the lock of its key; see [`LockLayer`](super::LockLayer).
///
/// # Readiness
///
/// `poll_ready` is always ready at once and does not poll the inner service. The key
/// comes from the request, so all per-key work happens in the future that `call`
/// returns, in this order: acquire the lock, then drive a clone of the inner service
/// to readiness, then call it (as [`tower::util::Oneshot`] does). Readiness is never
/// held while waiting for a lock: with a `ConcurrencyLimit` or a `Buffer` inside, a
/// request waiting for a hot key holds no permit or slot, so requests for other keys
/// are not stuck behind it. If the lock is not obtained, the inner service is not
/// touched at all. That is why the inner service must be `Clone`.
///
/// The inner service's backpressure therefore applies once the lock is held: put
/// load shedding or a concurrency limit *outside* this layer to bound how many
/// requests wait for locks (the locker's `max_waiters` bounds it per key).
///
/// # Guard lifetime
///
/// The guard lives in the response future: it is released (or handed off) when that
/// future completes or is dropped — not when a streamed response body ends.
///
/// # Lease loss
///
/// With [`LossPolicy::Abort`](crate::LossPolicy::Abort) (the default) the inner
/// future is dropped as soon as the lease is lost, and the call fails with
/// [`Error::LeaseLost`]. With [`LossPolicy::Signal`](crate::LossPolicy::Signal) it
/// runs on, and watches the [`LockInfo::loss`] it finds in the request; see the
/// [module docs](super#lease-loss).
#[derive(Clone, Debug)]
pub struct LockService<S, E> {
    inner: S,
    locker: Locker,
    extractor: E,
    missing: MissingKey,
    options: LockOptions,
}

impl<S, E> LockService<S, E> {
    /// Wraps `inner`.
    pub fn new(inner: S, locker: Locker, extractor: E, missing: MissingKey) -> Self {
        LockService {
            inner,
            locker,
            extractor,
            missing,
            options: LockOptions::default(),
        }
    }

    /// Locks with these per-call settings (see [`LockLayer::options`](super::LockLayer::options)).
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, E, Req> Service<Req> for LockService<S, E>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    E: KeyExtractor<Req>,
    Req: WithLockInfo + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req>;

    /// Always ready: the inner service is polled ready in the response future,
    /// once the lock is held (see [Readiness](LockService#readiness)).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let inner = self.inner.clone();
        match self.extractor.extract(&req) {
            Some(key) => ResponseFuture::locking(&self.locker, key, self.options, inner, req),
            None => match self.missing {
                MissingKey::PassThrough => ResponseFuture::passing(inner, req),
                MissingKey::Reject => ResponseFuture::failed(Error::InvalidKey {
                    key: LockKey::from(""),
                    reason: "the request carries no lock key".into(),
                }),
            },
        }
    }
}
