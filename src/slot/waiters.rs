//! A slot's local waiters in arrival order, where leaving costs O(1) amortized.
//!
//! Ids are handed out in increasing order and only ever removed, so the queue
//! stays sorted by id. A waiter that leaves from either end is removed at once; one
//! that leaves from the middle becomes a tombstone, skipped by every reader and
//! dropped when it reaches the front, or all at once when tombstones outnumber live
//! waiters. Cancelling all of `T` waiters in any order thus costs O(T log T) in
//! total, not O(T²) (a `retain` over the whole queue per cancelled waiter was
//! quadratic: 34 s for 100,000).
//!
//! A waiter's entry holds the waker of the task that waits, not a channel: the
//! slot keeps the one grant in flight itself (see the slot's `State::granted`), so
//! queueing allocates nothing beyond the queue's own storage. A waiter that is
//! granted or dropped leaves the queue, and its waker is handed back to be woken
//! once the slot mutex is released.
//!
//! Each waiter also has a deadline, kept in a min-heap beside the queue, so that
//! one watcher per slot can time out the due waiters ([`Waiters::time_out`]) in
//! place of a timer per waiting call. The heap is lazy: a waiter that is granted or
//! leaves keeps its heap entry until the entry comes due or the heap is rebuilt
//! from the queue, which a push does when the heap holds more than twice the live
//! waiters plus 8 (so a push costs O(log T) amortized and stale entries stay
//! bounded by the live ones).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::task::Waker;
use tokio::time::Instant;

/// A queued waiter.
#[derive(Debug)]
struct Entry {
    id: u64,
    /// When its call began (fair mode orders by it).
    arrived: Instant,
    /// When the watcher drops it.
    until: Instant,
    /// `false`: it left, and this entry is a tombstone.
    live: bool,
    /// The task to wake when it is granted or dropped (`None` before its first
    /// poll).
    waker: Option<Waker>,
}

