//! A locker configured from `LOCKFLIGHT_*` variables ([`Locker::from_env`],
//! [`Locker::from_vars`]): the topology, the key prefix, the timeouts, the lease
//! TTL and the hold limit, for services that configure everything from their
//! environment.

use std::collections::HashMap;
use std::time::Duration;

use super::Locker;
use crate::backend::{RedisBackend, RedisBackendBuilder};
use crate::error::{Error, Result};

/// One server: a `redis://` or `rediss://` URL.
const URL: &str = "LOCKFLIGHT_REDIS_URL";
/// A Redis Cluster: node URLs, separated by commas (feature `cluster`).
const CLUSTER: &str = "LOCKFLIGHT_REDIS_CLUSTER";
/// Sentinels: their URLs, separated by commas (feature `sentinel`), with the
/// primary's name in [`MASTER`].
const SENTINELS: &str = "LOCKFLIGHT_REDIS_SENTINELS";
const MASTER: &str = "LOCKFLIGHT_SENTINEL_MASTER";
/// The primary's credentials and database, for a Sentinel-managed primary
/// (`RedisBackendBuilder::primary_connection_info`).
const PRIMARY_USERNAME: &str = "LOCKFLIGHT_SENTINEL_PRIMARY_USERNAME";
const PRIMARY_PASSWORD: &str = "LOCKFLIGHT_SENTINEL_PRIMARY_PASSWORD";
const PRIMARY_DB: &str = "LOCKFLIGHT_SENTINEL_PRIMARY_DB";
const PREFIX: &str = "LOCKFLIGHT_PREFIX";
const RESPONSE_TIMEOUT: &str = "LOCKFLIGHT_RESPONSE_TIMEOUT";
const CONNECTION_TIMEOUT: &str = "LOCKFLIGHT_CONNECTION_TIMEOUT";
const LEASE_TTL: &str = "LOCKFLIGHT_LEASE_TTL";
const WAIT_TIMEOUT: &str = "LOCKFLIGHT_WAIT_TIMEOUT";
const HOLD_LIMIT: &str = "LOCKFLIGHT_HOLD_LIMIT";

/// Where the locks live, as the variables name it.
#[derive(Debug, PartialEq, Eq)]
enum Where {
    One(String),
    Cluster(Vec<String>),
    Sentinel(Vec<String>, String),
}

/// The credentials and database of a Sentinel-managed primary.
#[derive(PartialEq, Eq, Default)]
struct Primary {
    username: Option<String>,
    password: Option<String>,
    db: Option<i64>,
}

impl std::fmt::Debug for Primary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Primary")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

/// The settings the variables give.
#[derive(Debug, PartialEq, Eq)]
struct FromVars {
    at: Where,
    /// Set only with sentinels.
    primary: Option<Primary>,
    prefix: Option<String>,
    response_timeout: Option<Duration>,
    connection_timeout: Option<Duration>,
    lease_ttl: Option<Duration>,
    wait_timeout: Option<Duration>,
    hold_limit: Option<Duration>,
}

/// A duration written `<number><unit>`, the unit one of `ms`, `s`, `m`, `h`
/// (`250ms`, `30s`, `2m`).
fn duration(name: &str, value: &str) -> Result<Duration> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let bad = || {
        Error::config(format!(
            "{name}={value:?}: a duration is a whole number and a unit (ms, s, m, h), \
             e.g. 250ms or 30s"
        ))
    };
    let n: u64 = number.parse().map_err(|_| bad())?;
    let per = match unit.trim() {
        "ms" => Duration::from_millis(1),
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        _ => return Err(bad()),
    };
    per.checked_mul(u32::try_from(n).map_err(|_| bad())?)
        .ok_or_else(bad)
}

/// Comma-separated URLs, none empty.
fn urls(name: &str, value: &str) -> Result<Vec<String>> {
    let list: Vec<String> = value.split(',').map(|u| u.trim().to_owned()).collect();
    if list.iter().any(String::is_empty) {
        return Err(Error::config(format!(
            "{name}={value:?}: a comma-separated list of URLs, none empty"
        )));
    }
    Ok(list)
}

