//! One idempotent request with a key, from its body to its answer:
//!
//! 1. buffer the body (at most `max_body`, else `413`) and fingerprint it;
//! 2. join the key's flight in this process (`Locker::coalesce`): a follower
//!    waits for the leader's [`Outcome`] and sends nothing to the backend;
//! 3. the leader reads the record (one round trip): a stored response is
//!    replayed;
//! 4. else it takes the lease of the key, waiting at most `wait` (a duplicate
//!    running in another instance holds it; its release wakes this one), else
//!    `409`;
//! 5. fences the record under the lease's fencing token (one script: a response
//!    stored meanwhile is replayed; else the record's fence holds the token, and
//!    every older executor's store is refused from now on);
//! 6. runs the handler with the lease's [`LockInfo`](crate::guard::LockInfo) as
//!    a request extension (dropped when the lease is lost under
//!    [`LossPolicy::Abort`], as the lock layer does: nothing is stored), and
//!    stores its response under the same token unless the policy calls it
//!    retryable;
//! 7. releases the lease (waking the next instance) and shares the response.
//!
//! Every caller compares the outcome's fingerprint with its own: another
//! request under the same key is `422`.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, LengthLimitError, Limited};
use tower::{BoxError, ServiceExt};
use tower_service::Service;

use super::record::{Fingerprint, Stored};
use super::refusal::Refusal;
use super::settings::Settings;
use crate::backend::RecordState;
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::layer::edge;
use crate::layer::shared_error::SharedError;
use crate::locker::{LockGuard, LockOptions, Locker, LossPolicy};

/// The layer's response: its own (a replay, a shared copy, a refusal) or the
/// inner service's body, untouched.
pub(super) type Reply<B> = Response<Either<Full<Bytes>, B>>;

/// The header that marks a response the handler did not run for now: a stored
/// one replayed, or the copy a duplicate in flight received.
pub(super) const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// What one flight's callers share.
#[derive(Clone)]
enum Outcome {
    /// A response; `replayed` when it was read from the backend.
    Response { stored: Arc<Stored>, replayed: bool },
    /// A request with this key runs in another instance (or replaced this one's
    /// lease) and did not end within the wait.
    InProgress,
    /// The leader's response was too large to buffer: it got its own, and every
    /// other caller runs its own request.
    Bypass,
    /// The inner service or its body failed: nothing was stored.
    Failed(Arc<dyn std::error::Error + Send + Sync>),
}

/// One caller's request and what its flight needs of it.
struct Job<S, ReqB, ResB> {
    settings: Arc<Settings>,
    key: LockKey,
    fingerprint: Fingerprint,
    service: S,
    req: Option<Request<ReqB>>,
    /// The inner response, when it was too large to buffer.
    own: Option<Response<ResB>>,
    /// Whether this caller's own work ran (it led a flight).
    led: bool,
}

/// Runs `req`, whose idempotency lock key is `key`, through `service`.
///
/// Cancel safe as the locker's flights are: a follower leaves; a dropped leader
/// drops its handler, stores nothing, releases its lease in the background, and
/// a waiting caller leads with its own request.
pub(super) async fn run<S, ReqB, ResB>(
    settings: Arc<Settings>,
    key: LockKey,
    service: S,
    req: Request<ReqB>,
) -> Result<Reply<ResB>, BoxError>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > settings.max_body as u64) {
        return Ok(refused(Refusal::BodyTooLarge));
    }
    let body = match Limited::new(body, settings.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => return Ok(refused(Refusal::BodyTooLarge)),
        Err(e) => return Err(e),
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let fingerprint = Fingerprint::of(&parts.method, path, &body);
    let locker = settings.locker.clone();
    let mut job = Job {
        settings,
        key: key.clone(),
        fingerprint,
        service,
        req: Some(Request::from_parts(parts, ReqB::from(body))),
        own: None,
        led: false,
    };
    let mut outcome = {
        let job = &mut job;
        locker
            .coalesce(key, || async move {
                job.led = true;
                job.lead().await
            })
            .await?
    };
    if matches!(outcome, Outcome::Bypass) && !job.led {
        // The leader's response could not be shared: this request runs on its
        // own, as if it came from another instance.
        job.led = true;
        outcome = job.lead().await?;
    }
    match outcome {
        Outcome::Response { stored, .. } if stored.fingerprint != job.fingerprint => {
            Ok(refused(Refusal::Reused))
        }
        Outcome::Response { stored, replayed } => Ok(reply(&stored, replayed || !job.led)),
        Outcome::InProgress => Ok(refused(Refusal::InProgress {
            retry_after: job.settings.retry_after,
        })),
        Outcome::Failed(e) => Err(Box::new(SharedError(e))),
        Outcome::Bypass => match job.own.take() {
            Some(res) => Ok(res.map(Either::Right)),
            None => Err("lockflight: the idempotent request was lost".into()),
        },
    }
}