#[derive(Debug, Default)]
pub(super) struct Waiters {
    queue: VecDeque<Entry>,
    /// Tombstones in `queue`.
    gone: usize,
    /// `(deadline, id)` of every live waiter, and of some that are gone.
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Waiters {
    /// Waiters that have not left.
    pub(super) fn len(&self) -> usize {
        self.queue.len() - self.gone
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a waiter that arrived at `arrived` and waits until `until`; `id` must
    /// be greater than every id queued before.
    pub(super) fn push(&mut self, id: u64, arrived: Instant, until: Instant) {
        debug_assert!(self.queue.back().is_none_or(|last| last.id < id));
        self.queue.push_back(Entry {
            id,
            arrived,
            until,
            live: true,
            waker: None,
        });
        self.deadlines.push(Reverse((until, id)));
        if self.deadlines.len() > 2 * self.len() + 8 {
            self.deadlines.clear();
            let live = self.queue.iter().filter(|e| e.live);
            self.deadlines
                .extend(live.map(|e| Reverse((e.until, e.id))));
        }
    }

    /// Stores `waker` as waiter `id`'s, returning the one it replaces (to drop
    /// once the slot mutex is released); `None` if `id` is no longer queued.
    pub(super) fn wait(&mut self, id: u64, waker: &Waker) -> Option<Option<Waker>> {
        let entry = self.find(id)?;
        if entry.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            return Some(None);
        }
        Some(entry.waker.replace(waker.clone()))
    }

    /// Drops the waiters whose deadline is `now` or earlier, adding their wakers to
    /// `woken`; returns the earliest deadline left, `None` if no waiter is left.
    pub(super) fn time_out(&mut self, now: Instant, woken: &mut Vec<Waker>) -> Option<Instant> {
        while let Some(&Reverse((until, id))) = self.deadlines.peek() {
            if until > now {
                break;
            }
            self.deadlines.pop();
            woken.extend(self.remove(id));
        }
        if self.is_empty() {
            self.clear(woken);
            return None;
        }
        self.deadlines.peek().map(|Reverse((until, _))| *until)
    }

    /// Drops every waiter, adding their wakers to `woken`.
    pub(super) fn clear(&mut self, woken: &mut Vec<Waker>) {
        woken.extend(self.queue.drain(..).filter_map(|e| e.waker));
        self.gone = 0;
        self.deadlines.clear();
    }

    /// Takes the first waiter that has not left: its id and waker.
    pub(super) fn pop(&mut self) -> Option<(u64, Option<Waker>)> {
        while let Some(entry) = self.queue.pop_front() {
            if entry.live {
                self.drop_tombstones_front();
                return Some((entry.id, entry.waker));
            }
            self.gone -= 1;
        }
        None
    }

    /// The arrival of the first waiter (tombstones skipped).
    pub(super) fn front_arrival(&self) -> Option<Instant> {
        self.queue.iter().find(|e| e.live).map(|e| e.arrived)
    }

    /// Removes waiter `id` if it is still queued, returning its waker.
    pub(super) fn remove(&mut self, id: u64) -> Option<Waker> {
        let i = self.index(id)?;
        if i == 0 {
            let entry = self.queue.pop_front()?;
            self.drop_tombstones_front();
            return entry.waker;
        }
        if i + 1 == self.queue.len() {
            return self.queue.pop_back()?.waker;
        }
        let entry = &mut self.queue[i];
        entry.live = false;
        let waker = entry.waker.take();
        self.gone += 1;
        if self.gone > self.len() {
            self.queue.retain(|e| e.live);
            self.gone = 0;
        }
        waker
    }

    /// Where live waiter `id` is in the queue.
    fn index(&self, id: u64) -> Option<usize> {
        let i = self.queue.binary_search_by_key(&id, |e| e.id).ok()?;
        self.queue[i].live.then_some(i)
    }

    fn find(&mut self, id: u64) -> Option<&mut Entry> {
        let i = self.index(id)?;
        Some(&mut self.queue[i])
    }

    fn drop_tombstones_front(&mut self) {
        while self.queue.front().is_some_and(|e| !e.live) {
            self.queue.pop_front();
            self.gone -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Wake;
    use std::time::Duration;

    /// A waker that records that it was woken.
    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn flag() -> (Arc<Flag>, Waker) {
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        (Arc::clone(&flag), Waker::from(flag))
    }

    fn queue(n: u64) -> Waiters {
        let mut w = Waiters::default();
        let now = Instant::now();
        for id in 0..n {
            w.push(id, now, now + Duration::from_secs(id));
        }
        w
    }

    /// Whatever the order of leaving, the live waiters stay in arrival order and
    /// the count stays exact; the storage never holds more tombstones than live
    /// waiters.
    #[test]
    fn leaving_in_any_order_keeps_the_order_and_the_count() {
        for order in [
            vec![2, 4, 6, 1, 3, 5, 0, 7],
            vec![7, 6, 5, 4, 3, 2, 1, 0],
            vec![0, 1, 2, 3, 4, 5, 6, 7],
            vec![3, 4, 2, 5, 1, 6, 0, 7],
        ] {
            for leave in 0..=order.len() {
                let mut w = queue(8);
                for &id in &order[..leave] {
                    w.remove(id);
                    w.remove(id); // twice: a no-op
                    assert!(w.gone <= w.len() || w.queue.is_empty(), "{order:?}");
                    assert!(w.index(id).is_none());
                }
                assert_eq!(w.len(), 8 - leave);
                let mut left: Vec<u64> = order[leave..].to_vec();
                left.sort_unstable();
                let mut popped = Vec::new();
                while !w.is_empty() {
                    let before = w.len();
                    popped.push(w.pop().expect("a live waiter").0);
                    assert_eq!(w.len(), before - 1);
                }
                assert!(w.pop().is_none());
                assert_eq!(popped, left, "{order:?} after {leave}");
                assert_eq!((w.len(), w.gone), (0, 0));
            }
        }
    }

    /// A waiter's stored waker is the one its last poll gave; removing or
    /// popping the waiter hands it back, and a waiter no longer queued stores none.
    #[test]
    fn the_waker_of_the_last_poll_is_handed_back() {
        let mut w = queue(3);
        let (first, waker) = flag();
        let (second, other) = flag();
        assert!(matches!(w.wait(1, &waker), Some(None)));
        assert!(matches!(w.wait(1, &waker), Some(None))); // the same task: kept
        let replaced = w.wait(1, &other).expect("queued").expect("a waker");
        replaced.wake();
        assert!(first.0.load(Ordering::SeqCst));
        w.remove(1).expect("the stored waker").wake();
        assert!(second.0.load(Ordering::SeqCst));
        assert!(w.wait(1, &waker).is_none());
        assert!(
            w.pop()
                .is_some_and(|(id, waker)| id == 0 && waker.is_none())
        );
    }

    /// The watcher's step drops exactly the due waiters, whatever order their
    /// deadlines came in and whoever left before, and wakes exactly those that
    /// polled; the rest keep their order.
    #[test]
    fn time_out_drops_exactly_the_due_waiters() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let mut w = Waiters::default();
        let mut flags = Vec::new();
        // Deadlines out of arrival order: 5, 1, 4, 2, 3 seconds.
        for (id, d) in [5u64, 1, 4, 2, 3].into_iter().enumerate() {
            w.push(id as u64, t0, t0 + secs(d));
            let (flag, waker) = flag();
            if id != 4 {
                assert!(w.wait(id as u64, &waker).is_some());
            }
            flags.push(flag);
        }
        w.remove(3); // deadline 2 s: left before it came due
        let mut woken = Vec::new();
        assert_eq!(w.time_out(t0, &mut woken), Some(t0 + secs(1)));
        assert_eq!(w.time_out(t0 + secs(3), &mut woken), Some(t0 + secs(4)));
        // Id 1 (1 s) polled and is woken; id 4 (3 s) never polled.
        woken.into_iter().for_each(Waker::wake);
        let woke: Vec<bool> = flags.iter().map(|f| f.0.load(Ordering::SeqCst)).collect();
        assert_eq!(woke, [false, true, false, false, false]);
        let queued: Vec<bool> = (0..5).map(|id| w.index(id).is_some()).collect();
        assert_eq!(queued, [true, false, true, false, false]);
        assert_eq!(w.len(), 2);
        assert_eq!(w.front_arrival(), Some(t0));
        assert!(w.pop().is_some_and(|(id, _)| id == 0));
        let mut woken = Vec::new();
        assert_eq!(w.time_out(t0 + secs(4), &mut woken), None); // id 2 was the last
        assert_eq!(woken.len(), 1);
        assert_eq!((w.len(), w.queue.len(), w.deadlines.len()), (0, 0, 0));
    }

    /// Waiters granted before their deadline leave stale heap entries; a steady
    /// stream of them never lets the heap outgrow twice the queue plus 8.
    #[test]
    fn stale_deadlines_stay_bounded() {
        let t0 = Instant::now();
        let mut w = Waiters::default();
        let mut id = 0;
        for live in [1usize, 7, 64] {
            for _ in 0..10 * live + 100 {
                while w.len() < live {
                    w.push(id, t0, t0 + Duration::from_secs(60));
                    id += 1;
                    assert!(w.deadlines.len() <= 2 * w.len() + 8);
                }
                drop(w.pop());
            }
        }
    }
}
