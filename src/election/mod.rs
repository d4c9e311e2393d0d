//! Leader election on the mutex's lease: [`Election`], [`Leadership`],
//! [`LeaderInfo`], [`Observation`].
//!
//! A leader is the holder of the key's exclusive lock, taken through the mutex's
//! lock path (local coalescing, backend queue, pub/sub wake-ups, renewal with its
//! loss signal): the term is that lease's [`FencingToken`](crate::FencingToken).
//! The only state of its own is the **leader record** (`<prefix>:{<key>}:leader`
//! on Redis), which names the leader for everyone else, and the registrations of
//! the instances that observe it, to which the backend announces each change of
//! the record; ARCHITECTURE.md says why it keeps the mutex's guarantees, and why
//! observation by message stays correct when a message is lost.
//!
//! One idea per file: `candidate.rs` ([`Election`]: campaign, read, observe, run,
//! and the pace of a waiting candidate), `leadership.rs` ([`Leadership`] and the
//! refresh of its record), `record.rs` ([`LeaderInfo`] and the record's
//! encoding), `observe.rs` ([`Observation`], its buffer and its task), `run.rs`
//! (one term of `run`: work, stop hook, release), `signals.rs` (logs and
//! metrics).
//!
//! **Invariants**
//!
//! 1. A record is written only by the holder of the term it names, after the lease
//!    was granted, with the lease TTL; a record of a smaller term never replaces a
//!    greater one (the backend compares).
//! 2. A [`Leadership`] stops refreshing its record when it is dropped, resigned or
//!    lost; a resignation deletes the record (if still its own) before the lease is
//!    released.
//! 3. An observer's value is only ever a record it read. It reads after every
//!    announced change, after every reconnect of the instance's subscription and
//!    at least once per lease TTL, so a lost announcement delays it by a TTL at
//!    most, never for good.
//! 4. An [`Observation`] delivers every change it read, in order; a reader that
//!    falls behind its buffer is told how many it missed, never skipped silently.
//! 5. `run`'s order is: work stopped → stop hook → lease released; the work sees
//!    its loss under every [`LossPolicy`](crate::LossPolicy).
//! 6. A waiting candidate asks the backend at least once per pace (a third of the
//!    lease TTL, 100 ms to 10 s, ±25 %), besides its wake-ups and the times the
//!    backend names.

mod candidate;
mod leadership;
mod observe;
mod record;
mod run;
mod signals;

pub use candidate::{Election, MAX_IDENTITY_LEN};
pub use leadership::Leadership;
pub use observe::{Observation, Observed};
pub use record::LeaderInfo;
/// The record's reader, for `inspect`.
#[cfg(feature = "inspect")]
pub(crate) use record::decode;
pub use run::{StopCause, Stopped};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::backend::MemoryBackend;
    use crate::locker::Locker;

    use super::Observed;

    /// In memory the backend's own write and deletion announce the change: an
    /// observer of another instance follows a gain, a resignation and the next
    /// gain with the clock paused, well before its renewal interval (let alone
    /// its lease TTL) could pass.
    #[tokio::test(start_paused = true)]
    async fn an_observer_follows_announced_changes_without_time_passing() {
        let ttl = Duration::from_secs(60);
        let memory = MemoryBackend::new();
        let build = |backend: MemoryBackend| {
            Locker::builder(backend)
                .lease_ttl(ttl)
                .renew_every(ttl / 4)
                .build()
                .unwrap()
        };
        let (candidates, observer) = (build(memory.clone()), build(memory));
        let mut seen = observer.election("jobs").observe();
        let start = tokio::time::Instant::now();
        let soon = || start.elapsed() < ttl / 4;
        assert_eq!(seen.next().await, Some(Observed::NoLeader));

        let a = candidates.election("jobs").identity("a");
        let first = a.campaign().await.unwrap();
        let first_term = first.fencing_token();
        match seen.next().await {
            Some(Observed::Leader(l)) => assert_eq!(l.term, first_term),
            other => panic!("{other:?}"),
        }
        assert!(soon(), "seen only after {:?}", start.elapsed());

        first.resign().await.unwrap();
        assert_eq!(seen.next().await, Some(Observed::NoLeader));
        assert!(soon(), "seen only after {:?}", start.elapsed());

        let second = candidates
            .election("jobs")
            .identity("b")
            .campaign()
            .await
            .unwrap();
        let second_term = second.fencing_token();
        assert!(second_term > first_term);
        match seen.next().await {
            Some(Observed::Leader(l)) => {
                assert_eq!((l.identity.as_str(), l.term), ("b", second_term));
            }
            other => panic!("{other:?}"),
        }
        assert!(soon(), "seen only after {:?}", start.elapsed());
        second.resign().await.unwrap();
        drop(seen);
        // The released lease may stay cached for its linger.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(candidates.active_keys() + observer.active_keys(), 0);
    }

    #[test]
    fn observe_outside_a_runtime_does_not_panic() {
        let locker = Locker::builder(MemoryBackend::new()).build().unwrap();
        let mut seen = locker.election("jobs").observe();
        assert_eq!(seen.current(), None);
        assert_eq!(
            futures::FutureExt::now_or_never(seen.next()),
            Some(None),
            "no task keeps it current: it has ended"
        );
    }
}
