//! One point: the worker processes, the start barrier, the results.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::Run;
use super::verify::{commandstats, verify};
use crate::config::{HOLD, Mode, Workload};
use crate::new_histogram;
use crate::protocol::{Msg, WORKER_ENV, WorkerResult, WorkerSpec, go_line, unix_us};
use crate::report::Point;

/// Runs one point: starts the worker processes, waits until all are ready, starts
/// them at one instant, collects their results, then summarizes and verifies.
pub(super) async fn run_point(
    run: &mut Run<'_>,
    workload: Workload,
    mode: Mode,
    p: usize,
    t: usize,
) -> Result<(Point, Vec<String>), String> {
    let cfg = run.cfg;
    let prefix = run.prefix();
    let (procs, tasks) = if mode == Mode::Floor {
        (1, p * t)
    } else {
        (p, t)
    };
    let what = format!("{} {} P={procs} T={tasks}", workload.name(), mode.name());
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Msg)>();
    let mut children = Vec::new();
    let mut stdins = Vec::new();
    for id in 0..procs {
        let mut cmd = tokio::process::Command::from((cfg.worker)());
        cmd.env(WORKER_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("{what}: spawn worker: {e}"))?;
        let mut stdin = child.stdin.take().ok_or("no worker stdin")?;
        let spec = WorkerSpec {
            id: id as u64,
            url: run.url.clone(),
            prefix: prefix.clone(),
            workload,
            mode,
            tasks,
            threads: cfg.worker_threads,
            seed: unix_us() ^ (id as u64) << 40,
        };
        let spec = serde_json::to_string(&spec).map_err(|e| format!("{what}: spec: {e}"))?;
        stdin
            .write_all(format!("{spec}\n").as_bytes())
            .await
            .map_err(|e| format!("{what}: write spec: {e}"))?;
        stdin.flush().await.map_err(|e| e.to_string())?;
        stdins.push(stdin);
        let stdout = child.stdout.take().ok_or("no worker stdout")?;
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Some(msg) = Msg::parse(&line) else {
                    continue;
                };
                if tx.send((id, msg)).is_err() {
                    return;
                }
            }
            let _ = tx.send((id, Msg::Eof));
        });
        children.push(child);
    }
    drop(tx);

    // Start barrier: everyone connected and subscribed.
    let mut ready = 0;
    while ready < procs {
        match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
            Err(_) => return Err(format!("{what}: workers not ready within 60 s")),
            Ok(None) => return Err(format!("{what}: workers gone before ready")),
            Ok(Some((_, Msg::Ready))) => ready += 1,
            Ok(Some((id, Msg::Error(e)))) => return Err(format!("{what}: worker {id}: {e}")),
            Ok(Some((id, _))) => {
                return Err(format!("{what}: worker {id} exited before it was ready"));
            }
        }
    }
    let before = commandstats(&mut run.admin).await?;
    let start = unix_us() + 50_000;
    let end = start + (cfg.secs * 1e6) as u64;
    for stdin in &mut stdins {
        stdin
            .write_all(go_line(start, end).as_bytes())
            .await
            .map_err(|e| format!("{what}: write GO: {e}"))?;
        stdin.flush().await.map_err(|e| e.to_string())?;
    }
    drop(stdins);

    let mut results: Vec<Option<WorkerResult>> = vec![None; procs];
    let mut got = 0;
    let limit = Duration::from_secs_f64(cfg.secs) + Duration::from_secs(90);
    while got < procs {
        match tokio::time::timeout(limit, rx.recv()).await {
            Err(_) => return Err(format!("{what}: no result within {limit:?}")),
            Ok(None) => return Err(format!("{what}: workers gone before their result")),
            Ok(Some((id, Msg::Result(v)))) => {
                results[id] = Some(*v);
                got += 1;
            }
            Ok(Some((id, Msg::Error(e)))) => return Err(format!("{what}: worker {id}: {e}")),
            Ok(Some((id, Msg::Eof))) => {
                if results[id].is_none() {
                    return Err(format!("{what}: worker {id} exited without a result"));
                }
            }
            Ok(Some((_, Msg::Ready))) => {}
        }
    }
    let after = commandstats(&mut run.admin).await?;
    for mut child in children {
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => return Err(format!("{what}: a worker exited with {status}")),
            Ok(Err(e)) => return Err(format!("{what}: waiting for a worker: {e}")),
            Err(_) => return Err(format!("{what}: a worker did not exit after its result")),
        }
    }
    let results: Vec<WorkerResult> = results.into_iter().flatten().collect();

    let mut server: BTreeMap<String, u64> = BTreeMap::new();
    for (name, &calls) in &after {
        let delta = calls.saturating_sub(before.get(name).copied().unwrap_or(0));
        if delta > 0 && name != "info" {
            server.insert(name.clone(), delta);
        }
    }
    let (point, mut bad) = summarize(workload, mode, t, procs, tasks, &results, server)?;
    bad.extend(verify(run, workload, mode, &prefix, &results).await?);
    Ok((
        point,
        bad.into_iter().map(|b| format!("{what}: {b}")).collect(),
    ))
}

