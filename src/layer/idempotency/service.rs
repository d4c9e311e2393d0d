//! [`IdempotencyService`]: a request with an idempotency key runs once; its
//! response is stored and replayed.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tower::BoxError;
use tower_service::Service;

use super::future::ResponseFuture;
use super::refusal::Refusal;
use super::settings::{Settings, valid_key};
use crate::key::KeyExtractor;
use crate::layer::settings::refusal;

/// Runs each request with an idempotency key once and replays its stored
/// response; see [`IdempotencyLayer`](super::IdempotencyLayer) for the contract.
/// A response's body is `Either::Left` (the layer's: a buffered response, a
/// replay, a refusal) or `Either::Right` (the inner service's own body,
/// untouched: a request without a key, or a response too large to buffer),
/// `http_body_util::Either`.
///
/// # Readiness
///
/// `poll_ready` is always ready at once and does not poll the inner service: the
/// key comes from the request, so all per-key work happens in the future. `call`
/// takes a clone of the inner service; the future drives that clone to
/// readiness only when it is about to call it, under the key's lease. A request
/// waiting for its flight or its lease holds no readiness (no
/// `ConcurrencyLimit` permit, no `Buffer` slot): put concurrency limits outside
/// the layer.
///
/// # Errors
///
/// Refusals are responses (`400`, `413`, `409`, `422`: see the layer). The
/// service fails with a lockflight [`Error`](crate::Error) when the backend
/// does not answer (the lock layer's outage answer, `503
/// lock_backend_unavailable` through `handle_errors()`: a request never runs
/// without idempotency), when the backend has no idempotency records
/// ([`Error::Unsupported`](crate::Error::Unsupported), e.g. Redlock), or when
/// the route yields no key at all (a configuration error); and with the inner
/// service's error, shared by the duplicates in flight.
#[derive(Clone, Debug)]
pub struct IdempotencyService<S, E> {
    inner: S,
    settings: Arc<Settings>,
    extractor: E,
}

impl<S, E> IdempotencyService<S, E> {
    pub(super) fn new(inner: S, settings: Arc<Settings>, extractor: E) -> Self {
        IdempotencyService {
            inner,
            settings,
            extractor,
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

/// The route a request matched (axum's `MatchedPath`), else its path.
fn route<B>(req: &http::Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(matched) = req.extensions().get::<axum::extract::MatchedPath>() {
        return matched.as_str();
    }
    req.uri().path()
}

impl<S, E, ReqB, ResB> Service<http::Request<ReqB>> for IdempotencyService<S, E>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    E: KeyExtractor<http::Request<ReqB>>,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = http::Response<http_body_util::Either<http_body_util::Full<Bytes>, ResB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S, ReqB, ResB>;

    /// Always ready: the inner service is polled ready in the response future,
    /// right before it is called (see [Readiness](IdempotencyService#readiness)).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<ReqB>) -> Self::Future {
        let service = self.inner.clone();
        let settings = &self.settings;
        let key = match self.extractor.extract_key(&mut req) {
            Ok(key) => key,
            Err(no_key) if !no_key.is_client_error() => {
                return ResponseFuture::failed(refusal(&no_key, route(&req)));
            }
            Err(_) if settings.required => return ResponseFuture::refused(Refusal::Missing),
            Err(_) => return ResponseFuture::alone(service, req),
        };
        if !valid_key(key.as_bytes(), settings.max_key_len) {
            return ResponseFuture::refused(Refusal::InvalidKey);
        }
        let scoped = settings.scoped(req.method(), route(&req), key.as_bytes());
        ResponseFuture::keyed(Arc::clone(settings), scoped, service, req)
    }
}
