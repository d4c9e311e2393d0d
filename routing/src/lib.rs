//! Key-affine routing for [lockflight]: send every request for one key
//! to the same instance.
//!
//! The cheapest distributed lock is the one never contended across instances. If a
//! gateway or client routes every request for a key to the same instance,
//! lockflight's per-process coalescing absorbs nearly all contention locally and
//! Redis stays the safety net for rebalancing and failover.
//!
//! This crate holds the pieces for that:
//!
//! * [`key_hash`]: the one stable hash every method here starts from.
//! * [`jump_hash`] / [`jump_bucket`]: Lamping & Veach's jump consistent hash, for a
//!   fixed, numbered list of buckets (shards) that only grows or shrinks at the end.
//! * [`Rendezvous`]: weighted highest-random-weight (rendezvous) hashing over named
//!   nodes; any node may join or leave.
//! * [`HashRing`]: a consistent-hash ring with virtual nodes and optional bounded
//!   loads (Mirrokni, Thorup & Zadimoghaddam).
//! * [`KeyRouter`]: a tower [`Service`](tower_service::Service) that sends each
//!   request to one of several inner services by the request's
//!   [`LockKey`](lockflight::LockKey), with membership that changes at run time through a
//!   [`RouterHandle`].
//!
//! # Routing makes the lock cheap; it never replaces it
//!
//! Routing makes cross-instance contention *rare*. It never makes it *impossible*,
//! so it can never be the thing that provides mutual exclusion. The same key reaches
//! two instances at once whenever:
//!
//! * membership changes (an instance joins, leaves or is marked down): requests
//!   already running on the old owner overlap the first ones on the new owner;
//! * an instance fails over and its keys move while its in-flight work is still
//!   running (a slow or partitioned instance is not a dead one);
//! * a client retries against another instance after a timeout;
//! * a client bypasses the gateway, or two gateways hold different membership views
//!   for a while (membership is never updated atomically everywhere);
//! * keyless requests or a [`KeyExtractor`](lockflight::layer::KeyExtractor) that disagrees with
//!   the lock's own key extraction.
//!
//! So keep the Redis lock on every path. Routing only decides where the contention
//! lands: on one instance, where it is coalesced in memory, instead of across
//! instances, where every waiter costs Redis round trips.
//!
//! # Stability
//!
//! Routing decisions must agree across processes, machines and versions of this
//! crate, or two gateways would send one key to two instances. Everything here is
//! therefore built on [`key_hash`], a fixed, named algorithm (XXH3-64, seed 0), and
//! on fixed arithmetic documented on each item; nothing uses the standard library's
//! randomly seeded hasher for a routing decision. A change to any of these outputs is
//! a breaking change, and the test suite pins them with known-answer vectors.
//!
//! This crate depends on lockflight only for [`LockKey`](lockflight::LockKey) and
//! [`KeyExtractor`](lockflight::layer::KeyExtractor); it takes no lock.

mod error;
mod jump;
mod rendezvous;
mod ring;
mod router;

pub use error::RoutingError;
pub use jump::{jump_bucket, jump_hash};
pub use rendezvous::Rendezvous;
pub use ring::{DEFAULT_VNODES, HashRing};
pub use router::{KeyRouter, ResponseFuture, RouterHandle};

/// The stable 64-bit hash of a key: XXH3-64 with seed 0.
///
/// XXH3-64 is the 64-bit variant of xxHash's XXH3 algorithm (Yann Collet), as
/// specified by the reference implementation; with seed 0 and the default secret the
/// result is the same on every platform, endianness, process and release of this
/// crate, and it is the hash lockflight itself gives a key's bytes (its lock
/// striping, Redlock's wake node). For example the empty input hashes to
/// `0x2D06800538D394C2`, the reference value.
///
/// Every routing method in this crate hashes keys (and node names) with this
/// function, so anything else that needs to agree with lockflight's routing — a
/// gateway written in another language, say — can reproduce it with any conforming
/// XXH3 implementation.
///
/// ```
/// use lockflight_routing::key_hash;
///
/// assert_eq!(key_hash(b""), 0x2D06800538D394C2);
/// assert_eq!(key_hash(b"sku:555"), key_hash("sku:555".as_bytes()));
/// ```
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// Mixes two 64-bit hashes into one, for scoring a (node, key) pair.
///
/// `fmix64(key_hash ^ node_hash)`, where `fmix64` is MurmurHash3's 64-bit finalizer
/// (a bijection with full avalanche). Fixed forever, like [`key_hash`].
pub(crate) fn pair_hash(key_hash: u64, node_hash: u64) -> u64 {
    fmix64(key_hash ^ node_hash)
}

/// MurmurHash3's 64-bit finalizer.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hash_is_xxh3_64_seed_0() {
        assert_eq!(key_hash(b""), 0x2D06_8005_38D3_94C2);
        assert_eq!(
            key_hash(b"abc"),
            xxhash_rust::xxh3::xxh3_64_with_seed(b"abc", 0)
        );
    }

    #[test]
    fn fmix64_known_values() {
        // fmix64 is a bijection that fixes 0; these pin its constants.
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
        assert_eq!(fmix64(0xdead_beef), 0xd24b_d59f_862a_1dac);
        assert_eq!(pair_hash(5, 5), 0);
    }
}
