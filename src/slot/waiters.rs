//! A slot's local waiters in arrival order, where leaving costs O(1) amortized.
//!
//! Ids are handed out in increasing order and only ever removed, so the queue
//! stays sorted by id. A waiter that leaves from either end is removed at once; one
//! that leaves from the middle becomes a tombstone (its channel dropped), skipped by
//! every reader and dropped when it reaches the front, or all at once when
//! tombstones outnumber live waiters. Cancelling all of `T` waiters in any order
//! thus costs O(T log T) in total, not O(T²) (a `retain` over the whole queue per
//! cancelled waiter was quadratic: 34 s for 100,000).

use std::collections::VecDeque;
use tokio::time::Instant;

use tokio::sync::oneshot;

use super::Grant;

/// A waiter: its id, its arrival, and its grant channel (`None`: it left).
type Entry = (u64, Instant, Option<oneshot::Sender<Grant>>);

#[derive(Debug, Default)]
pub(super) struct Waiters {
    queue: VecDeque<Entry>,
    /// Tombstones in `queue`.
    gone: usize,
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

    /// Queues a waiter; `id` must be greater than every id queued before.
    pub(super) fn push(&mut self, id: u64, at: Instant, tx: oneshot::Sender<Grant>) {
        debug_assert!(self.queue.back().is_none_or(|(last, _, _)| *last < id));
        self.queue.push_back((id, at, Some(tx)));
    }

    /// Takes the first waiter that has not left.
    pub(super) fn pop(&mut self) -> Option<oneshot::Sender<Grant>> {
        while let Some((_, _, tx)) = self.queue.pop_front() {
            match tx {
                Some(tx) => return Some(tx),
                None => self.gone -= 1,
            }
        }
        None
    }

    /// Drops the waiters at the front whose channel is closed or that left.
    pub(super) fn drop_closed_front(&mut self) {
        while let Some((_, _, tx)) = self.queue.front() {
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
            .find(|(_, _, tx)| tx.is_some())
            .map(|(_, at, _)| *at)
    }

    /// The arrival of the first waiter whose channel is open.
    pub(super) fn oldest_live(&self) -> Option<Instant> {
        self.queue
            .iter()
            .find(|(_, _, tx)| tx.as_ref().is_some_and(|tx| !tx.is_closed()))
            .map(|(_, at, _)| *at)
    }

    /// Removes waiter `id`, if it is still queued.
    pub(super) fn remove(&mut self, id: u64) {
        let Ok(i) = self.queue.binary_search_by_key(&id, |(id, _, _)| *id) else {
            return;
        };
        if self.queue[i].2.is_none() {
            return;
        }
        if i == 0 {
            self.queue.pop_front();
            self.drop_tombstones_front();
        } else if i + 1 == self.queue.len() {
            self.queue.pop_back();
        } else {
            self.queue[i].2 = None;
            self.gone += 1;
            if self.gone > self.len() {
                self.queue.retain(|(_, _, tx)| tx.is_some());
                self.gone = 0;
            }
        }
    }

    fn drop_tombstones_front(&mut self) {
        while self.queue.front().is_some_and(|(_, _, tx)| tx.is_none()) {
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
            w.push(id, Instant::now(), tx);
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
                    let first = w.queue.iter().find(|(_, _, tx)| tx.is_some()).map(|e| e.0);
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
}
