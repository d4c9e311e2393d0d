//! The coordinator: the private Redis server, the scenarios, the comparison and
//! per-workload matrices (modes interleaved, `repeat` rounds, the median round
//! kept), the report.

mod point;
mod scenarios;
mod verify;

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::config::{Config, Mode, Workload};
use crate::data_connection;
use crate::protocol::unix_us;
use crate::report::{Point, Report, fmt_shares, fmt_us, markdown, write_outputs};
use point::run_point;
use scenarios::{measure_uncontended, measure_wake};

/// Runs the configured matrix, the wake-up scenario and the uncontended check; writes
/// the results; fails (with every violation listed) if correctness was violated.
pub fn run(cfg: &Config) -> Result<Report, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(coordinate(cfg))
}

/// The state of a run shared by its points and scenarios.
struct Run<'a> {
    cfg: &'a Config,
    url: String,
    /// The coordinator's own connection: `INFO commandstats`, the oracles' reads.
    admin: redis::aio::MultiplexedConnection,
    run_id: String,
    pb: ProgressBar,
    next_prefix: u64,
}

impl Run<'_> {
    fn say(&self, line: String) {
        if self.pb.is_hidden() {
            eprintln!("{line}");
        } else {
            self.pb.println(line);
        }
    }

    fn prefix(&mut self) -> String {
        self.next_prefix += 1;
        format!("lfbench:{}:{}", self.run_id, self.next_prefix)
    }
}

async fn coordinate(cfg: &Config) -> Result<Report, String> {
    let started = Instant::now();
    let server = match &cfg.redis_url {
        Some(_) => None,
        None => Some(testkit::RedisServer::start()),
    };
    let url = match (&cfg.redis_url, &server) {
        (Some(u), _) => u.clone(),
        (None, Some(s)) => s.url(),
        (None, None) => unreachable!(),
    };
    let admin = data_connection(&url).await?;
    // The workers reach Redis through the delay proxy, if asked; the coordinator's
    // own reads (oracles, command counts) go direct.
    let _proxy = if cfg.delay.is_zero() {
        None
    } else {
        let target = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .parse::<std::net::SocketAddr>()
            .map_err(|e| format!("the delay proxy needs a redis://IP:PORT url, got {url}: {e}"))?;
        Some(crate::delay::DelayProxy::start(target, cfg.delay).map_err(|e| e.to_string())?)
    };
    let url = _proxy.as_ref().map_or(url, crate::delay::DelayProxy::url);
    let distributed: Vec<Mode> = cfg
        .modes
        .iter()
        .copied()
        .filter(|&m| m.is_lockflight())
        .collect();
    let steps = cfg.workloads.len() * cfg.tasks.len() * cfg.modes.len() * cfg.repeat
        + cfg.compare.iter().map(|c| c.modes.len()).sum::<usize>() * cfg.repeat
        + 2;
    let pb = ProgressBar::new(steps as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} (eta {eta}) {msg}",
        )
        .map_err(|e| e.to_string())?,
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    let mut run = Run {
        cfg,
        url,
        admin,
        run_id: format!("{}-{}", std::process::id(), unix_us() % 1_000_000_000),
        pb,
        next_prefix: 0,
    };
    run.say(format!(
        "lockflight contention bench{}: P={} T={:?} {:.1} s/point, workloads {:?}, modes {:?}, redis {}, one-way delay {:?}",
        if cfg.smoke { " (smoke)" } else { "" },
        cfg.procs,
        cfg.tasks,
        cfg.secs,
        cfg.workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
        cfg.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        run.url,
        cfg.delay,
    ));

    let mut violations = Vec::new();
    let mut uncontended = Vec::new();
    run.pb.set_message("uncontended lock + release");
    for &mode in &distributed {
        let u = measure_uncontended(&mut run, mode).await?;
        if u.min_requests != 2 || u.max_requests != 2 {
            violations.push(format!(
                "uncontended lock + release ({}) took {}..{} backend round trips, not exactly 2",
                mode.name(),
                u.min_requests,
                u.max_requests
            ));
        }
        uncontended.push(u);
    }
    run.pb.inc(1);
    run.pb.set_message("wake-up after a remote release");
    let wake = measure_wake(&mut run).await?;
    run.pb.inc(1);

    let mut compare = Vec::new();
    for cell in &cfg.compare {
        compare.extend(
            run_cell(
                &mut run,
                cell.workload,
                cell.procs,
                cell.tasks,
                &cell.modes,
                &mut violations,
            )
            .await?,
        );
    }
    let mut points = Vec::new();
    for &workload in &cfg.workloads {
        for &t in &cfg.tasks {
            let modes = cfg.modes.clone();
            points
                .extend(run_cell(&mut run, workload, cfg.procs, t, &modes, &mut violations).await?);
        }
    }
    run.pb.finish_and_clear();
    drop(server);
    let topology = if cfg.topology {
        eprintln!(
            "topologies: one server, a Cluster, Sentinel ({:.1} s per row)",
            cfg.secs
        );
        Some(crate::topology::measure(cfg.secs).await?)
    } else {
        None
    };

    let total = started.elapsed();
    let mut report = Report {
        points,
        compare,
        wake,
        uncontended,
        topology,
        markdown: String::new(),
        chart: None,
        total,
    };
    report.markdown = markdown(cfg, &report, &violations);
    write_outputs(cfg, &mut report)?;
    if violations.is_empty() {
        Ok(report)
    } else {
        Err(format!(
            "{} correctness violation(s):\n  - {}",
            violations.len(),
            violations.join("\n  - ")
        ))
    }
}

/// Runs one (workload, P, T) point in each of `modes`, interleaved, `repeat` rounds;
/// returns, per mode, the round with the median throughput (with every round's
/// throughput in `rounds`).
async fn run_cell(
    run: &mut Run<'_>,
    workload: Workload,
    procs: usize,
    t: usize,
    modes: &[Mode],
    violations: &mut Vec<String>,
) -> Result<Vec<Point>, String> {
    let repeat = run.cfg.repeat;
    let mut rounds: Vec<Vec<Point>> = vec![Vec::new(); modes.len()];
    for round in 0..repeat {
        for (m, &mode) in modes.iter().enumerate() {
            run.pb.set_message(format!(
                "{} {} P={procs} T={t} round {}/{}",
                workload.name(),
                mode.name(),
                round + 1,
                repeat
            ));
            let (point, bad) = run_point(run, workload, mode, procs, t).await?;
            run.say(format!(
                "{:<20} {:<9} P={} T={:<3} {:>9.0} cs/s  wait p50 {:>7} p99 {:>7}  req/cs {:>7.3}  server lock cmds/cs {:>7.2}  shares {}{}",
                workload.name(),
                mode.name(),
                point.procs,
                point.tasks,
                point.throughput,
                fmt_us(point.wait_p50_us as i64),
                fmt_us(point.wait_p99_us as i64),
                point.requests_per_cs(),
                point.server_lock_per_cs(),
                fmt_shares(&point.shares()),
                if bad.is_empty() { "" } else { "  *** CORRECTNESS VIOLATION ***" },
            ));
            violations.extend(bad);
            rounds[m].push(point);
            run.pb.inc(1);
        }
    }
    Ok(rounds
        .into_iter()
        .map(|mut r| {
            let all: Vec<f64> = r.iter().map(|p| p.throughput).collect();
            r.sort_by(|a, b| a.throughput.total_cmp(&b.throughput));
            let mut median = r.swap_remove(r.len() / 2);
            median.rounds = all;
            median
        })
        .collect())
}
