//! The Redis names of a key, and back: the same as the backend's (`backend/redis`).

use crate::key::LockKey;

/// The Redis names of a key; the same as the backend's (`backend/redis`).
pub(super) struct Names {
    pub(super) base: Vec<u8>,
}

impl Names {
    pub(super) fn new(prefix: &str, key: &LockKey) -> Names {
        let mut base = Vec::with_capacity(prefix.len() + key.len() + 4);
        base.extend_from_slice(prefix.as_bytes());
        base.extend_from_slice(b":{");
        for &b in key.as_bytes() {
            match b {
                b'%' => base.extend_from_slice(b"%25"),
                b'{' => base.extend_from_slice(b"%7B"),
                b'}' => base.extend_from_slice(b"%7D"),
                _ => base.push(b),
            }
        }
        base.push(b'}');
        Names { base }
    }

    pub(super) fn with(&self, suffix: &str) -> Vec<u8> {
        [&self.base[..], suffix.as_bytes()].concat()
    }
}

/// The key a lock name `<prefix>:{<escaped key>}` belongs to, and the suffix
/// after it (`""` for the mutex, `":wr"`, …); `None` if it is not one.
pub(super) fn parse_name<'a>(prefix: &str, name: &'a [u8]) -> Option<(LockKey, &'a [u8])> {
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

#[cfg(test)]
mod tests {
    use super::parse_name;
    use crate::inspect::Inspector;
    use crate::key::LockKey;

    #[test]
    fn names_parse_back_to_their_keys() {
        let inspector = Inspector::new("p");
        for key in ["a", "a{b}", "100%", "x:y"] {
            let key = LockKey::from(key);
            let name = [&inspector.lock_name(&key)[..], b":wr"].concat();
            assert_eq!(parse_name("p", &name), Some((key, &b":wr"[..])));
        }
        assert_eq!(parse_name("p", b"q:{a}"), None);
    }
}
