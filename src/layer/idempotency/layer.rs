//! [`IdempotencyLayer`]: the layer and its settings.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, StatusCode, header};
use tower_layer::Layer;

use super::service::IdempotencyService;
use super::settings::Settings;
use crate::layer::KeyFrom;
#[cfg(feature = "axum")]
use crate::layer::http::{ErrorHandler, error_handler};
use crate::locker::Locker;
#[cfg(feature = "axum")]
use axum::error_handling::HandleErrorLayer;

/// Applies [`IdempotencyService`]: a request with an idempotency key runs once,
/// and its response is stored and replayed for the key's later requests; see
/// the [module docs](crate::layer::idempotency) for the contract, the answers and
/// what it cannot promise.
///
/// ```
/// use std::time::Duration;
/// use lockflight::layer::IdempotencyLayer;
/// use lockflight::{Locker, MemoryBackend};
///
/// # fn main() -> lockflight::Result<()> {
/// let locker = Locker::builder(MemoryBackend::new()).build()?;
/// let layer = IdempotencyLayer::new(locker)
///     .required()
///     .key_prefix("tenant-7:")
///     .retention(Duration::from_secs(3600))
///     .wait(Duration::from_secs(2));
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct IdempotencyLayer<E = KeyFrom> {
    settings: Settings,
    extractor: E,
}

/// The settings' defaults.
impl IdempotencyLayer {
    /// Default bound on a key's length, in bytes.
    pub const DEFAULT_MAX_KEY_LEN: usize = 255;
    /// Default bound on a buffered request body, in bytes.
    pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
    /// Default bound on a stored response body, in bytes.
    pub const DEFAULT_MAX_RESPONSE: usize = 1024 * 1024;
    /// Default retention of a stored response: 24 hours.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
    /// Default wait for a duplicate running in another instance.
    pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);

    /// Idempotency through `locker`, the key from the `Idempotency-Key` header,
    /// with the defaults: a request without a key passes through untouched, keys
    /// of at most 255 bytes, bodies of at most 1 MiB buffered and stored,
    /// responses kept 24 hours, a 5 s wait for a duplicate in another instance
    /// (then `409` with `Retry-After: 1`), `content-type` and `location` stored
    /// with the status and the body, and 5xx responses not stored.
    pub fn new(locker: Locker) -> Self {
        IdempotencyLayer {
            settings: Settings {
                locker,
                required: false,
                prefix: Vec::new(),
                max_key_len: Self::DEFAULT_MAX_KEY_LEN,
                max_body: Self::DEFAULT_MAX_BODY,
                max_response: Self::DEFAULT_MAX_RESPONSE,
                retention: Self::DEFAULT_RETENTION,
                wait: Self::DEFAULT_WAIT,
                retry_after: 1,
                stored_headers: vec![header::CONTENT_TYPE, header::LOCATION],
                retryable: Arc::new(|status: StatusCode| status.is_server_error()),
            },
            extractor: KeyFrom::header(HeaderName::from_static("idempotency-key")),
        }
    }
}

impl<E> IdempotencyLayer<E> {
    /// Takes the key from `extractor` instead of the `Idempotency-Key` header
    /// (any [`KeyExtractor`](crate::layer::KeyExtractor), e.g. another
    /// [`KeyFrom`]).
    pub fn key_from<F>(self, extractor: F) -> IdempotencyLayer<F> {
        IdempotencyLayer {
            settings: self.settings,
            extractor,
        }
    }

    /// Refuses a request without a key (`400 idempotency_key_missing`) instead
    /// of passing it through untouched.
    pub fn required(mut self) -> Self {
        self.settings.required = true;
        self
    }

    /// Puts `prefix` in front of every lock key (a tenant's own namespace).
    pub fn key_prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// Longest key accepted, in bytes (default 255); a longer one is `400
    /// invalid_idempotency_key`.
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.settings.max_key_len = bytes;
        self
    }

    /// Largest request body buffered and fingerprinted (default 1 MiB); a larger
    /// one is `413 idempotency_body_too_large`, never partly hashed.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.settings.max_body = bytes;
        self
    }

    /// Largest response body stored (default 1 MiB). A larger response is
    /// answered but not stored (a retry runs again); one whose size hint says
    /// so up front is not even buffered.
    pub fn max_response(mut self, bytes: usize) -> Self {
        self.settings.max_response = bytes;
        self
    }

    /// How long a stored response is replayed (default 24 hours; at least 1 ms).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.settings.retention = retention.max(Duration::from_millis(1));
        self
    }

    /// How long a request waits for a duplicate that runs in another instance
    /// (default 5 s): woken when the other's lease is released, it replays the
    /// stored response; past the wait, `409 idempotency_request_in_progress`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.settings.wait = wait;
        self
    }

    /// The `Retry-After` of a `409` (default 1 s; whole seconds, rounded up).
    pub fn retry_after(mut self, after: Duration) -> Self {
        let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        self.settings.retry_after = u32::try_from(seconds).unwrap_or(u32::MAX);
        self
    }

    /// The response headers stored with the status and the body (default
    /// `content-type` and `location`), replacing the set. Every value of each is
    /// kept; other headers are not replayed.
    pub fn store_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.settings.stored_headers = names.into_iter().collect();
        self
    }

    /// Which statuses are retryable: not stored, so that a retry runs the
    /// handler again (default: 5xx). A handler that fails, panics or is
    /// cancelled never stores a response.
    pub fn retryable(
        mut self,
        retryable: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.settings.retryable = Arc::new(retryable);
        self
    }
}

#[cfg(feature = "axum")]
impl<E> IdempotencyLayer<E> {
    /// This layer behind axum's `HandleErrorLayer` with
    /// [`handle_error`](crate::layer::handle_error) (feature `axum`), as
    /// [`LockLayer::handle_errors`](crate::layer::LockLayer::handle_errors): an
    /// outage of the backend becomes `503 lock_backend_unavailable`. Its own
    /// refusals (`400`, `409`, `413`, `422`) are problem responses already.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use lockflight::layer::IdempotencyLayer;
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// # fn main() -> lockflight::Result<()> {
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let app: Router = Router::new()
    ///     .route("/payments", post(|| async { "paid" }))
    ///     .route_layer(IdempotencyLayer::new(locker).required().handle_errors());
    /// # let _ = app;
    /// # Ok(()) }
    /// ```
    pub fn handle_errors(self) -> (HandleErrorLayer<ErrorHandler, ()>, Self) {
        (error_handler(), self)
    }
}

impl<S, E: Clone> Layer<S> for IdempotencyLayer<E> {
    type Service = IdempotencyService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(
            inner,
            Arc::new(self.settings.clone()),
            self.extractor.clone(),
        )
    }
}
