//! MemoryBackend's read-write locks: [`RwBackend`](crate::backend::rw::RwBackend).

use std::time::Duration;

use async_trait::async_trait;

use super::MemoryBackend;
use crate::backend::rw::RwBackend;
use crate::backend::{Extend, LeaseToken};
use crate::error::{Error, Result};
use crate::key::LockKey;

/// The in-process state of the rw locks.
#[derive(Debug, Default)]
pub(super) struct State {}

#[async_trait]
impl RwBackend for MemoryBackend {
    async fn extend_read(
        &self,
        key: &LockKey,
        _token: LeaseToken,
        _ttl: Duration,
    ) -> Result<Extend> {
        Err(Error::Unsupported {
            key: key.clone(),
            what: "read-write locks",
        })
    }
    async fn extend_write(
        &self,
        key: &LockKey,
        _token: LeaseToken,
        _ttl: Duration,
    ) -> Result<Extend> {
        Err(Error::Unsupported {
            key: key.clone(),
            what: "read-write locks",
        })
    }
}
