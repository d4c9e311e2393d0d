//! `lockflight doctor`: is this Redis configured so that lockflight's locks are
//! safe? Each check gives pass / warn / fail and the fix.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use redis::aio::MultiplexedConnection;
use redis::{RedisError, RedisResult};

use crate::report::{Check, Verdict, plural, print_checks};
use crate::{EXIT_FAILED, cluster_primaries, connect, progress, redact};

/// The rights the minimal ACL user needs (`lockflight::guide::operating`, `RedisBackend` docs), as
/// `(right, command line that exercises it)`; `K` is a probe key, `Z` a probe
/// sorted set, `C` a probe channel, all under the prefix.
const RIGHTS: &[(&str, &[&str])] = &[
    ("+set", &["SET", "K", "v", "PX", "10000"]),
    ("+get", &["GET", "K"]),
    ("+exists", &["EXISTS", "K"]),
    ("+pexpire", &["PEXPIRE", "K", "10000"]),
    ("+pttl", &["PTTL", "K"]),
    ("+zadd", &["ZADD", "Z", "1", "m"]),
    ("+zscore", &["ZSCORE", "Z", "m"]),
    ("+zcard", &["ZCARD", "Z"]),
    ("+zrange", &["ZRANGE", "Z", "0", "-1"]),
    ("+zrangebyscore", &["ZRANGEBYSCORE", "Z", "-inf", "+inf"]),
    ("+zcount", &["ZCOUNT", "Z", "-inf", "+inf"]),
    ("+zrem", &["ZREM", "Z", "m"]),
    (
        "+zremrangebyscore",
        &["ZREMRANGEBYSCORE", "Z", "-inf", "+inf"],
    ),
    ("+time", &["TIME"]),
    ("+publish", &["PUBLISH", "C", ""]),
    ("+del", &["DEL", "K", "Z"]),
];

/// The minimal ACL line for `prefix` (`lockflight::guide::operating`).
fn minimal_line(prefix: &str) -> String {
    format!(
        "ACL SETUSER <user> on >password ~{prefix}:* &{prefix}:inst:* +evalsha +script|load +publish +subscribe +time +get +set +del +exists +pexpire +pttl +zcard +zscore +zrange +zrangebyscore +zremrangebyscore +zcount +zadd +zrem"
    )
}

fn is_noperm(e: &RedisError) -> bool {
    e.code() == Some("NOPERM")
        || e.detail()
            .is_some_and(|d| d.contains("no permissions") || d.contains("NOPERM"))
        || e.to_string().contains("NOPERM")
}

/// `INFO <section>` as a map, or the error.
async fn info(
    conn: &mut MultiplexedConnection,
    section: &str,
) -> RedisResult<HashMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect())
}

/// The server engine and version of an `INFO server` map: Valkey says
/// `server_name:valkey` and its own `valkey_version` (its `redis_version` is the
/// Redis version it is compatible with, 7.2.4); Redis says only `redis_version`.
fn engine(server: &HashMap<String, String>) -> (&'static str, String) {
    let valkey = server.get("server_name").is_some_and(|n| n == "valkey")
        || server.contains_key("valkey_version");
    let field = if valkey {
        "valkey_version"
    } else {
        "redis_version"
    };
    let version = server.get(field).cloned().unwrap_or_default();
    (if valkey { "Valkey" } else { "Redis" }, version)
}

/// The `version` verdict: what lockflight's scripts need (`SET … GET`) is in
/// Redis from 6.2 and in every Valkey (7.2 and later).
fn judge_version(server: &HashMap<String, String>) -> Check {
    let (engine, version) = engine(server);
    let minimum = if engine == "Valkey" { (7, 2) } else { (6, 2) };
    let needed = format!("{engine} {}.{} or newer", minimum.0, minimum.1);
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) >= minimum {
        Check::pass(
            "version",
            format!("engine: {engine} {version} ({needed} needed: SET … GET)"),
        )
    } else {
        Check::fail(
            "version",
            format!("engine: {engine} {version}: lockflight's scripts need {needed} (SET … GET)"),
            format!("upgrade the server to {needed}"),
        )
    }
}

