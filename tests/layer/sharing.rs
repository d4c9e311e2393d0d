//! `SharedResponseLayer`: identical reads share one execution.

use super::*;

fn get(sku: &str) -> Request<()> {
    Request::builder()
        .uri(format!("/items/{sku}"))
        .body(())
        .unwrap()
}

#[tokio::test]
async fn coalesce_layer_gives_identical_gets_one_execution() {
    let locker = memory_locker();
    let runs = Arc::new(AtomicUsize::new(0));
    // The handler finishes only when the test opens the gate, after every request
    // has joined the flight: sharing does not depend on timing.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let inner = {
        let (runs, gate) = (runs.clone(), gate.clone());
        service_fn(move |req: Request<()>| {
            let (runs, gate) = (runs.clone(), gate.clone());
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let _open = gate.acquire().await.unwrap();
                let body = format!("{} run {n}", req.uri().path());
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(StatusCode::OK)
                        .header("x-run", n.to_string())
                        .body(Full::new(Bytes::from(body)))
                        .unwrap(),
                )
            }
        })
    };
    let svc = SharedResponseLayer::new(locker.clone(), KeyFrom::path_segment(1)).layer(inner);
    let mut calls: Vec<_> = (0..100)
        .map(|_| Box::pin(svc.clone().oneshot(get("555"))))
        .collect();
    // One poll each: the first leads (and waits at the gate), the others join.
    for call in &mut calls {
        assert!(futures::poll!(call.as_mut()).is_pending());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    gate.add_permits(1);
    for res in futures::future::join_all(calls).await {
        let res = res.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-run"], "1");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "/items/555 run 1");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(no_active_keys(&locker).await, "a slot remained");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesce_layer_does_not_share_bodies_over_the_limit() {
    let locker = memory_locker();
    let runs = Arc::new(AtomicUsize::new(0));
    let inner = {
        let runs = runs.clone();
        service_fn(move |_req: Request<()>| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(vec![b'x'; 2048]))))
            }
        })
    };
    let svc = SharedResponseLayer::new(locker, KeyFrom::path_segment(1))
        .max_body(1024)
        .layer(inner);
    let mut calls = Vec::new();
    for _ in 0..5 {
        calls.push(tokio::spawn(svc.clone().oneshot(get("big"))));
    }
    for c in calls {
        let body = c
            .await
            .unwrap()
            .unwrap()
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(body.len(), 2048);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        5,
        "large bodies must not be shared"
    );
}

/// As for [`LockLayer`]: a read waiting for a held key holds no inner readiness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_read_waiting_for_its_lock_holds_no_inner_readiness() {
    let locker = Locker::builder(MemoryBackend::new())
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let inner = OnePermit::new(service_fn(|req: Request<()>| async move {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(
            req.uri().path().to_owned(),
        ))))
    }));
    let svc = SharedResponseLayer::new(locker.clone(), KeyFrom::path_segment(1)).layer(inner);

    let held = locker.lock("a").await.unwrap();
    let waits = locker.stats().local_waits;
    let a = tokio::spawn(svc.clone().oneshot(get("a")));
    assert!(
        wait_until(Duration::from_secs(2), || async {
            locker.stats().local_waits > waits
        })
        .await,
        "read A never waited for key a"
    );
    let b = tokio::time::timeout(Duration::from_secs(2), svc.clone().oneshot(get("b")))
        .await
        .expect("read B was blocked by read A's wait for another key")
        .unwrap();
    assert_eq!(
        b.into_body().collect().await.unwrap().to_bytes(),
        "/items/b"
    );
    assert!(!a.is_finished(), "A ran while key a was held");
    held.release().await.unwrap();
    let a = a.await.unwrap().unwrap();
    assert_eq!(
        a.into_body().collect().await.unwrap().to_bytes(),
        "/items/a"
    );
}
