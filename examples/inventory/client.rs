//! A small HTTP/1.1 client (hyper-util's pooled legacy client) for the demo and
//! the tests.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Errors of this module.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A keep-alive connection pool; cheap to clone.
#[derive(Clone, Debug)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

/// A buffered response.
#[derive(Clone, Debug)]
pub struct Reply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (`Null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `code` of a problem body (the service's one error format), if any.
    pub fn error_code(&self) -> Option<String> {
        self.json()
            .get("code")
            .and_then(|e| e.as_str())
            .map(str::to_owned)
    }
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    /// A new pool.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Http { client }
    }

    /// Sends a request and buffers the response.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        json: Option<&serde_json::Value>,
    ) -> Result<Reply, BoxError> {
        self.send_with(method, url, json, &[]).await
    }

    /// Like [`send`](Self::send), with extra request headers.
    pub async fn send_with(
        &self,
        method: Method,
        url: &str,
        json: Option<&serde_json::Value>,
        headers: &[(&str, &str)],
    ) -> Result<Reply, BoxError> {
        let mut req = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let body = match json {
            Some(value) => {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(serde_json::to_vec(value)?))
            }
            None => Full::new(Bytes::new()),
        };
        let res = self.client.request(req.body(body)?).await?;
        let (parts, body) = res.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// `GET url`.
    pub async fn get(&self, url: &str) -> Result<Reply, BoxError> {
        self.send(Method::GET, url, None).await
    }

    /// `POST url` with a JSON body.
    pub async fn post(&self, url: &str, json: &serde_json::Value) -> Result<Reply, BoxError> {
        self.send(Method::POST, url, Some(json)).await
    }
}
