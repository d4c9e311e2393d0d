//! Tower middleware: lock per request key, and share responses of identical reads.
//!
//! * [`LockLayer`] wraps a service so that each request runs while holding the lock
//!   of its key (found by a [`KeyExtractor`]). The handler
//!   finds a [`LockInfo`](crate::guard::LockInfo) (key, fencing token and loss signal) in
//!   the request extensions. What happens when the lease is lost while the handler
//!   runs depends on the locker's [`LossPolicy`](crate::LossPolicy), see
//!   [Lease loss](#lease-loss); a wait timeout fails with
//!   [`Error::Timeout`](crate::Error::Timeout).
//! * [`SharedResponseLayer`] makes concurrent identical reads (same key) share one
//!   execution and one buffered response.
//!
//! # With axum
//!
//! Use `route_layer`, not `layer`, so that only matched routes lock (and the
//! `PathParam` extractor sees the matched route), and map errors with
//! `handle_error` (feature `axum`), which turns lockflight's errors into 503 / 400
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
//!
//! Error responses carry a short stable code (`lock_timeout`, `lease_lost`, …), never
//! the error's text; the table is on `IntoResponse for Error`.
//!
//! # Lease loss
//!
//! With the default [`LossPolicy::Abort`](crate::LossPolicy::Abort), a handler
//! whose lease is lost is dropped at its next `.await`, and the call fails with
//! [`Error::LeaseLost`](crate::Error::LeaseLost) (`503 lease_lost` through
//! `handle_error`). With [`LossPolicy::Signal`](crate::LossPolicy::Signal) the
//! handler runs to its end and decides for itself: the `loss` field of its
//! [`LockInfo`](crate::guard::LockInfo) is a [`LossSignal`](crate::guard::LossSignal). Check it
//! before each write the lock protects, and pass the fencing token along, so that
//! the resource rejects a write that comes too late anyway:
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # fn app() -> lockflight::Result<axum::Router> {
//! use axum::{error_handling::HandleErrorLayer, http::StatusCode, routing::post, Extension, Router};
//! use lockflight::layer::{handle_error, LockLayer, PathParam};
//! use lockflight::{FencingToken, Locker, LossPolicy, MemoryBackend, guard::LockInfo};
//! use tower::ServiceBuilder;
//!
//! async fn reserve(Extension(info): Extension<LockInfo>) -> (StatusCode, &'static str) {
//!     let stock = load_stock().await;
//!     if info.loss.is_lost() {
//!         // Another holder may be writing by now: do not write unprotected.
//!         return (StatusCode::CONFLICT, "lock lost, retry");
//!     }
//!     save_stock(stock - 1, info.fencing_token).await;
//!     (StatusCode::OK, "reserved")
//! }
//! # async fn load_stock() -> u32 { 1 }
//! # async fn save_stock(_qty: u32, _fence: FencingToken) {}
//!
//! let locker = Locker::builder(MemoryBackend::new())
//!     .on_loss(LossPolicy::Signal)
//!     .build()?;
//! Ok(Router::new()
//!     .route("/items/{sku}/reserve", post(reserve))
//!     .route_layer(
//!         ServiceBuilder::new()
//!             .layer(HandleErrorLayer::new(handle_error))
//!             .layer(LockLayer::new(locker, PathParam::new("sku"))),
//!     ))
//! # }
//! ```

#[cfg(feature = "axum")]
mod axum;
pub mod future;
#[allow(clippy::module_inception)]
mod layer;
mod service;
mod shared_response;

#[cfg(feature = "axum")]
pub use self::axum::{PathParam, handle_error};
pub use crate::key::{HeaderKey, KeyExtractor, PathSegment};
pub use layer::{LockLayer, MissingKey};
pub use service::{LockService, WithLockInfo};
pub use shared_response::{SharedBody, SharedResponseLayer, SharedResponseService};

/// The error type of lockflight's services: inner errors and [`crate::Error`]s,
/// boxed (downcast to [`crate::Error`] to tell them apart).
pub type BoxError = tower::BoxError;
