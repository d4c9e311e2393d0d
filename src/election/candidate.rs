//! [`Election`]: a candidate's handle on the election of one key, and its door on
//! the locker, [`Locker::election`].

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;

use super::leadership::Leadership;
use super::observe::{self, Observation};
use super::record::{LeaderInfo, decode, encode};
use super::run::{self, Stopped};
use super::signals;
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::lease::LossSignal;
use crate::locker::Locker;

/// The longest identity, in bytes.
pub const MAX_IDENTITY_LEN: usize = 200;

/// The shortest pause between a waiting candidate's asks (see [`pace`]).
const MIN_PACE: Duration = Duration::from_millis(100);
/// The longest pause between a waiting candidate's asks (see [`pace`]).
const MAX_PACE: Duration = Duration::from_secs(10);

/// A candidate's handle on the election of one key: campaign, run while leading,
/// see who leads.
///
/// Made by [`Locker::election`]; cheap to clone (clones share the identity).
/// Several candidates of one [`Locker`] for one key make one campaign at the
/// backend: they queue locally as the mutex's tasks do.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockflight::Result<()> {
/// use lockflight::{Locker, MemoryBackend};
///
/// let locker = Locker::builder(MemoryBackend::new()).build()?;
/// let election = locker.election("compaction").identity("worker-1");
/// let leadership = election.campaign().await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.identity, "worker-1");
/// assert_eq!(leader.term, leadership.fencing_token());
/// leadership.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    locker: Locker,
    key: LockKey,
    identity: Arc<str>,
    /// Woken when a candidate of this handle gains or gives up leadership.
    changed: Arc<Notify>,
}

/// Elections: the door on the handle (here, above the locker, which knows nothing
/// of elections).
impl Locker {
    /// The election of `key`, for a candidate whose identity is set with
    /// [`Election::identity`]. Cheap: nothing is checked or sent until it
    /// campaigns or reads.
    ///
    /// An election key is a mutex key: do not take the same key with
    /// [`lock`](Locker::lock).
    pub fn election(&self, key: impl Into<LockKey>) -> Election {
        Election::new(self.clone(), key.into())
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("key", &self.key)
            .field("identity", &self.identity)
            .finish()
    }
}

impl Election {
    /// The election of `key` on `locker` ([`Locker::election`]), without an
    /// identity yet.
    pub(crate) fn new(locker: Locker, key: LockKey) -> Election {
        Election {
            locker,
            key,
            identity: Arc::from(""),
            changed: Arc::new(Notify::new()),
        }
    }

    /// Sets the identity this candidate leads with: a name of 1 to
    /// [`MAX_IDENTITY_LEN`] bytes without control characters, checked when it
    /// campaigns.
    #[must_use]
    pub fn identity(mut self, identity: impl Into<String>) -> Election {
        self.identity = Arc::from(identity.into());
        self
    }

