//! Leader election on the mutex's lease: [`Election`], [`Leadership`],
//! [`LeaderInfo`].
//!
//! A leader is the holder of the key's exclusive lock, taken through the mutex's
//! lock path (local coalescing, backend queue, pub/sub wake-ups, renewal with its
//! loss signal): the term is that lease's [`FencingToken`]. The only state of its
//! own is the **leader record** (`<prefix>:{<key>}:leader` on Redis), which names
//! the leader for everyone else, and the registrations of the instances that
//! observe it, to which the backend announces each change of the record;
//! ARCHITECTURE.md says why it keeps the mutex's guarantees, and why observation
//! by message stays correct when a message is lost.
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

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::guard::{FencingToken, Loss, LossSignal};
use crate::key::LockKey;
use crate::locker::{LockGuard, Locker};

/// The longest identity, in bytes.
pub const MAX_IDENTITY_LEN: usize = 200;

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
/// assert_eq!(leader.term, leadership.term());
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

/// Who leads an election: read from the leader record by
/// [`Election::leader`] and [`Election::observe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The identity the leader campaigned with.
    pub identity: String,
    /// The leader's term: its lease's fencing token.
    pub term: FencingToken,
    /// When the leader gained leadership, by its own wall clock.
    pub since: SystemTime,
}

