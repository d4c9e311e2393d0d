//! axum integration (feature `axum`): HTTP responses for lockflight's errors, and a
//! key extractor for a route's path parameter.

use axum::extract::MatchedPath;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::BoxError;
use crate::error::Error;
use crate::key::{KeyExtractor, LockKey};

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

/// The body of a response for an error that is not lockflight's.
const INTERNAL_CODE: &str = "internal";

impl IntoResponse for Error {
    /// A response whose body is a short, stable code — never the error's message,
    /// which names the key and may quote the Redis server. The full error goes to
    /// `tracing` (target `lockflight::layer::axum`): at `WARN` for server errors, at
    /// `DEBUG` for a busy lock (timeout, overload) and for bad requests.
    ///
    /// | error | status | body |
    /// |---|---|---|
    /// | [`Error::Timeout`] | 503, `Retry-After: 1` | `lock_timeout` |
    /// | [`Error::Overloaded`] | 503, `Retry-After: 1` | `lock_overloaded` |
    /// | [`Error::Busy`] (fail-fast routes) | 503, `Retry-After: 1` | `lock_busy` |
    /// | [`Error::LeaseLost`] | 503 | `lease_lost` |
    /// | [`Error::Refused`] (`OOM`, `READONLY`, …) | 503 | `lock_refused` |
    /// | [`Error::Backend`] | 503 | `backend_unavailable` |
    /// | [`Error::Connect`] | 503 | `backend_unreachable` |
    /// | [`Error::InvalidKey`] | 400 | `invalid_key` |
    /// | [`Error::ForeignValue`] | 500 | `foreign_value` |
    /// | [`Error::NoPermission`] | 500 | `no_permission` |
    /// | [`Error::InvalidConfig`] | 500 | `invalid_config` |
    /// | [`Error::Panicked`] | 500 | `panicked` |
    /// | [`Error::Reentrant`] | 500 | `lock_reentrant` |
    /// | [`Error::Unsupported`] | 500 | `lock_unsupported` |
    /// | [`Error::PermitMismatch`] | 500 | `permit_mismatch` |
    /// | any other error, in [`handle_error`] | 500 | `internal` |
    ///
    /// The codes are part of the API: they change only in a breaking release.
    fn into_response(self) -> Response {
        let (status, code) = (status(&self), self.code());
        let busy = matches!(
            self,
            Error::Timeout { .. } | Error::Busy { .. } | Error::Overloaded { .. }
        );
        if status.is_server_error() && !busy {
            tracing::warn!(code, status = status.as_u16(), error = %self, "lockflight error response");
        } else {
            tracing::debug!(code, status = status.as_u16(), error = %self, "lockflight error response");
        }
        let mut res = (status, code).into_response();
        if busy {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        res
    }
}

/// Turns a service error into a response: lockflight's [`Error`]s through their
/// [`IntoResponse`] (a short code per error, see the table there), anything else as
/// a 500 whose body is `internal`. The full error goes to `tracing`, never to the
/// client. Made for `axum::error_handling::HandleErrorLayer::new(handle_error)`.
///
/// # Cancel safety
///
/// Cancel safe: it completes on its first poll and holds nothing.
pub async fn handle_error(err: BoxError) -> Response {
    match err.downcast::<Error>() {
        Ok(e) => e.into_response(),
        Err(other) => {
            tracing::warn!(code = INTERNAL_CODE, status = 500, error = %other, "service error response");
            (StatusCode::INTERNAL_SERVER_ERROR, INTERNAL_CODE).into_response()
        }
    }
}

/// Takes the key from a named parameter of the matched axum route, as it appears in
/// the URI (percent-encoded).
///
/// It reads axum's [`MatchedPath`], which exists only after routing: install the
/// lock layer with `Router::route_layer` (which also keeps unmatched URLs from
/// locking), not `Router::layer`.
///
/// ```
/// use lockflight::layer::PathParam;
/// use lockflight::{LockKey, layer::KeyExtractor};
///
/// let sku = PathParam::new("sku");
/// // Outside a router there is no matched path, hence no key.
/// let req = http::Request::builder().uri("/items/555").body(()).unwrap();
/// assert_eq!(sku.extract(&req), None);
/// ```
#[derive(Clone, Debug)]
pub struct PathParam {
    pattern: String,
}

impl PathParam {
    /// Uses the parameter `name` (`{name}` in the route).
    pub fn new(name: &str) -> Self {
        PathParam {
            pattern: format!("{{{name}}}"),
        }
    }
}

impl<B> KeyExtractor<http::Request<B>> for PathParam {
    fn extract(&self, req: &http::Request<B>) -> Option<LockKey> {
        let route = req.extensions().get::<MatchedPath>()?.as_str();
        let index = route.split('/').position(|seg| seg == self.pattern)?;
        req.uri()
            .path()
            .split('/')
            .nth(index)
            .filter(|s| !s.is_empty())
            .map(LockKey::from)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::error::Phase;

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
                Error::Timeout {
                    key: key.clone(),
                    phase,
                    waited: Duration::from_secs(5),
                },
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
                "backend_unreachable",
                busy,
            ),
            (
                Error::Backend {
                    key,
                    phase,
                    source: source(),
                },
                "backend_unavailable",
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

    #[tokio::test]
    async fn every_variant_maps_to_its_status_and_a_bare_code() {
        let mut codes = std::collections::HashSet::new();
        for (error, code, status) in every_variant() {
            assert!(codes.insert(code), "code {code} used twice");
            let res = error.clone().into_response();
            assert_eq!(res.status(), status, "{error:?}");
            let busy = matches!(
                error,
                Error::Timeout { .. } | Error::Busy { .. } | Error::Overloaded { .. }
            );
            assert_eq!(
                res.headers().get(header::RETRY_AFTER).map(|v| v.as_bytes()),
                busy.then_some(&b"1"[..]),
                "{error:?}"
            );
            let body = body_of(res).await;
            assert_eq!(body, code, "{error:?}");
            assert_clean(&body);
            // The same through `handle_error`.
            let body = body_of(handle_error(Box::new(error)).await).await;
            assert_eq!(body, code);
        }
    }

    #[tokio::test]
    async fn other_errors_are_an_internal_500_without_their_text() {
        let res = handle_error(format!("inner failed on {KEY}: {REDIS_TEXT}").into()).await;
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = body_of(res).await;
        assert_eq!(body, "internal");
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
            let busy = matches!(
                error,
                Error::Timeout { .. } | Error::Busy { .. } | Error::Overloaded { .. }
            );
            let level = if status.is_server_error() && !busy {
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
