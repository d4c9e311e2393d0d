//! [`HandleErrors`]: a lockflight layer whose errors are already responses, ready
//! for `Router::route_layer` (feature `axum`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::response::{IntoResponse, Response};
use pin_project::pin_project;
use tower::util::Oneshot;
use tower_layer::Layer;
use tower_service::Service;

use super::BoxError;
use super::axum::error_response;

/// Wraps a lockflight layer so that its errors become problem responses (see
/// `IntoResponse for Error`): the service it makes never fails, which is what
/// `Router::route_layer` and `Router::layer` ask for. Made by
/// [`LockLayer::handle_errors`](super::LockLayer::handle_errors) and
/// [`SharedResponseLayer::handle_errors`](super::SharedResponseLayer::handle_errors);
/// it replaces `ServiceBuilder::new().layer(HandleErrorLayer::new(handle_error))`
/// in front of them.
#[derive(Clone, Debug)]
#[must_use]
pub struct HandleErrors<L> {
    inner: L,
}

impl<L> HandleErrors<L> {
    pub(crate) fn new(inner: L) -> Self {
        HandleErrors { inner }
    }
}

impl<L: Layer<S>, S> Layer<S> for HandleErrors<L> {
    type Service = HandleErrorsService<L::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        HandleErrorsService {
            inner: self.inner.layer(inner),
        }
    }
}

/// The service of [`HandleErrors`]: the wrapped service, with its errors turned
/// into problem responses.
///
/// Always ready: each call drives its own clone of the wrapped service to
/// readiness (lockflight's services are always ready at once), so that an error
/// there is a response too.
#[derive(Clone, Debug)]
pub struct HandleErrorsService<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for HandleErrorsService<S>
where
    S: Service<http::Request<B>> + Clone,
    S::Error: Into<BoxError>,
    S::Response: IntoResponse,
{
    type Response = Response;
    type Error = Infallible;
    type Future = HandleErrorsFuture<S, http::Request<B>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        HandleErrorsFuture {
            inner: Oneshot::new(self.inner.clone(), req),
        }
    }
}

/// The future of [`HandleErrorsService`].
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct HandleErrorsFuture<S: Service<Req>, Req> {
    #[pin]
    inner: Oneshot<S, Req>,
}

impl<S: Service<Req>, Req> std::fmt::Debug for HandleErrorsFuture<S, Req> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleErrorsFuture").finish_non_exhaustive()
    }
}

impl<S, Req> Future for HandleErrorsFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    S::Response: IntoResponse,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(Ok(match ready!(self.project().inner.poll(cx)) {
            Ok(res) => res.into_response(),
            Err(e) => error_response(e.into()),
        }))
    }
}
