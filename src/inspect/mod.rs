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
mod inspector;
mod instance;
mod list;
mod reply;
mod state;

pub use force::ForcedRelease;
pub use inspector::Inspector;
pub use instance::InstanceCard;
pub use list::{HeldKind, ListedKey, Listing};
pub use state::{KeyState, LeaseState, MEMBERS_SHOWN, Sizes, WaiterState};
