//! Number, time and machine formatting for the reports.

use serde_json::{Value, json};

use super::Point;
use crate::protocol::unix_us;

pub(crate) fn fmt_us(us: i64) -> String {
    if us.abs() >= 10_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else if us.abs() >= 1000 {
        format!("{:.2} ms", us as f64 / 1000.0)
    } else {
        format!("{us} µs")
    }
}

/// Median throughput, with the range over the rounds when there were several.
pub(super) fn fmt_cs(p: &Point) -> String {
    let lo = p.rounds.iter().copied().fold(f64::MAX, f64::min);
    let hi = p.rounds.iter().copied().fold(0.0, f64::max);
    if p.rounds.len() > 1 {
        format!(
            "{} ({}–{})",
            fmt_rate(p.throughput),
            fmt_rate(lo),
            fmt_rate(hi)
        )
    } else {
        fmt_rate(p.throughput)
    }
}

/// A figure that may be undefined: `—` when it is.
pub(super) fn fmt_opt(x: Option<f64>, fmt: impl FnOnce(f64) -> String) -> String {
    x.map_or_else(|| "—".to_owned(), fmt)
}

pub(crate) fn fmt_shares(shares: &[f64]) -> String {
    shares
        .iter()
        .map(|s| format!("{:.0}%", s * 100.0))
        .collect::<Vec<_>>()
        .join("/")
}

pub(super) fn fmt_rate(x: f64) -> String {
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `YYYY-MM-DD HH:MM UTC` from the system clock.
pub(super) fn utc_now() -> String {
    let secs = unix_us() / 1_000_000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

pub(super) fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .map(|l| l.trim().to_owned())
        })
        .unwrap_or_default();
    let cmd = |c: &str, arg: &str| {
        std::process::Command::new(c)
            .arg(arg)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    json!({
        "nproc": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu": cpu,
        "mem": mem,
        "redis_server": cmd("redis-server", "--version"),
        "rustc": cmd("rustc", "--version"),
    })
}
