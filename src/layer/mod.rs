//! Tower middleware and axum glue: lock per request key, and share responses of
//! identical reads.
//!
//! * [`LockLayer`] wraps a service so that each request runs while holding the lock
//!   of its key (found by a [`KeyExtractor`]; with axum, [`KeyFrom`] takes it
//!   from the router's own path parameters). A request without a key is refused
//!   (unless [`run_unlocked_without_key`](LockLayer::run_unlocked_without_key)). What happens when the lease is lost while the handler runs
//!   depends on the locker's [`LossPolicy`](crate::LossPolicy), see
//!   [Lease loss](#lease-loss).
//! * [`Locked`] (feature `axum`), with [`LockLayer::lock_in_handler`], takes the
//!   lock in the handler, once the request's body is received and valid.
//! * [`SharedResponseLayer`] makes concurrent identical reads (same key) share one
//!   execution and one buffered response.
//! * [`IdempotencyLayer`] runs a request with an idempotency key once across the
//!   fleet, and stores and replays its response ([`idempotency`]).
//!
//! Each service has a named response future: [`future::ResponseFuture`],
//! [`shared_response::future::ResponseFuture`] and
//! [`idempotency::future::ResponseFuture`].
//!
//! # With axum
//!
//! **Handlers without a body**: the layer takes the lock before the handler runs.
//! Install it with `route_layer`, not `layer` (only matched routes lock, and
//! [`KeyFrom`] sees the router's parameters), and finish it with
//! [`handle_errors`](LockLayer::handle_errors), which turns lockflight's errors
//! into `application/problem+json` responses ([`Problem`]):
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # fn app(locker: lockflight::Locker) -> axum::Router {
//! use axum::{Extension, Router, routing::delete};
//! use lockflight::guard::LockInfo;
//! use lockflight::layer::{LockLayer, KeyFrom};
//!
//! async fn cancel(Extension(lock): Extension<LockInfo>) -> String {
//!     format!("cancelled {} under {}", lock.key, lock.fencing_token)
//! }
//!
//! Router::new()
//!     .route("/orders/{id}", delete(cancel))
//!     .route_layer(LockLayer::new(locker, KeyFrom::path_param("id")).handle_errors())
//! # }
//! ```
//!
//! **Handlers with a body**: add [`lock_in_handler`](LockLayer::lock_in_handler)
//! and take the body through [`Locked`], the handler's last argument. The body is
//! received and validated *before* the lock is taken: a slow upload holds no lock,
//! a malformed request takes none:
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # fn app(locker: lockflight::Locker) -> axum::Router {
//! use axum::{Json, Router, routing::post};
//! use lockflight::layer::{LockLayer, Locked, KeyFrom};
//!
//! async fn debit(Locked(Json(body), lock): Locked<Json<serde_json::Value>>) -> String {
//!     format!("debit {body} under {}", lock.fencing_token)
//! }
//!
//! Router::new()
//!     .route("/accounts/{id}/debit", post(debit))
//!     .route_layer(
//!         LockLayer::new(locker, KeyFrom::path_param("id"))
//!             .key_prefix("account:")
//!             .lock_in_handler()
//!             .handle_errors(),
//!     )
//! # }
//! ```
//!
//! Bound the time a client may take to send its body outside lockflight (for
//! example `tower_http::timeout::RequestBodyTimeoutLayer`): with `Locked` a slow
//! body costs a connection, never a lock.
//!
//! # Error responses
//!
//! Every response the layer, [`Locked`] and [`handle_error`] produce is an RFC 9457
//! problem (`application/problem+json`) with a short stable `code`
//! (`lock_timeout`, `lock_backend_unavailable`, `invalid_key`, …), never the
//! error's text; the table is on `IntoResponse for Error`. An unreachable backend
//! is `503 lock_backend_unavailable`, not a lock timeout: see
//! [`LockService`'s errors](LockService#errors).
//!
//! # Lease loss
//!
//! With the default [`LossPolicy::Abort`](crate::LossPolicy::Abort), a handler
//! whose lease is lost is dropped at its next `.await`, and the call fails with
//! [`Error::LeaseLost`](crate::Error::LeaseLost) (`503 lease_lost`). With
//! [`LossPolicy::Signal`](crate::LossPolicy::Signal) the handler runs to its end
//! and decides for itself: the `loss` field of its
//! [`LockInfo`](crate::guard::LockInfo) is a [`LossSignal`](crate::guard::LossSignal). Check it
//! before each write the lock protects, and pass the fencing token along, so that
//! the resource rejects a write that comes too late anyway:
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # fn app() -> lockflight::Result<axum::Router> {
//! use axum::{http::StatusCode, routing::post, Extension, Router};
//! use lockflight::layer::{LockLayer, KeyFrom};
//! use lockflight::{FencingToken, Locker, LossPolicy, MemoryBackend, guard::LockInfo};
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
//!     .route_layer(LockLayer::new(locker, KeyFrom::path_param("sku")).handle_errors()))
//! # }
//! ```

// The axum items these docs link to exist with the `axum` feature only.
#![cfg_attr(not(feature = "axum"), allow(rustdoc::broken_intra_doc_links))]

mod edge;
pub mod future;
mod http;
pub mod idempotency;
#[allow(clippy::module_inception)]
mod layer;
mod request;
mod service;
mod settings;
mod shared_error;
pub mod shared_response;
mod ticket;

pub use self::http::KeyFrom;
#[cfg(feature = "axum")]
pub use self::http::{Locked, PROBLEM_JSON, Problem, handle_error};
pub use self::idempotency::{IdempotencyLayer, IdempotencyService};
pub use self::layer::LockLayer;
pub use self::service::LockService;
pub use self::shared_response::{SharedResponseLayer, SharedResponseService};
pub use crate::key::{KeyExtractor, NoKey};
