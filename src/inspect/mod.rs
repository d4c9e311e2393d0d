//! Operating lockflight's Redis keys: read-only queries (who holds a key, since
//! when, who waits, which read leases and permits are out), listing held keys, and
//! an operator's forced release that advances the key's fences. What the
//! `lockflight` command line tool runs.
//!
//! An [`Inspector`] knows the key prefix and runs on any `redis` async
//! connection to the server (or, for one key, a cluster connection: every name of
//! a key shares one slot). Listing uses `SCAN` on one server: on a Cluster, list
//! each primary on a connection of its own (what `lockflight list --cluster`
//! does); no key is listed by two primaries.
//!
//! ```no_run
//! # async fn demo() -> lockflight::Result<()> {
//! use lockflight::inspect::Inspector;
//!
//! let mut conn = redis::Client::open("redis://127.0.0.1:6379")
//!     .expect("a valid URL")
//!     .get_multiplexed_async_connection()
//!     .await
//!     .expect("Redis is up");
//! let inspector = Inspector::new("lockflight");
//! let state = inspector.key(&mut conn, "sku:555").await?;
//! if let Some(holder) = &state.holder {
//!     println!("held for {:?} more, fence epoch {:?}", holder.ttl, state.fence_epoch);
//! }
//! println!("{} instances wait", state.queue.len());
//! # Ok(()) }
//! ```
//!
//! A lease is stored as its token, whose first 16 hex digits are the id of the
//! instance that took it ([`LeaseState::instance`]; what
//! `RedisBackend::instance_id` returns in that process); waiting instances are
//! stored by id. [`Inspector::instance`] reads who an id is (host, process id,
//! name) from the card each instance keeps while it runs.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use crate::election::LeaderInfo;
use crate::error::{Error, Phase, Result};
use crate::fence::FencedKey;
use crate::guard::FencingToken;
use crate::key::LockKey;

static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/inspect.lua")));
static FORCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/force_release.lua")));

/// How many members of each sorted set [`Inspector::key`] reads at most.
pub const MEMBERS_SHOWN: usize = 100;

/// Reads and operates on lockflight's Redis names under one prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspector {
    prefix: String,
}

/// A lease of a key: its token and how long it lives (from the server's TTL or
/// sorted-set expiry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseState {
    /// The lease's token (hex).
    pub token: String,
    /// Time left before the server drops it (`None`: no expiry, not lockflight's).
    pub ttl: Option<Duration>,
}

impl LeaseState {
    /// The id of the instance that holds the lease: the token's first 16 hex
    /// digits (the Redis backend mints its tokens so,
    /// [`LeaseToken::for_instance`](crate::backend::LeaseToken::for_instance)).
    /// `None` for a token that is not 32 hex digits. (A token minted by an
    /// earlier lockflight, fully random, names no real instance.)
    ///
    /// ```
    /// use lockflight::inspect::LeaseState;
    ///
    /// let lease = LeaseState {
    ///     token: "00000000c0ffee00a1b2c3d4e5f60718".into(),
    ///     ttl: None,
    /// };
    /// assert_eq!(lease.instance(), Some("00000000c0ffee00"));
    /// ```
    pub fn instance(&self) -> Option<&str> {
        let t = self.token.as_str();
        (t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit())).then(|| &t[..16])
    }
}

/// A waiting instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaiterState {
    /// The instance id (what `RedisBackend::instance_id` returns in that process).
    pub instance: String,
    /// How long it has waited (by the server's clock), if its arrival is recorded.
    pub waited: Option<Duration>,
    /// Time left before its entry expires (it renews the entry while it waits).
    pub expires_in: Option<Duration>,
}

