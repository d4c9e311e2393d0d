use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::task::{Context, Poll};

use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::{Acquire, MissingKey, Settings};
use super::ticket::Ticket;
use crate::error::Error;
use crate::guard::LockInfo;
use crate::key::{KeyExtractor, LockKey, NoKey};
use crate::locker::{LockOptions, Locker};
use tower::BoxError;

/// A request that can carry the [`LockInfo`] of the lock it runs under:
/// `http::Request<B>` (the info goes into its extensions). Public but unnameable
/// outside the crate: the layers serve HTTP requests.
pub trait WithLockInfo {
    /// Attaches `info` to the request.
    fn set_lock_info(&mut self, info: LockInfo);

    /// Names the request's route in logs (never its data): for HTTP the method and
    /// the matched route template (`POST /accounts/{id}/debit`), or the path where
    /// no router has matched one. The default says only "a request".
    fn route(&self) -> String {
        "a request".to_owned()
    }

    /// The request's HTTP extensions, where
    /// [`LockLayer::lock_in_handler`](super::LockLayer::lock_in_handler) leaves what
    /// the handler's [`Locked`](super::Locked) extractor needs to take the lock. The
    /// default has none, and then the in-handler mode refuses every request.
    fn http_extensions(&mut self) -> Option<&mut http::Extensions> {
        None
    }
}

impl<B> WithLockInfo for http::Request<B> {
    fn set_lock_info(&mut self, info: LockInfo) {
        self.extensions_mut().insert(info);
    }

    fn route(&self) -> String {
        #[cfg(feature = "axum")]
        {
            let extensions = self.extensions();
            if let Some(matched) = extensions.get::<axum::extract::MatchedPath>() {
                return format!("{} {}", self.method(), matched.as_str());
            }
            if let Some(original) = extensions.get::<axum::extract::OriginalUri>() {
                return format!("{} {}", self.method(), original.path());
            }
        }
        format!("{} {}", self.method(), self.uri().path())
    }

    fn http_extensions(&mut self) -> Option<&mut http::Extensions> {
        Some(self.extensions_mut())
    }
}

/// Runs each request while holding the lock of its key; see [`LockLayer`](super::LockLayer).
///
/// The key is the extractor's ([`KeyExtractor::extract_key`]) after the layer's
/// [`key_prefix`](super::LockLayer::key_prefix). A request without one, or whose key is
/// empty or whitespace only before the prefix, is refused and logged with its route (see
/// [`LockLayer::run_unlocked_without_key`](super::LockLayer::run_unlocked_without_key)).
/// `poll_ready` is ready at once; the future of `call` takes the lock, then drives a
/// clone of the inner service (hence `S: Clone`) to readiness and calls it: bound the
/// waiting requests outside this layer (per key: the locker's `max_waiters`).
///
/// # Errors
///
/// [`Error::Backend`] (`503 lock_backend_unavailable` under `axum`), not a busy lock, for a
/// backend error or a wait timeout while the backend does not answer a probe
/// ([`Locker::check_backend`]). Under [`LossPolicy::Abort`](crate::LossPolicy::Abort) (the
/// default) a lost lease drops the inner future and fails with [`Error::LeaseLost`]; under
/// [`LossPolicy::Signal`](crate::LossPolicy::Signal) the handler runs on and watches the
/// [`LockInfo::loss`] in the request ([module docs](super#lease-loss)).
///
/// # Cancel safety
///
/// The guard lives in the response future: it is released (or handed off) when that
/// future completes or is dropped, not when a streamed response body ends.
#[derive(Clone, Debug)]
pub struct LockService<S, E> {
    inner: S,
    settings: Settings,
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
        let settings = Settings {
            locker,
            missing: MissingKey::Reject,
            options: LockOptions::default(),
            prefix: None,
            acquire: Acquire::default(),
        };
        LockService::from_settings(inner, settings, extractor)
    }

    pub(crate) fn from_settings(inner: S, settings: Settings, extractor: E) -> Self {
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

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The key of `req` with the layer's prefix.
    fn key_of<Req>(&self, req: &mut Req) -> Result<LockKey, NoKey>
    where
        E: KeyExtractor<Req>,
    {
        let key = crate::key::named(self.extractor.extract_key(req)?)?;
        Ok(match &self.settings.prefix {
            None => key,
            Some(prefix) => {
                let mut bytes = Vec::with_capacity(prefix.len() + key.as_bytes().len());
                bytes.extend_from_slice(prefix);
                bytes.extend_from_slice(key.as_bytes());
                LockKey::from(bytes)
            }
        })
    }
}

/// The error that refuses a request without a key, logged with its route.
pub(crate) fn refusal(no_key: &NoKey, route: &str) -> Error {
    if no_key.is_client_error() {
        tracing::info!(route, reason = %no_key, "lockflight: guarded request without a lock key refused");
        Error::InvalidKey {
            key: LockKey::from(""),
            reason: format!("{route}: {no_key}"),
        }
    } else {
        tracing::warn!(route, reason = %no_key, "lockflight: the lock layer of this route finds no key; every request is refused");
        Error::InvalidConfig {
            reason: format!("the lock layer of {route} finds no key: {no_key}"),
        }
    }
}

impl<S, E, Req> Service<Req> for LockService<S, E>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    E: KeyExtractor<Req>,
    Req: WithLockInfo + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    /// Always ready: the inner service is polled ready in the response future,
    /// once the lock is held (see [Readiness](LockService#readiness)).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        Box::pin(self.start(req))
    }
}

impl<S, E> LockService<S, E> {
    /// The response future of `req`, unboxed.
    fn start<Req>(&mut self, mut req: Req) -> ResponseFuture<S, Req>
    where
        S: Service<Req> + Clone + Send + 'static,
        E: KeyExtractor<Req>,
        Req: WithLockInfo + Send + 'static,
    {
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
            Acquire::BeforeHandler => {
                ResponseFuture::locking(&settings.locker, key, settings.options, inner, req)
            }
            Acquire::InHandler => {
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