impl FromVars {
    /// Reads the `LOCKFLIGHT_*` variables among `vars` (others are ignored).
    fn parse(vars: HashMap<String, String>) -> Result<FromVars> {
        let get = |name: &str| vars.get(name).filter(|v| !v.trim().is_empty());
        let time = |name: &str| get(name).map(|v| duration(name, v)).transpose();
        let at = match (get(URL), get(CLUSTER), get(SENTINELS)) {
            (Some(url), None, None) => Where::One(url.trim().to_owned()),
            (None, Some(nodes), None) => Where::Cluster(urls(CLUSTER, nodes)?),
            (None, None, Some(sentinels)) => {
                let master = get(MASTER).ok_or_else(|| {
                    Error::config(format!(
                        "{SENTINELS} is set: {MASTER} must name the primary"
                    ))
                })?;
                Where::Sentinel(urls(SENTINELS, sentinels)?, master.trim().to_owned())
            }
            (None, None, None) => {
                return Err(Error::config(format!(
                    "no Redis to lock on: set {URL} (one server), {CLUSTER} (a cluster) or \
                     {SENTINELS} with {MASTER}"
                )));
            }
            _ => {
                return Err(Error::config(format!(
                    "more than one of {URL}, {CLUSTER} and {SENTINELS} is set; set one"
                )));
            }
        };
        let primary = Primary {
            username: get(PRIMARY_USERNAME).map(|v| v.trim().to_owned()),
            // Taken as it is: spaces may be part of a password.
            password: get(PRIMARY_PASSWORD).cloned(),
            db: get(PRIMARY_DB)
                .map(|v| {
                    v.trim()
                        .parse::<i64>()
                        .ok()
                        .filter(|db| *db >= 0)
                        .ok_or_else(|| {
                            Error::config(format!(
                                "{PRIMARY_DB}={v:?}: a database number (0, 1, …)"
                            ))
                        })
                })
                .transpose()?,
        };
        let primary = (primary != Primary::default()).then_some(primary);
        if let Some(p) = &primary {
            let set = [
                (PRIMARY_USERNAME, p.username.is_some()),
                (PRIMARY_PASSWORD, p.password.is_some()),
                (PRIMARY_DB, p.db.is_some()),
            ]
            .iter()
            .filter(|(_, set)| *set)
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ");
            if !matches!(at, Where::Sentinel(..)) {
                return Err(Error::config(format!(
                    "{set}: for a Sentinel-managed primary ({SENTINELS}); one server or a \
                     cluster takes its credentials in its URLs"
                )));
            }
            if p.username.is_some() && p.password.is_none() {
                return Err(Error::config(format!(
                    "{PRIMARY_USERNAME} is set: {PRIMARY_PASSWORD} must be set too"
                )));
            }
        }
        Ok(FromVars {
            at,
            primary,
            prefix: get(PREFIX).map(|p| p.trim().to_owned()),
            response_timeout: time(RESPONSE_TIMEOUT)?,
            connection_timeout: time(CONNECTION_TIMEOUT)?,
            lease_ttl: time(LEASE_TTL)?,
            wait_timeout: time(WAIT_TIMEOUT)?,
            hold_limit: time(HOLD_LIMIT)?,
        })
    }

    /// The backend's builder for these settings.
    fn backend(&self) -> Result<RedisBackendBuilder> {
        let mut builder = match &self.at {
            Where::One(url) => RedisBackend::builder(url.clone()),
            #[cfg(feature = "cluster")]
            Where::Cluster(nodes) => RedisBackend::cluster(nodes.clone()),
            #[cfg(feature = "sentinel")]
            Where::Sentinel(sentinels, master) => {
                let mut builder = RedisBackend::sentinel(sentinels.clone(), master.clone());
                if let Some(p) = &self.primary {
                    let mut info = redis::RedisConnectionInfo::default();
                    if let Some(username) = &p.username {
                        info = info.set_username(username);
                    }
                    if let Some(password) = &p.password {
                        info = info.set_password(password);
                    }
                    if let Some(db) = p.db {
                        info = info.set_db(db);
                    }
                    builder = builder.primary_connection_info(info);
                }
                builder
            }
            #[allow(unreachable_patterns)]
            other => {
                return Err(Error::config(format!(
                    "{other:?} needs lockflight's `{}` feature",
                    if matches!(other, Where::Cluster(_)) {
                        "cluster"
                    } else {
                        "sentinel"
                    }
                )));
            }
        };
        if let Some(prefix) = &self.prefix {
            builder = builder.prefix(prefix.clone());
        }
        if let Some(t) = self.response_timeout {
            builder = builder.response_timeout(t);
        }
        if let Some(t) = self.connection_timeout {
            builder = builder.connection_timeout(t);
        }
        Ok(builder)
    }
}