/// Everything lockflight stores for one key, at one instant of the server clock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The key.
    pub key: LockKey,
    /// The server's clock at the snapshot (ms since the Unix epoch).
    pub server_time_ms: u64,
    /// The mutex's holder.
    pub holder: Option<LeaseState>,
    /// The mutex's last fencing epoch (kept a while after the last use).
    pub fence_epoch: Option<u64>,
    /// Instances waiting for the mutex, in arrival order.
    pub queue: Vec<WaiterState>,
    /// The instance woken to take the free mutex, and how long its claim lasts.
    pub claim: Option<(String, Duration)>,
    /// Read leases of the read-write lock.
    pub readers: Vec<LeaseState>,
    /// The write lease of the read-write lock.
    pub writer: Option<LeaseState>,
    /// Writers waiting (their tokens), which stop new read leases.
    pub waiting_writers: Vec<LeaseState>,
    /// The read-write lock's last write epoch.
    pub write_epoch: Option<u64>,
    /// Instances to wake when the read-write lock frees up.
    pub rw_waiting: Vec<WaiterState>,
    /// The semaphore's permits out.
    pub permits: Vec<LeaseState>,
    /// The semaphore's number of permits, fixed while it is in use.
    pub permit_count: Option<u32>,
    /// Instances waiting for permits, in arrival order.
    pub permit_queue: Vec<WaiterState>,
    /// The full sizes of the sorted sets, of which at most [`MEMBERS_SHOWN`]
    /// members are listed: queue, read leases, waiting writers, rw waiting,
    /// permits, permit queue.
    pub sizes: [usize; 6],
    /// Who leads the election of this key, as its leader record says
    /// ([`Election`](crate::election::Election)); `None` when nobody does or the
    /// key is no election's.
    pub leader: Option<LeaderInfo>,
}

impl KeyState {
    /// Whether anything holds the key: the mutex, the write lease, a read lease or
    /// a permit.
    pub fn is_held(&self) -> bool {
        self.holder.is_some()
            || self.writer.is_some()
            || !self.readers.is_empty()
            || !self.permits.is_empty()
    }

    /// How long the mutex's holder has held the key, by the server's clock: since
    /// its fencing epoch was minted, at the grant of its lease (or at an acquire of
    /// its own token that re-armed it). The lease may have passed between tasks of
    /// the holder's instance meanwhile. `None` when free, without an epoch, or
    /// when the epoch is ahead of the clock (the server's clock stepped back).
    pub fn held_for(&self) -> Option<Duration> {
        self.holder.as_ref()?;
        since(self.fence_epoch?, self.server_time_ms)
    }

    /// As [`held_for`](Self::held_for), for the read-write lock's write lease.
    pub fn write_held_for(&self) -> Option<Duration> {
        self.writer.as_ref()?;
        since(self.write_epoch?, self.server_time_ms)
    }

    /// The ids of the instances named in the snapshot (holders, waiters, the
    /// claim), each once, in order of first appearance.
    pub fn instances(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = Vec::new();
        let leases = self
            .holder
            .iter()
            .chain(&self.writer)
            .chain(&self.readers)
            .chain(&self.waiting_writers)
            .chain(&self.permits)
            .filter_map(LeaseState::instance);
        let waiters = self
            .queue
            .iter()
            .chain(&self.rw_waiting)
            .chain(&self.permit_queue)
            .map(|w| w.instance.as_str());
        let claim = self.claim.iter().map(|(id, _)| id.as_str());
        for id in leases.chain(waiters).chain(claim) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// Free permits of the semaphore, if one is in use.
    pub fn free_permits(&self) -> Option<u32> {
        let held = u32::try_from(self.sizes[4]).unwrap_or(u32::MAX);
        self.permit_count.map(|n| n.saturating_sub(held))
    }
}

/// Time from an epoch (µs) to the server clock (ms); `None` if the epoch is ahead
/// of it (beyond the millisecond the clock was read in).
fn since(epoch_us: u64, now_ms: u64) -> Option<Duration> {
    let now_us = now_ms.checked_mul(1000)?;
    (epoch_us < now_us + 1000).then(|| Duration::from_micros(now_us.saturating_sub(epoch_us)))
}

/// Who an instance is, from the card it keeps at `<prefix>:inst:<id>` while it
/// runs (rewritten every minute, expiring 3 minutes after its process stopped).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceCard {
    /// The instance id.
    pub id: String,
    /// The name its service gave it (`RedisBackendBuilder::instance_name`).
    pub name: Option<String>,
    /// Its host name.
    pub host: Option<String>,
    /// Its process id.
    pub pid: Option<u32>,
    /// When it connected, by its own clock (ms since the Unix epoch).
    pub started_ms: Option<u64>,
    /// The lockflight version it runs.
    pub version: Option<String>,
}

