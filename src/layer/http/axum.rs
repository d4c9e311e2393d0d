//! axum integration (feature `axum`): problem responses for lockflight's errors,
//! [`handle_error`], and the layers' `handle_errors()`.
//!
//! The `handle_errors()` methods of [`LockLayer`] and [`SharedResponseLayer`] are
//! written here, so that the layers import nothing of the HTTP side.

use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tower::BoxError;

use super::problem::Problem;
use crate::error::Error;
use crate::layer::edge::is_outage;
use crate::layer::{LockLayer, SharedResponseLayer};

/// The status of `e`: the table in the docs of `IntoResponse for Error`.
/// Exhaustive on purpose: a new variant does not compile until it has a status.
fn status(e: &Error) -> StatusCode {
    const BUSY: StatusCode = StatusCode::SERVICE_UNAVAILABLE;
    const INTERNAL: StatusCode = StatusCode::INTERNAL_SERVER_ERROR;
    match e {
        Error::Timeout { .. }
        | Error::Busy { .. }
        | Error::Overloaded { .. }
        | Error::LeaseLost { .. }
        | Error::Refused { .. }
        | Error::Backend { .. }
        | Error::QuorumNotReached { .. }
        | Error::Connect { .. } => BUSY,
        Error::InvalidKey { .. } => StatusCode::BAD_REQUEST,
        Error::ForeignValue { .. }
        | Error::NoPermission { .. }
        | Error::InvalidConfig { .. }
        | Error::Panicked { .. }
        | Error::Reentrant { .. }
        | Error::Unsupported { .. }
        | Error::PermitMismatch { .. } => INTERNAL,
    }
}

/// The `detail` of `e`'s response: a fixed sentence per code.
fn detail(e: &Error) -> &'static str {
    match e {
        Error::Timeout { .. } | Error::Busy { .. } => {
            "The resource is locked by another request; retry later."
        }
        Error::Overloaded { .. } => "Too many requests wait for this resource; retry later.",
        Error::LeaseLost { .. } => {
            "The request was stopped: its lock was lost before it finished; it may have partly run."
        }
        Error::Backend { .. } | Error::Connect { .. } | Error::QuorumNotReached { .. } => {
            "The lock service is unavailable; retry later."
        }
        Error::Refused { .. } => "The lock service refused the request; retry later.",
        Error::InvalidKey { .. } => "The request does not name a valid resource to lock.",
        _ => "The server could not lock this resource; its log says why.",
    }
}

/// Whether `e` is a busy lock (answered with `Retry-After`, logged at `DEBUG`).
fn is_busy(e: &Error) -> bool {
    matches!(
        e,
        Error::Timeout { .. } | Error::Busy { .. } | Error::Overloaded { .. }
    )
}

/// The code of an error that is not lockflight's.
const INTERNAL_CODE: &str = "internal";

impl From<&Error> for Problem {
    /// The problem response of `e`: its status, its [`code`](Error::code), a fixed
    /// `detail`; the table is on `IntoResponse for Error`.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use lockflight::{Error, LockKey, layer::Problem};
    ///
    /// let problem = Problem::from(&Error::Busy { key: LockKey::from("sku:1") });
    /// assert_eq!((problem.status(), problem.code()), (StatusCode::SERVICE_UNAVAILABLE, "lock_busy"));
    /// ```
    fn from(e: &Error) -> Problem {
        let problem = Problem::new(status(e), e.code()).detail(detail(e));
        if is_busy(e) || is_outage(e) {
            problem.retry_after(1)
        } else {
            problem
        }
    }
}

impl IntoResponse for Error {
    /// An `application/problem+json` response ([`Problem`]) whose `code` is short
    /// and stable — never the error's message, which names the key and may quote the
    /// Redis server. The full error goes to `tracing` (target
    /// `lockflight::layer::axum`): at `WARN` for server errors, at `DEBUG` for a busy
    /// lock, for an unreachable backend (the lock layer logs the outage's start and
    /// end at `WARN`, once each) and for bad requests.
    ///
    /// | error | status | `code` |
    /// |---|---|---|
    /// | [`Error::Timeout`] | 503, `Retry-After: 1` | `lock_timeout` |
    /// | [`Error::Overloaded`] | 503, `Retry-After: 1` | `lock_overloaded` |
    /// | [`Error::Busy`] (fail-fast routes) | 503, `Retry-After: 1` | `lock_busy` |
    /// | [`Error::Backend`] (unreachable, no answer, also a wait timeout while the backend does not answer) | 503, `Retry-After: 1` | `lock_backend_unavailable` |
    /// | [`Error::Connect`] | 503, `Retry-After: 1` | `lock_backend_unreachable` |
    /// | [`Error::QuorumNotReached`] | 503, `Retry-After: 1` | `quorum_not_reached` |
    /// | [`Error::LeaseLost`] | 503 | `lease_lost` |
    /// | [`Error::Refused`] (`OOM`, `READONLY`, …) | 503 | `lock_refused` |
    /// | [`Error::InvalidKey`] (also a request without its key) | 400 | `invalid_key` |
    /// | [`Error::ForeignValue`] | 500 | `foreign_value` |
    /// | [`Error::NoPermission`] | 500 | `no_permission` |
    /// | [`Error::InvalidConfig`] (also a route that yields no key) | 500 | `invalid_config` |
    /// | [`Error::Panicked`] | 500 | `panicked` |
    /// | [`Error::Reentrant`] | 500 | `lock_reentrant` |
    /// | [`Error::Unsupported`] | 500 | `lock_unsupported` |
    /// | [`Error::PermitMismatch`] | 500 | `permit_mismatch` |
    /// | any other error, in [`handle_error`] | 500 | `internal` |
    /// | a body the [`Locked`](crate::layer::Locked) extractor's inner extractor refused | its status | `invalid_request` |
    ///
    /// The codes are part of the API: they change only in a breaking release.
    fn into_response(self) -> Response {
        let problem = Problem::from(&self);
        let (status, code) = (problem.status(), problem.code());
        if status.is_server_error() && !is_busy(&self) && !is_outage(&self) {
            tracing::warn!(code, status = status.as_u16(), error = %self, "lockflight error response");
        } else {
            tracing::debug!(code, status = status.as_u16(), error = %self, "lockflight error response");
        }
        problem.into_response()
    }
}

