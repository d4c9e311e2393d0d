//! [`Observation`]: who leads an election, as a stream of every change the
//! observer read, in order, with a bounded buffer and an explicit [`Observed::Missed`]
//! when a slow reader falls behind it.
//!
//! **Invariants**
//!
//! 1. Items come in the order the observer task read them, and only when the value
//!    read differs from the one before (the first read always gives one).
//! 2. At most [`Observation::BUFFER`] items wait. Pushing one more drops the oldest
//!    waiting item and counts it; the reader gets the count as one
//!    [`Observed::Missed`] before every item that was kept, so no item is skipped
//!    without a marker, and the items after the marker are the newest, in order.
//! 3. [`Observation::current`] is the newest value read, whatever the reader has
//!    taken.
//! 4. Dropping the [`Observation`] ends the task; the task's end (or a task that
//!    never started) ends the stream after its waiting items.
//!
//! **Lock order**: one mutex (the state), never held across an `.await`.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::record::{LeaderInfo, decode};
use super::signals;
use crate::key::LockKey;
use crate::locker::Locker;

/// One item of an [`Observation`]: a change of who leads, or how many changes
/// a slow reader missed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Observed {
    /// The leader record names this leader.
    Leader(LeaderInfo),
    /// Nobody leads: there is no leader record (never written, deleted on
    /// resignation, or expired).
    NoLeader,
    /// The reader fell more than [`Observation::BUFFER`] items behind: this many
    /// of the oldest items were dropped here, between the item read before this
    /// one and the item after it.
    Missed(u64),
}

/// Who leads an election, for anyone: every change of the leader record the
/// observer read, in order, from [`Election::observe`](super::Election::observe).
///
/// Read it with [`next`](Self::next). A background task reads the record and
/// queues each value that differs from the one before, starting with its first
/// read. Up to [`BUFFER`](Self::BUFFER) items wait for a slow reader; beyond that
/// the oldest are dropped and the reader is told how many by an
/// [`Observed::Missed`] in their place. [`current`](Self::current) is the newest
/// value read, at once.
///
/// The stream has what the observer read, not a log of the record: two changes
/// between two of its reads (a leader that came and went while a message was on
/// its way) show as the second one only. The term tells leaders apart: a greater
/// term is a later leader.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockflight::Result<()> {
/// use lockflight::election::Observed;
/// use lockflight::{Locker, MemoryBackend};
///
/// let locker = Locker::builder(MemoryBackend::new()).build()?;
/// let election = locker.election("compaction").identity("worker-1");
/// let mut leaders = election.observe();
/// assert_eq!(leaders.next().await, Some(Observed::NoLeader)); // its first read
///
/// let leadership = election.campaign().await?;
/// match leaders.next().await {
///     Some(Observed::Leader(leader)) => assert_eq!(leader.term, leadership.fencing_token()),
///     other => panic!("{other:?}"),
/// }
/// assert_eq!(leaders.current().map(|l| l.term), Some(leadership.fencing_token()));
/// leadership.resign().await?;
/// assert_eq!(leaders.next().await, Some(Observed::NoLeader));
/// # Ok(()) }
/// ```
#[must_use = "an observation does nothing unless read"]
pub struct Observation {
    shared: Arc<Shared>,
    /// Cancels the task when the observation is dropped.
    _stop: DropGuard,
}

/// What the task ([`Feed`]) and the reader ([`Observation`]) share.
struct Shared {
    state: Mutex<State>,
    /// A permit for the reader after each push and at the end.
    pushed: Notify,
}

struct State {
    waiting: VecDeque<Observed>,
    /// Items dropped from the front of `waiting` since the reader last took a
    /// marker.
    missed: u64,
    /// The newest value read; `None` also before the first read.
    current: Option<LeaderInfo>,
    /// Whether anything was read yet.
    read: bool,
    /// The task has ended (or never started).
    ended: bool,
}

impl Observation {
    /// How many items wait for a slow reader at most.
    pub const BUFFER: usize = 16;

