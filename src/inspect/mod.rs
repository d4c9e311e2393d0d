//! Operating lockflight's Redis keys: read-only queries (who holds a key, since
//! when, who waits, which read leases and permits are out), listing held keys, and
//! an operator's forced release that advances the key's fences. What the
//! `lockflight` command line tool runs.
//!
//! An [`Inspector`] knows the key prefix and runs on any `redis` async
//! connection to the server (or, for one key, a cluster connection: every name of
//! a key shares one slot). Listing uses `SCAN` on one server: on a Cluster, list
//! each primary on a connection of its own (what `lockflight list --cluster`
//! does); no key is listed by two primaries.
//!
//! ```no_run
//! # async fn demo() -> lockflight::Result<()> {
//! use lockflight::inspect::Inspector;
//!
//! let mut conn = redis::Client::open("redis://127.0.0.1:6379")
//!     .expect("a valid URL")
//!     .get_multiplexed_async_connection()
//!     .await
//!     .expect("Redis is up");
//! let inspector = Inspector::new("lockflight");
//! let state = inspector.key(&mut conn, "sku:555").await?;
//! if let Some(holder) = &state.holder {
//!     println!("held for {:?} more, fence epoch {:?}", holder.ttl, state.fence_epoch);
//! }
//! println!("{} instances wait", state.queue.len());
//! # Ok(()) }
//! ```
//!
//! A lease is stored as its token, whose first 16 hex digits are the id of the
//! instance that took it ([`LeaseState::instance`]; what
//! `RedisBackend::instance_id` returns in that process); waiting instances are
//! stored by id. [`Inspector::instance`] reads who an id is (host, process id,
//! name) from the card each instance keeps while it runs.

mod force;
mod instance;
mod list;
mod names;
mod reply;
mod state;

pub use force::ForcedRelease;
pub use instance::InstanceCard;
pub use list::{ListedKey, Listing};
pub use state::{KeyState, LeaseState, MEMBERS_SHOWN, WaiterState};

use crate::key::LockKey;
use names::Names;

/// Reads and operates on lockflight's Redis names under one prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspector {
    prefix: String,
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
        Names::new(&self.prefix, key).base
    }
}