fn summarize(
    workload: Workload,
    mode: Mode,
    t: usize,
    procs: usize,
    tasks: usize,
    results: &[WorkerResult],
    server: BTreeMap<String, u64>,
) -> Result<(Point, Vec<String>), String> {
    let mut bad = Vec::new();
    let mut hist = new_histogram();
    let mut requests = [0u64; 4];
    let mut per_proc = Vec::new();
    let mut elapsed_us = 0;
    let (mut handoffs, mut local_waits, mut acquired) = (0, 0, 0);
    for r in results {
        let id = r.id;
        per_proc.push(r.sections);
        elapsed_us = elapsed_us.max(r.elapsed_us);
        for &[v, n] in &r.hist {
            hist.record_n(v, n).map_err(|e| e.to_string())?;
        }
        for (total, n) in requests.iter_mut().zip(r.requests) {
            *total += n;
        }
        for e in &r.errors {
            bad.push(format!("worker {id}: {e}"));
        }
        if let Some(stats) = &r.stats {
            handoffs += stats.handoffs;
            local_waits += stats.local_waits;
            acquired += stats.acquired;
            for (n, what) in [
                (stats.leases_lost, "leases lost"),
                (stats.timeouts, "timeouts"),
                (stats.active_keys, "slots left in the map"),
            ] {
                if n > 0 {
                    bad.push(format!("worker {id}: {n} {what}"));
                }
            }
        }
    }
    let sections: u64 = per_proc.iter().sum();
    let elapsed_s = elapsed_us as f64 / 1e6;
    // How busy the hot key was: defined for one key only (`zipf`'s many keys are
    // busy at once).
    let hot_key = workload.keys() == 1;
    let busy_us: u64 = results.iter().map(|r| r.section_us).sum();
    let gaps = Gaps::of(
        results
            .iter()
            .flat_map(|r| {
                r.records
                    .iter()
                    .map(|&[k, value, _, _, start, end]| Section {
                        key: k,
                        value,
                        worker: r.id,
                        start,
                        end,
                    })
            })
            .collect(),
    );
    let point = Point {
        workload,
        mode,
        procs,
        tasks,
        t,
        sections,
        elapsed_s,
        throughput: if elapsed_s > 0.0 {
            sections as f64 / elapsed_s
        } else {
            0.0
        },
        wait_p50_us: hist.value_at_quantile(0.5),
        wait_p99_us: hist.value_at_quantile(0.99),
        wait_max_us: hist.max(),
        requests,
        server,
        handoffs,
        local_waits,
        acquired,
        per_proc,
        rounds: Vec::new(),
        efficiency: (hot_key && elapsed_us > 0).then(|| busy_us as f64 / elapsed_us as f64),
        transfers_per_s: (hot_key && elapsed_s > 0.0).then(|| gaps.transfers as f64 / elapsed_s),
        idle_us_per_transfer: hot_key.then(|| gaps.per_transfer()).flatten(),
        idle_us_per_turn: hot_key.then(|| gaps.per_turn()).flatten(),
        one_way_us: (hot_key && sections > 0).then(|| {
            // A section is a GET and a SET on the data connection (two round
            // trips), plus the hold of `hotkey-rmw-hold1ms`.
            let hold = if workload == Workload::HotkeyHold {
                HOLD.as_micros() as f64
            } else {
                0.0
            };
            ((busy_us as f64 / sections as f64 - hold) / 4.0).max(0.0)
        }),
    };
    if sections == 0 {
        bad.push("no critical section completed".into());
    }
    Ok((point, bad))
}

