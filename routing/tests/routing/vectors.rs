//! Known-answer vectors: published and pinned values of every hash and pick.

use super::*;

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
    // lockflight's own key hash (src/key.rs, `key_hash_is_routings_key_hash`) pins
    // the same values: the two copies hash alike.
    assert_eq!(key_hash(b"sku:555"), 0x4c94_58a0_6b04_d9b3);
    assert_eq!(key_hash(b"lockflight"), 0x266a_a90b_72c9_e8b0);
    assert_eq!(
        key_hash(LockKey::from("sku:555").as_bytes()),
        key_hash(b"sku:555")
    );
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