/// Turns a service error into a problem response: lockflight's [`Error`]s through
/// their [`IntoResponse`] (see the table there), anything else as a 500 whose
/// `code` is `internal`. The full error goes to `tracing`, never to the client.
///
/// [`LockLayer::handle_errors`] puts it in front
/// of lockflight's layers; for services of your own, use
/// `axum::error_handling::HandleErrorLayer::new(handle_error)`.
///
/// # Cancel safety
///
/// Cancel safe: it completes on its first poll and holds nothing.
pub async fn handle_error(err: BoxError) -> Response {
    error_response(err)
}

/// What `handle_errors()` puts in front of a lockflight layer: axum's
/// `HandleErrorLayer` with [`handle_error`], as a nameable function.
pub(crate) type ErrorHandler = fn(BoxError) -> std::future::Ready<Response>;

pub(crate) fn error_handler() -> HandleErrorLayer<ErrorHandler, ()> {
    HandleErrorLayer::new(|err| std::future::ready(error_response(err)))
}

impl<E> LockLayer<E> {
    /// This layer behind axum's `HandleErrorLayer` with [`handle_error`]
    /// (feature `axum`): its errors become problem responses, and the pair goes
    /// into `Router::route_layer` in one call.
    ///
    /// ```
    /// use axum::{Router, routing::delete};
    /// use lockflight::layer::{LockLayer, KeyFrom};
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// # fn main() -> lockflight::Result<()> {
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let app: Router = Router::new()
    ///     .route("/items/{sku}", delete(|| async { "deleted" }))
    ///     .route_layer(LockLayer::new(locker, KeyFrom::path_param("sku")).handle_errors());
    /// # let _ = app;
    /// # Ok(()) }
    /// ```
    pub fn handle_errors(self) -> (HandleErrorLayer<ErrorHandler, ()>, Self) {
        (error_handler(), self)
    }
}

impl<E> SharedResponseLayer<E> {
    /// This layer behind axum's `HandleErrorLayer` with [`handle_error`]
    /// (feature `axum`), as [`LockLayer::handle_errors`].
    pub fn handle_errors(self) -> (HandleErrorLayer<ErrorHandler, ()>, Self) {
        (error_handler(), self)
    }
}

