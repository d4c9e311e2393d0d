//! The correctness oracles, run on Redis after every point.

use std::collections::{BTreeMap, HashMap};

use super::Run;
use crate::config::{Mode, Workload, counter_name};
use crate::protocol::WorkerResult;

/// The correctness oracles of one point (see the crate docs): counters against
/// critical sections, the values read per key (no duplicate, no gap), fencing tokens
/// strictly increasing in critical-section order, no lock key left. Returns the
/// violations found.
pub(super) async fn verify(
    run: &mut Run<'_>,
    workload: Workload,
    mode: Mode,
    prefix: &str,
    results: &[WorkerResult],
) -> Result<Vec<String>, String> {
    let mut bad = Vec::new();
    // key -> [(value read, epoch, seq, worker)]
    let mut by_key: HashMap<u64, Vec<(u64, u64, u64, u64)>> = HashMap::new();
    for r in results {
        for &[k, value, epoch, seq, ..] in &r.records {
            by_key.entry(k).or_default().push((value, epoch, seq, r.id));
        }
    }
    // Every counter in Redis (also ones whose sections were not reported).
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:ctr:*"))
        .query_async(&mut run.admin)
        .await
        .map_err(|e| format!("KEYS: {e}"))?;
    let mut counters: HashMap<String, u64> = HashMap::new();
    for chunk in names.chunks(1000) {
        let values: Vec<Option<u64>> = redis::cmd("MGET")
            .arg(chunk)
            .query_async(&mut run.admin)
            .await
            .map_err(|e| format!("MGET: {e}"))?;
        for (n, v) in chunk.iter().zip(values) {
            counters.insert(n.clone(), v.unwrap_or(0));
        }
    }
    let counter_total: u64 = counters.values().sum();
    let sections: u64 = by_key.values().map(|v| v.len() as u64).sum();
    if counter_total != sections {
        bad.push(format!(
            "the counters add up to {counter_total} but {sections} critical sections ran \
             (lost updates: mutual exclusion was violated)"
        ));
    }
    let mut reported = 0;
    for (&k, recs) in &mut by_key {
        let name = counter_name(prefix, workload, k as usize);
        let counter = counters.get(&name).copied().unwrap_or(0);
        if counter != recs.len() as u64 {
            bad.push(format!(
                "counter {name} is {counter} but {} critical sections ran on it",
                recs.len()
            ));
        }
        recs.sort_unstable();
        for (i, w) in recs.iter().enumerate() {
            if w.0 != i as u64 && reported < 10 {
                reported += 1;
                bad.push(format!(
                    "key {k}: critical section #{i} (in counter order) read {} (sections overlapped)",
                    w.0
                ));
                break;
            }
        }
        if mode.is_lockflight() {
            for pair in recs.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                if (a.1, a.2) >= (b.1, b.2) && reported < 10 {
                    reported += 1;
                    bad.push(format!(
                        "key {k}: fencing token {}.{} (worker {}, value {}) is not below the \
                         next section's {}.{} (worker {}, value {})",
                        a.1, a.2, a.3, a.0, b.1, b.2, b.3, b.0
                    ));
                }
            }
        }
    }
    if mode != Mode::Floor {
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:{{*}}"))
            .query_async(&mut run.admin)
            .await
            .map_err(|e| format!("KEYS: {e}"))?;
        if !left.is_empty() {
            bad.push(format!(
                "{} lock key(s) remain after every worker released: {:?}",
                left.len(),
                &left[..left.len().min(5)]
            ));
        }
    }
    Ok(bad)
}

/// Calls per command name from `INFO commandstats`.
pub(crate) async fn commandstats(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<BTreeMap<String, u64>, String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(|e| format!("INFO commandstats: {e}"))?;
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        if let Some(calls) = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|c| c.parse().ok())
        {
            out.insert(name.to_owned(), calls);
        }
    }
    Ok(out)
}
