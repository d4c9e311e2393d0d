//! [`LockService`]: each request runs while holding the lock of its key.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::task::{Context, Poll};

use tower::BoxError;
use tower_service::Service;

use super::future::ResponseFuture;
use super::request::WithLockInfo;
use super::settings::{LayerSettings, LockAt, MissingKey, refusal};
use super::ticket::Ticket;
use crate::error::Error;
use crate::key::{KeyExtractor, LockKey, NoKey};
use crate::locker::{LockOptions, Locker};

/// Runs each request while holding the lock of its key; see [`LockLayer`](super::LockLayer).
///
/// The key is the extractor's ([`KeyExtractor::extract_key`]) after the layer's
/// [`key_prefix`](super::LockLayer::key_prefix). A request without one, or whose key is
/// empty or whitespace only before the prefix, is refused and logged with its route (see
/// [`LockLayer::run_unlocked_without_key`](super::LockLayer::run_unlocked_without_key)).
///
/// # Readiness
///
/// `poll_ready` is ready at once; the future of `call` (a
/// [`ResponseFuture`]) takes the lock, then drives a clone of the inner service
/// (hence `S: Clone`) to readiness and calls it: a request waiting for its lock
/// holds no inner capacity, and one that gets no lock never touches the inner
/// service. Bound the waiting requests outside this layer (per key: the locker's
/// `max_waiters`).
///
/// # Errors
///
/// [`Error::Backend`] (`503 lock_backend_unavailable` under `axum`), not a busy lock, for a
/// backend error or a wait timeout while the backend does not answer a probe
/// ([`Locker::check_backend`]). Under [`LossPolicy::Abort`](crate::LossPolicy::Abort) (the
/// default) a lost lease drops the inner future and fails with [`Error::LeaseLost`]; under
/// [`LossPolicy::Signal`](crate::LossPolicy::Signal) the handler runs on and watches the
/// [`LockInfo::loss`](crate::guard::LockInfo::loss) in the request ([module docs](super#lease-loss)).
///
/// # Cancel safety
///
/// The guard lives in the response future: it is released (or handed off) when that
/// future completes or is dropped, not when a streamed response body ends.
///
/// [`ResponseFuture`]: super::future::ResponseFuture
#[derive(Clone, Debug)]
pub struct LockService<S, E> {
    inner: S,
    settings: LayerSettings,
    extractor: E,
    /// Whether this service already warned of an in-handler route whose lock was
    /// not taken (shared by its clones).
    warned_unlocked: Arc<AtomicBool>,
}

impl<S, E> LockService<S, E> {
    /// Wraps `inner`: its requests lock with `locker`, keyed by `extractor`;
    /// requests without a key are refused (as [`LockLayer`](super::LockLayer)
    /// makes it by default).
    pub fn new(inner: S, locker: Locker, extractor: E) -> Self {
        LockService::from_settings(inner, LayerSettings::new(locker), extractor)
    }

    /// A service with the settings of a [`LockLayer`](super::LockLayer).
    pub(super) fn from_settings(inner: S, settings: LayerSettings, extractor: E) -> Self {
        LockService {
            inner,
            settings,
            extractor,
            warned_unlocked: Arc::default(),
        }
    }

    /// Locks with these per-call settings (see [`LockLayer::options`](super::LockLayer::options)).
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.settings.options = options;
        self
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

    /// The key of `req` with the layer's prefix.
    fn key_of<Req>(&self, req: &mut Req) -> Result<LockKey, NoKey>
    where
        E: KeyExtractor<Req>,
    {
        self.settings.key(self.extractor.extract_key(req)?)
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

    fn call(&mut self, mut req: Req) -> Self::Future {
        let inner = self.inner.clone();
        let settings = &self.settings;
        let key = match self.key_of(&mut req) {
            Ok(key) => key,
            Err(no_key) => {
                let route = req.route();
                return match settings.missing {
                    MissingKey::RunUnlocked => {
                        tracing::debug!(route, reason = %no_key, "lockflight: no lock key; running unlocked (run_unlocked_without_key)");
                        ResponseFuture::passing(inner, req)
                    }
                    MissingKey::Reject => ResponseFuture::failed(refusal(&no_key, &route)),
                };
            }
        };
        if let Err(e) = key.validate() {
            tracing::info!(route = req.route(), error = %e, "lockflight: guarded request with an invalid lock key refused");
            return ResponseFuture::failed(e);
        }
        match settings.acquire {
            LockAt::BeforeHandler => {
                ResponseFuture::locking(&settings.locker, key, settings.options, inner, req)
            }
            LockAt::InHandler => {
                let route = req.route();
                let ticket = Ticket::new(settings.locker.clone(), key, settings.options);
                let Some(extensions) = req.http_extensions() else {
                    return ResponseFuture::failed(Error::InvalidConfig {
                        reason: format!(
                            "{route}: only HTTP requests can take their lock in the handler"
                        ),
                    });
                };
                extensions.insert(ticket.clone());
                ResponseFuture::in_handler(
                    &settings.locker,
                    ticket,
                    inner,
                    req,
                    route,
                    Arc::clone(&self.warned_unlocked),
                )
            }
        }
    }
}
