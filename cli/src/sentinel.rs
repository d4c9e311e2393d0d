//! `lockflight doctor --sentinel`: what the sentinels say about the master (its
//! address, the quorum, the replicas), before the per-server checks run on the
//! primary they name.

use std::collections::HashMap;

use redis::RedisResult;

use crate::report::Check;
use crate::{connect, redact};

/// What the sentinels told.
pub(crate) struct SentinelView {
    /// The sentinel-specific checks.
    pub(crate) checks: Vec<Check>,
    /// The primary's URL (`redis://host:port/`), if a sentinel named one.
    pub(crate) primary: Option<String>,
    /// The URLs of the replicas the sentinels list as healthy.
    pub(crate) replicas: Vec<String>,
}

/// The URL of a data node as `RedisBackend::sentinel` reaches it: the sentinels
/// give `host:port` only, and the backend connects without credentials.
fn node_url(host: &str, port: &str) -> String {
    format!("redis://{host}:{port}/")
}

/// Asks each sentinel of `sentinels` about `master`: `SENTINEL
/// GET-MASTER-ADDR-BY-NAME` on every one, then `SENTINEL CKQUORUM` and
/// `SENTINEL REPLICAS` on the first that names the primary.
pub(crate) async fn inspect(
    sentinels: &[String],
    master: &str,
    replica_ack: Option<u32>,
) -> SentinelView {
    let mut checks = Vec::new();
    let mut named: Vec<(String, String)> = Vec::new(); // (sentinel, host:port)
    let mut problems: Vec<String> = Vec::new();
    let mut answering = None;
    for url in sentinels {
        let mut conn = match connect(url).await {
            Ok(conn) => conn,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        let addr: RedisResult<Option<(String, String)>> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(master)
            .query_async(&mut conn)
            .await;
        match addr {
            Ok(Some((host, port))) => {
                named.push((redact(url), format!("{host}:{port}")));
                if answering.is_none() {
                    answering = Some((conn, host, port));
                }
            }
            Ok(None) => problems.push(format!("{} does not monitor {master:?}", redact(url))),
            Err(e) => problems.push(format!("{}: {e}", redact(url))),
        }
    }
    let Some((mut conn, host, port)) = answering else {
        checks.push(Check::fail(
            "sentinels",
            format!(
                "no sentinel names a primary for {master:?}: {}",
                problems.join("; ")
            ),
            "check the sentinel URLs and the master name (`sentinel monitor <name> …` in sentinel.conf)",
        ));
        return SentinelView {
            checks,
            primary: None,
            replicas: Vec::new(),
        };
    };
    let primary = format!("{host}:{port}");
    let disagree: Vec<String> = named
        .iter()
        .filter(|(_, addr)| *addr != primary)
        .map(|(s, addr)| format!("{s} names {addr}"))
        .collect();
    checks.push(if !disagree.is_empty() {
        Check::fail(
            "sentinels",
            format!(
                "the sentinels disagree about {master:?}: {} names {primary}, {}",
                named[0].0,
                disagree.join(", ")
            ),
            "wait for the failover to settle; if it persists, the sentinels watch different sets (check `sentinel monitor` on each)",
        )
    } else if !problems.is_empty() {
        Check::warn(
            "sentinels",
            format!(
                "{} of {} sentinels name the primary {primary}; {}",
                named.len(),
                sentinels.len(),
                problems.join("; ")
            ),
            "give the backend only reachable sentinels of this master, or bring the others back",
        )
    } else {
        Check::pass(
            "sentinels",
            format!(
                "{} of {} sentinels name the primary {primary} for {master:?}",
                named.len(),
                sentinels.len()
            ),
        )
    });

    let quorum: RedisResult<String> = redis::cmd("SENTINEL")
        .arg("CKQUORUM")
        .arg(master)
        .query_async(&mut conn)
        .await;
    checks.push(match quorum {
        Ok(text) => Check::pass("sentinel-quorum", text),
        Err(e) => Check::fail(
            "sentinel-quorum",
            format!("SENTINEL CKQUORUM {master}: {e}"),
            "a failover needs the quorum and a majority of the sentinels: start more sentinels or lower the quorum",
        ),
    });

    let listed: RedisResult<Vec<HashMap<String, String>>> = redis::cmd("SENTINEL")
        .arg("REPLICAS")
        .arg(master)
        .query_async(&mut conn)
        .await;
    let mut replicas = Vec::new();
    checks.push(match listed {
        Ok(listed) => {
            let total = listed.len();
            for r in &listed {
                let flags = r.get("flags").map_or("", String::as_str);
                let down = flags
                    .split(',')
                    .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"));
                let linked = r.get("master-link-status").is_none_or(|s| s == "ok");
                if let (false, true, Some(ip), Some(p)) = (down, linked, r.get("ip"), r.get("port"))
                {
                    replicas.push(node_url(ip, p));
                }
            }
            let healthy = replicas.len();
            let detail = format!("{healthy} of {total} replicas of {master:?} are up and linked");
            match replica_ack {
                Some(n) if healthy < n as usize => Check::fail(
                    "sentinel-replicas",
                    format!("{detail}, but replica_ack({n}) needs {n}: every grant would be refused NOREPLICAS"),
                    format!("attach at least {n} healthy replicas, or lower replica_ack"),
                ),
                Some(n) => Check::pass(
                    "sentinel-replicas",
                    format!("{detail}; replica_ack({n}) can be met"),
                ),
                None if healthy == 0 => Check::warn(
                    "sentinel-replicas",
                    format!("{detail}: a failover has no replica to promote"),
                    "attach replicas to the primary",
                ),
                None => Check::pass(
                    "sentinel-replicas",
                    format!("{detail}; without replica_ack a failover can lose a lock granted just before it"),
                ),
            }
        }
        Err(e) => Check::fail(
            "sentinel-replicas",
            format!("SENTINEL REPLICAS {master}: {e}"),
            "use Redis 5 or newer sentinels (SENTINEL REPLICAS)",
        ),
    });
    SentinelView {
        checks,
        primary: Some(node_url(&host, &port)),
        replicas,
    }
}
