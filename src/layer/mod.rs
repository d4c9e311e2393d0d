//! Tower middleware: lock per request key, and share responses of identical reads.
//!
//! * [`LockLayer`] wraps a service so that each request runs while holding the lock
//!   of its key (found by a [`KeyExtractor`](crate::KeyExtractor)). The handler
//!   finds a [`LockInfo`](crate::LockInfo) (key and fencing token) in the request
//!   extensions. If the lease is lost while the handler runs, its future is dropped
//!   and the call fails with [`Error::LeaseLost`](crate::Error::LeaseLost); a wait
//!   timeout fails with [`Error::Timeout`](crate::Error::Timeout).
//! * [`CoalesceLayer`] makes concurrent identical reads (same key) share one
//!   execution and one buffered response.
//!
//! # With axum
//!
//! Use `route_layer`, not `layer`, so that only matched routes lock (and the
//! [`PathParam`] extractor sees the matched route), and map errors with
//! [`handle_error`] (feature `axum`), which turns lockflight's errors into 503 / 400
//! responses:
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # fn app(locker: lockflight::Locker) -> axum::Router {
//! use axum::{error_handling::HandleErrorLayer, routing::post, Router};
//! use lockflight::layer::{handle_error, LockLayer, PathParam};
//! use tower::ServiceBuilder;
//!
//! Router::new()
//!     .route("/items/{sku}/reserve", post(|| async { "reserved" }))
//!     .route_layer(
//!         ServiceBuilder::new()
//!             .layer(HandleErrorLayer::new(handle_error))
//!             .layer(LockLayer::new(locker, PathParam::new("sku"))),
//!     )
//! # }
//! ```

#[cfg(feature = "axum")]
mod axum;
mod coalesce;
pub mod future;
#[allow(clippy::module_inception)]
mod layer;
mod service;

#[cfg(feature = "axum")]
pub use self::axum::{PathParam, handle_error};
pub use coalesce::{CoalesceLayer, CoalesceService, CoalescedBody};
pub use layer::{LockLayer, MissingKey};
pub use service::{LockService, WithLockInfo};

/// The error type of lockflight's services: inner errors and [`crate::Error`]s,
/// boxed (downcast to [`crate::Error`] to tell them apart).
pub type BoxError = tower::BoxError;
