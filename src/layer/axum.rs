//! axum integration (feature `axum`): HTTP responses for lockflight's errors, and a
//! key extractor for a route's path parameter.

use axum::extract::MatchedPath;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::BoxError;
use crate::error::Error;
use crate::key::{KeyExtractor, LockKey};

impl IntoResponse for Error {
    /// * 503 with `Retry-After: 1` for [`Error::Timeout`] and [`Error::Overloaded`];
    /// * 503 for a lost lease, an unreachable backend or a missing quorum;
    /// * 400 for an invalid key;
    /// * 500 for everything else (foreign values, permissions, configuration, panics).
    ///
    /// The body is the error's message.
    fn into_response(self) -> Response {
        let status = match &self {
            Error::Timeout { .. } | Error::Overloaded { .. } => {
                let mut res = (StatusCode::SERVICE_UNAVAILABLE, self.to_string()).into_response();
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return res;
            }
            Error::LeaseLost { .. }
            | Error::Backend { .. }
            | Error::Connect { .. }
            | Error::QuorumNotReached { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Error::InvalidKey { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, self.to_string()).into_response()
    }
}

/// Turns a service error into a response: lockflight's [`Error`]s through their
/// [`IntoResponse`], anything else as 500. Made for
/// `axum::error_handling::HandleErrorLayer::new(handle_error)`.
///
/// # Cancel safety
///
/// Cancel safe: it completes on its first poll and holds nothing.
pub async fn handle_error(err: BoxError) -> Response {
    match err.downcast::<Error>() {
        Ok(e) => e.into_response(),
        Err(other) => (StatusCode::INTERNAL_SERVER_ERROR, other.to_string()).into_response(),
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
/// use lockflight::{KeyExtractor, LockKey};
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
    use super::*;
    use std::time::Duration;

    #[test]
    fn statuses() {
        let key = LockKey::from("k");
        let timeout = Error::Timeout {
            key: key.clone(),
            phase: crate::Phase::Acquiring,
            waited: Duration::from_secs(5),
        }
        .into_response();
        assert_eq!(timeout.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(timeout.headers()[header::RETRY_AFTER], "1");
        let lost = Error::LeaseLost {
            key: key.clone(),
            phase: crate::Phase::Renewing,
            reason: "gone".into(),
        }
        .into_response();
        assert_eq!(lost.status(), StatusCode::SERVICE_UNAVAILABLE);
        let bad = LockKey::from("").validate().unwrap_err().into_response();
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    }
}