    /// An observation and the feed its task pushes to, and the token that is
    /// cancelled when the observation is dropped.
    pub(super) fn new() -> (Observation, Feed, CancellationToken) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                waiting: VecDeque::with_capacity(Self::BUFFER),
                missed: 0,
                current: None,
                read: false,
                ended: false,
            }),
            pushed: Notify::new(),
        });
        let stop = CancellationToken::new();
        let observation = Observation {
            shared: Arc::clone(&shared),
            _stop: stop.clone().drop_guard(),
        };
        (observation, Feed { shared }, stop)
    }

    /// The next change of who leads, waiting for one; `None` once the observation
    /// has ended, which happens only when it could not start (outside a Tokio
    /// runtime, or for an invalid key: see
    /// [`Election::observe`](super::Election::observe)) or when its runtime shuts
    /// down.
    ///
    /// An [`Observed::Missed`] says how many items were dropped because this
    /// reader fell more than [`BUFFER`](Self::BUFFER) items behind; the items
    /// after it are the newest, in order.
    ///
    /// # Errors
    ///
    /// None are returned: a failed read of the record is logged and tried again by
    /// the task (see [`Election::observe`](super::Election::observe)).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an item is taken only when the future returns it, so a
    /// dropped call loses nothing.
    pub async fn next(&mut self) -> Option<Observed> {
        loop {
            {
                let mut state = self.shared.lock();
                if state.missed > 0 {
                    return Some(Observed::Missed(std::mem::take(&mut state.missed)));
                }
                if let Some(item) = state.waiting.pop_front() {
                    return Some(item);
                }
                if state.ended {
                    return None;
                }
            }
            // A push after the check above left a permit: this returns at once.
            self.shared.pushed.notified().await;
        }
    }

    /// Who leads as of the newest read, whatever this reader has taken: `None`
    /// while nobody leads, and before the first read.
    pub fn current(&self) -> Option<LeaderInfo> {
        self.shared.lock().current.clone()
    }
}

impl fmt::Debug for Observation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Observation")
            .field("current", &state.current)
            .field("waiting", &state.waiting.len())
            .field("missed", &state.missed)
            .field("ended", &state.ended)
            .finish()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The task's end of an [`Observation`]. Dropping it ends the stream (after the
/// items that wait).
pub(super) struct Feed {
    shared: Arc<Shared>,
}

impl Feed {
    /// Queues `read` if it differs from the value before (or is the first read),
    /// dropping the oldest waiting item when the buffer is full. Returns whether it
    /// was a change, and whether it named a new term after the first read.
    pub(super) fn read(&self, read: Option<LeaderInfo>) -> Change {
        let mut state = self.shared.lock();
        if state.read && state.current == read {
            return Change::None;
        }
        let new_term = state.read
            && read.as_ref().is_some_and(|now| {
                state.current.as_ref().map(|before| before.term) != Some(now.term)
            });
        state.read = true;
        state.current.clone_from(&read);
        if state.waiting.len() == Observation::BUFFER {
            state.waiting.pop_front();
            state.missed += 1;
        }
        state.waiting.push_back(match read {
            Some(leader) => Observed::Leader(leader),
            None => Observed::NoLeader,
        });
        drop(state);
        self.shared.pushed.notify_one();
        if new_term {
            Change::NewTerm
        } else {
            Change::Other
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.shared.lock().ended = true;
        self.shared.pushed.notify_one();
    }
}

/// What a read changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Change {
    /// The same value as before.
    None,
    /// A leader of a new term after the first read (a new leader seen).
    NewTerm,
    /// Another change (the first read, or nobody leads now).
    Other,
}

