//! An exhaustive model of the lease protocol's messages: which orders of requests
//! and replies a backend may see, and what each side then believes.
//!
//! The model is the protocol, not the code: two instances (A with two local tasks
//! that coalesce, B with one), the mutex's server-side scripts reduced to the lock
//! key and the per-lease release records, and a network that may delay any request
//! past any later one (requests of one instance travel on several connections with
//! no mutual order: the pool of acknowledged writes, the shared connection, a
//! reconnect), lose any reply after its request was applied, and deliver a request
//! that its sender gave up on (a timeout) after the re-sent copy. Every state
//! reachable within a budget of faults (timeouts) is visited once (depth-first,
//! states deduplicated), and three properties are checked in each:
//!
//! 1. **Exclusion**: at most one task believes it holds the lock (the backend keeps
//!    its data: no expiry, no `FLUSHALL`, no failover in the model).
//! 2. **Truthful release**: a release answered "released" (`Ok`) ends a section
//!    during which the backend held the lock for that task's token throughout.
//! 3. **Nothing stranded**: once no request is in flight, the lock is not held for
//!    a token that no task will use or release (it would wait out its TTL).
//!
//! It covers acquire (with re-grant of an owned token), renew ("not
//! the owner" is a loss), release (with its record), local handoff, the local
//! leader's inheritance after a failed release or an abandoned acquire, and the
//! background release of an abandoned token; each request may be re-sent after a
//! timeout while its first copy is still in flight. It does not cover the queue,
//! claims and wake-ups (they decide who asks when, not who holds), nor the grant
//! path (a release that grants the lock on the server to the queue's head: its
//! safety is a matter of time, and [`timed`] explores it, its grant messages
//! lost, delayed past anything, duplicated and read after their waiter gave
//! up), the read-write
//! lock and the semaphore (their grants never reuse a token; their scripts keep
//! the same record rule), and Redlock's quorum (`backend/redlock/model.rs`). Time
//! is the second model's, [`timed`]: TTL expiry of the lock, release records that
//! expire, and a server restart that loses every key, with or without the life
//! that ends the leases of the earlier one.
//!
//! Two designs are explored. [`Design::Reuse`](messages::Design::Reuse) is the rejected design: a
//! release that fails leaves its token to the next local leader, which acquires
//! with it (a re-grant), and an acquire with a token deletes its release record.
//! [`Design::Retire`](messages::Design::Retire) is the protocol lockflight runs: a token whose release was sent is never
//! acquired again (the next local leader takes a fresh token and the failed one is
//! released in the background), a release that finds nothing to delete still
//! leaves a record (the token is retired), and an acquire refuses a token that has
//! a record. (Without that last record, the model finds a stranded lock: an
//! abandoned acquire's background release lands before the acquire itself.) The tests of `messages` assert that `Reuse` violates exclusion, the truthful
//! release and strands locks when requests may be reordered, that it is safe when
//! one FIFO connection carries every request of an instance, and that `Retire` is
//! safe in every order.

mod messages;
pub(crate) mod timed;