/// What `doctor` is pointed at.
pub(crate) enum Target<'a> {
    /// One server.
    Server(&'a str),
    /// Any node of a Cluster: every primary is checked.
    Cluster(&'a str),
    /// Sentinels and the master name: the sentinels are asked, then the primary
    /// they name is checked (with these credentials, if any).
    Sentinel(
        &'a [String],
        &'a str,
        Option<&'a crate::sentinel::PrimaryAuth>,
    ),
}

/// `lockflight doctor`.
pub(crate) async fn run(
    target: Target<'_>,
    prefix: &str,
    replica_ack: Option<u32>,
    strict: bool,
    json: bool,
) -> Result<u8, String> {
    let mut checks = Vec::new();
    let mut others = Vec::new();
    let (urls, shown, label_nodes) = match target {
        Target::Server(url) => (vec![url.to_owned()], redact(url), false),
        Target::Cluster(url) => (cluster_primaries(url).await?, redact(url), true),
        Target::Sentinel(sentinels, master, auth) => {
            let view = crate::sentinel::inspect(sentinels, master, auth, replica_ack).await;
            checks.extend(view.checks);
            others = view.replicas;
            let shown = format!(
                "sentinel master {master:?} via [{}]",
                sentinels
                    .iter()
                    .map(|s| redact(s))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            (view.primary.into_iter().collect(), shown, true)
        }
    };
    let mut offsets = Vec::new();
    for node in &urls {
        let (mut node_checks, offset) =
            check_server(node, prefix, replica_ack, !label_nodes, json).await?;
        if label_nodes {
            for c in &mut node_checks {
                c.detail = format!("{}: {}", redact(node), c.detail);
            }
        }
        checks.extend(node_checks);
        offsets.push((redact(node), offset));
    }
    // The replicas a failover may promote: their clocks must agree with the
    // primary's (fencing epochs are floored by the server's clock).
    for node in &others {
        if let Ok(mut conn) = connect(node).await {
            offsets.push((redact(node), clock_offset(&mut conn, 5).await.1));
        }
    }
    if !urls.is_empty() {
        checks.push(clock_check(&offsets));
    }
    let worst = print_checks("doctor", &shown, &checks, json);
    Ok(match worst {
        Verdict::Fail => EXIT_FAILED,
        Verdict::Warn | Verdict::Unknown if strict => EXIT_FAILED,
        _ => 0,
    })
}

/// `n` `TIME` calls: their round trips, sorted, and the server clock's offset
/// from this machine's (µs, corrected by half the round trip) at the last one
/// that answered; `None` when none answered (no `+time`).
async fn clock_offset(conn: &mut MultiplexedConnection, n: usize) -> (Vec<Duration>, Option<i64>) {
    let mut rtts = Vec::new();
    let mut offset = None;
    for _ in 0..n {
        let before = SystemTime::now();
        let sent = Instant::now();
        let time: RedisResult<(String, String)> = redis::cmd("TIME").query_async(conn).await;
        let rtt = sent.elapsed();
        rtts.push(rtt);
        if let Ok((s, us)) = time {
            let server = s.parse::<i64>().unwrap_or(0) * 1_000_000 + us.parse::<i64>().unwrap_or(0);
            let local = before
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_micros() as i64)
                .unwrap_or(0)
                + rtt.as_micros() as i64 / 2;
            offset = Some(server - local);
        }
    }
    rtts.sort();
    (rtts, offset)
}

/// Every check of one server; also the server clock's offset from this machine's
/// (µs, corrected by half the round trip).
async fn check_server(
    url: &str,
    prefix: &str,
    replica_ack: Option<u32>,
    single: bool,
    json: bool,
) -> Result<(Vec<Check>, Option<i64>), String> {
    let bar = progress(9, json);
    bar.set_message(format!("connecting to {}", redact(url)));
    // Connecting authenticates; no command is needed (the minimal user may lack PING).
    let mut conn = connect(url).await?;
    let mut checks = Vec::new();
    let tag: u64 = rand::random();
    let probe = format!("{prefix}:{{lockflight-doctor-{tag:x}}}");
    let channel = format!("{prefix}:inst:lockflight-doctor-{tag:x}");

    bar.set_message("version");
    checks.push(match info(&mut conn, "server").await {
        Ok(server) => judge_version(&server),
        Err(e) => Check::warn(
            "version",
            format!("cannot read INFO server: {e}"),
            "grant +info to read the version, or check it by hand (Redis 6.2 or newer, any Valkey)",
        ),
    });
    bar.inc(1);

    bar.set_message("scripts");
    const PUBLISH: &str = "return redis.call('PUBLISH', ARGV[1], ARGV[2])";
    let script = redis::Script::new(PUBLISH);
    let loaded: RedisResult<String> = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(PUBLISH)
        .query_async(&mut conn)
        .await;
    let ran: RedisResult<i64> = match &loaded {
        Ok(sha) => {
            redis::cmd("EVALSHA")
                .arg(sha)
                .arg(0)
                .arg(&channel)
                .arg("")
                .query_async(&mut conn)
                .await
        }
        Err(e) => Err(e.clone()),
    };
    checks.push(match (&loaded, &ran) {
        (Ok(_), Ok(_)) => Check::pass("scripts", "SCRIPT LOAD and EVALSHA work"),
        (Err(e), _) | (_, Err(e)) => Check::fail(
            "scripts",
            format!("scripts cannot run: {e}"),
            if is_noperm(e) {
                "grant +evalsha +script|load (and the channel pattern) to the user".to_owned()
            } else {
                "allow Lua scripts (some managed services restrict SCRIPT LOAD / EVALSHA)"
                    .to_owned()
            },
        ),
    });
    bar.inc(1);

    bar.set_message("ACL rights");
    let mut missing = Vec::new();
    if loaded.as_ref().is_err_and(is_noperm) {
        missing.push("+script|load".to_owned());
    }
    if ran.as_ref().is_err_and(is_noperm) && loaded.is_ok() {
        missing.push("+evalsha".to_owned());
    }
    let zset = format!("{probe}:z");
    for (right, args) in RIGHTS {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            match *arg {
                "K" => cmd.arg(&probe),
                "Z" => cmd.arg(&zset),
                "C" => cmd.arg(&channel),
                other => cmd.arg(other),
            };
        }
        if let Err(e) = cmd.query_async::<redis::Value>(&mut conn).await
            && is_noperm(&e)
        {
            let what = e.to_string();
            missing.push(if what.contains("key") {
                format!("~{prefix}:* (key pattern, seen on {right})")
            } else if what.contains("channel") {
                format!("&{prefix}:inst:* (channel pattern)")
            } else {
                (*right).to_owned()
            });
        }
    }
    if replica_ack.is_some()
        && let Err(e) = redis::cmd("WAIT")
            .arg(0)
            .arg(0)
            .query_async::<i64>(&mut conn)
            .await
        && is_noperm(&e)
    {
        missing.push("+wait (replica_ack)".to_owned());
    }
    bar.inc(1);

    bar.set_message("PUBLISH from a script");
    let (subscribed, delivered) = script_publish_reaches_subscriber(url, &script, &channel).await;
    if let Err(e) = &subscribed
        && is_noperm(e)
    {
        missing.push("+subscribe".to_owned());
    }
    missing.dedup();
    checks.push(if missing.is_empty() {
        Check::pass("acl", "the user has every right of the minimal ACL line")
    } else {
        Check::fail(
            "acl",
            format!("the user lacks: {}", missing.join(", ")),
            format!(
                "grant them, e.g. the whole minimal line: {}{}",
                minimal_line(prefix),
                if replica_ack.is_some() { " +wait" } else { "" }
            ),
        )
    });
    checks.push(match (subscribed, delivered) {
        (Ok(()), true) => Check::pass(
            "script-publish",
            "a PUBLISH from a script reaches a classic SUBSCRIBE (wake-ups work)",
        ),
        (Ok(()), false) => Check::fail(
            "script-publish",
            "a PUBLISH from a script did not reach a classic subscriber within 2 s (a managed engine may turn it into a sharded publish)",
            "use a server where script PUBLISH is classic pub/sub; without it waiters only wake on their timers",
        ),
        (Err(e), _) => Check::fail(
            "script-publish",
            format!("cannot SUBSCRIBE to {channel}: {e}"),
            format!("grant +subscribe and &{prefix}:inst:*"),
        ),
    });
    bar.inc(1);

    bar.set_message("eviction");
    checks.push(match info(&mut conn, "memory").await {
        Ok(memory) => {
            let policy = memory.get("maxmemory_policy").cloned().unwrap_or_default();
            let limit = memory.get("maxmemory").cloned().unwrap_or_default();
            if policy == "noeviction" {
                Check::pass(
                    "maxmemory-policy",
                    "noeviction: lock keys are never evicted (a full server refuses new locks, releases still work)",
                )
            } else {
                Check::fail(
                    "maxmemory-policy",
                    format!("{policy} (maxmemory {limit}): an evicting policy can drop lock keys, and two holders then hold one key"),
                    "CONFIG SET maxmemory-policy noeviction (or a Redis of its own for the locks)",
                )
            }
        }
        Err(e) => Check::unknown(
            "maxmemory-policy",
            format!("cannot read INFO memory: {e}"),
            "grant +info, or make sure maxmemory-policy is noeviction",
        ),
    });
    bar.inc(1);

    bar.set_message("persistence");
    let save: Option<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query_async::<Vec<String>>(&mut conn)
        .await
        .ok()
        .and_then(|v| v.get(1).cloned());
    checks.push(match info(&mut conn, "persistence").await {
        Ok(p) if p.get("aof_enabled").is_some_and(|v| v == "1") => {
            Check::pass("persistence", "AOF is on: a restart keeps the locks")
        }
        Ok(_) => match save.as_deref() {
            Some("") => Check::warn(
                "persistence",
                "no persistence: a restart frees every lock at once, so a key can have two holders within one TTL (fencing still rejects the older one)",
                "CONFIG SET appendonly yes (appendfsync everysec or always)",
            ),
            Some(save) => Check::warn(
                "persistence",
                format!("RDB snapshots only (save {save}): a crash loses the locks taken since the last snapshot"),
                "CONFIG SET appendonly yes",
            ),
            None => Check::warn(
                "persistence",
                "AOF is off (the RDB settings could not be read)",
                "CONFIG SET appendonly yes",
            ),
        },
        Err(e) => Check::unknown(
            "persistence",
            format!("cannot read INFO persistence: {e}"),
            "grant +info, or check persistence by hand",
        ),
    });
    bar.inc(1);

    bar.set_message("replicas");
    checks.push(replicas_check(&mut conn, replica_ack, single).await);
    bar.inc(1);

    bar.set_message("clock and latency");
    let (rtts, offset) = clock_offset(&mut conn, 20).await;
    let p50 = rtts[rtts.len() / 2];
    checks.push(latency_check(p50, rtts[rtts.len() - 1]));
    bar.inc(1);
    let _: RedisResult<()> = redis::cmd("DEL")
        .arg(&probe)
        .arg(&zset)
        .query_async(&mut conn)
        .await;
    bar.finish_and_clear();
    Ok((checks, offset))
}

