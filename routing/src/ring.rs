//! A consistent-hash ring with virtual nodes and optional bounded loads.

use std::collections::HashMap;

use super::{RoutingError, key_hash};

/// The default number of virtual nodes per node: 160, as in ketama.
///
/// With 160 points per node the share of keys each node owns stays within roughly
/// ±20% of the mean for up to a few dozen nodes.
pub const DEFAULT_VNODES: u32 = 160;

/// A consistent-hash ring with virtual nodes and, optionally, bounded loads.
///
/// Node `x` (its bytes, `N: AsRef<[u8]>`) gets `vnodes` points on a 64-bit ring: the
/// XXH3-64 hashes of its bytes with seeds `0, 1, …, vnodes - 1`. A key `k` lands on
/// [`key_hash`](super::key_hash)`(k)` and belongs to the node of the first point at or
/// after that position, wrapping around; points at the same position are ordered by
/// node bytes. Placement depends only on the nodes and `vnodes`, never on the order of
/// adds; adding a node takes about `1/(n + 1)` of the keys, removing one moves only its.
///
/// [`pick`](Self::pick) ignores loads. [`assign`](Self::assign) counts one more hold on
/// the key's node (a node's *load*: its distinct assigned keys): an assigned key keeps
/// its node while held; a new key takes the first node clockwise whose load is below the
/// capacity. [`release`](Self::release) drops one hold; the last frees the key. With
/// [`with_bounded_loads`](Self::with_bounded_loads)`(c)` the capacity is
/// `ceil(c * (m + 1) / n)` for `m` assigned keys and `n` nodes, so no node holds more
/// than `ceil(c * m / n)`; without, it is unlimited and `assign` agrees with `pick`.
/// Assignments never move (loads may sit above the capacity until released); removing a
/// node forgets its keys.
///
/// ```
/// use lockflight_routing::HashRing;
///
/// let mut ring = HashRing::new(160).with_bounded_loads(1.25)?;
/// for node in ["a", "b", "c"] {
///     ring.add(node);
/// }
/// let home = *ring.pick(b"sku:555").unwrap(); // plain consistent hashing
///
/// let first = *ring.assign(b"sku:555").unwrap();
/// assert_eq!(first, home); // nothing is loaded yet, so it goes home
/// assert_eq!(ring.load(first), Some(1));
/// assert_eq!(ring.assign(b"sku:555"), Some(&first)); // a second hold, same node
/// assert_eq!(ring.load(first), Some(1));
///
/// ring.release(b"sku:555");
/// ring.release(b"sku:555");
/// assert_eq!(ring.load(first), Some(0));
/// # Ok::<(), lockflight_routing::RoutingError>(())
/// ```
#[derive(Clone, Debug)]
pub struct HashRing<N> {
    vnodes: u32,
    load_factor: Option<f64>,
    nodes: Vec<RingNode<N>>,
    /// `(position, index into nodes)`, sorted by position, then node bytes.
    points: Vec<(u64, usize)>,
    assignments: HashMap<Box<[u8]>, Assignment>,
    total_load: u64,
}

#[derive(Clone, Debug)]
struct RingNode<N> {
    id: N,
    load: u64,
}

#[derive(Clone, Copy, Debug)]
struct Assignment {
    node: usize,
    holds: u64,
}

impl<N> Default for HashRing<N> {
    /// An empty ring with [`DEFAULT_VNODES`] and no load bound.
    fn default() -> Self {
        HashRing {
            vnodes: DEFAULT_VNODES,
            load_factor: None,
            nodes: Vec::new(),
            points: Vec::new(),
            assignments: HashMap::new(),
            total_load: 0,
        }
    }
}

impl<N: AsRef<[u8]>> HashRing<N> {
    /// An empty ring giving each node `vnodes` points (0 is taken as 1), with no
    /// load bound.
    pub fn new(vnodes: u32) -> Self {
        HashRing {
            vnodes: vnodes.max(1),
            ..Self::default()
        }
    }

