//! `KeyRouter`, the tower service that routes a request by its key.

use super::*;

type Named = tower::util::BoxCloneSyncService<String, &'static str, BoxError>;

/// A mock instance that answers with its name.
fn instance(name: &'static str) -> Named {
    Named::new(service_fn(move |_req: String| async move {
        Ok::<_, BoxError>(name)
    }))
}

#[allow(clippy::ptr_arg)] // an extractor for `String` requests takes `&String`
fn by_sku(req: &String) -> Option<LockKey> {
    req.strip_prefix("sku=").map(LockKey::from)
}

type SkuRouter = KeyRouter<Named, fn(&String) -> Option<LockKey>>;

fn router(names: &[&'static str]) -> SkuRouter {
    let router = KeyRouter::new(by_sku as fn(&String) -> Option<LockKey>);
    for n in names {
        router.handle().add(*n, instance(n));
    }
    router
}

async fn send(router: &SkuRouter, req: &str) -> Result<&'static str, BoxError> {
    router.clone().oneshot(req.to_string()).await
}

/// Boxes the response future in a plain function. Awaiting the router's future
/// directly inside `tokio::spawn(async move { .. })` while the inner error type is
/// exactly `BoxError` trips rustc's "implementation of `From` is not general enough"
/// (rust-lang/rust#110338, the same with tower's own middleware); boxing it outside
/// the async block avoids that.
fn send_boxed(
    router: SkuRouter,
    req: String,
) -> BoxFuture<'static, Result<&'static str, BoxError>> {
    router.oneshot(req).boxed()
}

async fn owners(router: &SkuRouter, keys: &[String]) -> Vec<&'static str> {
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        out.push(send(router, &format!("sku={k}")).await.unwrap());
    }
    out
}

fn sku_keys() -> Vec<String> {
    (0..600).map(|i| format!("{i}")).collect()
}

#[tokio::test]
async fn same_key_same_service() {
    let router = router(&["a", "b", "c"]);
    let keys = sku_keys();
    let first = owners(&router, &keys).await;
    assert_eq!(owners(&router, &keys).await, first);
    let used: HashSet<_> = first.iter().collect();
    assert_eq!(used.len(), 3, "every member gets keys");
    // The handle predicts the route, and agrees with a plain Rendezvous.
    let mut hrw = Rendezvous::new();
    for n in ["a", "b", "c"] {
        hrw.add(n, 1.0).unwrap();
    }
    for (k, o) in keys.iter().zip(&first) {
        assert_eq!(router.handle().route(k).as_deref(), Some(*o));
        assert_eq!(hrw.pick(k), Some(o));
    }
}

#[tokio::test]
async fn removal_moves_only_the_removed_members_keys() {
    let router = router(&["a", "b", "c", "d"]);
    let keys = sku_keys();
    let before = owners(&router, &keys).await;
    assert!(router.handle().remove("c").is_some());
    assert!(router.handle().remove("c").is_none());
    let after = owners(&router, &keys).await;
    let mut receivers = HashSet::new();
    for (b, a) in before.iter().zip(&after) {
        if *b == "c" {
            assert_ne!(*a, "c");
            receivers.insert(*a);
        } else {
            assert_eq!(a, b);
        }
    }
    assert_eq!(receivers.len(), 3, "c's keys spread over all the others");

    // Adding it back restores the original assignment exactly.
    router.handle().add("c", instance("c"));
    assert_eq!(owners(&router, &keys).await, before);
}

#[tokio::test]
async fn mark_down_and_up() {
    let router = router(&["a", "b", "c"]);
    let handle = router.handle();
    let keys = sku_keys();
    let before = owners(&router, &keys).await;

    assert!(handle.mark_down("b"));
    assert!(!handle.mark_down("b"));
    assert!(!handle.mark_down("nobody"));
    assert_eq!(
        handle.members(),
        vec![("a".into(), true), ("b".into(), false), ("c".into(), true)]
    );
    let during = owners(&router, &keys).await;
    for (b, d) in before.iter().zip(&during) {
        if *b == "b" {
            assert_ne!(*d, "b");
        } else {
            assert_eq!(d, b);
        }
    }

    // Replacing a down member's service keeps it down.
    assert!(handle.add("b", instance("b")).is_some());
    assert_eq!(owners(&router, &keys).await, during);

    assert!(handle.mark_up("b"));
    assert!(!handle.mark_up("b"));
    assert_eq!(owners(&router, &keys).await, before);

    // All down: an error, not a panic.
    for n in ["a", "b", "c"] {
        handle.mark_down(n);
    }
    let err = send(&router, "sku=1").await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<RoutingError>(),
        Some(&RoutingError::NoMembers)
    );
    assert_eq!(handle.route("1"), None);
}

#[tokio::test]
async fn no_members_is_an_error() {
    let router = router(&[]);
    let err = send(&router, "sku=1").await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<RoutingError>(),
        Some(&RoutingError::NoMembers)
    );
    let err = send(&router, "no key").await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<RoutingError>(),
        Some(&RoutingError::NoMembers)
    );
}

#[tokio::test]
async fn keyless_requests_round_robin_by_default() {
    let router = router(&["a", "b", "c"]);
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for _ in 0..9 {
        *seen
            .entry(send(&router, "no key").await.unwrap())
            .or_default() += 1;
    }
    assert_eq!(seen, HashMap::from([("a", 3), ("b", 3), ("c", 3)]));
}

