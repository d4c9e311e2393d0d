use std::task::{Context, Poll};

use tower_service::Service;

use super::BoxError;
use super::future::ResponseFuture;
use super::layer::MissingKey;
use crate::error::Error;
use crate::guard::LockInfo;
use crate::key::{KeyExtractor, LockKey};
use crate::locker::Locker;

/// A request type that can carry the [`LockInfo`] of the lock it runs under.
///
/// Implemented for `http::Request<B>` (the info goes into its extensions). Implement
/// it for your own request type to use [`LockService`] outside HTTP; a no-op is fine
/// if the handler does not need the fencing token.
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
/// `poll_ready` only forwards to the inner service: the key comes from the request,
/// so all per-key work (coalescing, acquiring, handoff) happens in the future that
/// `call` returns. `call` keeps the inner service that was polled ready and leaves a
/// clone in its place (the clone-and-swap pattern), because the inner call happens
/// later, once the lock is held. That is why the inner service must be `Clone`.
///
/// # Guard lifetime
///
/// The guard lives in the response future: it is released (or handed off) when that
/// future completes or is dropped — not when a streamed response body ends.
#[derive(Clone, Debug)]
pub struct LockService<S, E> {
    inner: S,
    locker: Locker,
    extractor: E,
    missing: MissingKey,
}

impl<S, E> LockService<S, E> {
    /// Wraps `inner`.
    pub fn new(inner: S, locker: Locker, extractor: E, missing: MissingKey) -> Self {
        LockService {
            inner,
            locker,
            extractor,
            missing,
        }
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

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        match self.extractor.extract(&req) {
            Some(key) => ResponseFuture::locking(&self.locker, key, ready, req),
            None => match self.missing {
                MissingKey::PassThrough => {
                    let mut ready = ready;
                    ResponseFuture::passing(ready.call(req))
                }
                MissingKey::Reject => ResponseFuture::failed(Error::InvalidKey {
                    key: LockKey::from(""),
                    reason: "the request carries no lock key".into(),
                }),
            },
        }
    }
}
