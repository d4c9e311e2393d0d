//! One key's state: everything lockflight stores for it, read by one script at
//! one instant of the server clock (`lua/inspect.lua`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use super::inspector::Inspector;
use super::reply::{int, millis, pairs, text};
use crate::backend::redis::names::key_name;
use crate::election::LeaderInfo;
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/inspect.lua")));

/// How many members of each sorted set [`Inspector::key`] reads at most.
pub const MEMBERS_SHOWN: usize = 100;

/// A lease of a key: its token and how long it lives (from the server's TTL or
/// sorted-set expiry).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    pub fn instance(&self) -> Option<&str> {
        LeaseState::instance_of(&self.token)
    }

    /// The id of the instance that minted `token` (hex), as
    /// [`instance`](Self::instance) reads it.
    ///
    /// ```
    /// use lockflight::inspect::LeaseState;
    ///
    /// let token = "00000000c0ffee00a1b2c3d4e5f60718";
    /// assert_eq!(LeaseState::instance_of(token), Some("00000000c0ffee00"));
    /// assert_eq!(LeaseState::instance_of("not a token"), None);
    /// ```
    pub fn instance_of(token: &str) -> Option<&str> {
        (token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit())).then(|| &token[..16])
    }
}

/// A waiting instance.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaiterState {
    /// The instance id (what `RedisBackend::instance_id` returns in that process).
    pub instance: String,
    /// How long it has waited (by the server's clock), if its arrival is recorded.
    pub waited: Option<Duration>,
    /// Time left before its entry expires (it renews the entry while it waits).
    pub expires_in: Option<Duration>,
}

/// How many members each of a key's sorted sets has in full: a [`KeyState`]
/// lists at most [`MEMBERS_SHOWN`] of each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sizes {
    /// Instances waiting for the mutex ([`KeyState::queue`]).
    pub queue: usize,
    /// Read leases ([`KeyState::readers`]).
    pub readers: usize,
    /// Writers waiting ([`KeyState::waiting_writers`]).
    pub waiting_writers: usize,
    /// Instances waiting for the read-write lock ([`KeyState::rw_waiting`]).
    pub rw_waiting: usize,
    /// Permits out ([`KeyState::permits`]).
    pub permits: usize,
    /// Instances waiting for permits ([`KeyState::permit_queue`]).
    pub permit_queue: usize,
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
    /// members are listed.
    pub sizes: Sizes,
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
        let held = u32::try_from(self.sizes.permits).unwrap_or(u32::MAX);
        self.permit_count.map(|n| n.saturating_sub(held))
    }
}

/// Time from an epoch (µs) to the server clock (ms); `None` if the epoch is ahead
/// of it (beyond the millisecond the clock was read in).
fn since(epoch_us: u64, now_ms: u64) -> Option<Duration> {
    let now_us = now_ms.checked_mul(1000)?;
    (epoch_us < now_us + 1000).then(|| Duration::from_micros(now_us.saturating_sub(epoch_us)))
}

impl Inspector {
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
        let mut invocation = INSPECT.prepare_invoke();
        for suffix in [
            "", ":fence", ":wq", ":wqx", ":claim", ":rd", ":wr", ":ww", ":wf", ":rwq", ":sem",
            ":semn", ":semq", ":semqx", ":leader",
        ] {
            invocation.key(key_name(&self.prefix, &key, suffix));
        }
        invocation.arg(MEMBERS_SHOWN);
        let reply: Vec<Value> = invocation
            .invoke_async(conn)
            .await
            .map_err(|e| crate::fence::redis_error(&key, Phase::Inspecting, e))?;
        decode_state(key, &reply)
    }
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
        sizes: Sizes {
            queue: size(0),
            readers: size(2),
            waiting_writers: size(3),
            rw_waiting: size(4),
            permits: size(5),
            permit_queue: size(6),
        },
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

    use super::since;

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
}
