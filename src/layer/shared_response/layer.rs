//! [`SharedResponseLayer`]: the layer and its settings.

use tower_layer::Layer;

use super::service::SharedResponseService;
use crate::locker::Locker;

/// Applies [`SharedResponseService`]: concurrent requests with the same key share one
/// execution of the inner service and one buffered response.
///
/// For idempotent reads (`GET /items/{sku}`): under a burst, one request per key
/// runs — under the key's distributed lock, so it never overlaps a writer that holds
/// the same lock — and the others receive a copy of its response. Responses whose
/// body is larger than `max_body` (or of unknown size) are not shared: the other
/// callers then run their own requests.
///
/// ```
/// use lockflight::layer::SharedResponseLayer;
/// use lockflight::{Locker, MemoryBackend, layer::KeyFrom};
///
/// # fn main() -> lockflight::Result<()> {
/// let locker = Locker::builder(MemoryBackend::new()).build()?;
/// let layer = SharedResponseLayer::new(locker, KeyFrom::path_segment(1)).max_body(256 * 1024);
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct SharedResponseLayer<E> {
    locker: Locker,
    extractor: E,
    max_body: usize,
}

impl<E> SharedResponseLayer<E> {
    /// Default bound on a shared body, in bytes.
    pub const DEFAULT_MAX_BODY: usize = 64 * 1024;

    /// Shares responses through `locker`, keyed by `extractor`. Requests without a key
    /// are not shared: each runs on its own, without a lock (reads only: a read is
    /// not serialised with the key's writers then).
    pub fn new(locker: Locker, extractor: E) -> Self {
        SharedResponseLayer {
            locker,
            extractor,
            max_body: Self::DEFAULT_MAX_BODY,
        }
    }

    /// Largest body that is buffered and shared (default 64 KiB).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }
}

impl<S, E: Clone> Layer<S> for SharedResponseLayer<E> {
    type Service = SharedResponseService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        SharedResponseService::new(
            inner,
            self.locker.clone(),
            self.extractor.clone(),
            self.max_body,
        )
    }
}
