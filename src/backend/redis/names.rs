//! The Redis names of a key, one encoding for the backend's scripts and the
//! inspector: the lock `<prefix>:{<escaped key>}` (`%`, `{` and `}` escaped, so
//! the braces make the whole key the Cluster hash tag), every other name of the
//! key that name plus a suffix (`:fence`, `:wq`, `:wr`, …), and back.

use crate::key::LockKey;

/// The name of `key`'s mutex under `prefix`, which every other name of the key
/// extends with a suffix.
pub(crate) fn lock_name(prefix: &str, key: &LockKey) -> Vec<u8> {
    let mut lock = Vec::with_capacity(prefix.len() + key.len() + 4);
    lock.extend_from_slice(prefix.as_bytes());
    lock.extend_from_slice(b":{");
    for &b in key.as_bytes() {
        match b {
            b'%' => lock.extend_from_slice(b"%25"),
            b'{' => lock.extend_from_slice(b"%7B"),
            b'}' => lock.extend_from_slice(b"%7D"),
            _ => lock.push(b),
        }
    }
    lock.push(b'}');
    lock
}

/// The name of `key`'s `suffix` under `prefix` (`""`: the mutex).
#[cfg_attr(not(feature = "inspect"), allow(dead_code))]
pub(crate) fn key_name(prefix: &str, key: &LockKey, suffix: &str) -> Vec<u8> {
    [&lock_name(prefix, key)[..], suffix.as_bytes()].concat()
}

/// The key a lock name `<prefix>:{<escaped key>}` belongs to, and the suffix
/// after it (`""` for the mutex, `":wr"`, …); `None` if it is not one.
#[cfg_attr(not(feature = "inspect"), allow(dead_code))]
pub(crate) fn parse_lock_name<'a>(prefix: &str, name: &'a [u8]) -> Option<(LockKey, &'a [u8])> {
    let rest = name.strip_prefix(prefix.as_bytes())?.strip_prefix(b":{")?;
    let close = rest.iter().position(|&b| b == b'}')?;
    let (escaped, suffix) = (&rest[..close], &rest[close + 1..]);
    let mut key = Vec::with_capacity(escaped.len());
    let mut i = 0;
    while i < escaped.len() {
        match &escaped[i..] {
            [b'%', b'2', b'5', ..] => (key.push(b'%'), i += 3).1,
            [b'%', b'7', b'B', ..] => (key.push(b'{'), i += 3).1,
            [b'%', b'7', b'D', ..] => (key.push(b'}'), i += 3).1,
            [b, ..] => (key.push(*b), i += 1).1,
            [] => break,
        }
    }
    Some((LockKey::from(key), suffix))
}

/// The Redis names of one key, as the backend's scripts use them.
pub(super) struct Names {
    pub(super) lock: Vec<u8>,
    pub(super) fence: Vec<u8>,
    pub(super) queue: Vec<u8>,
    pub(super) claim: Vec<u8>,
    pub(super) queue_expiry: Vec<u8>,
}

impl Names {
    pub(super) fn new(prefix: &str, key: &LockKey) -> Names {
        let lock = lock_name(prefix, key);
        let with = |suffix: &[u8]| [&lock[..], suffix].concat();
        Names {
            fence: with(b":fence"),
            queue: with(b":wq"),
            claim: with(b":claim"),
            queue_expiry: with(b":wqx"),
            lock,
        }
    }

    /// The leader record of an election on this key (`<lock name>:leader`):
    /// written by `lua/leader_write.lua`, deleted by `lua/leader_clear.lua`.
    pub(super) fn leader(&self) -> Vec<u8> {
        [&self.lock[..], b":leader"].concat()
    }

    /// The idempotency record of this key (`<lock name>:idem`, a hash: its
    /// fence and the stored response): fenced, stored and read by
    /// `lua/record.lua`.
    pub(super) fn record(&self) -> Vec<u8> {
        [&self.lock[..], b":idem"].concat()
    }

    /// The observers of the leader record (`<lock name>:observers`, a sorted set:
    /// an observing instance's channel → its registration's expiry in ms):
    /// written by `lua/leader_observe.lua`, read and pruned by
    /// `lua/leader_write.lua` and `lua/leader_clear.lua`, which publish a leader
    /// message to each live observer when they change the record.
    pub(super) fn observers(&self) -> Vec<u8> {
        [&self.lock[..], b":observers"].concat()
    }

    /// The release record of the lease `token` of this key, whatever its kind
    /// (`<lock name>:rel:<token hex>`): written by the release scripts after they
    /// delete the lease, read by a retried release (see `lua/release.lua`). Tokens
    /// are random per lease, so the leases of the mutex, the read-write lock and the
    /// semaphore of one key never share a record.
    pub(super) fn release_record(&self, token: &str) -> Vec<u8> {
        [&self.lock[..], b":rel:", token.as_bytes()].concat()
    }
}

#[cfg(test)]
mod tests {
    use super::{key_name, parse_lock_name};
    use crate::key::LockKey;

    #[test]
    fn names_parse_back_to_their_keys() {
        for key in ["a", "a{b}", "100%", "x:y"] {
            let key = LockKey::from(key);
            let name = key_name("p", &key, ":wr");
            assert_eq!(parse_lock_name("p", &name), Some((key, &b":wr"[..])));
        }
        assert_eq!(parse_lock_name("p", b"q:{a}"), None);
    }
}