/// The leadership of a term, won by [`Election::campaign`].
///
/// While it is held a watchdog renews the lease and refreshes the leader record;
/// [`lost`](Leadership::lost) resolves if the lease is lost, no later than its
/// validity ends. Pass [`term`](Leadership::term) with every write to a fenced
/// resource ([`fence`](crate::fence)). Dropping it gives up leadership in the
/// background; [`resign`](Leadership::resign) does it and reports.
#[must_use = "leadership is given up when it is dropped"]
pub struct Leadership {
    /// `None` only once resigned.
    guard: Option<LockGuard>,
    info: LeaderInfo,
    record: Vec<u8>,
    refresher: Option<JoinHandle<()>>,
    changed: Arc<Notify>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("key", self.held().key())
            .field("identity", &self.info.identity)
            .field("term", &self.info.term)
            .field("lost", &self.held().is_lost())
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
    /// Waits without a deadline: the locker's wait timeout only paces the local
    /// wait, which starts again. A record that cannot be written at once is
    /// retried while the leadership is held.
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
        let guard = loop {
            match self.locker.lock(self.key.clone()).await {
                Ok(guard) => break guard,
                Err(Error::Timeout { .. }) => continue,
                Err(e) => return Err(e),
            }
        };
        let since = SystemTime::now();
        let info = LeaderInfo {
            identity: self.identity.to_string(),
            term: guard.fencing_token(),
            since,
        };
        let record = encode(&info);
        let backend = self.locker.backend();
        let ttl = self.locker.lease_ttl();
        match backend.write_leader(&self.key, &record, ttl).await {
            Ok(_) => {}
            Err(e @ Error::Unsupported { .. }) => return Err(e),
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "writing the leader record failed")
            }
        }
        signals::gained(&self.key, &info, started.elapsed());
        let refresher = {
            let (key, record, loss) = (self.key.clone(), record.clone(), guard.loss_signal());
            let (identity, term) = (info.identity.clone(), info.term);
            let every = self.locker.renew_every();
            crate::runtime::spawn(async move {
                loop {
                    tokio::select! {
                        // Resigning or dropping the leadership aborts this task
                        // first: a loss seen here is a loss.
                        _ = loss.lost() => {
                            let cause = loss.reason().unwrap_or_default();
                            return signals::lost(&key, &identity, term, &cause);
                        }
                        _ = tokio::time::sleep(every) => {}
                    }
                    if let Err(e) = backend.write_leader(&key, &record, ttl).await {
                        tracing::debug!(%key, error = %e, "refreshing the leader record failed");
                    }
                }
            })
        };
        self.changed.notify_waiters();
        Ok(Leadership {
            guard: Some(guard),
            info,
            record,
            refresher,
            changed: Arc::clone(&self.changed),
        })
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

    /// A [`watch`] of who leads, as the leader record says: `None` until the
    /// record was first read, and while nobody leads.
    ///
    /// A background task keeps it current. It registers this instance as an
    /// observer of the record at the backend (`LockBackend::observe_leader`),
    /// then reads the record: at once; whenever the backend announces a change of
    /// it (on Redis, a message from the script that wrote or deleted it); when a
    /// candidate of this handle (or of a clone) gains or gives up leadership; after
    /// the instance's notification subscription reconnects (messages may have
    /// been lost); and at least once per lease TTL. It registers again before
    /// every read. The value changes only when the record read differs from it; a
    /// read that fails leaves it as it was. The task ends when every receiver is
    /// dropped.
    ///
    /// Every value was the stored record when it was read. It trails the record
    /// by a message's delivery when the change was announced, and by at most
    /// about a lease TTL when it was not: an announcement lost with the
    /// connection (and no reconnect since), a record that expired (nobody
    /// announces that), or a backend that announces nothing (the Redlock backend,
    /// and one that keeps the default `observe_leader`).
    ///
    /// # Errors
    ///
    /// None are returned: a failed registration or read is logged (at `debug`)
    /// and tried again at the next trigger.
    ///
    /// # Cancel safety
    ///
    /// Not async. Dropping every receiver ends the task; the backend forgets the
    /// registration when it lapses (after about two lease TTLs).
    ///
    /// # Panics
    ///
    /// Never. Outside a Tokio runtime no task starts: the receiver keeps `None`,
    /// and its [`changed`](watch::Receiver::changed) returns an error at once.
    pub fn observe(&self) -> watch::Receiver<Option<LeaderInfo>> {
        let (tx, rx) = watch::channel(None);
        crate::runtime::spawn(self.clone().keep_observing(tx));
        rx
    }

    /// [`observe`](Self::observe)'s task: registers, reads and waits for the next
    /// reason to read, until every receiver of `tx` is gone.
    async fn keep_observing(self, tx: watch::Sender<Option<LeaderInfo>>) {
        if let Err(e) = self.key.validate() {
            tracing::debug!(key = %self.key, error = %e, "not observing an invalid key");
            return tx.closed().await;
        }
        let backend = self.locker.backend();
        let ttl = self.locker.lease_ttl();
        // Taken before the first registration and read: a change announced while
        // either runs is kept for the next wait.
        let mut announced = backend.wakeups().watch_leader(&self.key);
        let mut first = true;
        loop {
            // Before the read, so a local change during it is not missed.
            let local = self.changed.notified();
            // Twice the period of the re-reads below: a registration does not
            // lapse between two of them.
            if let Err(e) = backend.observe_leader(&self.key, ttl * 2).await {
                tracing::debug!(key = %self.key, error = %e, "registering as an observer failed");
            }
            match self.leader().await {
                Ok(now) => {
                    tx.send_if_modified(|seen| {
                        let differs = *seen != now;
                        if differs {
                            let new_term = now.as_ref().map(|l| l.term);
                            if !first
                                && new_term.is_some()
                                && seen.as_ref().map(|l| l.term) != new_term
                            {
                                signals::leader_changed(&self.key);
                            }
                            *seen = now;
                        }
                        differs
                    });
                    first = false;
                }
                Err(e) => {
                    tracing::debug!(key = %self.key, error = %e, "reading the leader failed")
                }
            }
            tokio::select! {
                _ = tx.closed() => return,
                _ = announced.changed() => {}
                _ = local => {}
                _ = tokio::time::sleep(ttl) => {}
            }
        }
    }

    /// Runs `work` whenever this candidate leads: campaigns, starts `work` with
    /// the leader's [`LeaderInfo`] and a [`LossSignal`], drops it when leadership
    /// is lost, and campaigns again after a loss or after `work` returns (then
    /// resigning first). Returns only with an error.
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
    /// As [`campaign`](Self::campaign); transient backend errors
    /// ([`Error::is_transient`]) are retried after a renewal interval.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work` and gives up leadership in the background.
    pub async fn run<F, Fut>(&self, mut work: F) -> Result<Infallible>
    where
        F: FnMut(LeaderInfo, LossSignal) -> Fut,
        Fut: Future<Output = ()>,
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
            let lost = leadership.lost();
            let job = work(leadership.info().clone(), leadership.loss_signal());
            tokio::select! {
                biased;
                _ = lost => {
                    tracing::debug!(key = %self.key, "leadership lost; work dropped");
                    drop(leadership);
                }
                _ = job => {
                    if let Err(e) = leadership.resign().await {
                        tracing::debug!(key = %self.key, error = %e, "resigning after the work failed");
                    }
                }
            }
        }
    }
}

impl Leadership {
    /// This leader's term: the fencing token of its lease, strictly increasing
    /// across the election's leaders.
    pub fn term(&self) -> FencingToken {
        self.info.term
    }

    /// The identity this leader campaigned with.
    pub fn identity(&self) -> &str {
        &self.info.identity
    }

    /// Identity, term and since when, as the leader record says.
    pub fn info(&self) -> &LeaderInfo {
        &self.info
    }

