//! The Redis names lockflight's Redis backend gives a key's records and an
//! instance's channel, computed from the documented key layout (ARCHITECTURE.md,
//! "Redis key layout") with the prefix the backend was built with
//! (`RedisBackendBuilder::prefix`, default `RedisBackendBuilder::DEFAULT_PREFIX`).
//!
//! The backend does not expose its names; `tests/locks/redis_lock/names.rs` checks these
//! against what it writes.

use lockflight::LockKey;

/// The mutex lock of `key`: `<prefix>:{<key>}`, with `%`, `{` and `}` of the key
/// percent-escaped. Every other name of the key starts with it (see [`suffixed`]:
/// `:fence`, `:wq`, `:rd`, `:wr`, `:semn`, …).
///
/// [`suffixed`]: crate::suffixed
pub fn lock(prefix: &str, key: &LockKey) -> Vec<u8> {
    let mut name = Vec::with_capacity(prefix.len() + key.len() + 4);
    name.extend_from_slice(prefix.as_bytes());
    name.extend_from_slice(b":{");
    for &b in key.as_bytes() {
        match b {
            b'%' => name.extend_from_slice(b"%25"),
            b'{' => name.extend_from_slice(b"%7B"),
            b'}' => name.extend_from_slice(b"%7D"),
            _ => name.push(b),
        }
    }
    name.push(b'}');
    name
}

/// The queue of instances waiting for the mutex `key` (a sorted set): [`lock`] + `:wq`.
pub fn queue(prefix: &str, key: &LockKey) -> Vec<u8> {
    crate::suffixed(&lock(prefix, key), ":wq")
}

/// The permit set of semaphore `key` (a sorted set: token → expiry in ms):
/// [`lock`] + `:sem`; its count and waiting sets are this name + `n`, `q`, `qx`.
pub fn permits(prefix: &str, key: &LockKey) -> Vec<u8> {
    crate::suffixed(&lock(prefix, key), ":sem")
}

/// The leader record of the election `key` (a string): [`lock`] + `:leader`.
pub fn leader(prefix: &str, key: &LockKey) -> Vec<u8> {
    crate::suffixed(&lock(prefix, key), ":leader")
}

/// The observers of the leader record of the election `key` (a sorted set: an
/// observing instance's [`channel`] → its registration's expiry in ms, server
/// time): [`lock`] + `:observers`.
pub fn observers(prefix: &str, key: &LockKey) -> Vec<u8> {
    crate::suffixed(&lock(prefix, key), ":observers")
}

/// The pub/sub channel of the backend instance `instance_id`
/// (`RedisBackend::instance_id`): `<prefix>:inst:<instance_id>`.
pub fn channel(prefix: &str, instance_id: &str) -> String {
    format!("{prefix}:inst:{instance_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_layout() {
        let key = LockKey::from("a{b}%c");
        assert_eq!(lock("app", &key), b"app:{a%7Bb%7D%25c}");
        assert_eq!(queue("app", &key), b"app:{a%7Bb%7D%25c}:wq");
        assert_eq!(permits("p", &"k".into()), b"p:{k}:sem");
        assert_eq!(leader("p", &"k".into()), b"p:{k}:leader");
        assert_eq!(observers("p", &"k".into()), b"p:{k}:observers");
        assert_eq!(channel("lockflight", "x1"), "lockflight:inst:x1");
    }
}