    /// Bounds loads to `c` times the average (`c > 1`; the paper's `1 + ε`, 1.25 is
    /// a common choice): see the type's documentation.
    ///
    /// # Errors
    ///
    /// [`RoutingError::InvalidLoadFactor`] when `c` is not finite or not greater
    /// than 1.
    pub fn with_bounded_loads(mut self, c: f64) -> Result<Self, RoutingError> {
        if !(c.is_finite() && c > 1.0) {
            return Err(RoutingError::InvalidLoadFactor(c));
        }
        self.load_factor = Some(c);
        Ok(self)
    }

    /// The number of points per node.
    pub fn vnodes(&self) -> u32 {
        self.vnodes
    }

    /// The load bound `c`, if loads are bounded.
    pub fn load_factor(&self) -> Option<f64> {
        self.load_factor
    }

    /// Adds `node`, or replaces the node with the same bytes (keeping its load and
    /// assignments), returning the node it replaced.
    pub fn add(&mut self, node: N) -> Option<N> {
        if let Some(i) = self.position(node.as_ref()) {
            return Some(std::mem::replace(&mut self.nodes[i].id, node));
        }
        let index = self.nodes.len();
        let bytes = node.as_ref();
        self.points.extend(
            (0..u64::from(self.vnodes))
                .map(|seed| (xxhash_rust::xxh3::xxh3_64_with_seed(bytes, seed), index)),
        );
        self.nodes.push(RingNode { id: node, load: 0 });
        self.sort_points();
        None
    }

    /// Removes the node with these bytes and forgets the keys assigned to it,
    /// returning it, or `None` if there is none.
    pub fn remove(&mut self, node: impl AsRef<[u8]>) -> Option<N> {
        let gone = self.position(node.as_ref())?;
        let last = self.nodes.len() - 1;
        let removed = self.nodes.swap_remove(gone);
        self.total_load -= removed.load;
        // The node that was last now sits at `gone`.
        let renumber = |i: usize| if i == last { gone } else { i };
        self.points.retain(|&(_, i)| i != gone);
        for p in &mut self.points {
            p.1 = renumber(p.1);
        }
        self.assignments.retain(|_, a| a.node != gone);
        for a in self.assignments.values_mut() {
            a.node = renumber(a.node);
        }
        // Renumbering can change the order of points that share a position.
        self.sort_points();
        Some(removed.id)
    }

    /// Whether a node with these bytes is present.
    pub fn contains(&self, node: impl AsRef<[u8]>) -> bool {
        self.position(node.as_ref()).is_some()
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The nodes and their loads, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&N, u64)> {
        self.nodes.iter().map(|n| (&n.id, n.load))
    }

    /// The node that owns `key` by plain consistent hashing (loads ignored), or
    /// `None` when the ring is empty.
    pub fn pick(&self, key: impl AsRef<[u8]>) -> Option<&N> {
        self.pick_hashed(key_hash(key.as_ref()))
    }

    /// Like [`pick`](Self::pick), for a key already hashed with
    /// [`key_hash`](super::key_hash).
    pub fn pick_hashed(&self, key_hash: u64) -> Option<&N> {
        let start = self.start(key_hash)?;
        Some(&self.nodes[self.points[start].1].id)
    }

    /// Assigns `key` to a node, counting it in that node's load, and returns the
    /// node; `None` when the ring is empty.
    ///
    /// A key already assigned keeps its node and gains one hold. A new key goes to
    /// the first node clockwise from its position whose load is below the capacity
    /// (see the type's documentation).
    pub fn assign(&mut self, key: impl AsRef<[u8]>) -> Option<&N> {
        let key = key.as_ref();
        if let Some(a) = self.assignments.get_mut(key) {
            a.holds += 1;
            return Some(&self.nodes[a.node].id);
        }
        let start = self.start(key_hash(key))?;
        let capacity = self.capacity_for(self.total_load + 1);
        // The loads sum to `total_load < n * capacity`, so some node is below the
        // capacity and a full turn of the ring finds it; the fallback only guards
        // against a broken invariant.
        let len = self.points.len();
        let node = (0..len)
            .map(|step| self.points[(start + step) % len].1)
            .find(|&i| self.nodes[i].load < capacity)
            .unwrap_or(self.points[start].1);
        self.nodes[node].load += 1;
        self.total_load += 1;
        self.assignments
            .insert(key.into(), Assignment { node, holds: 1 });
        Some(&self.nodes[node].id)
    }