    /// Whether leadership has been lost (the lease's loss, see
    /// [`LockGuard::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.held().is_lost()
    }

    /// How long leadership is known to stay valid without a further renewal
    /// (zero once it is lost).
    pub fn valid_for(&self) -> Duration {
        self.held().valid_for()
    }

    /// Resolves when leadership is lost, no later than the lease's validity ends;
    /// see [`LockGuard::lost`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; it only observes.
    pub fn lost(&self) -> Loss {
        self.held().lost()
    }

    /// A cloneable loss signal that does not borrow `self`.
    pub fn loss_signal(&self) -> LossSignal {
        self.held().loss_signal()
    }

    /// Gives up leadership: deletes the leader record (if still this term's),
    /// then releases the lease, which wakes the next candidate at once (a local
    /// one by handoff, or the next instance by its wake-up).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if leadership had already been lost; backend errors of
    /// the release (the lease then expires at its TTL). A record that cannot be
    /// deleted expires at its TTL and is not an error.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the release finishes in the background, as
    /// [`LockGuard::release`]'s does.
    pub async fn resign(mut self) -> Result<()> {
        if let Some(refresher) = self.refresher.take() {
            refresher.abort();
        }
        if !self.held().is_lost() {
            signals::ended(self.held().key(), &self.info, "resigned");
        }
        let backend = self.guard_backend();
        if let Err(e) = backend.clear_leader(self.held().key(), &self.record).await {
            tracing::debug!(key = %self.held().key(), error = %e, "deleting the leader record failed");
        }
        let guard = self.guard.take().expect("held until resigned");
        let released = guard.release().await;
        self.changed.notify_waiters();
        released
    }

    fn held(&self) -> &LockGuard {
        self.guard.as_ref().expect("held until resigned")
    }

    fn guard_backend(&self) -> Arc<dyn crate::backend::LockBackend> {
        self.held().backend()
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if self.guard.is_none() {
            return;
        }
        if let Some(refresher) = self.refresher.take() {
            refresher.abort();
            if !self.held().is_lost() {
                signals::ended(self.held().key(), &self.info, "dropped");
            }
            // Not resigned: delete the record in the background.
            let (backend, key, record) = (
                self.guard_backend(),
                self.held().key().clone(),
                std::mem::take(&mut self.record),
            );
            let changed = Arc::clone(&self.changed);
            // Observers re-read once the record is gone.
            crate::runtime::spawn(async move {
                let _ = backend.clear_leader(&key, &record).await;
                changed.notify_waiters();
            });
        } else {
            self.changed.notify_waiters();
        }
    }
}

/// What an election tells the operator: tracing events and, with the `metrics`
/// feature, per election key (elections are few; their keys are labels):
/// `lockflight_leader` (1 while this process leads), `lockflight_leader_terms_total`
/// (terms this process won), `lockflight_elect_seconds` (from a campaign's start
/// to its leadership) and `lockflight_leader_changes_total` (new leaders an
/// `Election::observe` of this process saw after its first read).
mod signals {
    use std::time::Duration;

    use super::LeaderInfo;
    use crate::guard::FencingToken;
    use crate::key::LockKey;

    pub(super) fn gained(key: &LockKey, info: &LeaderInfo, waited: Duration) {
        tracing::info!(
            %key,
            identity = %info.identity,
            term = %info.term,
            waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            "leadership gained"
        );
        #[cfg(feature = "metrics")]
        {
            let label = key.to_string();
            metrics::gauge!("lockflight_leader", "election" => label.clone()).set(1.0);
            metrics::counter!("lockflight_leader_terms_total", "election" => label.clone())
                .increment(1);
            metrics::histogram!("lockflight_elect_seconds", "election" => label)
                .record(waited.as_secs_f64());
        }
    }

    /// The lease was lost while leading (`cause`: its loss reason).
    pub(super) fn lost(key: &LockKey, identity: &str, term: FencingToken, cause: &str) {
        tracing::warn!(%key, %identity, %term, %cause, "leadership lost");
        not_leading(key);
    }

    /// Given up: `how` is "resigned" or "dropped".
    pub(super) fn ended(key: &LockKey, info: &LeaderInfo, how: &'static str) {
        tracing::info!(%key, identity = %info.identity, term = %info.term, how, "leadership given up");
        not_leading(key);
    }

    /// An observer saw a new leader (a new term) after its first read.
    pub(super) fn leader_changed(_key: &LockKey) {
        #[cfg(feature = "metrics")]
        metrics::counter!("lockflight_leader_changes_total", "election" => _key.to_string())
            .increment(1);
    }

