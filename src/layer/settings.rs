//! What a [`LockLayer`](super::LockLayer) gives each
//! [`LockService`](super::LockService): the locker, the per-call options, the
//! key's prefix, what to do with a request without a key, and when to lock.
//!
//! Below both the layer (which builds the settings) and the service (which reads
//! them): neither imports the other for them.

use std::sync::Arc;

use crate::error::Error;
use crate::key::{LockKey, NoKey};
use crate::locker::{LockOptions, Locker};

/// What [`LockService`](super::LockService) does with a request whose key
/// extractor finds no key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum MissingKey {
    #[default]
    Reject,
    RunUnlocked,
}

/// When the lock is taken: before the handler (the default), or by the handler's
/// [`Locked`](super::Locked) extractor once the request's body is in and valid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum LockAt {
    #[default]
    BeforeHandler,
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    InHandler,
}

/// The settings a [`LockLayer`](super::LockLayer) gives each
/// [`LockService`](super::LockService) (shared, cheap to clone).
#[derive(Clone, Debug)]
pub(crate) struct LayerSettings {
    pub(crate) locker: Locker,
    pub(crate) missing: MissingKey,
    pub(crate) options: LockOptions,
    pub(crate) prefix: Option<Arc<[u8]>>,
    pub(crate) acquire: LockAt,
}

impl LayerSettings {
    /// The defaults: the locker's own options, no prefix, a request without a key
    /// refused, the lock taken before the handler.
    pub(crate) fn new(locker: Locker) -> Self {
        LayerSettings {
            locker,
            missing: MissingKey::default(),
            options: LockOptions::default(),
            prefix: None,
            acquire: LockAt::default(),
        }
    }

    /// The key to lock for `extracted` (what the key extractor found): no key when
    /// it is empty or whitespace only, else the key behind the prefix.
    pub(crate) fn key(&self, extracted: LockKey) -> Result<LockKey, NoKey> {
        let key = crate::key::named(extracted)?;
        Ok(match &self.prefix {
            None => key,
            Some(prefix) => {
                let mut bytes = Vec::with_capacity(prefix.len() + key.as_bytes().len());
                bytes.extend_from_slice(prefix);
                bytes.extend_from_slice(key.as_bytes());
                LockKey::from(bytes)
            }
        })
    }
}

/// The error that refuses a request without a key, logged with its route.
pub(crate) fn refusal(no_key: &NoKey, route: &str) -> Error {
    if no_key.is_client_error() {
        tracing::info!(route, reason = %no_key, "lockflight: guarded request without a lock key refused");
        Error::InvalidKey {
            key: LockKey::from(""),
            reason: format!("{route}: {no_key}"),
        }
    } else {
        tracing::warn!(route, reason = %no_key, "lockflight: the lock layer of this route finds no key; every request is refused");
        Error::InvalidConfig {
            reason: format!("the lock layer of {route} finds no key: {no_key}"),
        }
    }
}