impl InstanceCard {
    /// Reads a card's text: `field=value` lines; unknown fields and malformed lines
    /// are skipped.
    fn parse(id: &str, text: &str) -> InstanceCard {
        let mut card = InstanceCard {
            id: id.to_owned(),
            ..InstanceCard::default()
        };
        for (field, value) in text.lines().filter_map(|l| l.split_once('=')) {
            match field {
                "name" => card.name = Some(value.to_owned()),
                "host" => card.host = Some(value.to_owned()),
                "pid" => card.pid = value.parse().ok(),
                "started_ms" => card.started_ms = value.parse().ok(),
                "lockflight" => card.version = Some(value.to_owned()),
                _ => {}
            }
        }
        card
    }
}

impl std::fmt::Display for InstanceCard {
    /// `name (host, pid N)`, with the parts the card has.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(host) = &self.host {
            parts.push(host.clone());
        }
        if let Some(pid) = self.pid {
            parts.push(format!("pid {pid}"));
        }
        match (&self.name, parts.is_empty()) {
            (Some(name), true) => write!(f, "{name}"),
            (Some(name), false) => write!(f, "{name} ({})", parts.join(", ")),
            (None, false) => write!(f, "{}", parts.join(", ")),
            (None, true) => write!(f, "instance {}", self.id),
        }
    }
}

/// What [`Inspector::force_release`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForcedRelease {
    /// The mutex holder's token, if it was held.
    pub holder: Option<String>,
    /// The write lease's token, if one was out.
    pub writer: Option<String>,
    /// How many read leases were dropped.
    pub readers: usize,
    /// The mutex fence's new epoch: every later mutex token of the key is greater.
    /// `FencingToken { epoch, seq: 0 }` is newer than every earlier token.
    pub fence: FencingToken,
    /// The write fence's new epoch (the same, for write leases).
    pub write_fence: FencingToken,
    /// How many waiting instances were woken.
    pub woken: usize,
    /// How many of the semaphore's permits were dropped (a permit has no fencing
    /// token: its holder is kept out by its loss).
    pub permits: usize,
    /// How many loss messages were published: one per dropped lease (holder,
    /// write lease, read lease, permit) whose token names an instance, on that
    /// instance's channel. The instance marks that lease lost when the message
    /// arrives; a refused `PUBLISH` is not counted.
    pub told: usize,
    /// How many subscribers received the loss messages, as `PUBLISH` counts them
    /// on the server that ran the release (on a Cluster, only the subscribers
    /// connected to that node; an instance also subscribed there counts). Zero
    /// with `told` above zero: no holder's instance was listening there; its
    /// holders learn of the loss at their next renewal.
    pub receivers: usize,
}

/// The Redis names of a key; the same as the backend's (`backend/redis`).
struct Names {
    base: Vec<u8>,
}

impl Names {
    fn new(prefix: &str, key: &LockKey) -> Names {
        let mut base = Vec::with_capacity(prefix.len() + key.len() + 4);
        base.extend_from_slice(prefix.as_bytes());
        base.extend_from_slice(b":{");
        for &b in key.as_bytes() {
            match b {
                b'%' => base.extend_from_slice(b"%25"),
                b'{' => base.extend_from_slice(b"%7B"),
                b'}' => base.extend_from_slice(b"%7D"),
                _ => base.push(b),
            }
        }
        base.push(b'}');
        Names { base }
    }

    fn with(&self, suffix: &str) -> Vec<u8> {
        [&self.base[..], suffix.as_bytes()].concat()
    }
}

