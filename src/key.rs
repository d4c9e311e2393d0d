//! Lock keys and the extractors that find a key in a request.
//!
//! A [`LockKey`] is an arbitrary, non-empty byte string of at most [`LockKey::MAX_LEN`]
//! bytes that is not whitespace only. Conversions from `&str`, `String`, `&[u8]` and `Vec<u8>` are infallible;
//! the key is validated when it is used, so a bad key becomes a clear
//! [`Error::InvalidKey`](crate::Error::InvalidKey) at the call site instead of a panic.
//!
//! Binary keys round-trip exactly. The Redis names derived from a key escape `%`, `{`
//! and `}` so that every name of one key shares one cluster hash tag and no two keys
//! ever share a derived name.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

/// The name of a lock: a non-empty byte string of at most [`LockKey::MAX_LEN`] bytes,
/// not whitespace only.
///
/// Cheap to clone (reference counted). Ordering, equality and hashing are those of
/// the bytes.
///
/// ```
/// use lockflight::LockKey;
///
/// let a = LockKey::from("sku:555");
/// let b = LockKey::from(b"sku:555".to_vec());
/// assert_eq!(a, b);
/// assert_eq!(a.as_bytes(), b"sku:555");
/// assert_eq!(a.to_string(), "sku:555");
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(Arc<[u8]>);

impl LockKey {
    /// The longest key accepted, in bytes (1 KiB).
    ///
    /// Longer keys are rejected with [`Error::InvalidKey`](crate::Error::InvalidKey):
    /// every key is copied into several Redis names and into every wake-up message,
    /// so an unbounded key would be an unbounded cost per lock.
    pub const MAX_LEN: usize = 1024;

    /// The key's bytes, exactly as given.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The key as UTF-8 text, if it is valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the key is empty (an empty key is never accepted for locking).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Why the key names nothing, if it does not: it is empty, or UTF-8 text of
    /// whitespace only (a key built from a missing or blank value, which would
    /// make every such request share one lock).
    pub(crate) fn blank(&self) -> Option<&'static str> {
        if self.0.is_empty() {
            Some("the key is empty")
        } else if self
            .0
            .first()
            .is_some_and(|&b| !b.is_ascii() || char::from(b).is_whitespace())
            && self.as_str().is_some_and(|s| s.trim().is_empty())
        {
            // A blank key starts with whitespace: an ASCII first byte that is not
            // whitespace settles it without decoding the key.
            Some("the key is blank (whitespace only)")
        } else {
            None
        }
    }

    /// What is wrong with the key for locking, if anything: the reason of the
    /// [`Error::InvalidKey`](crate::Error::InvalidKey) that
    /// [`validate`](LockKey::validate) returns.
    pub(crate) fn problem(&self) -> Option<String> {
        if let Some(blank) = self.blank() {
            return Some(blank.into());
        }
        if self.0.len() > LockKey::MAX_LEN {
            return Some(format!(
                "the key is {} bytes long, the limit is {}",
                self.0.len(),
                LockKey::MAX_LEN
            ));
        }
        None
    }
}

impl From<&str> for LockKey {
    fn from(s: &str) -> Self {
        LockKey(Arc::from(s.as_bytes()))
    }
}

impl From<String> for LockKey {
    fn from(s: String) -> Self {
        LockKey(Arc::from(s.into_bytes()))
    }
}

impl From<&String> for LockKey {
    fn from(s: &String) -> Self {
        LockKey::from(s.as_str())
    }
}

impl From<&[u8]> for LockKey {
    fn from(b: &[u8]) -> Self {
        LockKey(Arc::from(b))
    }
}

impl<const N: usize> From<&[u8; N]> for LockKey {
    fn from(b: &[u8; N]) -> Self {
        LockKey(Arc::from(&b[..]))
    }
}

impl From<Vec<u8>> for LockKey {
    fn from(b: Vec<u8>) -> Self {
        LockKey(Arc::from(b))
    }
}

impl From<&LockKey> for LockKey {
    fn from(k: &LockKey) -> Self {
        k.clone()
    }
}

impl Borrow<[u8]> for LockKey {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for LockKey {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Longest prefix of a key shown in messages; the rest is elided.
const DISPLAY_LIMIT: usize = 64;

impl fmt::Display for LockKey {
    /// Text keys print as they are; other bytes print as `\xNN` escapes. Keys longer
    /// than 64 bytes are shortened with `…(N bytes)`, so an error about an oversized
    /// key stays readable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = &self.0[..self.0.len().min(DISPLAY_LIMIT)];
        for chunk in shown.utf8_chunks() {
            for c in chunk.valid().chars() {
                if c.is_control() {
                    write!(f, "{}", c.escape_default())?;
                } else {
                    write!(f, "{c}")?;
                }
            }
            for b in chunk.invalid() {
                write!(f, "\\x{b:02x}")?;
            }
        }
        if self.0.len() > DISPLAY_LIMIT {
            write!(f, "…({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockKey(\"{self}\")")
    }
}

/// Finds the lock key of a request.
///
/// Implemented for closures `Fn(&Req) -> Option<LockKey>` and for
/// [`KeyFrom`](crate::layer::KeyFrom) (a header, a path segment, an axum path
/// parameter).
/// `None` means the request has no key; what happens then is the caller's policy
/// (the lock layer rejects it unless told to run it unlocked).
///
/// The lock layers call [`extract_key`](KeyExtractor::extract_key), which may
/// look at the request mutably and says *why* there is no key; by default it
/// calls [`extract`](KeyExtractor::extract).
///
/// ```
/// use lockflight::{LockKey, layer::KeyExtractor};
///
/// let by_query = |req: &String| req.strip_prefix("sku=").map(LockKey::from);
/// assert_eq!(by_query.extract(&"sku=7".to_string()), Some(LockKey::from("7")));
/// assert_eq!(by_query.extract(&"other".to_string()), None);
/// let why = by_query.extract_key(&mut "other".to_string()).unwrap_err();
/// assert!(why.is_client_error());
/// ```
pub trait KeyExtractor<Req> {
    /// The key of `req`, or `None` when it has none.
    fn extract(&self, req: &Req) -> Option<LockKey>;

