//! lockflight: Redis distributed locks that stay cheap under contention.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod coalesce;
mod error;
mod guard;
mod key;
mod lease;
mod locker;
mod slot;
mod stats;

pub use backend::memory::MemoryBackend;
pub use backend::redis::{RedisBackend, RedisBackendBuilder};
pub use backend::LockBackend;
pub use error::{Error, Phase, Result};
pub use guard::{FencingToken, LockGuard, LockInfo};
pub use key::{HeaderKey, KeyExtractor, LockKey, PathSegment, MAX_KEY_LEN};
pub use locker::{Handoff, Locker, LockerBuilder, LossPolicy};
pub use stats::Stats;
