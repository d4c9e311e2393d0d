//! Tests of `lockflight::routing`: known-answer vectors, balance, minimal movement,
//! determinism, and the `KeyRouter` tower service.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures::future::{BoxFuture, FutureExt};
use lockflight::routing::{
    HashRing, KeyRouter, Rendezvous, RoutingError, jump_bucket, jump_hash, key_hash,
};
use lockflight::{LockKey, layer::HeaderKey, layer::PathSegment};
use proptest::prelude::*;
use tower::{BoxError, Service, ServiceExt, service_fn};

// ---------------------------------------------------------------------------------
// Known-answer vectors
// ---------------------------------------------------------------------------------

/// The xorshift-generated buffer of LLVM's `unittests/Support/xxhashTest.cpp`, whose
/// XXH3-64 vectors (seed 0) cover every length class of the algorithm.
fn xorshift_buffer(len: usize) -> Vec<u8> {
    let mut x: u64 = 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn key_hash_matches_published_xxh3_64_vectors() {
    // Plain strings: the empty input is xxHash's own reference value.
    assert_eq!(key_hash(b""), 0x2D06_8005_38D3_94C2);
    assert_eq!(key_hash(b"a"), 0xE6C6_32B6_1E96_4E1F);
    assert_eq!(key_hash(b"abc"), 0x78AF_5F94_892F_3950);

    let buf = xorshift_buffer(2243);
    let vectors: [(usize, u64); 27] = [
        (0, 0x2d06800538d394c2),
        (1, 0xd0d496e05c553485),
        (2, 0x84d625edb7055eac),
        (3, 0x6ea2d59aca5c3778),
        (4, 0xbf65290914e80242),
        (5, 0xc01fd099ad4fc8e4),
        (6, 0x9e3ea8187399caa5),
        (7, 0x9da8b60540644f5a),
        (8, 0xabc1413da6cd0209),
        (9, 0x8bc89400bfed51f6),
        (16, 0x7e46916754d7c9b8),
        (17, 0xed4be912ba5f836d),
        (32, 0xf59b59b58c304fd1),
        (33, 0x9013fb74ca603e0c),
        (64, 0xfa5271fcce0db1c3),
        (65, 0x79c42431727f1012),
        (96, 0x591ee0ddf9c9ccd1),
        (97, 0x8ffc6a3111fe19da),
        (128, 0x06a146ee9a2da378),
        (129, 0xbc7138129bf065da),
        (403, 0xcefeb3ffa532ad8c),
        (512, 0xcdfa6b6268e3650f),
        (513, 0x4bb5d42742f9765f),
        (2048, 0x330ce110cbb79eae),
        (2049, 0x3ba6afa0249fef9a),
        (2240, 0xd61d4d2a94e926a8),
        (2243, 0x0979f786a24edde7),
    ];
    for (len, want) in vectors {
        assert_eq!(key_hash(&buf[..len]), want, "XXH3-64 of {len} bytes");
    }
}

#[test]
fn key_hash_pins_lockflight_keys() {
    // Computed once with this crate; a change here changes every routing decision.
    assert_eq!(key_hash(b"sku:555"), 0x4c94_58a0_6b04_d9b3);
    assert_eq!(key_hash(b"lockflight"), 0x266a_a90b_72c9_e8b0);
    assert_eq!(
        key_hash(LockKey::from("sku:555").as_bytes()),
        key_hash(b"sku:555")
    );
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

/// The paper's explanatory form of jump hash, written independently: draw
/// `r` uniform in (0, 1] from the LCG and jump to `floor((b + 1) / r)`.
fn jump_reference(key: u64, buckets: u32) -> u32 {
    let mut state = key;
    let mut next_r = || {
        state = state.wrapping_mul(2862933555777941757).wrapping_add(1);
        ((state >> 33) + 1) as f64 / 2147483648.0
    };
    let mut b: u64 = 0;
    loop {
        let j = ((b + 1) as f64 / next_r()).floor();
        if j >= f64::from(buckets) {
            return b as u32;
        }
        b = j as u64;
    }
}

#[test]
fn jump_hash_matches_guava_golden_values() {
    // Guava's HashingTest "golden" values, checked there to agree across languages.
    let golden100 = [
        0, 55, 62, 8, 45, 59, 86, 97, 82, 59, 73, 37, 17, 56, 86, 21, 90, 37, 38, 83,
    ];
    for (key, want) in golden100.into_iter().enumerate() {
        assert_eq!(jump_hash(key as u64, nz(100)), want, "key {key}");
        assert_eq!(
            jump_reference(key as u64, 100),
            want,
            "reference, key {key}"
        );
    }
    assert_eq!(jump_hash(10863919174838991, nz(11)), 6);
    assert_eq!(jump_hash(2016238256797177309, nz(11)), 3);
    assert_eq!(jump_hash(1673758223894951030, nz(11)), 5);
    assert_eq!(jump_hash(2, nz(100001)), 80343);
    assert_eq!(jump_hash(2201, nz(100001)), 22152);
    assert_eq!(jump_hash(2202, nz(100001)), 15018);
}

#[test]
fn jump_hash_pinned_values() {
    // Computed once and checked against the independent reference.
    let pinned: [(u64, u32, u32); 6] = [
        (0, 1, 0),
        (u64::MAX, 1000, 313),
        (0xDEAD_BEEF, 7, 5),
        (42, 1 << 20, 153897),
        (12345678901234567890, 65536, 46485),
        (u64::MAX, u32::MAX, 2680453518),
    ];
    for (key, buckets, want) in pinned {
        assert_eq!(
            jump_hash(key, nz(buckets)),
            want,
            "jump_hash({key}, {buckets})"
        );
        assert_eq!(
            jump_reference(key, buckets),
            want,
            "reference({key}, {buckets})"
        );
    }
    assert_eq!(jump_bucket(b"sku:555", 10), Some(7));
    assert_eq!(jump_bucket(b"order:1", 10), Some(7));
    assert_eq!(jump_bucket(b"user:42", 10), Some(1));
    assert_eq!(jump_bucket(b"sku:555", 0), None);
}

const NODES4: [&str; 4] = ["node-a", "node-b", "node-c", "node-d"];

#[test]
fn rendezvous_and_ring_pinned_picks() {
    // Computed once with this crate; they pin the scoring and placement formulas.
    let mut hrw = Rendezvous::new();
    let mut weighted = Rendezvous::new();
    let mut ring = HashRing::new(160);
    for (name, w) in NODES4.into_iter().zip([1.0, 2.0, 0.5, 4.0]) {
        hrw.add(name, 1.0).unwrap();
        weighted.add(name, w).unwrap();
        ring.add(name);
    }
    let expected = [
        ("sku:0", "node-b", "node-b", "node-c"),
        ("sku:1", "node-b", "node-b", "node-d"),
        ("sku:2", "node-c", "node-d", "node-d"),
        ("sku:3", "node-c", "node-a", "node-c"),
        ("sku:4", "node-a", "node-d", "node-b"),
        ("sku:5", "node-d", "node-d", "node-b"),
        ("sku:6", "node-a", "node-a", "node-d"),
        ("sku:7", "node-a", "node-d", "node-a"),
        ("sku:8", "node-c", "node-d", "node-b"),
        ("sku:9", "node-c", "node-d", "node-c"),
        ("sku:10", "node-c", "node-d", "node-d"),
        ("sku:11", "node-a", "node-d", "node-c"),
    ];
    for (key, h, w, r) in expected {
        assert_eq!(hrw.pick(key), Some(&h), "rendezvous {key}");
        assert_eq!(weighted.pick(key), Some(&w), "weighted rendezvous {key}");
        assert_eq!(ring.pick(key), Some(&r), "ring {key}");
    }
}

// ---------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------

const KEYS: usize = 10_000;

fn keys(seed: u64) -> Vec<String> {
    (0..KEYS).map(|i| format!("key:{seed}:{i}")).collect()
}

fn names(seed: u64, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{seed}-{i}")).collect()
}

/// max load / mean load.
fn imbalance<'a>(owners: impl Iterator<Item = &'a str>, nodes: usize) -> f64 {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for o in owners {
        *counts.entry(o).or_default() += 1;
    }
    let max = counts.values().copied().max().unwrap_or(0);
    max as f64 / (KEYS as f64 / nodes as f64)
}

fn rendezvous_of(names: &[String]) -> Rendezvous<String> {
    let mut hrw = Rendezvous::new();
    for n in names {
        hrw.add(n.clone(), 1.0).unwrap();
    }
    hrw
}

fn ring_of(names: &[String]) -> HashRing<String> {
    let mut ring = HashRing::new(160);
    for n in names {
        ring.add(n.clone());
    }
    ring
}

/// Checks that growing from `before` to `after` moved about `1/(n + 1)` of the keys
/// (relative tolerance `tol`) and that every moved key moved to `new`.
fn check_growth(before: &[String], after: &[String], new: &str, n: usize, tol: f64) {
    let moved: Vec<(&String, &String)> = before.iter().zip(after).filter(|(b, a)| b != a).collect();
    for (_, to) in &moved {
        assert_eq!(to.as_str(), new, "a key moved to an old node");
    }
    let expected = KEYS as f64 / (n + 1) as f64;
    let dev = (moved.len() as f64 - expected).abs() / expected;
    assert!(
        dev <= tol,
        "moved {} keys, expected about {expected:.0} (n = {n})",
        moved.len()
    );
}

/// Checks that removing `gone` moved exactly its keys.
fn check_removal(before: &[String], after: &[String], gone: &str) {
    for (b, a) in before.iter().zip(after) {
        if b == gone {
            assert_ne!(a, gone);
        } else {
            assert_eq!(a, b, "a key of another node moved");
        }
    }
}

proptest! {
    /// The published float jump agrees with the paper's explanatory form.
    #[test]
    fn jump_agrees_with_reference(key in any::<u64>(), buckets in 1u32..=1 << 16) {
        prop_assert_eq!(jump_hash(key, nz(buckets)), jump_reference(key, buckets));
    }
}

proptest! {
    // Each case routes 10,000 keys several times; a few cases suffice.
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Balance, documented bounds over 10,000 keys and 2..=16 nodes (worst seen over
    /// 4,500 random configurations: jump 1.14, rendezvous 1.12, ring(160) 1.42):
    /// jump and rendezvous ≤ 1.2, ring with 160 vnodes ≤ 1.6, bounded loads with
    /// c = 1.25 ≤ ceil(1.25 · mean) — exactly, by construction.
    #[test]
    fn balance(seed in any::<u64>(), n in 2usize..=16) {
        let keys = keys(seed);
        let names = names(seed, n);

        let jump: Vec<&str> = keys
            .iter()
            .map(|k| names[jump_bucket(k.as_bytes(), n as u32).unwrap() as usize].as_str())
            .collect();
        let r = imbalance(jump.into_iter(), n);
        prop_assert!(r <= 1.2, "jump max/mean {r}");

        let hrw = rendezvous_of(&names);
        let r = imbalance(keys.iter().map(|k| hrw.pick(k).unwrap().as_str()), n);
        prop_assert!(r <= 1.2, "rendezvous max/mean {r}");

        let ring = ring_of(&names);
        let r = imbalance(keys.iter().map(|k| ring.pick(k).unwrap().as_str()), n);
        prop_assert!(r <= 1.6, "ring max/mean {r}");

        let mut bounded = ring_of(&names).with_bounded_loads(1.25).unwrap();
        for k in &keys {
            bounded.assign(k).unwrap();
        }
        let cap = (1.25 * KEYS as f64 / n as f64).ceil() as u64;
        let max = bounded.iter().map(|(_, load)| load).max().unwrap();
        prop_assert!(max <= cap, "bounded max load {max} > {cap}");
        prop_assert_eq!(bounded.total_load(), KEYS as u64);
    }

    /// Weighted rendezvous gives each node its weight's share.
    #[test]
    fn weighted_shares(seed in any::<u64>(), weights in prop::collection::vec(0.25f64..4.0, 2..=6)) {
        let keys = keys(seed);
        let names = names(seed, weights.len());
        let mut hrw = Rendezvous::new();
        for (n, w) in names.iter().zip(&weights) {
            hrw.add(n.clone(), *w).unwrap();
        }
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for k in &keys {
            *counts.entry(hrw.pick(k).unwrap().as_str()).or_default() += 1;
        }
        let total: f64 = weights.iter().sum();
        for (n, w) in names.iter().zip(&weights) {
            let expected = KEYS as f64 * w / total;
            let got = counts.get(n.as_str()).copied().unwrap_or(0) as f64;
            // Six standard deviations of a binomial count.
            let sd = (expected * (1.0 - w / total)).sqrt();
            prop_assert!((got - expected).abs() <= 6.0 * sd + 1.0, "{n}: {got} vs {expected:.0}");
        }
    }

    /// Adding a node moves about 1/(n + 1) of the keys, all to it; removing one moves
    /// only its keys.
    #[test]
    fn minimal_movement(seed in any::<u64>(), n in 2usize..=16) {
        let keys = keys(seed);
        let names = names(seed, n + 1);
        let (old, new) = (&names[..n], names[n].as_str());

        // Jump: bucket n is the new one; shrinking back moves only its keys.
        let name_of = |k: &String, b: usize| names[jump_bucket(k.as_bytes(), b as u32).unwrap() as usize].clone();
        let before: Vec<String> = keys.iter().map(|k| name_of(k, n)).collect();
        let after: Vec<String> = keys.iter().map(|k| name_of(k, n + 1)).collect();
        check_growth(&before, &after, new, n, 0.25);
        check_removal(&after, &before, new);

        let mut hrw = rendezvous_of(old);
        let before: Vec<String> = keys.iter().map(|k| hrw.pick(k).unwrap().clone()).collect();
        hrw.add(new.to_string(), 1.0).unwrap();
        let after: Vec<String> = keys.iter().map(|k| hrw.pick(k).unwrap().clone()).collect();
        check_growth(&before, &after, new, n, 0.25);
        let gone = &old[seed as usize % n];
        hrw.remove(gone);
        let removed: Vec<String> = keys.iter().map(|k| hrw.pick(k).unwrap().clone()).collect();
        check_removal(&after, &removed, gone);

        let mut ring = ring_of(old);
        let before: Vec<String> = keys.iter().map(|k| ring.pick(k).unwrap().clone()).collect();
        ring.add(new.to_string());
        let after: Vec<String> = keys.iter().map(|k| ring.pick(k).unwrap().clone()).collect();
        // A node's share with 160 vnodes varies by about ±8% (1/√160); worst seen 34%.
        check_growth(&before, &after, new, n, 0.5);
        ring.remove(gone);
        let removed: Vec<String> = keys.iter().map(|k| ring.pick(k).unwrap().clone()).collect();
        check_removal(&after, &removed, gone);
    }

    /// The same nodes, added in any order, give the same answers; so does a rebuilt
    /// instance.
    #[test]
    fn deterministic(seed in any::<u64>(), n in 1usize..=12, rotate in 0usize..12) {
        let keys = &keys(seed)[..1000];
        let names = names(seed, n);
        let mut shuffled = names.clone();
        shuffled.rotate_left(rotate % n);
        shuffled.reverse();

        let (a, b) = (rendezvous_of(&names), rendezvous_of(&shuffled));
        let (c, d) = (ring_of(&names), ring_of(&shuffled));
        for k in keys {
            prop_assert_eq!(a.pick(k), b.pick(k));
            prop_assert_eq!(c.pick(k), d.pick(k));
            prop_assert_eq!(jump_bucket(k.as_bytes(), n as u32), jump_bucket(k.as_bytes(), n as u32));
        }
    }
}

#[test]
fn ring_bounded_loads_hold_and_release() {
    let mut ring = HashRing::new(40).with_bounded_loads(1.25).unwrap();
    for n in NODES4 {
        ring.add(n);
    }
    // A key assigned twice stays put and counts once.
    let home = *ring.assign("k").unwrap();
    assert_eq!(ring.assign("k"), Some(&home));
    assert_eq!(ring.total_load(), 1);
    assert_eq!(ring.assigned("k"), Some(&home));
    assert_eq!(ring.release("k"), Some(&home));
    assert_eq!(ring.total_load(), 1);
    assert_eq!(ring.release("k"), Some(&home));
    assert_eq!(ring.total_load(), 0);
    assert_eq!(ring.assigned("k"), None);
    assert_eq!(ring.release("k"), None);

    // Fill and drain: loads always stay within the capacity at assignment time.
    let keys: Vec<String> = (0..1000).map(|i| format!("sku:{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        let cap = ring.capacity().unwrap();
        let node = *ring.assign(k).unwrap();
        assert!(ring.load(node).unwrap() <= cap);
        assert_eq!(ring.total_load(), i as u64 + 1);
    }
    for k in &keys {
        ring.release(k).unwrap();
    }
    assert!(ring.iter().all(|(_, load)| load == 0));
    assert_eq!(ring.capacity(), Some(1));
}

// ---------------------------------------------------------------------------------
// KeyRouter
// ---------------------------------------------------------------------------------

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
    let by_header = KeyRouter::new(HeaderKey::new(http::HeaderName::from_static("x-sku")));
    let by_path = by_header.handle().router(PathSegment::new(1));
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
