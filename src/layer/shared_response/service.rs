//! [`SharedResponseService`]: concurrent identical requests share one response.

use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tower::BoxError;
use tower_service::Service;

use super::future::ResponseFuture;
use crate::key::KeyExtractor;
use crate::locker::Locker;

/// Shares one response among concurrent identical requests; see
/// [`SharedResponseLayer`](super::SharedResponseLayer). A response's body is
/// `Either::Left` (a copy of the shared, buffered body) or `Either::Right` (the
/// inner service's own body, untouched), `http_body_util::Either`.
///
/// # Readiness
///
/// `poll_ready` is always ready at once and does not poll the inner service: the
/// key comes from the request, so all per-key work happens in the future. `call`
/// takes a clone of the inner service; the future drives that clone to readiness
/// only when it is about to call it — as the flight's leader, under the lock, or
/// for its own request when the shared response could not be shared. A request
/// waiting for its flight or its lock holds no readiness (no `ConcurrencyLimit`
/// permit, no `Buffer` slot), and a follower never touches the inner service. The
/// response future is a [`ResponseFuture`]: unboxed for a request without a key;
/// for one with a key it boxes its part in the key's flight.
#[derive(Clone, Debug)]
pub struct SharedResponseService<S, E> {
    inner: S,
    locker: Locker,
    extractor: E,
    max_body: usize,
}

impl<S, E> SharedResponseService<S, E> {
    /// Wraps `inner`.
    pub fn new(inner: S, locker: Locker, extractor: E, max_body: usize) -> Self {
        SharedResponseService {
            inner,
            locker,
            extractor,
            max_body,
        }
    }

    /// Gets a reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Gets a mutable reference to the inner service.
    ///
    /// Each request is served by a clone of the inner service taken when it is
    /// called: a change made here reaches the requests called after it, not those
    /// already under way.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, E, ReqB, ResB> Service<http::Request<ReqB>> for SharedResponseService<S, E>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    E: KeyExtractor<http::Request<ReqB>>,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = http::Response<http_body_util::Either<http_body_util::Full<Bytes>, ResB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S, ReqB, ResB>;

    /// Always ready: the inner service is polled ready in the response future,
    /// right before it is called (see [Readiness](SharedResponseService#readiness)).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<ReqB>) -> Self::Future {
        let service = self.inner.clone();
        match self
            .extractor
            .extract_key(&mut req)
            .and_then(crate::key::named)
        {
            Ok(key) => {
                ResponseFuture::shared(self.locker.clone(), key, service, req, self.max_body)
            }
            Err(_) => ResponseFuture::alone(service, req),
        }
    }
}