/// [`handle_error`], without the future.
pub(crate) fn error_response(err: BoxError) -> Response {
    match err.downcast::<Error>() {
        Ok(e) => e.into_response(),
        Err(other) => {
            tracing::warn!(code = INTERNAL_CODE, status = 500, error = %other, "service error response");
            Problem::new(StatusCode::INTERNAL_SERVER_ERROR, INTERNAL_CODE)
                .detail("The request failed; the server's log says why.")
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::http::header;

    use super::*;
    use crate::error::Phase;
    use crate::key::LockKey;
    use crate::layer::http::problem::PROBLEM_JSON;

    const KEY: &str = "sku:secret-555";
    const REDIS_TEXT: &str = "OOM command not allowed when used memory > 'maxmemory'";

    fn source() -> crate::error::Source {
        Arc::new(std::io::Error::other(REDIS_TEXT))
    }

    /// One error of every variant, with the code and status it must map to.
    fn every_variant() -> Vec<(Error, &'static str, StatusCode)> {
        let key = LockKey::from(KEY);
        let phase = Phase::Acquiring;
        let busy = StatusCode::SERVICE_UNAVAILABLE;
        let internal = StatusCode::INTERNAL_SERVER_ERROR;
        vec![
            (
                Error::timeout(&key, phase, Duration::from_secs(5)),
                "lock_timeout",
                busy,
            ),
            (
                Error::Overloaded {
                    key: key.clone(),
                    waiters: 10,
                },
                "lock_overloaded",
                busy,
            ),
            (Error::Busy { key: key.clone() }, "lock_busy", busy),
            (
                Error::Reentrant { key: key.clone() },
                "lock_reentrant",
                internal,
            ),
            (
                Error::Unsupported {
                    key: key.clone(),
                    what: "semaphores",
                },
                "lock_unsupported",
                internal,
            ),
            (
                Error::PermitMismatch {
                    key: key.clone(),
                    permits: 4,
                    requested: 5,
                },
                "permit_mismatch",
                internal,
            ),
            (
                Error::LeaseLost {
                    key: key.clone(),
                    phase: Phase::Renewing,
                    reason: REDIS_TEXT.into(),
                },
                "lease_lost",
                busy,
            ),
            (
                Error::InvalidKey {
                    key: key.clone(),
                    reason: "the key is too long".into(),
                },
                "invalid_key",
                StatusCode::BAD_REQUEST,
            ),
            (
                Error::InvalidConfig {
                    reason: REDIS_TEXT.into(),
                },
                "invalid_config",
                internal,
            ),
            (
                Error::ForeignValue {
                    key: key.clone(),
                    phase,
                    detail: REDIS_TEXT.into(),
                },
                "foreign_value",
                internal,
            ),
            (
                Error::NoPermission {
                    key: key.clone(),
                    phase,
                    source: source(),
                },
                "no_permission",
                internal,
            ),
            (
                Error::Refused {
                    key: key.clone(),
                    phase,
                    code: "OOM".into(),
                    source: source(),
                },
                "lock_refused",
                busy,
            ),
            (Error::Panicked { key: key.clone() }, "panicked", internal),
            (
                Error::Connect {
                    target: format!("redis://{KEY}:6379"),
                    source: source(),
                },
                "lock_backend_unreachable",
                busy,
            ),
            (
                Error::Backend {
                    key,
                    phase,
                    source: source(),
                },
                "lock_backend_unavailable",
                busy,
            ),
        ]
    }

    async fn body_of(res: Response) -> String {
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn assert_clean(body: &str) {
        for leak in [KEY, "secret", "LockKey(", "OOM", "maxmemory", "redis://"] {
            assert!(!body.contains(leak), "body {body:?} leaks {leak:?}");
        }
    }

    fn retries(error: &Error) -> bool {
        matches!(
            error,
            Error::Timeout { .. }
                | Error::Busy { .. }
                | Error::Overloaded { .. }
                | Error::Backend { .. }
                | Error::Connect { .. }
                | Error::QuorumNotReached { .. }
        )
    }

    /// The `code` member of a problem body, checking the members every problem has.
    fn problem_code(body: &str, status: StatusCode) -> String {
        let value: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(value["type"], "about:blank", "{body}");
        assert_eq!(value["status"], status.as_u16(), "{body}");
        assert_eq!(value["title"], status.canonical_reason().unwrap(), "{body}");
        assert!(value["detail"].is_string(), "{body}");
        value["code"].as_str().unwrap().to_owned()
    }

    #[tokio::test]
    async fn every_variant_maps_to_its_status_and_a_problem_with_its_code() {
        let mut codes = std::collections::HashSet::new();
        for (error, code, status) in every_variant() {
            assert!(codes.insert(code), "code {code} used twice");
            let res = error.clone().into_response();
            assert_eq!(res.status(), status, "{error:?}");
            assert_eq!(res.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
            assert_eq!(
                res.headers().get(header::RETRY_AFTER).map(|v| v.as_bytes()),
                retries(&error).then_some(&b"1"[..]),
                "{error:?}"
            );
            let body = body_of(res).await;
            assert_eq!(problem_code(&body, status), code, "{error:?}");
            assert_clean(&body);
            // The same through `handle_error`.
            let body = body_of(handle_error(Box::new(error)).await).await;
            assert_eq!(problem_code(&body, status), code);
        }
    }

    #[tokio::test]
    async fn other_errors_are_an_internal_500_without_their_text() {
        let res = handle_error(format!("inner failed on {KEY}: {REDIS_TEXT}").into()).await;
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = body_of(res).await;
        assert_eq!(
            problem_code(&body, StatusCode::INTERNAL_SERVER_ERROR),
            "internal"
        );
        assert_clean(&body);
    }

    /// Captures what a `tracing` subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(f: impl FnOnce()) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn the_full_error_goes_to_tracing() {
        for (error, code, status) in every_variant() {
            let full = error.to_string();
            let log = logged(|| drop(error.clone().into_response()));
            assert!(log.contains(&full), "{log:?} lacks {full:?}");
            assert!(log.contains(code), "{log:?} lacks {code}");
            let quiet = retries(&error);
            let level = if status.is_server_error() && !quiet {
                "WARN"
            } else {
                "DEBUG"
            };
            assert!(
                log.contains(level),
                "{error:?} logged {log:?}, not at {level}"
            );
        }
        let log = logged(|| {
            let res = futures::executor::block_on(handle_error("inner failed".into()));
            drop(res);
        });
        assert!(
            log.contains("WARN") && log.contains("inner failed"),
            "{log:?}"
        );
    }
}