/// Subscribes (classic) to `channel` on a connection of its own, runs `script`
/// (a `PUBLISH`) and waits at most 2 s for the message.
async fn script_publish_reaches_subscriber(
    url: &str,
    script: &redis::Script,
    channel: &str,
) -> (RedisResult<()>, bool) {
    let client = match crate::tls::client(url) {
        Ok(client) => client,
        Err(e) => return (Err(e), false),
    };
    let mut pubsub = match client.get_async_pubsub().await {
        Ok(p) => p,
        Err(e) => return (Err(e), false),
    };
    if let Err(e) = pubsub.subscribe(channel).await {
        return (Err(e), false);
    }
    let Ok(mut conn) = connect(url).await else {
        return (Ok(()), false);
    };
    let mut messages = pubsub.on_message();
    let published: RedisResult<i64> = script
        .arg(channel)
        .arg("lockflight-doctor")
        .invoke_async(&mut conn)
        .await;
    if published.is_err() {
        return (Ok(()), false);
    }
    let got = tokio::time::timeout(Duration::from_secs(2), messages.next()).await;
    (Ok(()), matches!(got, Ok(Some(_))))
}

async fn replicas_check(
    conn: &mut MultiplexedConnection,
    replica_ack: Option<u32>,
    single: bool,
) -> Check {
    let replication = match info(conn, "replication").await {
        Ok(r) => r,
        Err(e) => {
            return Check::warn(
                "replicas",
                format!("cannot read INFO replication: {e}"),
                "grant +info to check the role and replicas",
            );
        }
    };
    let role = replication.get("role").cloned().unwrap_or_default();
    if role != "master" {
        return Check::fail(
            "replicas",
            format!("this server is a {role}: lockflight must write to the primary"),
            "point lockflight at the primary (or use RedisBackend::sentinel)",
        );
    }
    let connected: u32 = replication
        .get("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    match replica_ack {
        Some(n) => {
            let acked: RedisResult<i64> =
                redis::cmd("WAIT").arg(n).arg(200).query_async(conn).await;
            match acked {
                Ok(acks) if acks >= i64::from(n) => Check::pass(
                    "replicas",
                    format!(
                        "{} connected; WAIT {n} got {}",
                        plural(connected, "replica", "replicas"),
                        plural(acks, "acknowledgement", "acknowledgements")
                    ),
                ),
                Ok(acks) => Check::fail(
                    "replicas",
                    format!(
                        "replica_ack({n}) asked, but {} connected and WAIT {n} 200 got {acks}: every grant would be refused NOREPLICAS",
                        plural(connected, "replica is", "replicas are")
                    ),
                    format!(
                        "attach at least {}, or lower replica_ack",
                        plural(n, "replica", "replicas")
                    ),
                ),
                Err(e) => Check::fail(
                    "replicas",
                    format!("WAIT failed: {e}"),
                    "grant +wait to the user (needed by replica_ack)",
                ),
            }
        }
        None if connected == 0 && single => Check::pass(
            "replicas",
            "no replicas (one server: a failover cannot lose locks; a crash without persistence can)",
        ),
        None => Check::pass(
            "replicas",
            format!(
                "{}; without replica_ack a failover can lose a lock granted just before it",
                plural(connected, "replica", "replicas")
            ),
        ),
    }
}

