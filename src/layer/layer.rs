//! [`LockLayer`]: the layer, and the settings it gives each service.

use std::sync::Arc;

use tower_layer::Layer;

use super::service::LockService;
#[cfg(feature = "axum")]
use super::settings::LockAt;
use super::settings::{LayerSettings, MissingKey};
use crate::locker::{LockOptions, Locker};

/// Applies [`LockService`]: every request runs under the lock of its key.
///
/// # Which form to use
///
/// * **Bodiless handlers** (`DELETE /items/{sku}`, `POST /jobs/{id}/run` without a
///   body): the layer alone. The lock is taken before the handler runs, and the
///   handler finds a [`LockInfo`](crate::guard::LockInfo) in the request
///   extensions.
/// * **Handlers that read a body** (`POST /accounts/{id}/debit` with JSON): add
///   [`lock_in_handler`](LockLayer::lock_in_handler) and take the body through the
///   [`Locked`](super::Locked) extractor (feature `axum`). The body is received and
///   validated first, the lock taken after: a slow upload holds no lock, and a
///   malformed body takes none. The layer still finds the key (so a request without
///   one is refused before its body is read) and still drops the handler if the
///   lease is lost.
///
/// With axum, finish with [`handle_errors`](LockLayer::handle_errors) (feature
/// `axum`): the errors become `application/problem+json` responses, and the result
/// goes straight into `Router::route_layer`.
///
/// ```
/// use lockflight::layer::LockLayer;
/// use lockflight::{Locker, MemoryBackend, layer::KeyFrom};
///
/// # fn main() -> lockflight::Result<()> {
/// let locker = Locker::builder(MemoryBackend::new()).build()?;
/// let layer = LockLayer::new(locker, KeyFrom::header(http::HeaderName::from_static("x-sku")))
///     .key_prefix("sku:");
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct LockLayer<E> {
    settings: LayerSettings,
    extractor: E,
}

impl<E> LockLayer<E> {
    /// Locks with `locker`, keyed by `extractor`.
    pub fn new(locker: Locker, extractor: E) -> Self {
        LockLayer {
            settings: LayerSettings::new(locker),
            extractor,
        }
    }

    /// Per-route lock settings (default: the locker's). Give each route its own
    /// layer to give it its own wait timeout or lease TTL; with
    /// [`LockOptions::try_only`] the route fails fast — [`Error::Busy`]
    /// (`503 lock_busy` with `Retry-After` under the `axum` feature) at once when the
    /// key is held — instead of queueing.
    ///
    /// ```
    /// use lockflight::layer::LockLayer;
    /// use lockflight::{LockOptions, Locker, MemoryBackend, layer::KeyFrom};
    ///
    /// # fn main() -> lockflight::Result<()> {
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let sku = KeyFrom::header(http::HeaderName::from_static("x-sku"));
    /// let fail_fast = LockLayer::new(locker, sku).options(LockOptions::new().try_only());
    /// # let _ = fail_fast;
    /// # Ok(()) }
    /// ```
    ///
    /// [`Error::Busy`]: crate::Error::Busy
    pub fn options(mut self, options: LockOptions) -> Self {
        self.settings.options = options;
        self
    }

    /// Runs a request whose key is missing **without any lock**, instead of
    /// refusing it. Only for routes where the lock is an optimisation, never
    /// where it protects a write.
    ///
    /// By default such a request is refused without calling the handler: the
    /// layer fails with [`Error::InvalidKey`](crate::Error::InvalidKey) when the
    /// request lacks what the key is made of (`400 invalid_key` with the `axum`
    /// feature), or [`Error::InvalidConfig`](crate::Error::InvalidConfig) when the
    /// route cannot yield a key at all (`500 invalid_config`), and logs which route.
    pub fn run_unlocked_without_key(mut self) -> Self {
        self.settings.missing = MissingKey::RunUnlocked;
        self
    }

    /// Prefixes every key this layer locks with `prefix` (default: none), so that
    /// two routes keyed by the same kind of value (`/accounts/{id}` and
    /// `/carts/{id}`) lock different keys, or so that they share one on purpose.
    ///
    /// ```
    /// use lockflight::layer::{KeyFrom, LockLayer};
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// # fn main() -> lockflight::Result<()> {
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let id = KeyFrom::header(http::HeaderName::from_static("x-account"));
    /// // Requests with `x-account: 7` lock the key `account:7`.
    /// let layer = LockLayer::new(locker, id).key_prefix("account:");
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn key_prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        let prefix = prefix.as_ref();
        self.settings.prefix = (!prefix.is_empty()).then(|| Arc::from(prefix));
        self
    }

    /// Leaves the locking to the handler's [`Locked`](super::Locked) extractor
    /// (feature `axum`), which takes the lock once the body it wraps is received and
    /// valid; see [Which form to use](LockLayer#which-form-to-use).
    ///
    /// The layer still extracts the key first (a request without one is refused
    /// before its body is read), scopes the handler as the key's holder (locking
    /// the same key again inside fails at once with
    /// [`Error::Reentrant`](crate::Error::Reentrant)), keeps the guard until the
    /// response future ends, and under
    /// [`LossPolicy::Abort`](crate::LossPolicy::Abort) drops the handler when the
    /// lease is lost.
    ///
    /// A handler behind this layer without a `Locked<_>` extractor runs unlocked:
    /// the first such request of each service is logged at `WARN`.
    #[cfg(feature = "axum")]
    pub fn lock_in_handler(mut self) -> Self {
        self.settings.acquire = LockAt::InHandler;
        self
    }
}

impl<S, E: Clone> Layer<S> for LockLayer<E> {
    type Service = LockService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService::from_settings(inner, self.settings.clone(), self.extractor.clone())
    }
}
