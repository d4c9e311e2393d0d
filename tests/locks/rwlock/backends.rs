//! The in-memory backend, unsupported backends and bad keys, guards that outlive
//! their runtime.

use super::*;

/// The in-memory backend: readers share, a writer excludes them and other
/// writers, a waiting writer is not starved, tokens increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_backend_read_write_semantics() {
    let backend = MemoryBackend::new();
    let a = Locker::builder(backend.clone()).build().unwrap();
    let b = Locker::builder(backend.clone()).build().unwrap();
    let c = Locker::builder(backend.clone()).build().unwrap();
    let r1 = a.rwlock("k").read().await.unwrap();
    let r2 = b.rwlock("k").read().await.unwrap();
    assert!(a.rwlock("k").try_write().await.unwrap().is_none());
    assert!(b.rwlock("k").try_write().await.unwrap().is_none());
    let waiting = tokio::spawn({
        let c = c.clone();
        async move { c.rwlock("k").write().await }
    });
    // The waiting writer (registered at the backend) refuses new read leases of
    // the other locker: a fourth locker's reads are refused once it is.
    let probe = Locker::builder(backend.clone()).build().unwrap();
    eventually("the waiting writer registered at the backend", || async {
        match probe.rwlock("k").try_read().await.unwrap() {
            Some(g) => {
                g.release().await.unwrap();
                false
            }
            None => true,
        }
    })
    .await;
    assert!(a.rwlock("other-key").try_read().await.unwrap().is_some());
    let late = Arc::new(Mutex::new(None));
    r1.release().await.unwrap();
    let (a2, late2) = (a.clone(), Arc::clone(&late));
    let asked = a.stats().acquire_attempts;
    let late_reader = tokio::spawn(async move {
        let g = a2.rwlock("k").read().await.unwrap();
        *late2.lock().unwrap() = Some(Instant::now());
        g
    });
    eventually("the late reader asked the backend", || async {
        a.stats().acquire_attempts > asked
    })
    .await;
    // A window for a wrong grant to show (a slow machine can only hide it).
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        late.lock().unwrap().is_none(),
        "a new reader passed a waiting writer"
    );
    drop(r2);
    let w = waiting.await.unwrap().unwrap();
    let t1 = w.fencing_token();
    drop(w);
    let g = late_reader.await.unwrap();
    assert_eq!(g.last_write(), t1);
    g.release().await.unwrap();
    let t2 = a.rwlock("k").write().await.unwrap().fencing_token();
    assert!(t2 > t1);
    wait_idle(&[a, b, c]).await;
}

/// A backend without read-write locks answers at once with `Unsupported`; a bad
/// key is an `InvalidKey`, not a panic.
#[tokio::test]
async fn unsupported_backends_and_bad_keys_are_clear_errors() {
    use async_trait::async_trait;
    use lockflight::backend::LockBackend;
    use lockflight::backend::{Acquire, LeaseToken, Released, Renewal, Signals, WhenBusy};

    #[derive(Debug, Default)]
    struct MutexOnly(Signals);

    #[async_trait]
    impl LockBackend for MutexOnly {
        async fn acquire(
            &self,
            _: &LockKey,
            _: LeaseToken,
            _: Duration,
            _: WhenBusy,
        ) -> lockflight::Result<Acquire> {
            Ok(Acquire::Acquired {
                epoch: 1,
                waiting: 0,
                earliest_other: None,
            })
        }
        async fn release(&self, _: &LockKey, _: LeaseToken) -> lockflight::Result<Released> {
            Ok(Released {
                released: true,
                waiting: 0,
            })
        }
        async fn renew(
            &self,
            _: &LockKey,
            _: LeaseToken,
            _: Duration,
        ) -> lockflight::Result<Renewal> {
            Ok(Renewal::Renewed { waiting: 0 })
        }
        async fn leave(&self, _: &LockKey) -> lockflight::Result<()> {
            Ok(())
        }
        fn signals(&self) -> &Signals {
            &self.0
        }
    }

    let locker = Locker::builder(MutexOnly::default()).build().unwrap();
    let unsupported = [
        ("read", locker.rwlock("k").read().await.map(drop)),
        ("write", locker.rwlock("k").write().await.map(drop)),
        ("try_read", locker.rwlock("k").try_read().await.map(drop)),
        ("try_write", locker.rwlock("k").try_write().await.map(drop)),
    ];
    for (call, result) in unsupported {
        assert!(
            matches!(result, Err(Error::Unsupported { .. })),
            "{call}: {result:?}"
        );
    }
    let memory = Locker::builder(MemoryBackend::new()).build().unwrap();
    for (call, result) in [
        ("read", memory.rwlock("").read().await.map(drop)),
        ("write", memory.rwlock("").write().await.map(drop)),
    ] {
        assert!(
            matches!(result, Err(Error::InvalidKey { .. })),
            "{call}: {result:?}"
        );
    }
    assert_eq!(locker.stats().keys_in_use + memory.stats().keys_in_use, 0);
}

/// Guards that outlive their runtime are dropped without a panic and leave no
/// local state; their leases expire at their TTL and the next runtime gets in.
#[test]
fn guards_dropped_after_their_runtime_leave_nothing_behind() {
    let locker = Locker::builder(MemoryBackend::new())
        .lease_ttl(Duration::from_millis(300))
        .build()
        .unwrap();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let rt = runtime();
    let read = rt.block_on(locker.rwlock("r").read()).unwrap();
    let write = rt.block_on(locker.rwlock("w").write()).unwrap();
    drop(rt);
    drop((read, write));
    assert_eq!(locker.stats().keys_in_use, 0);
    let rt = runtime();
    rt.block_on(async {
        let w = locker
            .rwlock("r")
            .write_with_options(lockflight::LockOptions::new().wait_timeout(Duration::from_secs(5)))
            .await
            .unwrap();
        w.release().await.unwrap();
        let r = locker
            .rwlock("w")
            .read_with_options(lockflight::LockOptions::new().wait_timeout(Duration::from_secs(5)))
            .await
            .unwrap();
        r.release().await.unwrap();
    });
    assert_eq!(locker.stats().keys_in_use, 0);
}