    /// The key of `req`, or why it has none: what the lock layers call.
    ///
    /// The default calls [`extract`](KeyExtractor::extract) and blames the
    /// request ([`NoKey::client`]) when it finds nothing. Override it when the key
    /// is cheaper to take with mutable access, or when a missing key can be the
    /// route's fault ([`NoKey::route`]).
    fn extract_key(&self, req: &mut Req) -> Result<LockKey, NoKey> {
        self.extract(req)
            .ok_or_else(|| NoKey::client("the request carries no lock key"))
    }
}

/// An extracted key that names something, before any prefix: an empty or blank
/// one (an empty path segment, a blank header) is the request's fault, so that
/// the layers fail closed instead of locking the prefix alone.
pub(crate) fn named(key: LockKey) -> Result<LockKey, NoKey> {
    match key.blank() {
        Some(why) => Err(NoKey::client(why)),
        None => Ok(key),
    }
}

/// Why a request has no lock key: the request's fault (a missing header, a path
/// parameter that is not UTF-8 once decoded) or the route's (a parameter the route
/// does not have, a layer installed where the router has not run yet).
///
/// The lock layer answers the first with `400 invalid_key` and the second with
/// `500 invalid_config` (feature `axum`), and logs both at `WARN` with the route.
///
/// ```
/// use lockflight::layer::NoKey;
///
/// let missing = NoKey::client("no `x-sku` header");
/// assert!(missing.is_client_error());
/// assert_eq!(missing.reason(), "no `x-sku` header");
/// assert!(!NoKey::route("the route has no `{sku}` parameter").is_client_error());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoKey {
    reason: String,
    client: bool,
}

impl NoKey {
    /// The request lacks what the key is made of.
    pub fn client(reason: impl Into<String>) -> Self {
        NoKey {
            reason: reason.into(),
            client: true,
        }
    }

    /// The route cannot yield a key, whatever the request: a configuration error.
    pub fn route(reason: impl Into<String>) -> Self {
        NoKey {
            reason: reason.into(),
            client: false,
        }
    }

    /// What is missing, in words (never the request's data beyond names).
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether the request, not the route, is at fault.
    pub fn is_client_error(&self) -> bool {
        self.client
    }
}

impl fmt::Display for NoKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl<Req, F> KeyExtractor<Req> for F
where
    F: Fn(&Req) -> Option<LockKey>,
{
    fn extract(&self, req: &Req) -> Option<LockKey> {
        self(req)
    }
}

/// The stable 64-bit hash of a key's bytes: XXH3-64 with seed 0, the same on every
/// platform and process. The backends' striping and Redlock's wake node use it.
/// `lockflight_routing::key_hash` is a copy of this function (both pin the same
/// known answers in their tests).
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_keys_round_trip() {
        let raw = vec![0u8, 0xff, b'{', b'}', b'%'];
        let k = LockKey::from(raw.clone());
        assert_eq!(k.as_bytes(), &raw[..]);
        assert_eq!(k.as_str(), None);
        assert_eq!(k.to_string(), "\\u{0}\\xff{}%");
    }

    #[test]
    fn validation_names_the_problem() {
        let empty = LockKey::from("").validate().unwrap_err();
        assert!(empty.to_string().contains("empty"), "{empty}");
        for blank in [" ", "\t\n", "\u{000B}", "\u{3000}", " \u{3000}"] {
            let e = LockKey::from(blank).validate().unwrap_err();
            assert!(e.to_string().contains("blank"), "{e}");
        }
        // Not text: bytes as they are.
        LockKey::from(&[b' ', 0xff][..]).validate().unwrap();
        LockKey::from(" sku ").validate().unwrap();
        let long = LockKey::from(vec![b'a'; LockKey::MAX_LEN + 1])
            .validate()
            .unwrap_err();
        assert!(long.to_string().contains("1025 bytes"), "{long}");
        LockKey::from(vec![b'a'; LockKey::MAX_LEN])
            .validate()
            .unwrap();
    }

    /// The same known answers as `lockflight_routing::key_hash` pins
    /// (routing/tests/routing/vectors.rs): the two copies hash alike.
    #[test]
    fn key_hash_is_routings_key_hash() {
        assert_eq!(key_hash(b""), 0x2D06_8005_38D3_94C2);
        assert_eq!(key_hash(b"a"), 0xE6C6_32B6_1E96_4E1F);
        assert_eq!(key_hash(b"abc"), 0x78AF_5F94_892F_3950);
        assert_eq!(key_hash(b"sku:555"), 0x4c94_58a0_6b04_d9b3);
        assert_eq!(key_hash(b"lockflight"), 0x266a_a90b_72c9_e8b0);
    }
}
