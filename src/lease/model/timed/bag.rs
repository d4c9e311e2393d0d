//! The small sorted multiset the states are made of.

/// A small multiset, kept sorted (so that a state has one form whatever the
/// order things were put in): requests on the wire, replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Bag<T, const N: usize>(pub(super) [Option<T>; N]);

impl<T: Copy + Ord, const N: usize> Bag<T, N> {
    pub(super) const EMPTY: Self = Bag([None; N]);

    pub(super) fn push(&mut self, item: T) {
        let free = self.0.iter_mut().find(|s| s.is_none());
        *free.expect("a bag big enough for every run") = Some(item);
        self.0.sort_unstable();
    }

    /// Takes out the item at `i` (as [`iter`](Self::iter) numbers them).
    pub(super) fn take(&mut self, i: usize) -> T {
        let item = self.0[i].take().expect("an item");
        self.0.sort_unstable();
        item
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (usize, T)> + '_ {
        self.0
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|x| (i, x)))
    }

    /// Changes every item; the order is restored.
    pub(super) fn map(&mut self, f: impl Fn(T) -> T) {
        for s in &mut self.0 {
            *s = s.map(&f);
        }
        self.0.sort_unstable();
    }

    pub(super) fn retain(&mut self, keep: impl Fn(&T) -> bool) {
        for s in &mut self.0 {
            if s.is_some_and(|x| !keep(&x)) {
                *s = None;
            }
        }
        self.0.sort_unstable();
    }
}
