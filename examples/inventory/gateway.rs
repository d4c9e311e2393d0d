//! A gateway in front of several inventory instances that sends each SKU to one
//! instance, with [`KeyRouter`] (weighted rendezvous hashing over the instances'
//! names).
//!
//! All requests for one SKU then meet in one process, where lockflight coalesces
//! them (and, with handoff, passes the lease on in memory): cross-instance
//! contention, and with it most Redis lock traffic, disappears. The Redis lock
//! stays on every path — routing makes contention rare, never impossible (a
//! membership change, a retry elsewhere or a client that bypasses the gateway puts
//! one SKU on two instances at once).
//!
//! Requests without a SKU (`/items`, `/stats`) go to the instances in turn.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::http::{Request, Response, StatusCode, Uri};
use axum::response::IntoResponse;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use lockflight::layer::KeyFrom;
use lockflight_routing::{KeyRouter, RouterHandle};
use tower::{BoxError, ServiceBuilder};
use tower_service::Service;

/// One inventory instance behind the gateway: forwards requests to `base`.
///
/// Its error type is `Infallible` (a failed upstream becomes a 502 response), which
/// also keeps clear of the `BoxError` inference limitation noted on [`KeyRouter`].
#[derive(Clone, Debug)]
pub struct Upstream {
    client: Client<HttpConnector, Body>,
    base: Arc<str>,
}

impl Upstream {
    /// Forwards to `base` (`http://host:port`, no trailing slash).
    pub fn new(client: Client<HttpConnector, Body>, base: &str) -> Self {
        Upstream {
            client,
            base: Arc::from(base.trim_end_matches('/')),
        }
    }
}

impl Service<Request<Body>> for Upstream {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let client = self.client.clone();
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let target = format!("{}{path}", self.base);
        Box::pin(async move {
            let uri: Uri = match target.parse() {
                Ok(uri) => uri,
                Err(e) => return Ok(bad_gateway(format!("bad upstream URI {target}: {e}"))),
            };
            *req.uri_mut() = uri;
            req.headers_mut().remove(axum::http::header::HOST);
            match client.request(req).await {
                Ok(res) => Ok(res.map(Body::new)),
                Err(e) => Ok(bad_gateway(format!("upstream {target}: {e}"))),
            }
        })
    }
}

fn bad_gateway(message: String) -> Response<Body> {
    (StatusCode::BAD_GATEWAY, message).into_response()
}

/// The gateway's router over `upstreams` (`(name, base URL)`), and the handle to
/// its membership (to add, remove or mark instances down at run time).
///
/// Keys are the second path segment, the SKU of `/items/{sku}` and
/// `/items/{sku}/reserve` — as it appears in the URI, exactly like the instances'
/// lock key (`KeyFrom`).
pub fn gateway(upstreams: &[(String, String)]) -> (Router, RouterHandle<Upstream>) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new()).build(connector);
    let router: KeyRouter<Upstream, KeyFrom> = KeyRouter::new(KeyFrom::path_segment(1));
    let members = router.handle();
    for (name, base) in upstreams {
        members.add(name.clone(), Upstream::new(client.clone(), base));
    }
    let service = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(|e: BoxError| async move {
            // No member up (or another routing error): nobody to send it to.
            (StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }))
        .service(router);
    (Router::new().fallback_service(service), members)
}
