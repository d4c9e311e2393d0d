//! Read-write locks: [`RwLock::read`](crate::rwlock::RwLock::read) and
//! [`RwLock::write`](crate::rwlock::RwLock::write), with [`ReadGuard`] and [`WriteGuard`].
//!
//! Many readers or one writer per key, across every instance that shares the
//! backend. The read-write lock of a key is its own lock: it neither excludes nor
//! waits for the exclusive lock ([`Locker::lock`](crate::Locker::lock)) or a
//! semaphore of the same key string (their backend names differ). Each instance
//! stays cheap under contention:
//!
//! * **Readers of one process share one read lease.** The first local reader of a
//!   key acquires a read lease at the backend, readers that arrive within the
//!   lease's admission window ([`READ_ADMISSION_WINDOW`]) join it in memory, and the
//!   last one to leave releases it: N overlapping local readers cost one acquire and
//!   one release. The lease is renewed once for all of them, and its loss is
//!   signalled to each of them.
//! * **One local writer at a time talks to the backend.** Locally, readers and
//!   writers pass a fair (FIFO) local read-write lock per key: a writer waits there for the
//!   local readers to leave, and readers that arrive after a waiting writer queue
//!   behind it (local writer preference).
//! * **Writer preference across instances.** A writer that has to wait registers at
//!   the backend as a waiting writer (an entry that expires unless the writer keeps
//!   asking, so a crashed writer blocks nobody for long). While one is registered,
//!   no new read lease is granted anywhere; a shared read lease admits new local
//!   readers only within its admission window, after which newcomers wait for it to
//!   drain and then ask the backend again (where the writer comes first).
//! * **Wake-ups, not polling.** A waiting instance is woken by a message when a
//!   write lease is released or the last read lease leaves (the backend's pub/sub
//!   channel, like the mutex), with the backend's `retry_in` as a fallback timer.
//!   On Redis, a release that frees the lock while a writer of another instance
//!   waits gives that writer the write lease on the server instead, and the writer
//!   holds from the message with no request of its own (`Stats::grants`).
//!
//! # How long can readers hold off a writer?
//!
//! Once a writer has been told to wait (its registration landed), no new read
//! lease is granted, and every read lease stops admitting newcomers at most
//! [`READ_ADMISSION_WINDOW`] after it was acquired. So the writer gets the lock
//! within **admission window + longest read hold + wake-up latency** (a pub/sub
//! message, or at worst the backend's retry interval: a third of the Redis
//! backend's queue entry TTL, 1 s by default) — unless another *writer* gets it
//! first: writers are not ordered among themselves. Before it registers, a writer
//! passes its own process's local lock, behind the local readers that arrived before it
//! (they may take one more read lease, under the same window).
//!
//! Proved by the `a_stream_of_readers_cannot_starve_a_waiting_writer` test: with
//! writer preference or the window turned off, its writer waits 10 s or more.
//!
//! # Fencing
//!
//! [`WriteGuard::fencing_token`] strictly increases across the write leases of a key
//! (`max(last + 1, server time in µs)`, like the mutex's epochs, but from the rw
//! lock's own fence). [`ReadGuard::last_write`] is the token of the last write the
//! read lease observed (the fence at its acquisition; no write can happen while it
//! is held): a reader can tell a resource which version it read.
//!
//! # Reentrancy
//!
//! Not reentrant: a task holding a [`WriteGuard`] that asks for `read` or `write` of
//! the same key waits behind itself until its wait timeout (so does a reader asking
//! for `write`).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockflight::Result<()> {
//! use lockflight::{Locker, MemoryBackend};
//!
//! let locker = Locker::builder(MemoryBackend::new()).build()?;
//! let w = locker.rwlock("catalog").write().await?;
//! let version = w.fencing_token();
//! w.release().await?;
//!
//! let (a, b) = (locker.rwlock("catalog").read().await?, locker.rwlock("catalog").read().await?);
//! assert_eq!(a.last_write(), version);
//! assert!(locker.rwlock("catalog").try_write().await?.is_none()); // readers hold it
//! drop((a, b));
//! # Ok(()) }
//! ```

pub use crate::locker::RwLock;
pub use crate::rw::{READ_ADMISSION_WINDOW, ReadGuard, WriteGuard};