impl<S, ReqB, ResB> Job<S, ReqB, ResB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<BoxError>,
{
    /// Steps 3 to 7 of the module docs, for this caller's request.
    async fn lead(&mut self) -> Result<Outcome> {
        let settings = Arc::clone(&self.settings);
        let (locker, key) = (&settings.locker, &self.key);
        let backend = locker.backend();
        if let Some(bytes) = noted(locker, backend.read_record(key).await)? {
            return replay(key, bytes);
        }
        let options = LockOptions::new().wait_timeout(settings.wait);
        let guard = match edge::acquire(locker, key.clone(), options).await {
            Ok(guard) => guard,
            Err(Error::Timeout { .. }) => return Ok(Outcome::InProgress),
            Err(e) => return Err(e),
        };
        let token = guard.fencing_token();
        let fence = (token.epoch, token.seq);
        let fenced = backend.fence_record(key, fence, settings.retention).await;
        match noted(locker, fenced)? {
            RecordState::Fenced => {}
            RecordState::Stored(bytes) => {
                end(guard).await;
                return replay(key, bytes);
            }
            // A newer executor fenced the record: this lease was lost.
            RecordState::Stale => return Ok(Outcome::InProgress),
        }
        let Some(mut req) = self.req.take() else {
            return Err(Error::config("lockflight: the idempotent request was lost"));
        };
        req.extensions_mut().insert(guard.info());
        let service = &mut self.service;
        let call = async move {
            let ready: Result<&mut S, BoxError> = service.ready().await.map_err(Into::into);
            ready?.call(req).await.map_err(Into::into)
        };
        let scoped = crate::reentry::scope(locker.id(), key.clone(), call);
        let ran: Result<_, BoxError> = match locker.loss_policy() {
            LossPolicy::Signal => scoped.await,
            LossPolicy::Abort => {
                let lost = guard.lost();
                tokio::select! {
                    biased;
                    _ = lost => return Err(guard.lost_error()),
                    out = scoped => out,
                }
            }
        };
        let res = match ran {
            Ok(res) => res,
            Err(e) => {
                end(guard).await;
                return Ok(Outcome::Failed(Arc::from(e)));
            }
        };
        if res.body().size_hint().lower() > settings.max_response as u64 {
            tracing::warn!(key = %key, "lockflight: an idempotent response is larger than max_response: not stored, a retry runs again");
            self.own = Some(res);
            end(guard).await;
            return Ok(Outcome::Bypass);
        }
        let (parts, body) = res.into_parts();
        let collected: Result<_, BoxError> = body.collect().await.map_err(Into::into);
        let body = match collected {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                end(guard).await;
                return Ok(Outcome::Failed(Arc::from(e)));
            }
        };
        let stored = Arc::new(Stored {
            fingerprint: self.fingerprint,
            status: parts.status,
            headers: parts.headers,
            body,
        });
        if (settings.retryable)(stored.status) || stored.body.len() > settings.max_response {
            end(guard).await;
            return Ok(Outcome::Response {
                stored,
                replayed: false,
            });
        }
        let bytes = stored.encode(&settings.stored_headers);
        let written = backend
            .store_record(key, fence, &bytes, settings.retention)
            .await;
        end(guard).await;
        match noted(locker, written) {
            Ok(true) => {}
            Ok(false) => {
                // A newer executor fenced the record after this lease was lost:
                // its response, if stored, is the key's one outcome.
                tracing::warn!(key = %key, fencing_token = %token, "lockflight: an idempotent response was refused by the record's fence (the lease was lost and a newer request ran)");
                return match backend.read_record(key).await {
                    Ok(Some(bytes)) => replay(key, bytes),
                    Ok(None) | Err(_) => Ok(Outcome::InProgress),
                };
            }
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "lockflight: an idempotent response could not be stored; a retry runs again");
            }
        }
        Ok(Outcome::Response {
            stored,
            replayed: false,
        })
    }
}

/// The outcome of a stored record.
fn replay(key: &LockKey, bytes: Vec<u8>) -> Result<Outcome> {
    Ok(Outcome::Response {
        stored: Arc::new(Stored::decode(key, bytes)?),
        replayed: true,
    })
}

/// Reports a backend call's outcome to the locker's health, as the edge's
/// acquire does: an outage starts with a failure and ends with an answer.
fn noted<T>(locker: &Locker, result: Result<T>) -> Result<T> {
    match &result {
        Ok(_) => locker.health().succeeded(),
        Err(e) if edge::is_outage(e) => locker.health().failed(e),
        Err(_) => {}
    }
    result
}

/// Ends a hold: the release wakes a duplicate waiting in another instance. A
/// failed release is logged; the lease then ends at its TTL.
async fn end(guard: LockGuard) {
    let key = guard.key().clone();
    if let Err(e) = guard.release().await {
        tracing::debug!(key = %key, error = %e, "lockflight: an idempotent request's release failed");
    }
}

/// The response of `stored`, marked when the handler did not run for it now.
fn reply<B>(stored: &Stored, replayed: bool) -> Reply<B> {
    let mut res = Response::new(Either::Left(Full::new(stored.body.clone())));
    *res.status_mut() = stored.status;
    *res.headers_mut() = stored.headers.clone();
    if replayed {
        res.headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    res
}

/// A refusal as the layer's response.
pub(super) fn refused<B>(refusal: Refusal) -> Reply<B> {
    refusal.response().map(Either::Left)
}
