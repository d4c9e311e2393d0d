//! The tower layers with mock inner services: readiness, guard lifetime, key
//! policies, error mapping, lease loss, response sharing, idempotent requests,
//! and the named response futures and accessors.

mod errors;
mod guard;
mod idempotency;
mod loss;
mod mocks;
mod named;
mod readiness;
mod sharing;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use lockflight::layer::{LockLayer, SharedResponseLayer};
use lockflight::{
    Error, LockKey, Locker, MemoryBackend, RedisBackend, guard::LockInfo, layer::KeyFrom,
};
use testkit::{is_free, wait_until};
use tower::{Layer, Service, ServiceExt, service_fn};

use mocks::{Broken, DropFlag, OnePermit, Picky};

/// Panics (showing `err`) unless `err` is a lockflight [`Error`] that `is` accepts.
fn assert_lockflight_error(err: &tower::BoxError, is: fn(&Error) -> bool) {
    assert!(err.downcast_ref::<Error>().is_some_and(is), "{err}");
}

fn memory_locker() -> Locker {
    Locker::builder(MemoryBackend::new())
        .wait_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

fn sku_header() -> KeyFrom {
    KeyFrom::header(http::HeaderName::from_static("x-sku"))
}

fn request(sku: Option<&str>) -> Request<()> {
    let mut b = Request::builder().uri("/items");
    if let Some(sku) = sku {
        b = b.header("x-sku", sku);
    }
    b.body(()).unwrap()
}

/// Waits (up to 2 s) until `key` is free: a finished request releases in the
/// background.
async fn becomes_free(locker: &Locker, key: &str) -> bool {
    wait_until(Duration::from_secs(2), || async {
        is_free(locker, key).await
    })
    .await
}

/// Waits (up to 2 s) until the locker keeps no per-key state: slots go when the
/// background release that follows a request is done.
async fn no_active_keys(locker: &Locker) -> bool {
    wait_until(Duration::from_secs(2), || async {
        locker.stats().keys_in_use == 0
    })
    .await
}
