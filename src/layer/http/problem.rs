//! One body format for every response lockflight's HTTP layer produces: RFC 9457
//! problem details (`application/problem+json`) with a stable `code` member.

use std::borrow::Cow;
use std::fmt::Write as _;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The media type of every error body lockflight's HTTP layer writes.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An [RFC 9457](https://www.rfc-editor.org/rfc/rfc9457) problem details response:
/// the one body format of every response the lock layer, [`Locked`](crate::layer::Locked)
/// and [`handle_error`](crate::layer::handle_error) produce (feature `axum`).
///
/// ```json
/// {"type":"about:blank","title":"Service Unavailable","status":503,
///  "code":"lock_timeout","detail":"The resource is locked by another request; retry later."}
/// ```
///
/// `type` is `about:blank` (so `title` is the status's reason phrase); the
/// extension member `code` is the stable, machine-readable part (the table is on
/// `IntoResponse for Error`), `detail` a fixed sentence per code that never quotes
/// the key, the request or the backend. Use it for your own errors to give clients
/// one format:
///
/// ```
/// use axum::http::StatusCode;
/// use axum::response::IntoResponse;
/// use lockflight::layer::Problem;
///
/// let res = Problem::new(StatusCode::CONFLICT, "out_of_stock")
///     .detail("Not enough units left.")
///     .into_response();
/// assert_eq!(res.status(), StatusCode::CONFLICT);
/// assert_eq!(res.headers()["content-type"], "application/problem+json");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Problem {
    status: StatusCode,
    code: Cow<'static, str>,
    detail: Option<Cow<'static, str>>,
    retry_after: Option<u32>,
}

impl Problem {
    /// A problem with this status and stable `code`.
    pub fn new(status: StatusCode, code: impl Into<Cow<'static, str>>) -> Self {
        Problem {
            status,
            code: code.into(),
            detail: None,
            retry_after: None,
        }
    }

    /// A sentence for humans (`detail`): never put secrets or request data in it.
    pub fn detail(mut self, detail: impl Into<Cow<'static, str>>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Adds `Retry-After: <seconds>`.
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The JSON body.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use lockflight::layer::Problem;
    ///
    /// let body = Problem::new(StatusCode::BAD_REQUEST, "invalid_key").to_json();
    /// assert_eq!(
    ///     body,
    ///     r#"{"type":"about:blank","title":"Bad Request","status":400,"code":"invalid_key"}"#
    /// );
    /// ```
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(160);
        out.push_str(r#"{"type":"about:blank","title":"#);
        push_json_str(
            &mut out,
            self.status.canonical_reason().unwrap_or("Unknown Status"),
        );
        let _ = write!(out, r#","status":{},"code":"#, self.status.as_u16());
        push_json_str(&mut out, &self.code);
        if let Some(detail) = &self.detail {
            out.push_str(r#","detail":"#);
            push_json_str(&mut out, detail);
        }
        out.push('}');
        out
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut res = (self.status, self.to_json()).into_response();
        let headers = res.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        res
    }
}

/// Appends `s` as a JSON string literal.
fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped() {
        let body = Problem::new(StatusCode::IM_A_TEAPOT, "c\"o\\de")
            .detail("line\nbreak\u{1}")
            .to_json();
        assert_eq!(
            body,
            r#"{"type":"about:blank","title":"I'm a teapot","status":418,"code":"c\"o\\de","detail":"line\nbreak\u0001"}"#
        );
    }
}