fn latency_check(p50: Duration, max: Duration) -> Check {
    let detail = format!("round trip p50 {p50:?}, max {max:?} over 20 TIME calls");
    if p50 > Duration::from_millis(20) {
        Check::warn(
            "latency",
            detail,
            "each lock + release is 2 round trips: keep the lock server close, or raise lease_ttl so renewals stay far from its end",
        )
    } else {
        Check::pass("latency", detail)
    }
}

/// The clock verdict from each server's offset against this machine (µs):
/// lockflight measures validity on each client's monotonic clock and mints epochs
/// from the server's, so what matters is that the servers agree with each other
/// (a failover to a node whose clock is behind can mint smaller epochs) and do not
/// step; a large offset from this machine only hints at an unsynchronized clock.
///
/// A server whose clock could not be read (`None`: `TIME` refused) makes the
/// verdict unknown: its clock may be anywhere.
pub(crate) fn clock_check(offsets: &[(String, Option<i64>)]) -> Check {
    let unread: Vec<&str> = offsets
        .iter()
        .filter(|(_, o)| o.is_none())
        .map(|(node, _)| node.as_str())
        .collect();
    if !unread.is_empty() || offsets.is_empty() {
        let which = if unread.is_empty() {
            "no server".to_owned()
        } else {
            unread.join(", ")
        };
        return Check::unknown(
            "clock",
            format!("the clock of {which} could not be read (TIME was refused or failed)"),
            "grant +time",
        );
    }
    let offsets: Vec<(String, i64)> = offsets
        .iter()
        .filter_map(|(node, o)| o.map(|o| (node.clone(), o)))
        .collect();
    let min = offsets.iter().map(|(_, o)| *o).min().unwrap_or(0);
    let max = offsets.iter().map(|(_, o)| *o).max().unwrap_or(0);
    let spread_ms = (max - min) / 1000;
    let worst_ms = offsets.iter().map(|(_, o)| o.abs()).max().unwrap_or(0) / 1000;
    let listing = offsets
        .iter()
        .map(|(node, o)| format!("{node} {:+} ms", o / 1000))
        .collect::<Vec<_>>()
        .join(", ");
    if spread_ms > 100 {
        Check::fail(
            "clock",
            format!(
                "server clocks disagree by {spread_ms} ms ({listing}): after a failover a node whose clock is behind can mint older fencing epochs"
            ),
            "synchronize the servers' clocks (NTP/chrony)",
        )
    } else if worst_ms > 1000 {
        Check::warn(
            "clock",
            format!("a server clock is {worst_ms} ms away from this machine's ({listing})"),
            "synchronize clocks with NTP; a server clock stepping back can mint older epochs once a fence key has expired",
        )
    } else {
        Check::pass("clock", format!("clock offsets within bounds ({listing})"))
    }
}