impl Locker {
    /// A locker configured from the process's environment: see
    /// [`from_vars`](Self::from_vars) for the variables.
    ///
    /// # Errors
    ///
    /// As [`from_vars`](Self::from_vars).
    ///
    /// # Cancel safety
    ///
    /// As [`from_vars`](Self::from_vars).
    pub async fn from_env() -> Result<Locker> {
        Self::from_vars(std::env::vars()).await
    }

    /// A locker configured from the `LOCKFLIGHT_*` variables among `vars` (other names
    /// are ignored; an empty value counts as unset), connected to its Redis:
    ///
    /// | variable | meaning |
    /// |---|---|
    /// | `LOCKFLIGHT_REDIS_URL` | one server (`redis://…`, `rediss://…`) |
    /// | `LOCKFLIGHT_REDIS_CLUSTER` | a Redis Cluster: node URLs, comma-separated (feature `cluster`) |
    /// | `LOCKFLIGHT_REDIS_SENTINELS`, `LOCKFLIGHT_SENTINEL_MASTER` | sentinel URLs, comma-separated (with the sentinels' own password in them, if any), and the primary's name (feature `sentinel`) |
    /// | `LOCKFLIGHT_SENTINEL_PRIMARY_USERNAME`, `LOCKFLIGHT_SENTINEL_PRIMARY_PASSWORD`, `LOCKFLIGHT_SENTINEL_PRIMARY_DB` | with sentinels only: the primary's username, password and database (`RedisBackendBuilder::primary_connection_info`, feature `sentinel`); a username needs a password |
    /// | `LOCKFLIGHT_PREFIX` | the key prefix (default `lockflight`) |
    /// | `LOCKFLIGHT_RESPONSE_TIMEOUT`, `LOCKFLIGHT_CONNECTION_TIMEOUT` | the backend's timeouts |
    /// | `LOCKFLIGHT_LEASE_TTL`, `LOCKFLIGHT_WAIT_TIMEOUT`, `LOCKFLIGHT_HOLD_LIMIT` | the locker's settings ([`LockerBuilder`](crate::LockerBuilder)) |
    ///
    /// Exactly one of the three topologies must be set. Durations are a whole number and
    /// a unit (`250ms`, `30s`, `2m`, `1h`); everything else takes its default.
    ///
    /// ```no_run
    /// # async fn run() -> lockflight::Result<()> {
    /// use lockflight::Locker;
    ///
    /// let locker = Locker::from_vars([
    ///     ("LOCKFLIGHT_REDIS_URL", "redis://127.0.0.1:6379"),
    ///     ("LOCKFLIGHT_PREFIX", "billing"),
    ///     ("LOCKFLIGHT_LEASE_TTL", "10s"),
    /// ])
    /// .await?;
    /// # let _ = locker;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the variable (no topology or more than one,
    /// sentinels without a primary's name, an empty URL in a list, a malformed duration,
    /// primary credentials without sentinels or a username without a password, a
    /// database that is not a number, a topology whose feature is off, a setting the
    /// builders refuse); those of [`RedisBackendBuilder::connect`]. Cancel safe: dropping
    /// the future drops the connection attempt; nothing is locked.
    pub async fn from_vars<I, K, V>(vars: I) -> Result<Locker>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let settings = FromVars::parse(
            vars.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )?;
        let backend = settings.backend()?.connect().await?;
        let mut builder = Locker::builder(backend);
        if let Some(ttl) = settings.lease_ttl {
            builder = builder.lease_ttl(ttl);
        }
        if let Some(wait) = settings.wait_timeout {
            builder = builder.wait_timeout(wait);
        }
        if let Some(limit) = settings.hold_limit {
            builder = builder.hold_limit(limit);
        }
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<FromVars> {
        FromVars::parse(
            vars.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn reads_every_setting() {
        let s = parse(&[
            (URL, "redis://127.0.0.1:6390/2"),
            (PREFIX, "billing"),
            (RESPONSE_TIMEOUT, "750ms"),
            (CONNECTION_TIMEOUT, "3s"),
            (LEASE_TTL, "2m"),
            (WAIT_TIMEOUT, "1h"),
            (HOLD_LIMIT, "90s"),
            ("PATH", "/usr/bin"),
        ])
        .unwrap();
        assert_eq!(s.at, Where::One("redis://127.0.0.1:6390/2".into()));
        assert_eq!(s.prefix.as_deref(), Some("billing"));
        assert_eq!(s.response_timeout, Some(Duration::from_millis(750)));
        assert_eq!(s.connection_timeout, Some(Duration::from_secs(3)));
        assert_eq!(s.lease_ttl, Some(Duration::from_secs(120)));
        assert_eq!(s.wait_timeout, Some(Duration::from_secs(3600)));
        assert_eq!(s.hold_limit, Some(Duration::from_secs(90)));
    }

    #[test]
    fn reads_each_topology() {
        let c = parse(&[(CLUSTER, "redis://a:1, redis://b:2")]).unwrap();
        assert_eq!(
            c.at,
            Where::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        let s = parse(&[(SENTINELS, "redis://s:26379"), (MASTER, "main")]).unwrap();
        assert_eq!(
            s.at,
            Where::Sentinel(vec!["redis://s:26379".into()], "main".into())
        );
        assert_eq!(s.primary, None);
        // Empty values count as unset.
        let one = parse(&[(URL, "redis://x"), (CLUSTER, " "), (PREFIX, "")]).unwrap();
        assert_eq!(one.at, Where::One("redis://x".into()));
        assert_eq!(one.prefix, None);
    }

    #[test]
    fn bad_input_is_a_clear_error_naming_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[], URL),
            (
                &[(URL, "redis://a"), (CLUSTER, "redis://b")],
                "more than one",
            ),
            (&[(SENTINELS, "redis://s")], MASTER),
            (&[(CLUSTER, "redis://a,,redis://b")], CLUSTER),
            (&[(URL, "redis://a"), (LEASE_TTL, "30")], LEASE_TTL),
            (&[(URL, "redis://a"), (WAIT_TIMEOUT, "5 sec")], WAIT_TIMEOUT),
            (&[(URL, "redis://a"), (HOLD_LIMIT, "-1s")], HOLD_LIMIT),
            (
                &[(URL, "redis://a"), (RESPONSE_TIMEOUT, "99999999999ms")],
                RESPONSE_TIMEOUT,
            ),
            (
                &[(URL, "redis://a"), (PRIMARY_PASSWORD, "pw")],
                PRIMARY_PASSWORD,
            ),
            (
                &[(CLUSTER, "redis://a"), (PRIMARY_USERNAME, "u")],
                PRIMARY_USERNAME,
            ),
            (
                &[
                    (SENTINELS, "redis://s"),
                    (MASTER, "m"),
                    (PRIMARY_USERNAME, "u"),
                ],
                PRIMARY_PASSWORD,
            ),
            (
                &[
                    (SENTINELS, "redis://s"),
                    (MASTER, "m"),
                    (PRIMARY_PASSWORD, "pw"),
                    (PRIMARY_DB, "two"),
                ],
                PRIMARY_DB,
            ),
        ];
        for (vars, named) in cases {
            let e = parse(vars).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig { .. }), "{vars:?}: {e:?}");
            assert!(e.to_string().contains(named), "{vars:?}: {e}");
            // A password is never echoed.
            assert!(!format!("{e} {e:?}").contains("pw"), "{vars:?}: {e:?}");
        }
    }

    #[test]
    fn reads_the_sentinel_primarys_credentials_and_hides_the_password() {
        let s = parse(&[
            (SENTINELS, "redis://:sentinel-pw@s:26379"),
            (MASTER, "main"),
            (PRIMARY_USERNAME, " locks "),
            (PRIMARY_PASSWORD, "pri mary-pw"),
            (PRIMARY_DB, "3"),
        ])
        .unwrap();
        assert_eq!(
            s.primary,
            Some(Primary {
                username: Some("locks".into()),
                password: Some("pri mary-pw".into()),
                db: Some(3),
            })
        );
        let shown = format!("{s:?}");
        assert!(!shown.contains("mary-pw"), "{shown}");
        assert!(shown.contains("locks"), "{shown}");
        // The builder gets them, and its Debug hides the password too.
        #[cfg(feature = "sentinel")]
        {
            let b = format!("{:?}", s.backend().unwrap());
            assert!(b.contains("locks") && b.contains("db: 3"), "{b}");
            assert!(!b.contains("mary-pw") && !b.contains("sentinel-pw"), "{b}");
        }
        // A password alone (requirepass) is enough.
        let p = parse(&[
            (SENTINELS, "redis://s:26379"),
            (MASTER, "main"),
            (PRIMARY_PASSWORD, "pw"),
        ])
        .unwrap();
        assert_eq!(
            p.primary,
            Some(Primary {
                password: Some("pw".into()),
                ..Primary::default()
            })
        );
    }
}
