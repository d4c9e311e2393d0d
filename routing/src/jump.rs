//! Jump consistent hash (Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash
//! Algorithm", 2014).

use std::num::NonZeroU32;

use super::key_hash;

/// The bucket in `0..buckets` that `key` falls into, by jump consistent hash.
///
/// This is exactly the published algorithm (the paper's C++ listing, also Guava's
/// `Hashing.consistentHash` and the common Go port): a 64-bit linear congruential
/// generator `key = key * 2862933555777941757 + 1` and the jump
/// `j = (b + 1) * (2^31 / ((key >> 33) + 1))` in IEEE-754 double arithmetic, so it
/// gives the same answers as those implementations.
///
/// Growing from `n` to `n + 1` buckets moves only about `1/(n + 1)` of the keys, all
/// of them to the new bucket `n`; shrinking from the end moves only the last bucket's
/// keys. Buckets are numbers, not names: removing a bucket from the *middle* renumbers
/// everything after it, so jump hash suits a numbered shard list that only grows or
/// shrinks at the end. For named members that come and go, use
/// [`Rendezvous`](super::Rendezvous) or [`HashRing`](super::HashRing).
///
/// `buckets` is a [`NonZeroU32`], so there is no empty case to panic on; see
/// [`jump_bucket`] for a byte-key helper taking a plain count.
///
/// ```
/// use std::num::NonZeroU32;
/// use lockflight_routing::jump_hash;
///
/// let hundred = NonZeroU32::new(100).unwrap();
/// assert_eq!(jump_hash(1, hundred), 55); // Guava's golden value
/// assert_eq!(jump_hash(1, NonZeroU32::MIN), 0);
/// ```
pub fn jump_hash(mut key: u64, buckets: NonZeroU32) -> u32 {
    let buckets = i64::from(buckets.get());
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < buckets {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        // `as i64` saturates, so a huge jump simply ends the loop.
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    // 0 <= b < buckets <= u32::MAX.
    u32::try_from(b).unwrap_or(0)
}

/// The bucket in `0..buckets` of a byte key: [`jump_hash`] of [`key_hash`]`(key)`.
///
/// Returns `None` when `buckets` is 0.
///
/// ```
/// use lockflight_routing::jump_bucket;
///
/// let shard = jump_bucket(b"sku:555", 16).unwrap();
/// assert!(shard < 16);
/// assert_eq!(jump_bucket(b"sku:555", 16), Some(shard)); // deterministic
/// assert_eq!(jump_bucket(b"sku:555", 0), None);
/// ```
pub fn jump_bucket(key: &[u8], buckets: u32) -> Option<u32> {
    NonZeroU32::new(buckets).map(|n| jump_hash(key_hash(key), n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extremes_do_not_panic() {
        for key in [0, 1, u64::MAX, 0x8000_0000_0000_0000] {
            assert!(jump_hash(key, NonZeroU32::MAX) < u32::MAX);
            assert_eq!(jump_hash(key, NonZeroU32::MIN), 0);
        }
    }
}
