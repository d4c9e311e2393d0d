//! `release --force`: fencing out the old holder, freeing permits, its counts.

use std::time::Duration;

use lockflight::fence::{Fenced, FencedKey};
use serde_json::Value;
use testkit::{shared, unique_prefix};

use crate::support::{after_forced_release, args, force_release, lockflight};
use crate::{locker, lockflight_text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_fences_out_the_old_holder() {
    let server = shared();
    let prefix = unique_prefix("cli-release");
    // A holds with a long TTL and is "stuck"; B waits.
    let a = locker(&server.url(), &prefix, Duration::from_secs(30)).await;
    let b = locker(&server.url(), &prefix, Duration::from_secs(30)).await;
    let stuck = a.lock("job").await.unwrap();
    let old = stuck.fencing_token();
    let waiter = tokio::spawn(async move { b.lock("job").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut data = server.connection().await;
    let resource = FencedKey::new(format!("{prefix}:result")).unwrap();
    assert!(
        resource
            .set(&mut data, &stuck, "A's first write")
            .await
            .unwrap()
            .is_applied()
    );

    let name = String::from_utf8(resource.name().to_vec()).unwrap();
    let (report, forced) = force_release(&[], &prefix, &name, &server.url(), "job").await;
    assert_eq!(
        report["holder"].as_str().map(str::len),
        Some(32),
        "{report:#}"
    );
    assert_eq!(
        (&report["told"], &report["receivers"]),
        (&Value::from(1), &Value::from(1)),
        "the holder's instance is told: {report:#}"
    );
    let next = after_forced_release(&resource, &mut data, &stuck, (old, forced), waiter).await;
    // The old holder's release is a loss.
    assert!(stuck.release().await.is_err());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_force_frees_a_stuck_permit_holders_semaphore() {
    let server = shared();
    let prefix = unique_prefix("cli-release-sem");
    // A holds the only permit with a long TTL and is "stuck"; B waits for it.
    let a = locker(&server.url(), &prefix, Duration::from_secs(30)).await;
    let b = locker(&server.url(), &prefix, Duration::from_secs(30)).await;
    let stuck = a.semaphore("exports", 1).acquire().await.unwrap();
    // A mutex token of the key minted before the forced release: what a late
    // write of the stuck side would carry (a permit has no token of its own).
    let before = {
        let g = a.lock("exports").await.unwrap();
        let t = g.fencing_token();
        g.release().await.unwrap();
        t
    };
    let waiter = tokio::spawn(async move {
        let permit = b.semaphore("exports", 1).acquire().await;
        (b, permit)
    });
    let (code, state) = lockflight(args(&[
        "inspect",
        "--json",
        "--prefix",
        &prefix,
        &server.url(),
        "exports",
    ]))
    .await;
    assert_eq!(code, 0);
    assert_eq!(state["semaphore"]["free"], 0, "{state:#}");
    let mut data = server.connection().await;
    let resource = FencedKey::new(format!("{prefix}:export-file")).unwrap();
    let name = String::from_utf8(resource.name().to_vec()).unwrap();

    let (report, forced) = force_release(&[], &prefix, &name, &server.url(), "exports").await;
    assert_eq!(report["permits"], 1, "{report:#}");
    assert_eq!(report["told"], 1, "{report:#}");
    assert!(forced > before);
    // The resource's fence holds the forced token: a write under any token minted
    // before the forced release is refused.
    assert_eq!(
        resource.set(&mut data, before, "late").await.unwrap(),
        Fenced::Stale {
            last: forced,
            offered: before
        }
    );
    // The waiter gets the freed permit soon (woken, not at A's 30 s TTL).
    let (b, permit) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the permit soon after the forced release")
        .unwrap();
    let permit = permit.unwrap();
    // The stuck holder learns of its loss (its instance is told); its release is a
    // loss.
    tokio::time::timeout(Duration::from_secs(15), stuck.lost())
        .await
        .expect("the stuck permit holder is told its permit is lost");
    assert!(matches!(
        stuck.release().await,
        Err(lockflight::Error::LeaseLost { .. })
    ));
    permit.release().await.unwrap();
    drop(b);
}

/// `release --force` counts leases, permits, woken instances, loss messages and
/// their receivers with the noun that agrees: 1 of each, then 2 read leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_counts_agree_with_their_nouns() {
    let server = shared();
    let url = server.url();
    let prefix = unique_prefix("cli-plural");
    let a = locker(&url, &prefix, Duration::from_secs(30)).await;
    let b = locker(&url, &prefix, Duration::from_secs(30)).await;

    // One holder, one waiting instance.
    let held = a.lock("one").await.unwrap();
    let waiter = tokio::spawn(async move { b.lock("one").await.map(|g| (b, g)) });
    wait_for_queue(&url, &prefix, "one").await;
    let (code, text) = lockflight_text(&[
        "release", "--force", "--yes", "--prefix", &prefix, &url, "one",
    ])
    .await;
    assert_eq!(code, 0, "{text}");
    for phrase in [
        "0 read leases",
        "0 permits",
        "1 waiting instance woken",
        "1 loss message, received by 1 subscriber",
    ] {
        assert!(text.contains(phrase), "{phrase:?} in {text}");
    }
    let (b, next) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is woken")
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
    drop(held);

    // Two read leases, of two instances; one permit.
    let (r1, r2) = (
        a.rwlock("two").read().await.unwrap(),
        b.rwlock("two").read().await.unwrap(),
    );
    let (code, text) = lockflight_text(&[
        "release", "--force", "--yes", "--prefix", &prefix, &url, "two",
    ])
    .await;
    assert_eq!(code, 0, "{text}");
    for phrase in [
        "2 read leases",
        "0 waiting instances woken",
        "2 loss messages, received by 2 subscribers",
    ] {
        assert!(text.contains(phrase), "{phrase:?} in {text}");
    }
    drop((r1, r2));
    let permit = a.semaphore("three", 1).acquire().await.unwrap();
    let (code, text) = lockflight_text(&[
        "release", "--force", "--yes", "--prefix", &prefix, &url, "three",
    ])
    .await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains(", 1 permit;"), "{text}");
    drop(permit);
}

/// Polls `inspect` until one instance waits for the mutex of `key`.
async fn wait_for_queue(url: &str, prefix: &str, key: &str) {
    for _ in 0..100 {
        let (_, report) =
            lockflight(args(&["inspect", "--json", "--prefix", prefix, url, key])).await;
        if report["mutex"]["queue"]
            .as_array()
            .is_some_and(|q| q.len() == 1)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no instance came to wait for {key}");
}