#[cfg(test)]
mod tests {
    use super::{clock_check, judge_version};
    use crate::report::Verdict;

    /// `INFO server` as Redis and as Valkey write it (only the fields read).
    fn info(fields: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        fields
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn names_the_engine_and_judges_it_by_its_own_version() {
        let redis = judge_version(&info(&[("redis_version", "7.0.15")]));
        assert_eq!(redis.verdict, Verdict::Pass);
        assert!(
            redis.detail.starts_with("engine: Redis 7.0.15 "),
            "{}",
            redis.detail
        );
        let old = judge_version(&info(&[("redis_version", "6.0.16")]));
        assert_eq!(old.verdict, Verdict::Fail);
        assert!(old.detail.contains("Redis 6.2 or newer"), "{}", old.detail);

        let valkey = judge_version(&info(&[
            ("redis_version", "7.2.4"),
            ("server_name", "valkey"),
            ("valkey_version", "9.1.2"),
        ]));
        assert_eq!(valkey.verdict, Verdict::Pass);
        assert_eq!(valkey.id, "version", "the id stays stable");
        assert!(
            valkey.detail.starts_with("engine: Valkey 9.1.2 "),
            "{}",
            valkey.detail
        );
        let early = judge_version(&info(&[
            ("redis_version", "7.2.4"),
            ("server_name", "valkey"),
            ("valkey_version", "7.2.5"),
        ]));
        assert_eq!(early.verdict, Verdict::Pass, "{}", early.detail);
    }

    /// Clock skew between machines cannot be produced on one machine: the verdict
    /// is tested with injected offsets.
    #[test]
    fn injected_clock_skews_get_their_verdicts() {
        let node = |o: i64| ("n".to_owned(), Some(o));
        assert_eq!(
            clock_check(&[node(2_000), node(-3_000)]).verdict,
            Verdict::Pass
        );
        assert_eq!(
            clock_check(&[node(0), node(250_000)]).verdict,
            Verdict::Fail
        );
        assert_eq!(clock_check(&[node(5_000_000)]).verdict, Verdict::Warn);
        assert_eq!(clock_check(&[]).verdict, Verdict::Unknown);
        // A clock that could not be read (no +time) is never a pass.
        assert_eq!(
            clock_check(&[node(0), ("m".to_owned(), None)]).verdict,
            Verdict::Unknown
        );
    }
}