/// [`Election::observe`](super::Election::observe)'s task for `key` on `locker`:
/// registers, reads and waits for the next reason to read (an announced change, a
/// change of a local candidate through `changed`, a lease TTL), until `stop` is
/// cancelled (the observation was dropped).
pub(super) async fn follow(
    locker: Locker,
    key: LockKey,
    changed: Arc<Notify>,
    feed: Feed,
    stop: CancellationToken,
) {
    if let Err(e) = key.validate() {
        tracing::debug!(%key, error = %e, "not observing an invalid key");
        return;
    }
    let backend = locker.backend();
    let ttl = locker.lease_ttl();
    // Taken before the first registration and read: a change announced while
    // either runs is kept for the next wait.
    let mut announced = backend.signals().watch_leader(&key);
    loop {
        // Before the read, so a local change during it is not missed.
        let local = changed.notified();
        // Twice the period of the re-reads below: a registration does not
        // lapse between two of them.
        if let Err(e) = backend.observe_leader(&key, ttl * 2).await {
            tracing::debug!(%key, error = %e, "registering as an observer failed");
        }
        match backend.read_leader(&key).await {
            Ok(record) => {
                if feed.read(record.as_deref().and_then(decode)) == Change::NewTerm {
                    signals::leader_changed(&key);
                }
            }
            Err(e) => tracing::debug!(%key, error = %e, "reading the leader failed"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = announced.changed() => {}
            _ = local => {}
            _ = tokio::time::sleep(ttl) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::lease::FencingToken;

    fn leader(epoch: u64) -> LeaderInfo {
        LeaderInfo {
            identity: format!("c{epoch}"),
            term: FencingToken::new(epoch, 0),
            since: UNIX_EPOCH + Duration::from_secs(epoch),
        }
    }

    fn taken(observation: &mut Observation) -> Vec<Observed> {
        let mut items = Vec::new();
        while let Some(Some(item)) = futures::FutureExt::now_or_never(observation.next()) {
            items.push(item);
        }
        items
    }

    #[test]
    fn a_read_equal_to_the_one_before_is_no_item_but_the_first_read_is() {
        let (mut observation, feed, _stop) = Observation::new();
        assert_eq!(feed.read(None), Change::Other);
        assert_eq!(feed.read(None), Change::None);
        assert_eq!(feed.read(Some(leader(1))), Change::NewTerm);
        assert_eq!(feed.read(Some(leader(1))), Change::None);
        assert_eq!(feed.read(None), Change::Other);
        assert_eq!(
            taken(&mut observation),
            [
                Observed::NoLeader,
                Observed::Leader(leader(1)),
                Observed::NoLeader
            ]
        );
        assert_eq!(observation.current(), None);
    }

    /// Two buffers' worth of changes, and a few more after the reader took the
    /// first marker: each marker counts exactly the items dropped before the
    /// kept ones, and every kept item comes in order.
    #[test]
    fn a_slow_reader_gets_a_marker_counting_exactly_what_it_missed() {
        let (mut observation, feed, _stop) = Observation::new();
        let total = 2 * Observation::BUFFER as u64 + 3;
        for epoch in 1..=total {
            feed.read(Some(leader(epoch)));
        }
        let items = taken(&mut observation);
        let dropped = total - Observation::BUFFER as u64;
        let mut expected = vec![Observed::Missed(dropped)];
        expected.extend((dropped + 1..=total).map(|e| Observed::Leader(leader(e))));
        assert_eq!(items, expected);
        assert_eq!(observation.current(), Some(leader(total)));

        // Three more, read in time: no marker.
        for epoch in total + 1..=total + 3 {
            feed.read(Some(leader(epoch)));
        }
        assert_eq!(
            taken(&mut observation),
            (total + 1..=total + 3)
                .map(|e| Observed::Leader(leader(e)))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_stream_ends_after_its_waiting_items_when_the_feed_is_gone() {
        let (mut observation, feed, stop) = Observation::new();
        feed.read(Some(leader(1)));
        drop(feed);
        assert_eq!(taken(&mut observation), [Observed::Leader(leader(1))]);
        assert_eq!(
            futures::FutureExt::now_or_never(observation.next()),
            Some(None)
        );
        assert!(!stop.is_cancelled());
        drop(observation);
        assert!(
            stop.is_cancelled(),
            "dropping the observation stops its task"
        );
    }
}
