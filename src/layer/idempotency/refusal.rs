//! The idempotency layer's own answers: RFC 9457 problems
//! (`application/problem+json`) with a stable `code`, in the format of the lock
//! layer's problems, written without axum (the layer needs no feature).

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::Full;

/// Why the layer answers a request itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// `400 idempotency_key_missing`: the layer requires a key and the request
    /// has none.
    Missing,
    /// `400 invalid_idempotency_key`: too long, or not visible ASCII.
    InvalidKey,
    /// `413 idempotency_body_too_large`: the body is larger than the layer
    /// buffers to fingerprint it.
    BodyTooLarge,
    /// `422 idempotency_key_reused`: the key was used for another request
    /// (another method, path or body).
    Reused,
    /// `409 idempotency_request_in_progress` with `Retry-After`: a request with
    /// this key runs elsewhere and did not end within the layer's wait.
    InProgress {
        /// Seconds for `Retry-After`.
        retry_after: u32,
    },
}

impl Refusal {
    fn parts(self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Refusal::Missing => (
                StatusCode::BAD_REQUEST,
                "idempotency_key_missing",
                "This request needs an Idempotency-Key.",
            ),
            Refusal::InvalidKey => (
                StatusCode::BAD_REQUEST,
                "invalid_idempotency_key",
                "The idempotency key is too long or not visible ASCII.",
            ),
            Refusal::BodyTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "idempotency_body_too_large",
                "The body is too large for an idempotent request.",
            ),
            Refusal::Reused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "This idempotency key was used for another request.",
            ),
            Refusal::InProgress { .. } => (
                StatusCode::CONFLICT,
                "idempotency_request_in_progress",
                "A request with this idempotency key is in progress; retry later.",
            ),
        }
    }

    /// The problem response.
    pub(super) fn response(self) -> http::Response<Full<Bytes>> {
        let (status, code, detail) = self.parts();
        // `code` and `detail` are fixed ASCII without quotes or backslashes.
        let body = format!(
            r#"{{"type":"about:blank","title":"{}","status":{},"code":"{code}","detail":"{detail}"}}"#,
            status.canonical_reason().unwrap_or("Unknown Status"),
            status.as_u16(),
        );
        let mut res = http::Response::new(Full::new(Bytes::from(body)));
        *res.status_mut() = status;
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Refusal::InProgress { retry_after } = self {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn a_refusal_is_a_problem_with_its_code() {
        let res = Refusal::InProgress { retry_after: 2 }.response();
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(res.headers()["retry-after"], "2");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            body,
            r#"{"type":"about:blank","title":"Conflict","status":409,"code":"idempotency_request_in_progress","detail":"A request with this idempotency key is in progress; retry later."}"#
        );
    }
}