#[tokio::test]
async fn keyless_requests_can_be_rejected() {
    let router = router(&["a"]).reject_keyless();
    let err = send(&router, "no key").await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<RoutingError>(),
        Some(&RoutingError::NoKey)
    );
    assert_eq!(send(&router, "sku=1").await.unwrap(), "a");
}

#[tokio::test]
async fn weighted_members() {
    let router = router(&[]);
    let handle = router.handle();
    assert_eq!(
        handle.add_weighted("a", instance("a"), 0.0).unwrap_err(),
        RoutingError::InvalidWeight(0.0)
    );
    assert!(handle.add_weighted("a", instance("a"), f64::NAN).is_err());
    assert!(handle.members().is_empty());
    handle.add_weighted("a", instance("a"), 1.0).unwrap();
    handle.add_weighted("b", instance("b"), 3.0).unwrap();
    let keys: Vec<String> = (0..4000).map(|i| i.to_string()).collect();
    let on_b = owners(&router, &keys)
        .await
        .iter()
        .filter(|o| **o == "b")
        .count();
    assert!(
        (2800..=3200).contains(&on_b),
        "b has {on_b} of 4000, expected ~3000"
    );
}

#[tokio::test]
async fn inner_errors_reach_the_caller() {
    #[derive(Debug)]
    struct Boom;
    impl std::fmt::Display for Boom {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("boom")
        }
    }
    impl std::error::Error for Boom {}

    let failing = Named::new(service_fn(|_req: String| async {
        Err::<&'static str, BoxError>(Box::new(Boom))
    }));
    let router = router(&[]);
    router.handle().add("bad", failing);
    let err = send(&router, "sku=1").await.unwrap_err();
    assert!(err.downcast_ref::<Boom>().is_some(), "{err}");
}

/// Not ready until polled `needed` times (counted across clones); refuses calls made
/// before it said ready.
#[derive(Clone)]
struct SlowReady {
    polls: Arc<AtomicUsize>,
    needed: usize,
    ready: bool,
    fail_ready: bool,
}

impl Service<String> for SlowReady {
    type Response = &'static str;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<&'static str, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        let polls = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
        if polls < self.needed {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if self.fail_ready {
            return Poll::Ready(Err("not today".into()));
        }
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: String) -> Self::Future {
        let was_ready = std::mem::replace(&mut self.ready, false);
        async move {
            if was_ready {
                Ok("slow")
            } else {
                Err("called before ready".into())
            }
        }
        .boxed()
    }
}

#[tokio::test]
async fn readiness_is_driven_per_call() {
    let polls = Arc::new(AtomicUsize::new(0));
    let slow = SlowReady {
        polls: Arc::clone(&polls),
        needed: 4,
        ready: false,
        fail_ready: false,
    };
    let mut router = KeyRouter::new(by_sku as fn(&String) -> Option<LockKey>);
    router.handle().add("slow", slow);

    // The router is ready at once …
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(matches!(router.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    // … and the response waits for the member.
    let mut fut = pin!(router.call("sku=1".to_string()));
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    assert_eq!(fut.await.unwrap(), "slow");
    assert_eq!(polls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn readiness_errors_reach_the_caller() {
    let slow = SlowReady {
        polls: Arc::new(AtomicUsize::new(0)),
        needed: 2,
        ready: false,
        fail_ready: true,
    };
    let router = KeyRouter::new(by_sku as fn(&String) -> Option<LockKey>);
    router.handle().add("slow", slow);
    let err = router.oneshot("sku=1".to_string()).await.unwrap_err();
    assert_eq!(err.to_string(), "not today");
}

#[tokio::test]
async fn http_extractors() {
    let reply = |name: &'static str| {
        service_fn(move |_req: http::Request<()>| async move { Ok::<_, Infallible>(name) })
    };
    let by_header = KeyRouter::new(KeyFrom::header(http::HeaderName::from_static("x-sku")));
    let by_path = by_header.handle().router(KeyFrom::path_segment(1));
    for n in ["a", "b", "c"] {
        by_header.handle().add(n, reply(n));
    }
    for sku in ["1", "2", "3", "555", "abc"] {
        let want = by_header.handle().route(sku).unwrap();
        let req = http::Request::builder()
            .header("x-sku", sku)
            .body(())
            .unwrap();
        assert_eq!(by_header.clone().oneshot(req).await.unwrap(), want);
        let req = http::Request::builder()
            .uri(format!("/items/{sku}/reserve"))
            .body(())
            .unwrap();
        assert_eq!(by_path.clone().oneshot(req).await.unwrap(), want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_while_in_use() {
    let router = router(&["a", "b", "c"]);
    let handle = router.handle();
    let flapper = tokio::spawn({
        let handle = handle.clone();
        async move {
            for i in 0..200 {
                let n = ["b", "c"][i % 2];
                handle.mark_down(n);
                tokio::task::yield_now().await;
                handle.mark_up(n);
            }
        }
    });
    let mut tasks = Vec::new();
    for t in 0..4 {
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..200 {
                // "a" never goes down, so every request finds a member.
                let req = format!("sku={t}-{i}");
                let owner = send_boxed(router.clone(), req).await.unwrap();
                assert!(["a", "b", "c"].contains(&owner));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    flapper.await.unwrap();
    assert_eq!(handle.members().iter().filter(|(_, up)| *up).count(), 3);
}

#[test]
fn response_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let mut router = router(&["a"]);
    let fut = router.call("sku=1".to_string());
    assert_send(&fut);
    assert!(format!("{fut:?}").contains("Routed"));
}