/// The key a lock name `<prefix>:{<escaped key>}` belongs to, and the suffix
/// after it (`""` for the mutex, `":wr"`, …); `None` if it is not one.
fn parse_name<'a>(prefix: &str, name: &'a [u8]) -> Option<(LockKey, &'a [u8])> {
    let rest = name.strip_prefix(prefix.as_bytes())?.strip_prefix(b":{")?;
    let close = rest.iter().position(|&b| b == b'}')?;
    let (escaped, suffix) = (&rest[..close], &rest[close + 1..]);
    let mut key = Vec::with_capacity(escaped.len());
    let mut i = 0;
    while i < escaped.len() {
        match &escaped[i..] {
            [b'%', b'2', b'5', ..] => (key.push(b'%'), i += 3).1,
            [b'%', b'7', b'B', ..] => (key.push(b'{'), i += 3).1,
            [b'%', b'7', b'D', ..] => (key.push(b'}'), i += 3).1,
            [b, ..] => (key.push(*b), i += 1).1,
            [] => break,
        }
    }
    Some((LockKey::from(key), suffix))
}

/// A key found by [`Inspector::list`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedKey {
    /// The key.
    pub key: LockKey,
    /// What holds it: `"mutex"`, `"write"`, `"read"`, `"semaphore"`.
    pub kinds: Vec<&'static str>,
}

/// What [`Inspector::list`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    /// Held keys, sorted.
    pub keys: Vec<ListedKey>,
    /// Whether the scan stopped at its bound before the end (more may exist).
    pub truncated: bool,
}

