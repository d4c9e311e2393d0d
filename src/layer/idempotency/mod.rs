//! [`IdempotencyLayer`]: a request with an idempotency key runs once across the
//! fleet; its response is stored and replayed.
//!
//! A client that retries a `POST` after a timeout, a double submit, a queue's
//! redelivery: each sends the same `Idempotency-Key` (the IETF httpapi draft
//! "The Idempotency-Key HTTP Header Field"). The first request runs its handler
//! under a lease on the key; its response (status, the headers named by
//! [`store_headers`](IdempotencyLayer::store_headers), the body) is stored for
//! the [`retention`](IdempotencyLayer::retention), with a write fenced by the
//! lease's fencing token, and every later request with the key gets it back.
//!
//! # The key and the request
//!
//! The key comes from the `Idempotency-Key` header (or any extractor:
//! [`key_from`](IdempotencyLayer::key_from)), scoped by the method and the
//! matched route (axum's `MatchedPath`, else the path) and an optional
//! [`key_prefix`](IdempotencyLayer::key_prefix): the lock key is
//! `<prefix>idempotency:<METHOD> <route> <key>`. The request's fingerprint is
//! SHA-256 of its method, its path with the query, and its body, which is
//! buffered up to [`max_body`](IdempotencyLayer::max_body). The handler finds
//! the lease's [`LockInfo`](crate::guard::LockInfo) (its key and fencing token)
//! in the request's extensions, to fence its own writes.
//!
//! # Answers
//!
//! | case | answer |
//! |---|---|
//! | no key, not [`required`](IdempotencyLayer::required) | runs untouched, nothing stored |
//! | no key, required | `400 idempotency_key_missing` |
//! | key too long, or not visible ASCII | `400 invalid_idempotency_key` |
//! | body larger than `max_body` | `413 idempotency_body_too_large` (never hashed in part) |
//! | first request with the key | runs; its response is stored unless retryable |
//! | later request, same fingerprint | the stored response, byte for byte, with `idempotent-replayed: true` (one backend round trip) |
//! | later request, another fingerprint | `422 idempotency_key_reused` |
//! | duplicate in this process while the first runs | waits for the first and gets a copy of its response, marked `idempotent-replayed: true`, with no backend request of its own; another fingerprint: `422` once the first ends |
//! | duplicate in another instance while the first runs | waits up to [`wait`](IdempotencyLayer::wait) for the first's lease, woken by its release, then replays the stored response; past the wait, `409 idempotency_request_in_progress` with `Retry-After` |
//! | retryable response (default 5xx), handler error, panic, cancellation | not stored; the lease is released, so a retry runs again |
//! | the lease is lost while the handler runs | with the locker's [`LossPolicy::Abort`](crate::LossPolicy::Abort) (the default) the handler is dropped at its next `.await`: [`Error::LeaseLost`](crate::Error::LeaseLost) (`503 lease_lost`), nothing stored; with [`LossPolicy::Signal`](crate::LossPolicy::Signal) it runs on, and its store is fenced |
//! | the backend does not answer | the lock layer's outage answer (`503 lock_backend_unavailable` through [`handle_errors`](IdempotencyLayer::handle_errors)); the handler does not run |
//!
//! Every refusal is an RFC 9457 problem (`application/problem+json`) with a
//! stable `code`, as the lock layer's. A duplicate with another fingerprint is
//! `422`, not `409`, even while the first still runs: the key is reused for
//! another request whatever the first's state, and a client must not retry it.
//!
//! # Backends
//!
//! The records live in the lock's backend: [`MemoryBackend`](crate::MemoryBackend)
//! (shared by the lockers of its clones), [`RedisBackend`](crate::RedisBackend)
//! on one server, a Cluster (the record is one hash in the lock's hash tag) and
//! Sentinel, and the test kit's simulated server. [`RedlockBackend`](crate::backend::RedlockBackend)
//! has none: the first request fails with [`Error::Unsupported`](crate::Error::Unsupported).
//!
//! # What it cannot promise
//!
//! * A process that dies while its handler runs leaves no stored response: the
//!   retry runs the handler again once the lease has expired. Side effects
//!   outside writes fenced with the request's fencing token may happen twice.
//! * A handler whose lease is lost while it runs (a pause longer than the
//!   lease's TTL, which it does not see; or under `LossPolicy::Signal`) may run
//!   beside a newer request with the key; the newer one's fence on the record
//!   refuses the older one's response, which is then answered with the stored
//!   one (or `409`). Only fenced writes keep the resource right.
//! * A response that could not be stored (the backend failed after the
//!   handler ran, a body over [`max_response`](IdempotencyLayer::max_response))
//!   is answered, and a retry runs again.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use lockflight::layer::IdempotencyLayer;
//! use lockflight::{Locker, MemoryBackend, guard::LockInfo};
//! use tower::{Layer, ServiceExt, service_fn};
//!
//! let locker = Locker::builder(MemoryBackend::new()).build()?;
//! let pay = service_fn(|req: http::Request<Full<Bytes>>| async move {
//!     // Fence your own writes with the lease's token.
//!     let token = req.extensions().get::<LockInfo>().unwrap().fencing_token;
//!     Ok::<_, tower::BoxError>(http::Response::new(Full::new(Bytes::from(format!("paid under {token}")))))
//! });
//! let svc = IdempotencyLayer::new(locker).required().layer(pay);
//! let post = || {
//!     http::Request::post("/payments")
//!         .header("idempotency-key", "b2c5f1")
//!         .body(Full::new(Bytes::from_static(b"{\"amount\":5}")))
//!         .unwrap()
//! };
//! let first = svc.clone().oneshot(post()).await?;
//! let again = svc.clone().oneshot(post()).await?;
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! assert_eq!(
//!     first.into_body().collect().await?.to_bytes(),
//!     again.into_body().collect().await?.to_bytes(),
//! );
//! # Ok(()) }
//! ```

pub mod future;
#[allow(clippy::module_inception)]
mod layer;
mod record;
mod refusal;
mod run;
mod service;
mod settings;
#[cfg(test)]
mod tests;

pub use self::layer::IdempotencyLayer;
pub use self::service::IdempotencyService;
