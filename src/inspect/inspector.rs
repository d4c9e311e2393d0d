//! [`Inspector`]: the key prefix it reads under, and a key's lock name.

use crate::backend::redis::names::lock_name;
use crate::key::LockKey;

/// Reads and operates on lockflight's Redis names under one prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspector {
    pub(super) prefix: String,
}

impl Inspector {
    /// An inspector of the names under `prefix` (the backend's; default
    /// `lockflight`).
    pub fn new(prefix: impl Into<String>) -> Inspector {
        Inspector {
            prefix: prefix.into(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis name of the mutex of `key` (every other name of the key extends it).
    ///
    /// ```
    /// use lockflight::inspect::Inspector;
    ///
    /// assert_eq!(Inspector::new("app").lock_name(&"a{b}".into()), b"app:{a%7Bb%7D}");
    /// ```
    pub fn lock_name(&self, key: &LockKey) -> Vec<u8> {
        lock_name(&self.prefix, key)
    }
}
