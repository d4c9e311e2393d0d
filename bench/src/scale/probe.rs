//! What the curves read: this process's RSS and CPU time from `/proc/self`, and
//! the server's `INFO` fields, `DBSIZE`, and whether lock names are left.

use std::time::Duration;

use lockflight::LockKey;
use redis::aio::MultiplexedConnection;

/// This process's resident set (`VmRSS` of `/proc/self/status`), in bytes.
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// This process's CPU time, user + system (`/proc/self/stat` fields 14 and 15,
/// in clock ticks of 10 ms, Linux's `USER_HZ`).
pub fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may hold spaces: count from its closing ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    Duration::from_millis(ticks * 10)
}

/// `INFO <section>` as text.
pub async fn info(con: &mut MultiplexedConnection, section: &str) -> Result<String, String> {
    redis::cmd("INFO")
        .arg(section)
        .query_async::<String>(con)
        .await
        .map_err(|e| format!("INFO {section}: {e}"))
}

/// The value of `field:` in an `INFO` text.
fn field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// The server's `used_memory`, in bytes.
pub async fn used_memory(con: &mut MultiplexedConnection) -> Result<u64, String> {
    let text = info(con, "memory").await?;
    field(&text, "used_memory")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "INFO memory: no used_memory".to_owned())
}

/// The server's CPU time (`used_cpu_sys + used_cpu_user`).
pub async fn server_cpu(con: &mut MultiplexedConnection) -> Result<Duration, String> {
    let text = info(con, "cpu").await?;
    let secs: f64 = ["used_cpu_sys", "used_cpu_user"]
        .iter()
        .filter_map(|f| field(&text, f).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    Ok(Duration::from_secs_f64(secs))
}

/// Calls per command (`INFO commandstats`), e.g. `("evalsha", 12)`.
#[derive(Clone, Debug, Default)]
pub struct CommandStats(pub Vec<(String, u64)>);

impl CommandStats {
    /// `INFO commandstats` now.
    pub async fn read(con: &mut MultiplexedConnection) -> Result<CommandStats, String> {
        let text = info(con, "commandstats").await?;
        let mut calls = Vec::new();
        for line in text.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let n = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            calls.push((name.to_owned(), n));
        }
        Ok(CommandStats(calls))
    }

    /// Calls of `name` (lower case, e.g. `evalsha`).
    pub fn calls(&self, name: &str) -> u64 {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, c)| *c)
    }

    /// Every command's calls, except the `INFO` and `DBSIZE` calls of the probes.
    pub fn total(&self) -> u64 {
        self.0
            .iter()
            .filter(|(n, _)| n != "info" && n != "dbsize")
            .map(|(_, c)| c)
            .sum()
    }
}

/// `DBSIZE`.
pub async fn dbsize(con: &mut MultiplexedConnection) -> Result<u64, String> {
    redis::cmd("DBSIZE")
        .query_async(con)
        .await
        .map_err(|e| format!("DBSIZE: {e}"))
}

/// How many names match `pattern` (`SCAN … MATCH … COUNT 10000`, to the end).
pub async fn count_matching(con: &mut MultiplexedConnection, pattern: &str) -> Result<u64, String> {
    let (mut cursor, mut found) = (0u64, 0u64);
    // Bounded: SCAN returns to cursor 0 after one full pass over the keyspace;
    // the round cap only guards against a server that never does.
    for _ in 0..1_000_000 {
        let (next, names): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(con)
            .await
            .map_err(|e| format!("SCAN: {e}"))?;
        found += names.len() as u64;
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
    Err("SCAN did not finish".to_owned())
}

/// How many of `keys`' lock names (`<prefix>:{<key>}`, not its fence, queue or
/// release record) exist: `EXISTS` in pipelines of 1,000.
pub async fn lock_names_left(
    con: &mut MultiplexedConnection,
    prefix: &str,
    keys: impl Iterator<Item = LockKey>,
) -> Result<u64, String> {
    let mut left = 0;
    let mut keys = keys.peekable();
    // Bounded: each round consumes up to 1,000 keys of a finite iterator.
    while keys.peek().is_some() {
        let mut pipe = redis::pipe();
        for key in keys.by_ref().take(1000) {
            pipe.cmd("EXISTS").arg(testkit::names::lock(prefix, &key));
        }
        let found: Vec<u64> = pipe
            .query_async(con)
            .await
            .map_err(|e| format!("EXISTS: {e}"))?;
        left += found.iter().sum::<u64>();
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        assert!(rss_bytes() > 0);
        let _ = cpu_time();
    }

    #[test]
    fn parses_info() {
        let text = "# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:0.25\r\nused_memory:100\r\nused_memory_rss:7\r\n";
        assert_eq!(field(text, "used_memory"), Some("100"));
        assert_eq!(field(text, "used_cpu_user"), Some("0.25"));
    }
}
