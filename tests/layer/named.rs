//! The services' response futures are the named types of
//! `lockflight::layer::future` and `lockflight::layer::shared_response::future`,
//! `Send` and `Debug`; the services give their inner service back
//! (`get_ref`, `get_mut`, `into_inner`).

use lockflight::layer::future::ResponseFuture;
use lockflight::layer::shared_response::future::ResponseFuture as SharedResponseFuture;
use lockflight::layer::{LockService, SharedResponseService};

use super::*;

fn send<T: Send>(_: &T) {}

/// An inner service whose type can be named, with a field to reach through the
/// accessors.
#[derive(Clone)]
struct Named {
    answer: &'static str,
}

impl Service<Request<()>> for Named {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<()>) -> Self::Future {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from(self.answer)))))
    }
}

async fn body(res: Response<impl http_body::Body<Error: std::fmt::Debug>>) -> Bytes {
    res.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn the_lock_service_s_future_is_named_send_and_debug() {
    let locker = memory_locker();
    let mut svc: LockService<Named, KeyFrom> =
        LockLayer::new(locker.clone(), sku_header()).layer(Named { answer: "a" });
    let fut: ResponseFuture<Named, Request<()>> = svc.call(request(Some("named")));
    send(&fut);
    assert!(format!("{fut:?}").contains("locking"), "{fut:?}");
    assert_eq!(body(fut.await.unwrap()).await, "a");
    // A refused request's future is the same type, failed from the start.
    let refused = svc.call(request(None));
    assert!(format!("{refused:?}").contains("failed"), "{refused:?}");
    assert_lockflight_error(&refused.await.unwrap_err(), |e| {
        matches!(e, Error::InvalidKey { .. })
    });
    assert!(becomes_free(&locker, "named").await, "lock still held");
}

#[tokio::test]
async fn the_shared_response_service_s_future_is_named_send_and_debug() {
    let locker = memory_locker();
    let mut svc: SharedResponseService<Named, KeyFrom> =
        SharedResponseLayer::new(locker.clone(), sku_header()).layer(Named { answer: "s" });
    let shared: SharedResponseFuture<Named, (), Full<Bytes>> = svc.call(request(Some("named")));
    send(&shared);
    assert!(format!("{shared:?}").contains("shared"), "{shared:?}");
    let res = shared.await.unwrap();
    assert_eq!(body(res).await, "s");
    let alone = svc.call(request(None));
    send(&alone);
    assert!(format!("{alone:?}").contains("alone"), "{alone:?}");
    assert_eq!(body(alone.await.unwrap()).await, "s");
    assert!(becomes_free(&locker, "named").await, "lock still held");
}

#[tokio::test]
async fn the_services_give_their_inner_service_back() {
    let locker = memory_locker();
    let mut svc = LockLayer::new(locker.clone(), sku_header()).layer(Named { answer: "a" });
    assert_eq!(svc.get_ref().answer, "a");
    svc.get_mut().answer = "b";
    let res = svc.call(request(Some("inner"))).await.unwrap();
    assert_eq!(body(res).await, "b", "the change reaches later calls");
    assert_eq!(svc.into_inner().answer, "b");

    let mut svc =
        SharedResponseLayer::new(locker.clone(), sku_header()).layer(Named { answer: "a" });
    assert_eq!(svc.get_ref().answer, "a");
    svc.get_mut().answer = "b";
    let res = svc.call(request(Some("inner"))).await.unwrap();
    assert_eq!(body(res).await, "b", "the change reaches later calls");
    assert_eq!(svc.into_inner().answer, "b");
    assert!(becomes_free(&locker, "inner").await, "lock still held");
}
