//! A slot's local waiters in arrival order, where leaving costs O(1) amortized.
//!
//! Ids are handed out in increasing order and only ever removed, so the queue
//! stays sorted by id. A waiter that leaves from either end is removed at once; one
//! that leaves from the middle becomes a tombstone (its channel dropped), skipped by
//! every reader and dropped when it reaches the front, or all at once when
//! tombstones outnumber live waiters. Cancelling all of `T` waiters in any order
//! thus costs O(T log T) in total, not O(T²) (a `retain` over the whole queue per
//! cancelled waiter was quadratic: 34 s for 100,000).
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
use tokio::time::Instant;

use tokio::sync::oneshot;

use super::Grant;

/// A waiter: its id, its arrival, its deadline and its grant channel (`None`: it
/// left).
type Entry = (u64, Instant, Instant, Option<oneshot::Sender<Grant>>);

#[derive(Debug, Default)]
pub(super) struct Waiters {
    queue: VecDeque<Entry>,
    /// Tombstones in `queue`.
    gone: usize,
    /// `(deadline, id)` of every live waiter, and of some that are gone.
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Waiters {
    /// Waiters that have not left (some may have closed their channel and not
    /// left yet).
    pub(super) fn len(&self) -> usize {
        self.queue.len() - self.gone
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a waiter that arrived at `at` and waits until `until`; `id` must be
    /// greater than every id queued before.
    pub(super) fn push(
        &mut self,
        id: u64,
        at: Instant,
        until: Instant,
        tx: oneshot::Sender<Grant>,
    ) {
        debug_assert!(self.queue.back().is_none_or(|(last, ..)| *last < id));
        self.queue.push_back((id, at, until, Some(tx)));
        self.deadlines.push(Reverse((until, id)));
        if self.deadlines.len() > 2 * self.len() + 8 {
            self.deadlines.clear();
            let live = self.queue.iter().filter(|e| e.3.is_some());
            self.deadlines
                .extend(live.map(|(id, _, until, _)| Reverse((*until, *id))));
        }
    }

    /// Drops the waiters whose deadline is `now` or earlier (their receivers see
    /// the channel closed); returns the earliest deadline left, `None` if no
    /// waiter is left.
    pub(super) fn time_out(&mut self, now: Instant) -> Option<Instant> {
        while let Some(&Reverse((until, id))) = self.deadlines.peek() {
            if until > now {
                break;
            }
            self.deadlines.pop();
            self.remove(id);
        }
        if self.is_empty() {
            self.clear();
            return None;
        }
        self.deadlines.peek().map(|Reverse((until, _))| *until)
    }

    /// Drops every waiter (their receivers see the channel closed).
    pub(super) fn clear(&mut self) {
        self.queue.clear();
        self.gone = 0;
        self.deadlines.clear();
    }

    /// Takes the first waiter that has not left.
    pub(super) fn pop(&mut self) -> Option<oneshot::Sender<Grant>> {
        while let Some((_, _, _, tx)) = self.queue.pop_front() {
            match tx {
                Some(tx) => return Some(tx),
                None => self.gone -= 1,
            }
        }
        None
    }

    /// Drops the waiters at the front whose channel is closed or that left.
    pub(super) fn drop_closed_front(&mut self) {
        while let Some((_, _, _, tx)) = self.queue.front() {
            match tx {
                None => self.gone -= 1,
                Some(tx) if tx.is_closed() => {}
                Some(_) => return,
            }
            self.queue.pop_front();
        }
    }

    /// The arrival of the first waiter (tombstones skipped).
    pub(super) fn front_arrival(&self) -> Option<Instant> {
        self.queue
            .iter()
            .find(|(.., tx)| tx.is_some())
            .map(|(_, at, ..)| *at)
    }

    /// The arrival of the first waiter whose channel is open.
    pub(super) fn oldest_live(&self) -> Option<Instant> {
        self.queue
            .iter()
            .find(|(.., tx)| tx.as_ref().is_some_and(|tx| !tx.is_closed()))
            .map(|(_, at, ..)| *at)
    }

    /// Removes waiter `id`, if it is still queued.
    pub(super) fn remove(&mut self, id: u64) {
        let Ok(i) = self.queue.binary_search_by_key(&id, |(id, ..)| *id) else {
            return;
        };
        if self.queue[i].3.is_none() {
            return;
        }
        if i == 0 {
            self.queue.pop_front();
            self.drop_tombstones_front();
        } else if i + 1 == self.queue.len() {
            self.queue.pop_back();
        } else {
            self.queue[i].3 = None;
            self.gone += 1;
            if self.gone > self.len() {
                self.queue.retain(|(.., tx)| tx.is_some());
                self.gone = 0;
            }
        }
    }

    fn drop_tombstones_front(&mut self) {
        while self.queue.front().is_some_and(|(.., tx)| tx.is_none()) {
            self.queue.pop_front();
            self.gone -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(n: u64) -> (Waiters, Vec<oneshot::Receiver<Grant>>) {
        let mut w = Waiters::default();
        let mut rxs = Vec::new();
        for id in 0..n {
            let (tx, rx) = oneshot::channel();
            let now = Instant::now();
            w.push(id, now, now + std::time::Duration::from_secs(id), tx);
            rxs.push(rx);
        }
        (w, rxs)
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
                let (mut w, _rxs) = queue(8);
                for &id in &order[..leave] {
                    w.remove(id);
                    w.remove(id); // twice: a no-op
                    assert!(w.gone <= w.len() || w.queue.is_empty(), "{order:?}");
                }
                assert_eq!(w.len(), 8 - leave);
                let mut left: Vec<u64> = order[leave..].to_vec();
                left.sort_unstable();
                let mut popped = Vec::new();
                while !w.is_empty() {
                    let first = w.queue.iter().find(|(.., tx)| tx.is_some()).map(|e| e.0);
                    let before = w.len();
                    drop(w.pop().expect("a live waiter"));
                    popped.push(first.expect("a live entry"));
                    assert_eq!(w.len(), before - 1);
                }
                assert!(w.pop().is_none());
                assert_eq!(popped, left, "{order:?} after {leave}");
                assert_eq!((w.len(), w.gone), (0, 0));
            }
        }
    }

    /// The watcher's step drops exactly the due waiters, whatever order their
    /// deadlines came in and whoever left before; the rest keep their order.
    #[test]
    fn time_out_drops_exactly_the_due_waiters() {
        let t0 = Instant::now();
        let secs = std::time::Duration::from_secs;
        let mut w = Waiters::default();
        let mut rxs = Vec::new();
        // Deadlines out of arrival order: 5, 1, 4, 2, 3 seconds.
        for (id, d) in [5u64, 1, 4, 2, 3].into_iter().enumerate() {
            let (tx, rx) = oneshot::channel();
            w.push(id as u64, t0, t0 + secs(d), tx);
            rxs.push(rx);
        }
        w.remove(3); // deadline 2 s: left before it came due
        assert_eq!(w.time_out(t0), Some(t0 + secs(1)));
        assert_eq!(w.time_out(t0 + secs(3)), Some(t0 + secs(4)));
        let closed: Vec<bool> = rxs
            .iter_mut()
            .map(|rx| {
                rx.try_recv()
                    .is_err_and(|e| e == oneshot::error::TryRecvError::Closed)
            })
            .collect();
        assert_eq!(closed, [false, true, false, true, true]);
        assert_eq!(w.len(), 2);
        assert_eq!(w.front_arrival(), Some(t0));
        assert!(w.pop().is_some()); // id 0
        assert_eq!(w.time_out(t0 + secs(4)), None); // id 2 was the last
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
                    let (tx, _rx) = oneshot::channel();
                    w.push(id, t0, t0 + std::time::Duration::from_secs(60), tx);
                    id += 1;
                    assert!(w.deadlines.len() <= 2 * w.len() + 8);
                }
                drop(w.pop());
            }
        }
    }
}