/// One critical section, as the coordinator orders them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Section {
    key: u64,
    /// The counter value the section read: orders the sections of a key (the
    /// verifier checks that each value is read once).
    value: u64,
    worker: u64,
    /// The section's start and end, unix µs (the workers share the machine's clock).
    start: u64,
    end: u64,
}

/// The hot key's idle gaps: from a critical section's end to the next section's
/// start on the same key, split by whether the next section ran in another worker
/// process (a transfer between instances) or the same one (a turn inside a process:
/// a handoff or a cached lease).
#[derive(Debug, Default, PartialEq)]
struct Gaps {
    transfers: u64,
    transfer_idle_us: u64,
    turns: u64,
    turn_idle_us: u64,
}

impl Gaps {
    fn of(mut sections: Vec<Section>) -> Gaps {
        sections.sort_unstable();
        let mut gaps = Gaps::default();
        for w in sections.windows(2) {
            let (a, b) = (w[0], w[1]);
            if a.key != b.key {
                continue;
            }
            // Never negative under mutual exclusion; saturating all the same.
            let idle = b.start.saturating_sub(a.end);
            if a.worker == b.worker {
                gaps.turns += 1;
                gaps.turn_idle_us += idle;
            } else {
                gaps.transfers += 1;
                gaps.transfer_idle_us += idle;
            }
        }
        gaps
    }

    /// The mean idle time of a transfer between processes, µs.
    fn per_transfer(&self) -> Option<f64> {
        (self.transfers > 0).then(|| self.transfer_idle_us as f64 / self.transfers as f64)
    }

    /// The mean idle time of a turn inside a process, µs.
    fn per_turn(&self) -> Option<f64> {
        (self.turns > 0).then(|| self.turn_idle_us as f64 / self.turns as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::{Gaps, Section};

    /// The sections of one key run by the workers of `order`, values 0, 1, ...,
    /// each 10 µs long and starting `gap` µs after the previous one ended.
    fn on_key(key: u64, order: &[u64], gap: u64) -> Vec<Section> {
        let mut at = 0;
        (0..)
            .zip(order)
            .map(|(value, &worker)| {
                let s = Section {
                    key,
                    value,
                    worker,
                    start: at,
                    end: at + 10,
                };
                at += 10 + gap;
                s
            })
            .collect()
    }

    #[test]
    fn a_transfer_is_a_change_of_worker_in_counter_order() {
        let g = Gaps::of(on_key(0, &[0, 0, 1, 0], 5));
        assert_eq!((g.transfers, g.transfer_idle_us), (2, 10));
        assert_eq!((g.turns, g.turn_idle_us), (1, 5));
        assert_eq!(g.per_transfer(), Some(5.0));
        let one = Gaps::of(on_key(0, &[1, 1, 1], 5));
        assert_eq!((one.transfers, one.turns), (0, 2), "one worker");
        assert_eq!(one.per_transfer(), None);
        assert_eq!(Gaps::of(Vec::new()), Gaps::default());
        // The records arrive grouped by worker, not in counter order.
        let mut mixed = on_key(0, &[0, 1, 0, 1], 7);
        mixed.sort_by_key(|s| s.worker);
        let g = Gaps::of(mixed);
        assert_eq!((g.transfers, g.transfer_idle_us, g.turns), (3, 21, 0));
    }

    #[test]
    fn keys_do_not_pair_with_each_other() {
        // Key 0 ends on worker 0, key 1 starts on worker 1: no transfer between them.
        let mut both = on_key(0, &[0, 0], 1);
        both.extend(on_key(1, &[1, 1, 0], 1));
        let g = Gaps::of(both);
        assert_eq!((g.transfers, g.turns), (1, 2));
    }
}
