//! The `lockflight` command on a real Redis Cluster (3 primaries with one replica
//! each, started once for this test binary): `doctor --cluster` checks every
//! primary and names a misconfigured one; `inspect`, `list` and `release --force`
//! with `--cluster` reach each key's node, and the forced release fences out the
//! old holder there.
//!
//! The doctor test changes a primary's configuration, so the tests run one at a
//! time (the `SERIAL` lock).

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use lockflight::fence::FencedKey;
use lockflight::inspect::Inspector;
use lockflight::{Locker, RedisBackend};
use serde_json::Value;
use support::{after_forced_release, args, force_release, lockflight, verdicts};
use testkit::cluster::Cluster;
use testkit::unique_prefix;

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The cluster, for this test alone (hold the guard), once it is healthy.
async fn cluster_for_this_test() -> (tokio::sync::MutexGuard<'static, ()>, &'static Cluster) {
    let serial = SERIAL.lock().await;
    let c = CLUSTER.get_or_init(Cluster::start);
    c.wait_ok(Duration::from_secs(30)).await;
    (serial, c)
}

async fn set_policy(c: &Cluster, addr: &str, policy: &str) {
    c.by_addr(addr)
        .cmd::<()>(&["CONFIG", "SET", "maxmemory-policy", policy])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_every_primary_and_names_a_misconfigured_one() {
    let (_serial, c) = cluster_for_this_test().await;
    let url = c.urls()[0].clone();
    let primaries = c.primaries().await;
    assert_eq!(primaries.len(), 3);

    let (code, report) = lockflight(args(&["doctor", "--json", "--cluster", &url])).await;
    assert_eq!(code, 0, "{report:#}");
    let policies = verdicts(&report, "maxmemory-policy");
    assert_eq!(policies.len(), 3, "one check per primary: {report:#}");
    assert!(policies.iter().all(|(v, _)| *v == "pass"), "{report:#}");
    for id in ["version", "scripts", "acl", "script-publish"] {
        let checks = verdicts(&report, id);
        assert_eq!(checks.len(), 3, "{id}: {report:#}");
        assert!(checks.iter().all(|(v, _)| *v == "pass"), "{id}: {report:#}");
    }
    assert_eq!(verdicts(&report, "clock").len(), 1, "{report:#}");

    // One primary with an evicting policy: a failure naming that node alone.
    let bad = &primaries[1].addr;
    set_policy(c, bad, "allkeys-lru").await;
    let (code, report) = lockflight(args(&["doctor", "--json", "--cluster", &url])).await;
    set_policy(c, bad, "noeviction").await;
    assert_eq!(code, 1, "{report:#}");
    let warned: Vec<_> = verdicts(&report, "maxmemory-policy")
        .into_iter()
        .filter(|(v, _)| *v == "fail")
        .collect();
    assert_eq!(warned.len(), 1, "{report:#}");
    assert!(
        warned[0].1.contains(bad.as_str()) && warned[0].1.contains("allkeys-lru"),
        "{warned:?}"
    );
}

async fn locker(c: &Cluster, prefix: &str) -> Locker {
    let backend = RedisBackend::cluster(c.urls())
        .prefix(prefix)
        .connect()
        .await
        .unwrap();
    Locker::builder(backend)
        .lease_ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Keys whose names live on three different primaries (a bounded search).
async fn keys_on_every_primary(c: &Cluster, prefix: &str) -> Vec<String> {
    let inspector = Inspector::new(prefix);
    let mut owners = Vec::new();
    let mut keys = Vec::new();
    for i in 0..1000 {
        let key = format!("job:{i}");
        let slot = Cluster::slot(&inspector.lock_name(&key.as_str().into()));
        let owner = c.primary_of_slot(slot).await.id;
        if !owners.contains(&owner) {
            owners.push(owner);
            keys.push(key);
            if keys.len() == 3 {
                return keys;
            }
        }
    }
    panic!("no keys on three primaries among 1000");
}

fn listed(listing: &Value) -> Vec<String> {
    listing["keys"]
        .as_array()
        .map(|keys| {
            keys.iter()
                .map(|k| k["key"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_and_release_force_reach_each_keys_node() {
    let (_serial, c) = cluster_for_this_test().await;
    let url = c.urls()[0].clone();
    let prefix = unique_prefix("cli-cluster");
    let keys = keys_on_every_primary(c, &prefix).await;
    let a = locker(c, &prefix).await;
    let b = locker(c, &prefix).await;
    let mut held = Vec::new();
    for key in &keys {
        held.push(a.lock(key.as_str()).await.unwrap());
    }

    // `list` scans every primary: the three keys, on three nodes.
    let (code, listing) = lockflight(args(&[
        "list",
        "--json",
        "--cluster",
        "--prefix",
        &prefix,
        &url,
    ]))
    .await;
    assert_eq!(code, 0, "{listing:#}");
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(listed(&listing), expected, "{listing:#}");
    assert_eq!(listing["truncated"], false);
    let (_, cut) = lockflight(args(&[
        "list",
        "--json",
        "--cluster",
        "--limit",
        "2",
        "--prefix",
        &prefix,
        &url,
    ]))
    .await;
    assert_eq!(listed(&cut).len(), 2, "{cut:#}");
    assert_eq!(cut["truncated"], true, "{cut:#}");

    // `inspect` reaches each key's node, whichever node the URL names.
    for (key, guard) in keys.iter().zip(&held) {
        let (code, state) = lockflight(args(&[
            "inspect",
            "--json",
            "--cluster",
            "--prefix",
            &prefix,
            &url,
            key,
        ]))
        .await;
        assert_eq!(code, 0, "{state:#}");
        assert_eq!(state["held"], true, "{key}: {state:#}");
        assert_eq!(state["mutex"]["fence_epoch"], guard.fencing_token().epoch);
    }

    // `release --force` on the key of another node than the URL's: fenced out.
    let stuck = held.remove(1);
    let old = stuck.fencing_token();
    let key = keys[1].clone();
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move { b.lock(key).await })
    };
    let mut data = redis::cluster::ClusterClient::new(c.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let resource = FencedKey::new(format!("{prefix}:report:{{{key}}}")).unwrap();
    assert!(
        resource
            .set(&mut data, &stuck, "first")
            .await
            .unwrap()
            .is_applied()
    );
    let name = String::from_utf8(resource.name().to_vec()).unwrap();
    let (_, forced) = force_release(&["--cluster"], &prefix, &name, &url, &key).await;
    let next = after_forced_release(&resource, &mut data, &stuck, (old, forced), waiter).await;
    next.release().await.unwrap();
    for guard in held {
        guard.release().await.unwrap();
    }
}
