//! [`Future`] types: the response future of
//! [`IdempotencyService`](super::IdempotencyService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body::Body;
use http_body_util::Either;
use pin_project::pin_project;
use tower::BoxError;
use tower::util::Oneshot;
use tower_service::Service;

use super::refusal::Refusal;
use super::run::{self, Reply};
use super::settings::Settings;
use crate::error::Error;
use crate::key::LockKey;

/// Response future of [`IdempotencyService`](super::IdempotencyService).
///
/// A request without a key, on a layer that does not require one, runs on its
/// own: this future drives a clone of the inner service, unboxed. A refused
/// request (no key where one is required, an invalid key) is answered at once.
/// A request with a key runs its part in its key's flight, boxed inside this
/// future (the locker's flight has no name).
///
/// # Cancel safety
///
/// Dropping it drops the request's part: a duplicate waiting on another's
/// flight stops waiting; a request whose handler runs drops the handler, stores
/// nothing, and releases its lease in the background, so the next request with
/// the key runs the handler again (a waiting duplicate in this process leads
/// with its own request).
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<S, ReqB, ResB>
where
    S: Service<http::Request<ReqB>>,
{
    #[pin]
    state: State<S, ReqB, ResB>,
}

// `Alone` holds the request until the inner service is ready, `Keyed` a box:
// boxing `Alone` too would add an allocation to save space in a future that
// lives once per request.
#[allow(clippy::large_enum_variant)]
#[pin_project(project = StateProj)]
enum State<S, ReqB, ResB>
where
    S: Service<http::Request<ReqB>>,
{
    /// No key, and none required: the request runs untouched.
    Alone {
        #[pin]
        fut: Oneshot<S, http::Request<ReqB>>,
    },
    /// Answered by the layer without running anything.
    Refused { refusal: Refusal },
    /// The layer cannot find keys on this route (a configuration error).
    Failed { error: Option<Error> },
    /// The request's part in its key's flight.
    Keyed {
        fut: BoxFuture<'static, Result<Reply<ResB>, BoxError>>,
    },
}

impl<S, ReqB, ResB> fmt::Debug for ResponseFuture<S, ReqB, ResB>
where
    S: Service<http::Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Alone { .. } => "alone, without a key",
            State::Refused { .. } => "refused",
            State::Failed { .. } => "failed",
            State::Keyed { .. } => "keyed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, ReqB, ResB> ResponseFuture<S, ReqB, ResB>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    /// `req` on its own, by `service`.
    pub(super) fn alone(service: S, req: http::Request<ReqB>) -> Self {
        Self::with(State::Alone {
            fut: Oneshot::new(service, req),
        })
    }

    /// Answered with `refusal`.
    pub(super) fn refused(refusal: Refusal) -> Self {
        Self::with(State::Refused { refusal })
    }

    /// Failed with `error`.
    pub(super) fn failed(error: Error) -> Self {
        Self::with(State::Failed { error: Some(error) })
    }

    /// `req` under the idempotency lock key `key`.
    pub(super) fn keyed(
        settings: Arc<Settings>,
        key: LockKey,
        service: S,
        req: http::Request<ReqB>,
    ) -> Self {
        Self::with(State::Keyed {
            fut: Box::pin(run::run(settings, key, service, req)),
        })
    }

    fn with(state: State<S, ReqB, ResB>) -> Self {
        ResponseFuture { state }
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB, ResB>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Reply<ResB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Alone { fut } => fut
                .poll(cx)
                .map(|out| Ok(out.map_err(Into::into)?.map(Either::Right))),
            StateProj::Refused { refusal } => Poll::Ready(Ok(run::refused(*refusal))),
            StateProj::Failed { error } => Poll::Ready(Err(match error.take() {
                Some(e) => Box::new(e),
                None => "lockflight: idempotency ResponseFuture polled after completion".into(),
            })),
            StateProj::Keyed { fut } => fut.as_mut().poll(cx),
        }
    }
}
