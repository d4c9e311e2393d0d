//! Zipf-distributed key picks for the `zipf` workload.

use rand::RngExt as _;
use rand::rngs::StdRng;

/// Zipf(s) over `0..n` by inverse CDF (binary search in a cumulative table).
pub(crate) struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub(crate) fn new(n: usize, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += 1.0 / (k as f64).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    /// A key index; `rng` is the task's own seeded generator.
    pub(crate) fn sample(&self, rng: &mut StdRng) -> usize {
        let u: f64 = rng.random(); // uniform in [0, 1)
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;

    use super::*;

    #[test]
    fn low_ranks_dominate_and_every_pick_is_in_range() {
        let z = Zipf::new(1000, 1.0);
        let mut rng = StdRng::seed_from_u64(1);
        let mut hits = [0u32; 1000];
        for _ in 0..20_000 {
            hits[z.sample(&mut rng)] += 1;
        }
        // P(rank 1) = 1 / H(1000) ≈ 13.4 %; rank 1 is drawn about 10× as often as rank 10.
        assert!((2_000..3_400).contains(&hits[0]), "{}", hits[0]);
        assert!(hits[0] > 5 * hits[9], "{} vs {}", hits[0], hits[9]);
    }
}
