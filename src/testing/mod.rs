//! A simulated lock server for testing code that holds locks (feature `testing`).
//!
//! [`SimServer`] stands in for Redis in a test: it keeps leases with their TTLs,
//! fencing epochs, queues, release records, wake-ups and revocations, and every
//! [`SimServer::backend`] is one more instance over them, to build a
//! [`Locker`](crate::Locker) on. Everything runs on Tokio's clock, so a test on a
//! paused clock (`#[tokio::test(start_paused = true)]`, Tokio's `test-util`
//! feature) drives TTLs, renewals, lingers and wait timeouts with
//! `tokio::time::advance`, deterministically and without waiting.
//!
//! Then the test breaks what production breaks (in brackets, the test of
//! `tests/conformance/twins.rs` that produces the same fault on a real server and checks
//! the same outcome there and here):
//!
//! * **lost replies and lost requests**: [`FaultBuilder::lose_reply`] applies a
//!   request and loses its answer, [`FaultBuilder::fail`] loses the request
//!   itself; the caller sees a connection error either way ([`Op`] names the
//!   requests) (twins: `a_lost_acquire_reply_is_repeated_and_the_lock_held`,
//!   `a_lost_renewal_reply_keeps_the_lease`,
//!   `lost_renewals_lose_the_lease_at_its_ttl`,
//!   `lost_releases_free_the_key_at_the_ttl`; a lost release reply is the
//!   conformance cell `release::truthful_release_after_a_lost_reply`);
//! * **a failover or an eviction**: [`SimServer::lose_lease`] deletes a key's
//!   leases behind their holders' backs (twin: the conformance cell
//!   `loss::a_deleted_lease_is_signalled_lost`);
//! * **a restart without persistence**: [`SimServer::restart`] (twin: the
//!   conformance cell `release::release_after_a_restart_reports_the_loss`);
//! * **lost or late messages**: [`FaultBuilder::drop_message`] and
//!   [`FaultBuilder::delay_message`] for wake-ups and revocations ([`Message`])
//!   (twins: `a_dropped_wakeup_makes_the_waiter_late`,
//!   `a_delayed_wakeup_makes_the_waiter_late`,
//!   `a_dropped_revocation_keeps_a_cached_lease_until_its_linger`,
//!   `a_delayed_revocation_gives_up_a_cached_lease_late`);
//! * **an outage**: [`SimServer::unreachable_for`] (requests fail) and
//!   [`SimServer::hang_for`] (requests wait until the network heals) (twins:
//!   `an_unreachable_server_fails_requests_until_the_deadline`,
//!   `a_hanging_server_serves_requests_when_it_heals`).
//!
//! And a fenced resource to see what a holder that missed its loss does to
//! data: [`SimFencedKey`] ([`SimServer::fenced_key`]) is
//! [`FencedKey`](crate::fence::FencedKey) without Redis, with its rule, its
//! outcomes and its errors; its requests ([`Op::Fenced`]) meet the server's
//! faults, so a repeat after a lost reply can be tested too (twins: every case
//! of `tests/locks/fence/cases.rs` runs on both).
//!
//! When the holder feels each fault (at its next renewal, at the end of its
//! validity, never) is in the guide's
//! [testing page](crate::guide::testing#when-the-holder-feels-each-fault).
//!
//! Elections ([`Locker::election`](crate::Locker::election)) run on it too: the
//! leader record's writes, reads and deletes are requests ([`Op::Leader`]) that
//! faults hit like any other, and [`lose_lease`](SimServer::lose_lease) of the
//! election key takes leadership away.
//!
//! A fault is limited to a key with [`FaultBuilder::on_key`] and to the next few
//! requests with [`FaultBuilder::next`]. [`SimServer::requests`] and
//! [`SimBackend::requests`] count the requests of each kind, so a test can say
//! that a code path took one lock round trip.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockflight::Result<()> {
//! use std::time::Duration;
//! use lockflight::Locker;
//! use lockflight::testing::{Op, SimServer};
//!
//! tokio::time::pause();
//! let server = SimServer::new();
//! let locker = Locker::builder(server.backend())
//!     .lease_ttl(Duration::from_secs(3))
//!     .build()?;
//!
//! let guard = locker.lock("job:7").await?;
//! server.fault().on_key("job:7").fail(Op::Renew)?; // every renewal is lost
//! tokio::time::advance(Duration::from_secs(4)).await;
//! guard.lost().await; // at the end of the validity, at the latest
//! assert!(guard.is_lost());
//! # Ok(()) }
//! ```
//!
//! # The model
//!
//! The server holds the same locks as [`MemoryBackend`](crate::MemoryBackend) and
//! keeps the contract of the backend interface that Redis keeps: one owner per
//! lock, expiry at the TTL, epochs that strictly increase per key, a repeated
//! release reporting the release it repeats (a release record lives 11 s), a
//! wake-up message per release, and a revocation to the holder's instance when
//! another instance queues for its mutex. A lease that expires wakes nobody, as
//! on Redis: waiters ask again when their last answer told them to. A request
//! is applied at once, atomically, in the order requests arrive.
//!
//! Fencing: epochs are minted as Redis mints them, `max(last + 1, clock µs)`,
//! from the server's own clock: Tokio's, counted from the server's creation.
//! So a test on a paused clock gets the same fencing tokens in every run (the
//! first grant's epoch is 1, one made 3 s of virtual time later at least
//! 3,000,000), and a trace of a test can be compared whole. Redis loses its
//! fence keys with its data and keeps the next epochs increasing by its clock
//! alone; a simulated restart takes no time, so the server keeps its last epoch
//! across [`restart`](SimServer::restart) and
//! [`lose_lease`](SimServer::lose_lease) instead, and its epochs strictly
//! increase per key in every case. A test cannot observe the difference,
//! except that a read-write lock's last write epoch survives a restart here.
//! (Make the server inside the test, on its paused clock; lease tokens, which
//! no holder sees, stay random.)
//!
//! # What it does not model
//!
//! * **Replication lag**: there are no replicas; a failover is only its outcome,
//!   [`lose_lease`](SimServer::lose_lease). `READONLY` refusals and replica
//!   acknowledgements are not modelled.
//! * **Redis Cluster**: no cluster slots, slot moves or per-node failures.
//! * **Redlock**: no quorum of independent servers.
//! * **Time on the server**: leases expire on the test's clock, which the
//!   server and its clients share, so there is no clock drift.
//! * **The mutex's queue of waiting instances** outside fair mode: a release
//!   wakes every waiting instance and they compete, where Redis wakes the head
//!   of its FIFO queue and gives it a short claim. Which instance takes a
//!   contended key next may differ from Redis; that one takes it, and that no
//!   two hold it, do not. Fair mode orders instances by arrival, as Redis does.
//! * **Requests overtaking each other**: a request either arrives before its
//!   reply is produced or not at all; a late copy of an old request cannot arrive.
//! * **Fenced keys' other refusals**: no `OOM` or ACL refusal, and nothing but
//!   [`SimFencedKey`] writes its fence and write record, so they never hold a
//!   foreign value.

mod backend;
mod fault;
mod fence;
mod requests;
mod resources;
mod server;
mod shared;

pub use backend::SimBackend;
pub use fault::{FaultBuilder, Message, Op};
pub use fence::SimFencedKey;
pub use requests::Requests;
pub use server::SimServer;