impl Inspector {
    /// An inspector of the names under `prefix` (the backend's; default
    /// `lockflight`).
    pub fn new(prefix: impl Into<String>) -> Inspector {
        Inspector {
            prefix: prefix.into(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis name of the mutex of `key` (every other name of the key extends it).
    ///
    /// ```
    /// use lockflight::inspect::Inspector;
    ///
    /// assert_eq!(Inspector::new("app").lock_name(&"a{b}".into()), b"app:{a%7Bb%7D}");
    /// ```
    pub fn lock_name(&self, key: &LockKey) -> Vec<u8> {
        Names::new(&self.prefix, key).base
    }

    /// A snapshot of everything lockflight stores for `key`, read by one script
    /// (one instant of the server clock; nothing is written).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for a bad key; [`Error::ForeignValue`] when one of the
    /// key's names holds a value of another type; [`Error::NoPermission`],
    /// [`Error::Refused`], or [`Error::Backend`] for a failed connection.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn key<C>(&self, conn: &mut C, key: impl Into<LockKey>) -> Result<KeyState>
    where
        C: ConnectionLike + Send,
    {
        let key = key.into();
        key.validate()?;
        let n = Names::new(&self.prefix, &key);
        let mut invocation = INSPECT.prepare_invoke();
        for suffix in [
            "", ":fence", ":wq", ":wqx", ":claim", ":rd", ":wr", ":ww", ":wf", ":rwq", ":sem",
            ":semn", ":semq", ":semqx", ":leader",
        ] {
            invocation.key(n.with(suffix));
        }
        invocation.arg(MEMBERS_SHOWN);
        let reply: Vec<Value> = invocation
            .invoke_async(conn)
            .await
            .map_err(|e| crate::fence::redis_error(&key, Phase::Inspecting, e))?;
        decode_state(key, &reply)
    }

    /// The card of the instance `id` (16 hex digits, as [`LeaseState::instance`]
    /// and [`WaiterState::instance`] give it): who it is. `None` when it has no
    /// card: its process stopped more than 3 minutes ago, or it runs a lockflight
    /// without cards.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `id` is not 16 hex digits; otherwise as
    /// [`Inspector::key`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn instance<C>(&self, conn: &mut C, id: &str) -> Result<Option<InstanceCard>>
    where
        C: ConnectionLike + Send,
    {
        if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::config(format!(
                "instance id {id:?} is not 16 hex digits"
            )));
        }
        let name = format!("{}:inst:{id}", self.prefix);
        let text: Option<String> = redis::cmd("GET")
            .arg(&name)
            .query_async(conn)
            .await
            .map_err(|e| {
                crate::fence::redis_error(&LockKey::from(name.clone()), Phase::Inspecting, e)
            })?;
        Ok(text.map(|t| InstanceCard::parse(id, &t)))
    }

    /// The held keys under the prefix whose key starts with `key_prefix` (all
    /// with `""`): `SCAN MATCH` on one server, at most `max_keys` keys and
    /// `max_keys / 10 + 100` `SCAN` calls, so it is bounded on any database. On a
    /// Redis Cluster, run it on a plain connection to each primary: every name of
    /// a key lives in the key's slot, so each key is on exactly one of them.
    ///
    /// # Errors
    ///
    /// [`Error::NoPermission`] without `+scan`; otherwise as [`Inspector::key`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn list<C>(&self, conn: &mut C, key_prefix: &str, max_keys: usize) -> Result<Listing>
    where
        C: ConnectionLike + Send,
    {
        let probe = LockKey::from(format!("{key_prefix}*"));
        let mut pattern = Names::new(&self.prefix, &LockKey::from(key_prefix)).base;
        pattern.pop(); // the closing brace: any key that starts with key_prefix
        for b in [b'*', b'}', b'*'] {
            pattern.push(b);
        }
        let glob_escaped: Vec<u8> = pattern
            .iter()
            .enumerate()
            .flat_map(|(i, &b)| {
                let special =
                    matches!(b, b'?' | b'[' | b']' | b'\\') || (b == b'*' && i + 3 < pattern.len());
                if special { vec![b'\\', b] } else { vec![b] }
            })
            .collect();
        let mut found: std::collections::BTreeMap<LockKey, Vec<&'static str>> = Default::default();
        let mut cursor: u64 = 0;
        let mut truncated = false;
        let calls = max_keys / 10 + 100;
        for call in 0.. {
            if call >= calls || found.len() >= max_keys {
                truncated = cursor != 0 || call >= calls;
                break;
            }
            let (next, names): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&glob_escaped[..])
                .arg("COUNT")
                .arg(1000)
                .query_async(conn)
                .await
                .map_err(|e| crate::fence::redis_error(&probe, Phase::Inspecting, e))?;
            for name in names {
                let Some((key, suffix)) = parse_name(&self.prefix, &name) else {
                    continue;
                };
                let kind = match suffix {
                    b"" => "mutex",
                    b":wr" => "write",
                    b":rd" => "read",
                    b":sem" => "semaphore",
                    _ => continue,
                };
                if found.len() < max_keys || found.contains_key(&key) {
                    let kinds = found.entry(key).or_default();
                    if !kinds.contains(&kind) {
                        kinds.push(kind);
                    }
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        Ok(Listing {
            keys: found
                .into_iter()
                .map(|(key, kinds)| ListedKey { key, kinds })
                .collect(),
            truncated,
        })
    }

    /// Frees `key` whatever holds it (the mutex holder, the write lease, every read
    /// lease, every permit of its semaphore), advances both of its fences to
    /// `max(last + 1, server time in µs)`, tells each freed lease's instance that the
    /// lease is lost, then wakes the key's waiting instances of every kind. With
    /// `fence_resources`, also records the new token in each [`FencedKey`]'s fence on the
    /// same connection, so an old holder's late writes to them are refused from then on.
    ///
    /// Tokens of the key stay strictly increasing. A freed lease is marked lost when the
    /// message reaches its instance (or, unsubscribed, at its next renewal): no new local
    /// section starts on it, its releases report [`Error::LeaseLost`]. Until then the old
    /// holder overlaps the next, refused only by resources that have seen a newer token
    /// (a permit has none: only `fence_resources` fences it). On a Redis Cluster, pass a
    /// cluster connection (ARCHITECTURE.md, "Fenced writes and the forced release").
    ///
    /// # Errors
    ///
    /// As [`Inspector::key`]; a fenced resource that refuses the token (it had a
    /// newer one) is not an error.
    ///
    /// # Cancel safety
    ///
    /// The release is one script: dropping the future leaves it done or not done;
    /// the resources' fences are advanced one by one after it.
    pub async fn force_release<C>(
        &self,
        conn: &mut C,
        key: impl Into<LockKey>,
        fence_resources: &[FencedKey],
    ) -> Result<ForcedRelease>
    where
        C: ConnectionLike + Send,
    {
        let key = key.into();
        key.validate()?;
        let n = Names::new(&self.prefix, &key);
        let mut invocation = FORCE.prepare_invoke();
        for suffix in [
            "", ":fence", ":claim", ":wr", ":wf", ":rd", ":wq", ":rwq", ":sem", ":semn", ":semq",
        ] {
            invocation.key(n.with(suffix));
        }
        // The wake-up messages of the mutex, the read-write lock and the semaphore
        // (`backend/redis/notify.rs`: a tag byte, then the key); the script builds
        // the loss messages from the mutex's.
        let message = |tag: u8| [&[tag][..], key.as_bytes()].concat();
        invocation
            .arg(format!("{}:inst:", self.prefix))
            .arg(message(0xFD))
            .arg(message(0xFE))
            .arg(60_000)
            .arg(message(0xFF));
        let reply: Vec<Value> = invocation
            .invoke_async(conn)
            .await
            .map_err(|e| crate::fence::redis_error(&key, Phase::Inspecting, e))?;
        let bad = || {
            Error::backend(
                &key,
                Phase::Inspecting,
                format!("unexpected reply from the force-release script: {reply:?}"),
            )
        };
        let epoch = |v: Option<&Value>| {
            text(v?)?
                .parse::<u64>()
                .ok()
                .map(|epoch| FencingToken { epoch, seq: 0 })
        };
        let released = ForcedRelease {
            holder: reply.first().and_then(text),
            writer: reply.get(1).and_then(text),
            readers: reply.get(2).and_then(int).ok_or_else(bad)? as usize,
            fence: epoch(reply.get(3)).ok_or_else(bad)?,
            write_fence: epoch(reply.get(4)).ok_or_else(bad)?,
            woken: reply.get(5).and_then(int).ok_or_else(bad)? as usize,
            permits: reply.get(6).and_then(int).ok_or_else(bad)? as usize,
            told: reply.get(7).and_then(int).ok_or_else(bad)? as usize,
            receivers: reply.get(8).and_then(int).ok_or_else(bad)? as usize,
        };
        let newest = released.fence.max(released.write_fence);
        for resource in fence_resources {
            // Refused only if the resource already has a newer token: fine.
            let _ = resource.advance(conn, newest).await?;
        }
        Ok(released)
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

fn millis(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// Members and scores of a `WITHSCORES` reply.
fn pairs(v: Option<&Value>) -> Vec<(String, f64)> {
    let Some(Value::Array(items)) = v else {
        return Vec::new();
    };
    items
        .chunks(2)
        .filter_map(|pair| {
            let member = text(pair.first()?)?;
            let score = match pair.get(1)? {
                Value::Double(d) => *d,
                other => text(other)?.parse().ok()?,
            };
            Some((member, score))
        })
        .collect()
}

fn decode_state(key: LockKey, reply: &[Value]) -> Result<KeyState> {
    let bad = || {
        Error::backend(
            &key,
            Phase::Inspecting,
            format!("unexpected reply from the inspect script: {reply:?}"),
        )
    };
    if reply.len() < 20 {
        return Err(bad());
    }
    let now_ms = int(&reply[0]).ok_or_else(bad)?;
    let now_us: i64 = text(&reply[1])
        .and_then(|t| t.parse().ok())
        .ok_or_else(bad)?;
    let lease = |token: &Value, pttl: &Value| {
        text(token).map(|token| LeaseState {
            token,
            ttl: int(pttl).and_then(millis),
        })
    };
    let by_expiry = |v: &Value| {
        pairs(Some(v))
            .into_iter()
            .map(|(token, expiry)| LeaseState {
                token,
                ttl: millis(expiry as i64 - now_ms),
            })
            .collect::<Vec<_>>()
    };
    // A queue (arrival µs) and its expiry index (ms).
    let queue = |arrivals: Option<&Value>, expiries: Option<&Value>| {
        let expiries = pairs(expiries);
        pairs(arrivals)
            .into_iter()
            .map(|(instance, arrived)| WaiterState {
                waited: u64::try_from(now_us - arrived as i64)
                    .ok()
                    .map(Duration::from_micros),
                expires_in: expiries
                    .iter()
                    .find(|(id, _)| *id == instance)
                    .and_then(|(_, at)| millis(*at as i64 - now_ms)),
                instance,
            })
            .collect::<Vec<_>>()
    };
    let rw_waiting = pairs(Some(&reply[14]))
        .into_iter()
        .map(|(instance, expiry)| WaiterState {
            instance,
            waited: None,
            expires_in: millis(expiry as i64 - now_ms),
        })
        .collect();
    let sizes: Vec<usize> = match &reply[19] {
        Value::Array(items) => items.iter().filter_map(int).map(|n| n as usize).collect(),
        _ => return Err(bad()),
    };
    // ZCARDs of: wq, wqx, rd, ww, rwq, sem, semq, semqx.
    let size = |i: usize| sizes.get(i).copied().unwrap_or(0);
    let epoch = |v: &Value| text(v).and_then(|t| t.parse().ok());
    Ok(KeyState {
        server_time_ms: u64::try_from(now_ms).unwrap_or(0),
        holder: lease(&reply[2], &reply[3]),
        fence_epoch: epoch(&reply[4]),
        queue: queue(reply.get(5), reply.get(6)),
        claim: text(&reply[7]).map(|id| (id, int(&reply[8]).and_then(millis).unwrap_or_default())),
        readers: by_expiry(&reply[9]),
        writer: lease(&reply[10], &reply[11]),
        waiting_writers: by_expiry(&reply[12]),
        write_epoch: epoch(&reply[13]),
        rw_waiting,
        permits: by_expiry(&reply[15]),
        permit_count: text(&reply[16]).and_then(|t| t.parse().ok()),
        permit_queue: queue(reply.get(17), reply.get(18)),
        sizes: [size(0), size(2), size(3), size(4), size(5), size(6)],
        leader: match reply.get(20) {
            Some(Value::BulkString(record)) => crate::election::decode(record),
            _ => None,
        },
        key,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Inspector, InstanceCard, parse_name, since};
    use crate::key::LockKey;

    #[test]
    fn a_time_epoch_gives_the_time_held_and_one_ahead_of_the_clock_none() {
        let now_ms = 1_790_000_000_000;
        assert_eq!(
            since(now_ms * 1000 - 2_500_000, now_ms),
            Some(Duration::from_millis(2500))
        );
        // The epoch minted within the millisecond the clock was read in.
        assert_eq!(since(now_ms * 1000 + 400, now_ms), Some(Duration::ZERO));
        assert_eq!(since(now_ms * 1000 + 5_000_000, now_ms), None);
    }

    #[test]
    fn a_card_reads_its_fields_and_skips_others() {
        let card = InstanceCard::parse(
            "00000000c0ffee00",
            "name=billing=7\nhost=web-3\npid=42\nstarted_ms=x\nnew=1\nno equals sign\n",
        );
        assert_eq!(card.name.as_deref(), Some("billing=7"));
        assert_eq!(card.host.as_deref(), Some("web-3"));
        assert_eq!(card.pid, Some(42));
        assert_eq!(card.started_ms, None);
        assert_eq!(card.to_string(), "billing=7 (web-3, pid 42)");
        let bare = InstanceCard::parse("00000000c0ffee00", "");
        assert_eq!(bare.to_string(), "instance 00000000c0ffee00");
    }

    #[test]
    fn names_parse_back_to_their_keys() {
        let inspector = Inspector::new("p");
        for key in ["a", "a{b}", "100%", "x:y"] {
            let key = LockKey::from(key);
            let name = [&inspector.lock_name(&key)[..], b":wr"].concat();
            assert_eq!(parse_name("p", &name), Some((key, &b":wr"[..])));
        }
        assert_eq!(parse_name("p", b"q:{a}"), None);
    }
}
