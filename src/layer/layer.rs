use tower_layer::Layer;

use super::service::LockService;
use crate::locker::{LockOptions, Locker};

/// What [`LockService`] does with a request whose key extractor finds no key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Run the inner service without a lock (the default).
    #[default]
    PassThrough,
    /// Fail with [`Error::InvalidKey`](crate::Error::InvalidKey) (a 400 with the
    /// `axum` feature).
    Reject,
}

/// Applies [`LockService`]: every request runs under the lock of its key.
///
/// ```
/// use lockflight::layer::{LockLayer, MissingKey};
/// use lockflight::{Locker, MemoryBackend, layer::HeaderKey};
///
/// # fn main() -> lockflight::Result<()> {
/// let locker = Locker::builder(MemoryBackend::new()).build()?;
/// let layer = LockLayer::new(locker, HeaderKey::new(http::HeaderName::from_static("x-sku")))
///     .missing_key(MissingKey::Reject);
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct LockLayer<E> {
    locker: Locker,
    extractor: E,
    missing: MissingKey,
    options: LockOptions,
}

impl<E> LockLayer<E> {
    /// Locks with `locker`, keyed by `extractor`.
    pub fn new(locker: Locker, extractor: E) -> Self {
        LockLayer {
            locker,
            extractor,
            missing: MissingKey::default(),
            options: LockOptions::default(),
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
    /// use lockflight::{LockOptions, Locker, MemoryBackend, layer::HeaderKey};
    ///
    /// # fn main() -> lockflight::Result<()> {
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let sku = HeaderKey::new(http::HeaderName::from_static("x-sku"));
    /// let fail_fast = LockLayer::new(locker, sku).options(LockOptions::new().try_only());
    /// # let _ = fail_fast;
    /// # Ok(()) }
    /// ```
    ///
    /// [`Error::Busy`]: crate::Error::Busy
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// What to do with requests that have no key (default: pass through).
    pub fn missing_key(mut self, policy: MissingKey) -> Self {
        self.missing = policy;
        self
    }
}

impl<S, E: Clone> Layer<S> for LockLayer<E> {
    type Service = LockService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService::new(
            inner,
            self.locker.clone(),
            self.extractor.clone(),
            self.missing,
        )
        .with_options(self.options)
    }
}
