//! [`Future`] types: the response future of
//! [`SharedResponseService`](super::SharedResponseService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body::Body;
use http_body_util::{BodyExt, Either, Full};
use pin_project::pin_project;
use tower::util::Oneshot;
use tower::{BoxError, ServiceExt};
use tower_service::Service;

use crate::key::LockKey;
use crate::layer::shared_error::SharedError;
use crate::locker::Locker;

/// The response of a [`SharedResponseService`](super::SharedResponseService)
/// whose inner service answers with `http::Response<B>`.
type SharedResponse<B> = http::Response<Either<Full<Bytes>, B>>;

/// Response future of [`SharedResponseService`](super::SharedResponseService).
///
/// A request without a key runs on its own: this future drives a clone of the
/// inner service, unboxed. A request with a key joins its key's flight: the work
/// (the flight, or the request's own run under the lock when the flight's response
/// cannot be shared) is boxed inside this future, as the locker's
/// [`singleflight`](crate::Locker::singleflight) future has no name.
///
/// # Cancel safety
///
/// Dropping it leaves the flight as dropping a
/// [`singleflight`](crate::Locker::singleflight) call does: a follower leaves, a
/// dropped leader hands the flight to the next caller, and a lock it holds is
/// released in the background.
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<S, ReqB, ResB>
where
    S: Service<http::Request<ReqB>>,
{
    #[pin]
    state: State<S, ReqB, ResB>,
}

// `Alone` holds the request until the inner service is ready, `Shared` a box:
// boxing `Alone` too would add an allocation to save space in a future that lives
// once per request.
#[allow(clippy::large_enum_variant)]
#[pin_project(project = StateProj)]
enum State<S, ReqB, ResB>
where
    S: Service<http::Request<ReqB>>,
{
    /// No key: the request runs on its own, neither shared nor locked.
    Alone {
        #[pin]
        fut: Oneshot<S, http::Request<ReqB>>,
    },
    /// The request's part in its key's flight.
    Shared {
        fut: BoxFuture<'static, Result<SharedResponse<ResB>, BoxError>>,
    },
}

impl<S, ReqB, ResB> fmt::Debug for ResponseFuture<S, ReqB, ResB>
where
    S: Service<http::Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Alone { .. } => "alone, without a key",
            State::Shared { .. } => "shared",
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
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    /// `req` on its own, by `service`.
    pub(super) fn alone(service: S, req: http::Request<ReqB>) -> Self {
        ResponseFuture {
            state: State::Alone {
                fut: Oneshot::new(service, req),
            },
        }
    }

    /// `req` in the flight of `key`; bodies over `max_body` bytes are not shared.
    pub(super) fn shared(
        locker: Locker,
        key: LockKey,
        service: S,
        req: http::Request<ReqB>,
        max_body: usize,
    ) -> Self {
        ResponseFuture {
            state: State::Shared {
                fut: Box::pin(share(locker, key, service, req, max_body)),
            },
        }
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB, ResB>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<SharedResponse<ResB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Alone { fut } => fut
                .poll(cx)
                .map(|out| Ok(out.map_err(Into::into)?.map(Either::Right))),
            StateProj::Shared { fut } => fut.as_mut().poll(cx),
        }
    }
}

/// What one flight's callers share.
#[derive(Clone)]
enum FlightOutcome {
    Response {
        status: http::StatusCode,
        version: http::Version,
        headers: http::HeaderMap,
        body: Bytes,
    },
    /// The leader's response could not be shared (too large or of unknown size):
    /// everyone else runs their own request.
    Bypass,
    Failed(Arc<dyn std::error::Error + Send + Sync>),
}

/// Runs `req` in the flight of `key`: as its leader, under the lock, sharing the
/// response when it fits in `max_body`; as a follower, with a copy of the leader's;
/// on its own under the lock when the leader's could not be shared.
async fn share<S, ReqB, ResB>(
    locker: Locker,
    key: LockKey,
    mut service: S,
    req: http::Request<ReqB>,
    max_body: usize,
) -> Result<SharedResponse<ResB>, BoxError>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let mut req = Some(req);
    let mut own: Option<http::Response<ResB>> = None;
    let shared = locker
        .singleflight(key.clone(), || {
            let (req, own, service) = (req.take(), &mut own, &mut service);
            async move {
                let Some(req) = req else {
                    return FlightOutcome::Bypass;
                };
                let call = match service.ready().await {
                    Ok(ready) => ready.call(req),
                    Err(e) => return FlightOutcome::Failed(Arc::from(e.into())),
                };
                let res = match call.await {
                    Ok(res) => res,
                    Err(e) => return FlightOutcome::Failed(Arc::from(e.into())),
                };
                let fits = res
                    .body()
                    .size_hint()
                    .exact()
                    .is_some_and(|n| n <= max_body as u64);
                if !fits {
                    *own = Some(res);
                    return FlightOutcome::Bypass;
                }
                let (parts, body) = res.into_parts();
                match body.collect().await {
                    Ok(collected) => FlightOutcome::Response {
                        status: parts.status,
                        version: parts.version,
                        headers: parts.headers,
                        body: collected.to_bytes(),
                    },
                    Err(e) => FlightOutcome::Failed(Arc::from(e.into())),
                }
            }
        })
        .await?;
    match shared {
        FlightOutcome::Response {
            status,
            version,
            headers,
            body,
        } => {
            let mut res = http::Response::new(Either::Left(Full::new(body)));
            *res.status_mut() = status;
            *res.version_mut() = version;
            *res.headers_mut() = headers;
            Ok(res)
        }
        FlightOutcome::Failed(e) => Err(Box::new(SharedError(e)) as BoxError),
        FlightOutcome::Bypass => {
            if let Some(res) = own {
                return Ok(res.map(Either::Right));
            }
            // Our closure never ran: run our own request, under the lock
            // like every read of this layer.
            let req = req
                .take()
                .ok_or("lockflight: shared-response request lost")?;
            let res = locker
                .with_lock(key, |_| async move {
                    service.oneshot(req).await.map_err(Into::into)
                })
                .await??;
            Ok(res.map(Either::Right))
        }
    }
}
