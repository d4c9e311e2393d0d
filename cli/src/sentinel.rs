//! `lockflight doctor --sentinel`: what the sentinels say about the master (its
//! address, the quorum, the replicas), before the per-server checks run on the
//! primary they name.
//!
//! The data nodes are reached with the credentials `--primary-user` and
//! `LOCKFLIGHT_SENTINEL_PRIMARY_PASSWORD` give (the sentinels name only their
//! address), the sentinels with those of their URLs.

use std::collections::HashMap;

use redis::RedisResult;

use crate::report::{Check, plural};
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

/// The username (none: `default`) and password of the data nodes, as
/// `RedisBackendBuilder::primary_connection_info` would give them.
pub(crate) struct PrimaryAuth {
    username: Option<String>,
    password: String,
}

/// The variables `Locker::from_env` reads for the same settings.
const USERNAME_VAR: &str = "LOCKFLIGHT_SENTINEL_PRIMARY_USERNAME";
const PASSWORD_VAR: &str = "LOCKFLIGHT_SENTINEL_PRIMARY_PASSWORD";

/// The data nodes' credentials: the username from `--primary-user` or the
/// environment, the password from the environment only (a command line is
/// visible to other users).
pub(crate) fn primary_auth(user: Option<String>) -> Result<Option<PrimaryAuth>, String> {
    let var = |name| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let username = user.or_else(|| var(USERNAME_VAR).map(|u| u.trim().to_owned()));
    match (username, var(PASSWORD_VAR)) {
        (username, Some(password)) => Ok(Some(PrimaryAuth { username, password })),
        (Some(_), None) => Err(format!(
            "a primary username needs its password in {PASSWORD_VAR}"
        )),
        (None, None) => Ok(None),
    }
}

/// Percent-encodes the userinfo of a URL (everything but unreserved characters).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The URL of a data node as `RedisBackend::sentinel` reaches it: the sentinels
/// give `host:port` only; the credentials are the ones given for the primary
/// (shown redacted in reports).
fn node_url(host: &str, port: &str, auth: Option<&PrimaryAuth>) -> String {
    match auth {
        Some(a) => format!(
            "redis://{}:{}@{host}:{port}/",
            encode(a.username.as_deref().unwrap_or("")),
            encode(&a.password)
        ),
        None => format!("redis://{host}:{port}/"),
    }
}

/// Asks each sentinel of `sentinels` about `master`: `SENTINEL
/// GET-MASTER-ADDR-BY-NAME` on every one, then `SENTINEL CKQUORUM` and
/// `SENTINEL REPLICAS` on the first that names the primary.
pub(crate) async fn inspect(
    sentinels: &[String],
    master: &str,
    auth: Option<&PrimaryAuth>,
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
                "{} of {} name the primary {primary}; {}",
                named.len(),
                plural(sentinels.len(), "sentinel", "sentinels"),
                problems.join("; ")
            ),
            "give the backend only reachable sentinels of this master, or bring the others back",
        )
    } else {
        Check::pass(
            "sentinels",
            format!(
                "{} of {} name the primary {primary} for {master:?}",
                named.len(),
                plural(sentinels.len(), "sentinel", "sentinels")
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
                    replicas.push(node_url(ip, p, auth));
                }
            }
            let healthy = replicas.len();
            let detail = format!(
                "{healthy} of {} of {master:?} up and linked",
                plural(total, "replica", "replicas")
            );
            match replica_ack {
                Some(n) if healthy < n as usize => Check::fail(
                    "sentinel-replicas",
                    format!("{detail}, but replica_ack({n}) needs {n}: every grant would be refused NOREPLICAS"),
                    format!(
                        "attach at least {}, or lower replica_ack",
                        plural(n, "healthy replica", "healthy replicas")
                    ),
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
        primary: Some(node_url(&host, &port, auth)),
        replicas,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_urls_carry_encoded_credentials_that_reports_hide() {
        assert_eq!(node_url("h", "1", None), "redis://h:1/");
        let auth = PrimaryAuth {
            username: Some("locks".into()),
            password: "p@ss:w/rd".into(),
        };
        let url = node_url("h", "1", Some(&auth));
        assert_eq!(url, "redis://locks:p%40ss%3Aw%2Frd@h:1/");
        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str()).unwrap();
        assert_eq!(info.redis_settings().password(), Some("p@ss:w/rd"));
        assert_eq!(info.redis_settings().username(), Some("locks"));
        assert!(
            !crate::redact(&url).contains("p%40ss"),
            "{}",
            crate::redact(&url)
        );
        let default_user = PrimaryAuth {
            username: None,
            password: "pw".into(),
        };
        assert_eq!(node_url("h", "1", Some(&default_user)), "redis://:pw@h:1/");
    }
}