    /// The election key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    fn validate(&self) -> Result<()> {
        self.key.validate()?;
        let id = &*self.identity;
        let reason = if id.is_empty() {
            "identity is empty (set it with Election::identity)"
        } else if id.len() > MAX_IDENTITY_LEN {
            "identity is longer than 200 bytes"
        } else if id.chars().any(char::is_control) {
            "identity has a control character"
        } else {
            return Ok(());
        };
        Err(Error::config(format!("election({}): {reason}", self.key)))
    }

    /// Waits until this candidate leads, then writes the leader record and returns
    /// the [`Leadership`].
    ///
    /// Waits without a deadline, asking the backend on a schedule of the lease
    /// TTL: a wake-up when the leader releases, the time the backend says the
    /// lease ends, and at the latest about a third of the lease TTL after its last
    /// ask (between 100 ms and 10 s, each pause drawn within a quarter of it
    /// either way, so that candidates do not ask in step), whatever the locker's
    /// wait timeout. The backend keeps the candidate's place in its queue between
    /// those asks (the backend interface's `pace_waits`), so behind a leader that
    /// died a candidate asks a few times per TTL. A record
    /// that cannot be written at once is retried while the leadership is held.
    ///
    /// # Concurrent calls on the same key
    ///
    /// Candidates of one locker queue locally; one of them campaigns at the
    /// backend. If it is cancelled the next one takes over. A resigning leader
    /// may hand the lease to the next local candidate (with handoff on, within its
    /// budget): the term then grows by its handoff sequence.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for an invalid identity; [`Error::InvalidKey`];
    /// [`Error::Unsupported`] when the backend keeps no leader records (the
    /// Redlock backend); [`Error::Overloaded`], [`Error::NoPermission`] and other
    /// backend errors as [`Locker::lock`] returns them.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Locker::lock`]: a dropped campaign leaves the queue, and a
    /// leadership won but not yet returned is given up.
    pub async fn campaign(&self) -> Result<Leadership> {
        self.validate()?;
        let started = tokio::time::Instant::now();
        let ttl = self.locker.lease_ttl();
        // The backend keeps this candidate's place between its asks, which come
        // at its pace, not at the backend's own refresh; undone when the campaign
        // ends or is dropped.
        let _paced = Paced::new(self.locker.backend(), &self.key, max_pace(ttl));
        let guard = loop {
            match self.locker.lock_within(self.key.clone(), pace(ttl)).await {
                Ok(guard) => break guard,
                Err(Error::Timeout { .. }) => continue,
                Err(e) => return Err(e),
            }
        };
        let info = LeaderInfo {
            identity: self.identity.to_string(),
            term: guard.fencing_token(),
            since: SystemTime::now(),
        };
        let record = encode(&info);
        let backend = self.locker.backend();
        match backend.write_leader(&self.key, &record, ttl).await {
            Ok(_) => {}
            Err(e @ Error::Unsupported { .. }) => return Err(e),
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "writing the leader record failed")
            }
        }
        signals::gained(&self.key, &info, started.elapsed());
        let changed = Arc::clone(&self.changed);
        let leadership = Leadership::begin(guard, info, record, &self.locker, changed);
        self.changed.notify_waiters();
        Ok(leadership)
    }

    /// Who leads now, as the leader record says: `None` when nobody does (or
    /// the last leader's record expired or was deleted on resignation).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`]; [`Error::Unsupported`] when the backend keeps no
    /// leader records; backend errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; it only reads.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        self.key.validate()?;
        let record = self.locker.backend().read_leader(&self.key).await?;
        Ok(record.as_deref().and_then(decode))
    }

    /// Who leads, as a stream of every change of the leader record this observer
    /// reads, in order ([`Observation`]): its first read, then each value that
    /// differs from the one before. A reader that falls more than
    /// [`Observation::BUFFER`] items behind is told how many it missed
    /// ([`Observed::Missed`](super::Observed::Missed)); it never skips one
    /// silently. [`Observation::current`] is the newest value, at once.
    ///
    /// A background task reads the record. It registers this instance as an
    /// observer of the record at the backend (`LockBackend::observe_leader`),
    /// then reads it: at once; whenever the backend announces a change of it (on
    /// Redis, a message from the script that wrote or deleted it); when a
    /// candidate of this handle (or of a clone) gains or gives up leadership;
    /// after the instance's notification subscription reconnects (messages may
    /// have been lost); and at least once per lease TTL. It registers again before
    /// every read; a read that fails changes nothing. The task ends when the
    /// observation is dropped.
    ///
    /// Every item was the stored record when it was read. It trails the record
    /// by a message's delivery when the change was announced, and by at most
    /// about a lease TTL when it was not: an announcement lost with the
    /// connection (and no reconnect since), a record that expired (nobody
    /// announces that), or a backend that announces nothing (the Redlock backend,
    /// and one that keeps the default `observe_leader`). Changes that follow each
    /// other faster than that are seen as the last of them.
    ///
    /// # Errors
    ///
    /// None are returned: a failed registration or read is logged (at `debug`)
    /// and tried again at the next trigger; an invalid key ends the observation
    /// at once (logged).
    ///
    /// # Cancel safety
    ///
    /// Not async. Dropping the observation ends the task; the backend forgets the
    /// registration when it lapses (after about two lease TTLs).
    ///
    /// # Panics
    ///
    /// Never. Outside a Tokio runtime no task starts: the observation has ended
    /// at once ([`Observation::next`] returns `None`).
    pub fn observe(&self) -> Observation {
        let (observation, feed, stop) = Observation::new();
        crate::runtime::spawn(observe::follow(
            self.locker.clone(),
            self.key.clone(),
            Arc::clone(&self.changed),
            feed,
            stop,
        ));
        observation
    }

    /// Runs `work` whenever this candidate leads: [`run_with_stop`](Self::run_with_stop)
    /// without a stop hook.
    ///
    /// ```no_run
    /// # async fn f(locker: lockflight::Locker) -> lockflight::Result<()> {
    /// let election = locker.election("outbox-relay").identity("relay-a");
    /// election
    ///     .run(|leader, _loss| async move {
    ///         println!("leading term {}", leader.term);
    ///         // relay the outbox, passing `leader.term` with every fenced write
    ///         std::future::pending::<()>().await
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`run_with_stop`](Self::run_with_stop).
    ///
    /// # Cancel safety
    ///
    /// As [`run_with_stop`](Self::run_with_stop).
    pub async fn run<F, Fut>(&self, work: F) -> Result<Infallible>
    where
        F: FnMut(LeaderInfo, LossSignal) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.run_with_stop(work, |_| std::future::ready(())).await
    }

    /// Runs `work` whenever this candidate leads, and `on_stop` when it stops:
    /// campaigns, starts `work` with the leader's [`LeaderInfo`] and a
    /// [`LossSignal`], and when the work stops runs `on_stop`, then gives up the
    /// lease and campaigns again. Returns only with an error.
    ///
    /// **The order is: work stopped → `on_stop` → lease released.** The work stops
    /// when it returns, or when leadership is lost, as the locker's
    /// [`LossPolicy`](crate::LossPolicy) says:
    ///
    /// * [`Abort`](crate::LossPolicy::Abort) (the default): the work is dropped,
    ///   after one more poll in which its `LossSignal` reports the loss, so a work
    ///   that races [`LossSignal::lost`] takes that branch (up to its first
    ///   `.await` that does not complete at once);
    /// * [`Signal`](crate::LossPolicy::Signal): the work runs on, learns of the
    ///   loss from its `LossSignal`, and must return.
    ///
    /// `on_stop` then runs with the [`Stopped`] term: after a return the lease is
    /// still held (renewed while the hook runs; the leader record still names the
    /// term), so the hook can finish up before anyone else leads; after a loss
    /// it sees the loss ([`Stopped::loss`]) and can report it. Once it returns,
    /// the lease is released (after a return: the next candidate is woken at once)
    /// or given up (after a loss).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use lockflight::election::StopCause;
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build().unwrap();
    /// let election = locker.election("outbox-relay").identity("relay-a");
    /// let (tx, mut stopped) = tokio::sync::mpsc::unbounded_channel();
    /// let running = election.run_with_stop(
    ///     |leader, _loss| async move {
    ///         println!("leading term {}", leader.term);
    ///         // returns when its batch is done: the term ends
    ///     },
    ///     |stopped| {
    ///         let tx = tx.clone();
    ///         async move {
    ///             // still leading here after a return: flush, report, then release
    ///             assert_eq!(stopped.cause, StopCause::Returned);
    ///             assert!(!stopped.loss.is_lost());
    ///             let _ = tx.send(stopped.leader.term);
    ///         }
    ///     },
    /// );
    /// tokio::select! {
    ///     _ = running => unreachable!("run returns only with an error"),
    ///     term = stopped.recv() => println!("term {} ended", term.unwrap()),
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`campaign`](Self::campaign); transient backend errors
    /// ([`Error::is_transient`]) are retried after a renewal interval.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work` (or `on_stop`, if it runs) and gives up
    /// leadership in the background; a hook that has not started does not run.
    pub async fn run_with_stop<F, Fut, S, SFut>(
        &self,
        mut work: F,
        mut on_stop: S,
    ) -> Result<Infallible>
    where
        F: FnMut(LeaderInfo, LossSignal) -> Fut,
        Fut: Future<Output = ()>,
        S: FnMut(Stopped) -> SFut,
        SFut: Future<Output = ()>,
    {
        loop {
            let leadership = match self.campaign().await {
                Ok(leadership) => leadership,
                Err(e) if e.is_transient() => {
                    tracing::debug!(key = %self.key, error = %e, "campaign failed; retrying");
                    tokio::time::sleep(self.locker.renew_every()).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let job = work(leadership.info().clone(), leadership.loss_signal());
            let policy = self.locker.loss_policy();
            run::term(&self.key, leadership, job, policy, &mut on_stop).await;
            // A term may complete without ever waiting (an in-memory backend and a
            // work that returns at once): let the runtime's other tasks run.
            tokio::task::yield_now().await;
        }
    }
}

/// The longest [`pace`] for `ttl`.
fn max_pace(ttl: Duration) -> Duration {
    let base = (ttl / 3).clamp(MIN_PACE, MAX_PACE);
    base + base / 4
}

/// A campaign's pace, told to the backend ([`LockBackend::pace_waits`](crate::backend::LockBackend::pace_waits)) for as
/// long as it lives.
struct Paced {
    backend: std::sync::Arc<dyn crate::backend::LockBackend>,
    key: LockKey,
}

impl Paced {
    fn new(
        backend: std::sync::Arc<dyn crate::backend::LockBackend>,
        key: &LockKey,
        pace: Duration,
    ) -> Paced {
        backend.pace_waits(key, Some(pace));
        Paced {
            backend,
            key: key.clone(),
        }
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        self.backend.pace_waits(&self.key, None);
    }
}

/// How long a waiting candidate waits before asking the backend again, at most:
/// a third of the lease `ttl`, within [`MIN_PACE`] and [`MAX_PACE`], drawn
/// uniformly within a quarter of it either way.
fn pace(ttl: Duration) -> Duration {
    let base = (ttl / 3).clamp(MIN_PACE, MAX_PACE);
    let micros = u64::try_from(base.as_micros()).unwrap_or(u64::MAX);
    let spread = micros / 2;
    Duration::from_micros(micros - micros / 4 + rand::random::<u64>() % spread.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;

    #[test]
    fn the_pace_is_a_third_of_the_ttl_bounded_and_jittered() {
        for (ttl, base) in [
            (Duration::from_millis(100), MIN_PACE),
            (Duration::from_secs(3), Duration::from_secs(1)),
            (Duration::from_secs(30), Duration::from_secs(10)),
            (Duration::from_secs(3600), MAX_PACE),
        ] {
            let paces: Vec<Duration> = (0..200).map(|_| pace(ttl)).collect();
            for p in &paces {
                assert!(
                    *p >= base * 3 / 4 && *p < base * 5 / 4,
                    "{ttl:?}: {p:?} outside {base:?} ± 25 %"
                );
            }
            let distinct = paces
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            assert!(
                distinct > 100,
                "{ttl:?}: jittered, {distinct} distinct paces"
            );
        }
    }

    #[tokio::test]
    async fn an_invalid_identity_is_refused_naming_the_key() {
        let locker = Locker::builder(MemoryBackend::new()).build().unwrap();
        for bad in [
            String::new(),
            "x".repeat(MAX_IDENTITY_LEN + 1),
            "a\nb".into(),
        ] {
            let election = locker.election("jobs").identity(bad.clone());
            match election.campaign().await {
                Err(Error::InvalidConfig { reason }) => {
                    assert!(reason.contains("election(jobs)"), "{reason}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let longest = locker.election("jobs").identity("é".repeat(100));
        longest.campaign().await.unwrap().resign().await.unwrap();
        assert_eq!(locker.active_keys(), 0);
    }

    #[tokio::test]
    async fn local_candidates_take_turns_and_the_record_follows() {
        let locker = Locker::builder(MemoryBackend::new()).build().unwrap();
        let a = locker.election("jobs").identity("a");
        let b = locker.election("jobs").identity("b");
        let first = a.campaign().await.unwrap();
        let next = tokio::spawn(async move { b.campaign().await });
        tokio::task::yield_now().await;
        let first_term = first.fencing_token();
        first.resign().await.unwrap();
        let second = next.await.unwrap().unwrap();
        assert!(second.fencing_token() > first_term);
        let seen = a.leader().await.unwrap().unwrap();
        assert_eq!(
            (seen.identity.as_str(), seen.term),
            ("b", second.fencing_token())
        );
        drop(second);
        tokio::task::yield_now().await;
        assert_eq!(locker.active_keys(), 0);
    }
}
