//! Weighted rendezvous (highest random weight) hashing.

use std::cmp::Ordering;

use super::{RoutingError, key_hash, pair_hash};

/// Weighted rendezvous hashing (highest random weight) over named nodes.
///
/// Every node scores every key; the key goes to the highest score. A node's identity is
/// its bytes (`N: AsRef<[u8]>`), so processes holding the same nodes and weights route
/// every key the same way, whatever order the nodes were added in. A removed node's keys
/// spread over the others in proportion to their weights; an added node takes about
/// `w / (W + w)` of the keys (`W` the old total weight), all to itself; no other key
/// moves. [`pick`](Self::pick) is `O(n)` in the nodes.
///
/// The score of key `k` for node `x` with weight `w`: `h = fmix64(key_hash(k) ^
/// key_hash(x))` ([`key_hash`](super::key_hash): XXH3-64, seed 0; `fmix64`: MurmurHash3's
/// 64-bit finalizer), `u = ((h >> 12) + 0.5) / 2^52` (strictly inside (0, 1)), and
/// `score = -w / ln(u)`, which gives `x` a share `w / Σw` of the keys. The highest score
/// wins; ties go to the higher `h`, then to the greater node bytes. `ln` may differ in
/// the last bit between platforms, which can flip only a key whose two best scores are
/// within one rounding error of each other.
///
/// ```
/// use lockflight_routing::Rendezvous;
///
/// let mut hrw = Rendezvous::new();
/// hrw.add("node-a", 1.0)?;
/// hrw.add("node-b", 1.0)?;
/// hrw.add("node-c", 2.0)?; // twice the share of the others
///
/// let owner = *hrw.pick(b"sku:555").unwrap();
/// assert_eq!(hrw.pick(b"sku:555"), Some(&owner)); // same key, same node
///
/// // Removing another node never moves this key.
/// let other = ["node-a", "node-b", "node-c"].into_iter().find(|n| *n != owner).unwrap();
/// hrw.remove(other);
/// assert_eq!(hrw.pick(b"sku:555"), Some(&owner));
/// # Ok::<(), lockflight_routing::RoutingError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Rendezvous<N> {
    nodes: Vec<Node<N>>,
    /// All weights are equal, so the highest `h` wins and no logarithm is needed.
    uniform: bool,
}

#[derive(Clone, Debug)]
struct Node<N> {
    id: N,
    /// `key_hash` of the id's bytes.
    hash: u64,
    weight: f64,
}

impl<N> Default for Rendezvous<N> {
    fn default() -> Self {
        Rendezvous {
            nodes: Vec::new(),
            uniform: true,
        }
    }
}

impl<N: AsRef<[u8]>> Rendezvous<N> {
    /// An empty set of nodes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `node` with `weight`, or replaces the node with the same bytes (and its
    /// weight), returning the node it replaced.
    ///
    /// # Errors
    ///
    /// [`RoutingError::InvalidWeight`] when `weight` is not finite or not greater
    /// than zero; the set is left unchanged.
    pub fn add(&mut self, node: N, weight: f64) -> Result<Option<N>, RoutingError> {
        if !(weight.is_finite() && weight > 0.0) {
            return Err(RoutingError::InvalidWeight(weight));
        }
        let hash = key_hash(node.as_ref());
        let new = Node {
            id: node,
            hash,
            weight,
        };
        let old = match self.position(new.id.as_ref()) {
            Some(i) => Some(std::mem::replace(&mut self.nodes[i], new).id),
            None => {
                self.nodes.push(new);
                None
            }
        };
        self.refresh_uniform();
        Ok(old)
    }

    /// Removes the node with these bytes, returning it, or `None` if there is none.
    ///
    /// Only the keys that were on this node move.
    pub fn remove(&mut self, node: impl AsRef<[u8]>) -> Option<N> {
        let i = self.position(node.as_ref())?;
        let removed = self.nodes.swap_remove(i).id;
        self.refresh_uniform();
        Some(removed)
    }

    /// Whether a node with these bytes is present.
    pub fn contains(&self, node: impl AsRef<[u8]>) -> bool {
        self.position(node.as_ref()).is_some()
    }

    /// The weight of the node with these bytes.
    pub fn weight(&self, node: impl AsRef<[u8]>) -> Option<f64> {
        self.position(node.as_ref()).map(|i| self.nodes[i].weight)
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The nodes and their weights, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&N, f64)> {
        self.nodes.iter().map(|n| (&n.id, n.weight))
    }

    /// The node that owns `key`, or `None` when there are no nodes.
    pub fn pick(&self, key: impl AsRef<[u8]>) -> Option<&N> {
        self.pick_hashed(key_hash(key.as_ref()))
    }

    /// Like [`pick`](Self::pick), for a key already hashed with
    /// [`key_hash`](super::key_hash).
    pub fn pick_hashed(&self, key_hash: u64) -> Option<&N> {
        let mut nodes = self.nodes.iter();
        let first = nodes.next()?;
        let mut best = first;
        let mut best_h = pair_hash(key_hash, first.hash);
        if self.uniform {
            for n in nodes {
                let h = pair_hash(key_hash, n.hash);
                if (h, n.id.as_ref()) > (best_h, best.id.as_ref()) {
                    best = n;
                    best_h = h;
                }
            }
        } else {
            let mut best_score = score(best_h, first.weight);
            for n in nodes {
                let h = pair_hash(key_hash, n.hash);
                let s = score(h, n.weight);
                let wins = match s.partial_cmp(&best_score) {
                    Some(Ordering::Greater) => true,
                    Some(Ordering::Less) => false,
                    // Scores are finite and positive, so this is an exact tie.
                    _ => (h, n.id.as_ref()) > (best_h, best.id.as_ref()),
                };
                if wins {
                    best = n;
                    best_h = h;
                    best_score = s;
                }
            }
        }
        Some(&best.id)
    }

    fn position(&self, node: &[u8]) -> Option<usize> {
        self.nodes.iter().position(|n| n.id.as_ref() == node)
    }

    fn refresh_uniform(&mut self) {
        self.uniform = match self.nodes.first() {
            Some(first) => self.nodes.iter().all(|n| n.weight == first.weight),
            None => true,
        };
    }
}

/// `-w / ln(u)` with `u = ((h >> 12) + 0.5) / 2^52` in (0, 1): finite and positive
/// for every finite `w > 0`.
fn score(h: u64, weight: f64) -> f64 {
    const TWO_POW_52: f64 = (1u64 << 52) as f64;
    let u = ((h >> 12) as f64 + 0.5) / TWO_POW_52;
    -weight / u.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_is_finite_at_the_extremes() {
        for h in [0, 1, 4095, 4096, u64::MAX, u64::MAX - 4095] {
            let s = score(h, 1.0);
            assert!(s.is_finite() && s > 0.0, "h={h}: {s}");
        }
        assert!(score(u64::MAX, 1.0) > score(0, 1.0));
    }

    #[test]
    fn rejects_bad_weights() {
        let mut hrw = Rendezvous::new();
        for w in [0.0, -0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(matches!(
                hrw.add("a", w),
                Err(RoutingError::InvalidWeight(_))
            ));
        }
        assert!(hrw.is_empty());
        assert_eq!(hrw.pick(b"k"), None);
    }
}
