//! What an [`IdempotencyLayer`](super::IdempotencyLayer) gives each
//! [`IdempotencyService`](super::IdempotencyService): the locker, the bounds, the
//! retention, the policy; and the scoped key of a request. Below both the layer
//! (which builds the settings) and the service (which reads them).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, StatusCode};

use crate::key::LockKey;
use crate::locker::Locker;

/// Which responses are not stored (a retry runs the handler again).
pub(super) type Retryable = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// The settings of one layer, shared by its services.
#[derive(Clone)]
pub(super) struct Settings {
    pub(super) locker: Locker,
    pub(super) required: bool,
    pub(super) prefix: Vec<u8>,
    pub(super) max_key_len: usize,
    pub(super) max_body: usize,
    pub(super) max_response: usize,
    pub(super) retention: Duration,
    pub(super) wait: Duration,
    pub(super) retry_after: u32,
    pub(super) stored_headers: Vec<HeaderName>,
    pub(super) retryable: Retryable,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("locker", &self.locker)
            .field("required", &self.required)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("max_key_len", &self.max_key_len)
            .field("max_body", &self.max_body)
            .field("max_response", &self.max_response)
            .field("retention", &self.retention)
            .field("wait", &self.wait)
            .field("retry_after", &self.retry_after)
            .field("stored_headers", &self.stored_headers)
            .finish_non_exhaustive()
    }
}

/// Whether `key` (the idempotency key as the client sent it) is one the layer
/// accepts: 1 to `max` bytes of visible ASCII or spaces, not all spaces.
pub(super) fn valid_key(key: &[u8], max: usize) -> bool {
    !key.is_empty()
        && key.len() <= max
        && key.iter().all(|&b| (0x20..0x7f).contains(&b))
        && key.iter().any(|&b| b != b' ')
}

impl Settings {
    /// The lock key of a request: `<prefix>idempotency:<METHOD> <route> <key>`,
    /// where `route` is the matched route (or the path) and `key` the client's.
    /// No part but the prefix and the key holds a space, and the key comes last,
    /// so two scopes never share a key.
    pub(super) fn scoped(&self, method: &http::Method, route: &str, key: &[u8]) -> LockKey {
        let mut out = Vec::with_capacity(
            self.prefix.len() + 14 + method.as_str().len() + route.len() + key.len(),
        );
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(b"idempotency:");
        out.extend_from_slice(method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(route.as_bytes());
        out.push(b' ');
        out.extend_from_slice(key);
        LockKey::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::valid_key;

    #[test]
    fn keys_are_visible_ascii_within_the_bound() {
        assert!(valid_key(b"8e03978e-40d5-43e8-bc93-6894a57f9324", 255));
        assert!(valid_key(b"a b", 3));
        assert!(!valid_key(b"abcd", 3), "too long");
        assert!(!valid_key(b"", 3));
        assert!(!valid_key(b"   ", 3), "only spaces");
        assert!(!valid_key(b"a\tb", 3), "a control character");
        assert!(!valid_key("é".as_bytes(), 3), "not ASCII");
    }
}
