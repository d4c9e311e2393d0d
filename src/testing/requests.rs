//! The request counters: one per [`Op`], and their snapshot, [`Requests`].

use std::sync::atomic::{AtomicU64, Ordering};

use super::fault::Op;

/// How many requests of each kind reached the server (or an instance), whatever
/// happened to them: a failed or unanswered request counts.
///
/// Each request is one round trip to Redis, except renewals: the watchdog
/// renews a locker's due leases together, which Redis does in one script call
/// per batch and the kit counts per lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Requests {
    /// Acquires ([`Op::Acquire`]).
    pub acquire: u64,
    /// Renewals, one per lease ([`Op::Renew`]).
    pub renew: u64,
    /// Releases ([`Op::Release`]).
    pub release: u64,
    /// Waiters leaving a queue ([`Op::Leave`]).
    pub leave: u64,
    /// Leader record writes, reads and deletes ([`Op::Leader`]).
    pub leader: u64,
    /// Requests of fenced keys ([`Op::Fenced`]): counted by the server only, as
    /// they come from no instance.
    pub fenced: u64,
    /// Idempotency record fences, stores and reads ([`Op::Record`]).
    pub record: u64,
}

impl Requests {
    /// All requests.
    pub fn total(&self) -> u64 {
        self.acquire
            + self.renew
            + self.release
            + self.leave
            + self.leader
            + self.fenced
            + self.record
    }
}

/// Request counters, one per [`Op`].
#[derive(Debug, Default)]
pub(super) struct Counters([AtomicU64; Op::ALL.len()]);

impl Counters {
    pub(super) fn count(&self, op: Op) {
        self.0[op.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> Requests {
        let [acquire, renew, release, leave, leader, fenced, record] =
            Op::ALL.map(|op| self.0[op.index()].load(Ordering::Relaxed));
        Requests {
            acquire,
            renew,
            release,
            leave,
            leader,
            fenced,
            record,
        }
    }
}