    fn not_leading(_key: &LockKey) {
        #[cfg(feature = "metrics")]
        metrics::gauge!("lockflight_leader", "election" => _key.to_string()).set(0.0);
    }
}

/// The record: the term as 40 digits, then `:<since in ms>:<identity>`.
fn encode(info: &LeaderInfo) -> Vec<u8> {
    let since = info
        .since
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    format!(
        "{:020}{:020}:{since}:{}",
        info.term.epoch, info.term.seq, info.identity
    )
    .into_bytes()
}

pub(crate) fn decode(record: &[u8]) -> Option<LeaderInfo> {
    let text = std::str::from_utf8(record).ok()?;
    let (epoch, rest) = (text.get(..20)?, text.get(20..)?);
    let (seq, rest) = (rest.get(..20)?, rest.get(20..)?);
    let (since, identity) = rest.strip_prefix(':')?.split_once(':')?;
    Some(LeaderInfo {
        identity: identity.to_owned(),
        term: FencingToken {
            epoch: epoch.parse().ok()?,
            seq: seq.parse().ok()?,
        },
        since: UNIX_EPOCH + Duration::from_millis(since.parse().ok()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_decodes_to_what_was_encoded_and_orders_by_term() {
        let info = LeaderInfo {
            identity: "scheduler:7".into(),
            term: FencingToken { epoch: 42, seq: 3 },
            since: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        };
        let record = encode(&info);
        assert_eq!(decode(&record), Some(info.clone()));
        let later = encode(&LeaderInfo {
            term: FencingToken { epoch: 42, seq: 4 },
            ..info
        });
        assert!(later[..40] > record[..40]);
        assert_eq!(decode(b"garbage"), None);
    }

    #[tokio::test]
    async fn an_invalid_identity_is_refused_naming_the_key() {
        let locker = Locker::builder(crate::MemoryBackend::new())
            .build()
            .unwrap();
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

    /// In memory the backend's own write and deletion announce the change: an
    /// observer of another instance follows a gain, a resignation and the next
    /// gain with the clock paused, well before its renewal interval (let alone
    /// its lease TTL) could pass.
    #[tokio::test(start_paused = true)]
    async fn an_observer_follows_announced_changes_without_time_passing() {
        let ttl = Duration::from_secs(60);
        let memory = crate::MemoryBackend::new();
        let build = |backend: crate::MemoryBackend| {
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

        let a = candidates.election("jobs").identity("a");
        let first = a.campaign().await.unwrap();
        let first_term = first.term();
        seen.wait_for(|l| l.as_ref().is_some_and(|l| l.term == first_term))
            .await
            .unwrap();
        assert!(soon(), "seen only after {:?}", start.elapsed());

        first.resign().await.unwrap();
        seen.wait_for(Option::is_none).await.unwrap();
        assert!(soon(), "seen only after {:?}", start.elapsed());

        let second = candidates
            .election("jobs")
            .identity("b")
            .campaign()
            .await
            .unwrap();
        let second_term = second.term();
        assert!(second_term > first_term);
        seen.wait_for(|l| {
            l.as_ref()
                .is_some_and(|l| l.identity == "b" && l.term == second_term)
        })
        .await
        .unwrap();
        assert!(soon(), "seen only after {:?}", start.elapsed());
        second.resign().await.unwrap();
        drop(seen);
        // The released lease may stay cached for its linger.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(candidates.active_keys() + observer.active_keys(), 0);
    }

    #[test]
    fn observe_outside_a_runtime_does_not_panic() {
        let locker = Locker::builder(crate::MemoryBackend::new())
            .build()
            .unwrap();
        let seen = locker.election("jobs").observe();
        assert_eq!(*seen.borrow(), None);
        assert!(seen.has_changed().is_err(), "no task keeps it current");
    }

    #[tokio::test]
    async fn local_candidates_take_turns_and_the_record_follows() {
        let locker = Locker::builder(crate::MemoryBackend::new())
            .build()
            .unwrap();
        let a = locker.election("jobs").identity("a");
        let b = locker.election("jobs").identity("b");
        let first = a.campaign().await.unwrap();
        let next = tokio::spawn(async move { b.campaign().await });
        tokio::task::yield_now().await;
        let first_term = first.term();
        first.resign().await.unwrap();
        let second = next.await.unwrap().unwrap();
        assert!(second.term() > first_term);
        let seen = a.leader().await.unwrap().unwrap();
        assert_eq!((seen.identity.as_str(), seen.term), ("b", second.term()));
        drop(second);
        tokio::task::yield_now().await;
        assert_eq!(locker.active_keys(), 0);
    }
}