    /// Drops one hold on `key`, returning the node it is assigned to, or `None` if
    /// it is not assigned. The last hold frees the key and lowers the node's load.
    pub fn release(&mut self, key: impl AsRef<[u8]>) -> Option<&N> {
        let key = key.as_ref();
        let a = self.assignments.get_mut(key)?;
        let node = a.node;
        a.holds -= 1;
        if a.holds == 0 {
            self.assignments.remove(key);
            self.nodes[node].load -= 1;
            self.total_load -= 1;
        }
        Some(&self.nodes[node].id)
    }

    /// The node `key` is currently assigned to, if it is.
    pub fn assigned(&self, key: impl AsRef<[u8]>) -> Option<&N> {
        let a = self.assignments.get(key.as_ref())?;
        Some(&self.nodes[a.node].id)
    }

    /// The load (distinct assigned keys) of the node with these bytes.
    pub fn load(&self, node: impl AsRef<[u8]>) -> Option<u64> {
        self.position(node.as_ref()).map(|i| self.nodes[i].load)
    }

    /// The number of keys assigned over all nodes.
    pub fn total_load(&self) -> u64 {
        self.total_load
    }

    /// The capacity a new key would face now, `ceil(c * (m + 1) / n)`; `None` when
    /// loads are unbounded or the ring is empty.
    pub fn capacity(&self) -> Option<u64> {
        if self.load_factor.is_none() || self.nodes.is_empty() {
            return None;
        }
        Some(self.capacity_for(self.total_load + 1))
    }

    /// `ceil(c * m / n)`, at least `ceil(m / n)` so rounding can never leave every
    /// node full; unlimited without a load factor.
    fn capacity_for(&self, m: u64) -> u64 {
        let (Some(c), Ok(n)) = (self.load_factor, u64::try_from(self.nodes.len())) else {
            return u64::MAX;
        };
        if n == 0 {
            return u64::MAX;
        }
        let bounded = (c * m as f64 / n as f64).ceil() as u64;
        bounded.max(m.div_ceil(n))
    }

    /// Index into `points` of the first point at or after `hash`, wrapping.
    fn start(&self, hash: u64) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let i = self.points.partition_point(|&(p, _)| p < hash);
        Some(if i == self.points.len() { 0 } else { i })
    }

    fn position(&self, node: &[u8]) -> Option<usize> {
        self.nodes.iter().position(|n| n.id.as_ref() == node)
    }

    fn sort_points(&mut self) {
        let nodes = &self.nodes;
        self.points.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| nodes[a.1].id.as_ref().cmp(nodes[b.1].id.as_ref()))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_load_factors() {
        for c in [1.0, 0.5, 0.0, -2.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                HashRing::<&str>::new(8).with_bounded_loads(c),
                Err(RoutingError::InvalidLoadFactor(_))
            ));
        }
    }

    #[test]
    fn empty_ring_answers_none() {
        let mut ring = HashRing::<String>::new(0);
        assert_eq!(ring.vnodes(), 1);
        assert_eq!(ring.pick(b"k"), None);
        assert_eq!(ring.assign(b"k"), None);
        assert_eq!(ring.release(b"k"), None);
        assert_eq!(ring.capacity(), None);
    }

    #[test]
    fn remove_renumbers_and_forgets() {
        let mut ring = HashRing::new(16).with_bounded_loads(1.5).unwrap();
        for n in ["a", "b", "c", "d"] {
            ring.add(n);
        }
        let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
        let placed: Vec<&str> = keys.iter().map(|k| *ring.assign(k).unwrap()).collect();
        ring.remove("a");
        let on_a = placed.iter().filter(|n| **n == "a").count() as u64;
        assert_eq!(ring.total_load(), 200 - on_a);
        for (k, n) in keys.iter().zip(&placed) {
            if *n == "a" {
                assert_eq!(ring.assigned(k), None);
            } else {
                assert_eq!(ring.assigned(k), Some(n));
            }
        }
        let sum: u64 = ring.iter().map(|(_, l)| l).sum();
        assert_eq!(sum, ring.total_load());
        // The ring still answers like a freshly built one.
        let mut fresh = HashRing::new(16);
        for n in ["d", "c", "b"] {
            fresh.add(n);
        }
        for k in &keys {
            assert_eq!(ring.pick(k), fresh.pick(k));
        }
    }
}
