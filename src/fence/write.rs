//! [`WriteId`]: what makes a fenced write safe to repeat.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Names one logical write, so that the resource applies it at most once however
/// often it is sent: make one with [`WriteId::next`] before the first attempt and
/// send the same id with every repeat (the `*_once` methods of
/// [`FencedKey`](crate::fence::FencedKey)).
///
/// The resource keeps, per fencing token, the ids it has applied (the newest 64
/// by id order; see [`FencedKey`](crate::fence::FencedKey)'s "Repeating a write"),
/// so ids should increase in the order a critical section makes its writes, and
/// must be unique within it. [`WriteId::next`] does both: it reads a clock of this
/// process that never repeats and never goes back. An id of your own (`From<u64>`,
/// e.g. a sequence kept with a pending write) must keep that order too.
///
/// ```
/// use lockflight::fence::WriteId;
///
/// let (a, b) = (WriteId::next(), WriteId::next());
/// assert!(a < b);
/// assert_eq!(WriteId::from(255).to_string(), "00000000000000ff");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId(u64);

/// The last id [`WriteId::next`] gave.
static CLOCK: AtomicU64 = AtomicU64::new(0);

impl WriteId {
    /// A new id, greater than every id this process made before: the system time
    /// in µs, or the last id plus one when that is not greater (a clock stepped
    /// back, or many ids in one µs). Ids of several processes are ordered as far
    /// as their clocks agree.
    pub fn next() -> WriteId {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let step = |last: u64| last.saturating_add(1).max(now);
        let last = CLOCK
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                Some(step(last))
            })
            .unwrap_or_else(|last| last);
        WriteId(step(last))
    }

    /// The id as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for WriteId {
    fn from(id: u64) -> WriteId {
        WriteId(id)
    }
}

impl fmt::Display for WriteId {
    /// 16 lowercase hex digits, as the resource records it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::WriteId;

    #[test]
    fn ids_increase_across_threads() {
        let handles: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..1000).map(|_| WriteId::next()).collect::<Vec<_>>()))
            .collect();
        let mut all = Vec::new();
        for handle in handles {
            let ids = handle.join().unwrap();
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "one thread's ids increase"
            );
            all.extend(ids);
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 4000, "no id is given twice");
    }
}
