//! RedisBackend's read-write locks: [`RwBackend`](crate::backend::rw::RwBackend).

use std::time::Duration;

use async_trait::async_trait;

use super::RedisBackend;
use crate::backend::rw::RwBackend;
use crate::backend::{Extend, LeaseToken};
use crate::error::{Error, Result};
use crate::key::LockKey;

#[async_trait]
impl RwBackend for RedisBackend {
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
