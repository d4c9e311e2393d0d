use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_service::Service;

use crate::key::KeyExtractor;
use crate::locker::Locker;
use http_body_util::Either;
use tower::BoxError;

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
/// response future is boxed.
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

/// An inner error shared by every caller of a flight.
#[derive(Clone)]
struct SharedError(Arc<dyn std::error::Error + Send + Sync>);

impl fmt::Debug for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
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
    type Response = http::Response<Either<Full<Bytes>, ResB>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    /// Always ready: the inner service is polled ready in the response future,
    /// right before it is called (see [Readiness](SharedResponseService#readiness)).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<ReqB>) -> Self::Future {
        let mut service = self.inner.clone();
        let Ok(key) = self
            .extractor
            .extract_key(&mut req)
            .and_then(crate::key::named)
        else {
            return Box::pin(async move {
                let res = service.oneshot(req).await.map_err(Into::into)?;
                Ok(res.map(Either::Right))
            });
        };
        let locker = self.locker.clone();
        let max_body = self.max_body;
        Box::pin(async move {
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
        })
    }
}
