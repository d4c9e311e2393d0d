//! A served app, a real HTTP client, a slow uploader, and captured logs.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use lockflight::{Locker, RedisBackend};
use tokio::sync::mpsc;

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// An app served on a free loopback port until dropped.
pub(crate) struct Served {
    pub(crate) addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    client: Client<HttpConnector, Body>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A response, read whole.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Reply {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `code` of a problem body, after checking that it is one: the media type
    /// and the members every problem has.
    pub(crate) fn problem_code(&self) -> String {
        assert_eq!(
            self.headers
                .get(http::header::CONTENT_TYPE)
                .map(|v| v.to_str().unwrap()),
            Some("application/problem+json"),
            "not a problem: {self:?}"
        );
        let v: serde_json::Value =
            serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()));
        assert_eq!(v["type"], "about:blank", "{v}");
        assert_eq!(v["status"], self.status.as_u16(), "{v}");
        v["code"].as_str().expect("a code").to_owned()
    }
}

pub(crate) async fn serve(app: Router) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    let client = Client::builder(TokioExecutor::new()).build_http();
    Served { addr, task, client }
}

impl Served {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sends `body` (JSON when given) and reads the whole response (bounded: 20 s).
    pub(crate) async fn send(&self, method: Method, path: &str, body: Option<&str>) -> Reply {
        let mut req = Request::builder().method(method).uri(self.url(path));
        if body.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let body = Full::new(Bytes::from(body.unwrap_or("").to_owned())).boxed();
        self.request(req.body(body).unwrap()).await
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, None).await
    }

    pub(crate) async fn post(&self, path: &str, json: &str) -> Reply {
        self.send(Method::POST, path, Some(json)).await
    }

    pub(crate) async fn request(&self, req: Request<Body>) -> Reply {
        let call = async {
            let res = self.client.request(req).await.expect("the HTTP request");
            let (parts, body) = res.into_parts();
            let body = body.collect().await.expect("the response body").to_bytes();
            Reply {
                status: parts.status,
                headers: parts.headers,
                body,
            }
        };
        tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("no response within 20 s")
    }

    /// Starts a POST whose JSON body the returned sender feeds chunk by chunk
    /// (dropping it ends the body); the task resolves to the reply.
    pub(crate) fn slow_post(
        &self,
        path: &str,
    ) -> (mpsc::Sender<Bytes>, tokio::task::JoinHandle<Reply>) {
        let (tx, rx) = mpsc::channel::<Bytes>(4);
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|chunk| (Ok::<_, Infallible>(Frame::data(chunk)), rx))
        });
        let req = Request::post(self.url(path))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .unwrap();
        let client = self.client.clone();
        let task = tokio::spawn(async move {
            let res = client.request(req).await.expect("the slow request");
            let (parts, body) = res.into_parts();
            Reply {
                status: parts.status,
                headers: parts.headers,
                body: body.collect().await.unwrap().to_bytes(),
            }
        });
        (tx, task)
    }
}

/// A locker on the shared test Redis, under its own prefix.
pub(crate) async fn redis_locker(name: &str, wait: Duration) -> Locker {
    let prefix = testkit::unique_prefix(name);
    let backend = testkit::backend_at(&testkit::shared().url(), &prefix).await;
    Locker::builder(backend).wait_timeout(wait).build().unwrap()
}

/// A locker on `url` (its own server or a proxy), with short Redis timeouts.
pub(crate) async fn locker_at(url: &str, wait: Duration) -> Locker {
    let backend = RedisBackend::builder(url)
        .response_timeout(Duration::from_millis(300))
        .connection_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let backend = backend;
    Locker::builder(backend).wait_timeout(wait).build().unwrap()
}
