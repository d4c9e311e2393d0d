//! Which primary serves each cluster slot, and which primaries may run a script
//! that touches keys of several of their slots: what batched renewal needs to
//! renew a node's leases in one call (see `renew`).
//!
//! The map comes from `CLUSTER NODES` and is kept for [`FRESH_FOR`]; a batch that
//! finds it wrong (a lease refused as not local) forgets it. It is read in a task
//! of its own, never on a renewal's way: a renewal that finds no map goes per slot
//! at once, and one that finds it old uses it while the new one is read (reading
//! it takes up to two timeouts of [`ASK_WITHIN`] when a node is slow, which a
//! lease's renewal must not wait out). A wrong map never renews a lease on the wrong node: the node checks
//! every key a script touches and refuses one of a slot it does not serve, and
//! that lease is renewed on its own. It only costs that lease a second call.
//!
//! A primary may take a cross-slot batch when its `redis_version` is 7.0 or later
//! (the `allow-cross-slot-keys` script flag), except 7.2.0 to 7.2.4, which look a
//! key of an undeclared slot up in the wrong slot (redis#12906). Valkey reports
//! `redis_version:7.2.4` for compatibility and its own version in
//! `valkey_version` (with `server_name:valkey`): it is judged by its own version,
//! from 8.0 (which has the fix; its 7.2 releases are renewed per slot). A primary
//! whose version cannot be read is renewed per slot.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::cluster_routing::{Route, SlotAddr};
use redis::{RedisError, Value};

/// What reading the map asks of a cluster connection (`cluster::ClusterConn`
/// implements it, so that this file imports nothing of `cluster`).
pub(super) trait SlotNodes: Clone + Send + Sync + 'static {
    /// `CLUSTER NODES` as one node answers it; `None` if it cannot be asked.
    fn cluster_nodes(&self) -> impl Future<Output = Option<String>> + Send;

    /// `cmd` on the primary of the slot in `route`; an error reply as an error.
    fn route(
        &self,
        cmd: redis::Cmd,
        route: Route,
    ) -> impl Future<Output = Result<Value, RedisError>> + Send;
}

/// How long a slot map is used before it is asked for again.
pub(super) const FRESH_FOR: Duration = Duration::from_secs(30);

/// How long the map, or a primary's version, may take to arrive.
const ASK_WITHIN: Duration = Duration::from_secs(2);

/// The primaries and the slots each serves, as `CLUSTER NODES` said.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Owners {
    /// `(first slot, last slot, primary index)`, sorted by first slot.
    ranges: Vec<(u16, u16, usize)>,
    /// Per primary: whether it may run a cross-slot batch.
    cross_slot: Vec<bool>,
}

impl Owners {
    /// The primary (its index) that serves `slot` and may run a cross-slot batch.
    pub(super) fn batching_node(&self, slot: u16) -> Option<usize> {
        let i = self.ranges.partition_point(|&(first, _, _)| first <= slot);
        let &(_, last, node) = self.ranges.get(i.checked_sub(1)?)?;
        (slot <= last && self.cross_slot[node]).then_some(node)
    }
}

/// The slot map of a cluster connection, read in the background when needed.
#[derive(Debug, Default)]
pub(super) struct OwnersCache {
    state: Mutex<CacheState>,
}

#[derive(Debug, Default)]
struct CacheState {
    /// The map last read (`None`: none yet, forgotten, or it could not be read).
    map: Option<Arc<Owners>>,
    /// When the last read ended; `None`: read at the next [`OwnersCache::get`].
    read_at: Option<Instant>,
    /// A read is under way.
    reading: bool,
}

impl OwnersCache {
    /// The slot map as it is now, without waiting: `None` when there is none
    /// (then batched renewal goes per slot). Starts a read in a task of its own
    /// when the map is missing or older than [`FRESH_FOR`] (and none is under
    /// way); a map that cannot be read is asked for again after [`FRESH_FOR`].
    pub(super) fn get(self: &Arc<Self>, conn: &impl SlotNodes) -> Option<Arc<Owners>> {
        let (map, start) = {
            let mut state = lock(&self.state);
            let stale = state.read_at.is_none_or(|at| at.elapsed() >= FRESH_FOR);
            let start = stale && !state.reading;
            state.reading |= start;
            (state.map.clone(), start)
        };
        if start {
            // Made before the spawn, so a task dropped unrun (a runtime shutting
            // down) still ends the read; the state's lock is not held here, as
            // that drop may run inside `spawn`.
            let reading = Reading(Arc::clone(self));
            let conn = conn.clone();
            crate::runtime::spawn(async move {
                let map = read(&conn).await.map(Arc::new);
                let mut state = lock(&reading.0.state);
                state.map = map;
                state.read_at = Some(Instant::now());
            });
        }
        map
    }

    /// Forgets the map (a batch found it wrong): batches go per slot until it is
    /// read again, which the next [`get`](Self::get) starts.
    pub(super) fn forget(&self) {
        let mut state = lock(&self.state);
        state.map = None;
        state.read_at = None;
    }
}

/// A read of the map under way; ends it when dropped.
struct Reading(Arc<OwnersCache>);

impl Drop for Reading {
    fn drop(&mut self) {
        lock(&self.0.state).reading = false;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads `CLUSTER NODES` and each primary's version.
async fn read(conn: &impl SlotNodes) -> Option<Owners> {
    let text = conn.cluster_nodes().await?;
    let primaries = parse_primaries(&text);
    if primaries.is_empty() {
        return None;
    }
    let versions = futures::future::join_all(primaries.iter().map(|ranges| {
        let first = ranges.first().map(|&(a, _)| a);
        async move {
            let first = first?;
            let info = tokio::time::timeout(
                ASK_WITHIN,
                conn.route(
                    redis::cmd("INFO").arg("server").clone(),
                    Route::new(first, SlotAddr::Master),
                ),
            )
            .await
            .ok()?
            .ok()?;
            let text: String = redis::from_redis_value(info).ok()?;
            Some(cross_slot_ok(&text))
        }
    }))
    .await;
    let mut ranges: Vec<(u16, u16, usize)> = primaries
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.iter().map(move |&(a, z)| (a, z, i)))
        .collect();
    ranges.sort_unstable();
    Some(Owners {
        ranges,
        cross_slot: versions.into_iter().map(|ok| ok == Some(true)).collect(),
    })
}

/// The slot ranges of each connected primary of a `CLUSTER NODES` text (a slot
/// being migrated is listed by its owner as usual; the `[slot->-node]` and
/// `[slot-<-node]` markers are skipped).
fn parse_primaries(text: &str) -> Vec<Vec<(u16, u16)>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(flags), Some(link)) = (fields.get(2), fields.get(7)) else {
            continue;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master")
            || flags
                .iter()
                .any(|f| matches!(*f, "fail" | "fail?" | "noaddr" | "handshake"))
            || *link != "connected"
        {
            continue;
        }
        let ranges: Vec<(u16, u16)> = fields[8..]
            .iter()
            .filter(|r| !r.starts_with('['))
            .filter_map(|r| match r.split_once('-') {
                Some((a, z)) => Some((a.parse().ok()?, z.parse().ok()?)),
                None => r.parse().ok().map(|s| (s, s)),
            })
            .collect();
        if !ranges.is_empty() {
            out.push(ranges);
        }
    }
    out
}

/// The version in field `field` of an `INFO server` text, as (major, minor,
/// patch).
fn version(info: &str, field: &str) -> Option<(u32, u32, u32)> {
    let v = info.lines().find_map(|l| {
        l.trim_end()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })?;
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// Whether the server of an `INFO server` text runs a cross-slot batch
/// correctly: Valkey (it says `valkey_version`) from 8.0, Redis from 7.0 except
/// 7.2.0 to 7.2.4. `false` when the text has no version.
fn cross_slot_ok(info: &str) -> bool {
    if let Some(v) = version(info, "valkey_version") {
        return v >= (8, 0, 0);
    }
    version(info, "redis_version")
        .is_some_and(|v| v >= (7, 0, 0) && !((7, 2, 0)..=(7, 2, 4)).contains(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_primaries_and_their_slots() {
        let text = "\
a 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 [5461-<-c]
b 127.0.0.1:7004@17004 slave a 0 0 1 connected
c 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922 12000
d 127.0.0.1:7003@17003 master - 0 0 3 connected 10923-11999 12001-16383
e 127.0.0.1:7005@17005 master,fail - 0 0 4 disconnected 100-200
";
        assert_eq!(
            parse_primaries(text),
            vec![
                vec![(0, 5460)],
                vec![(5461, 10922), (12000, 12000)],
                vec![(10923, 11999), (12001, 16383)],
            ]
        );
    }

    #[test]
    fn finds_the_batching_node_of_a_slot() {
        let owners = Owners {
            ranges: vec![(0, 99, 0), (100, 199, 1), (300, 399, 0)],
            cross_slot: vec![true, false],
        };
        assert_eq!(owners.batching_node(0), Some(0));
        assert_eq!(owners.batching_node(99), Some(0));
        assert_eq!(owners.batching_node(150), None, "not cross-slot capable");
        assert_eq!(owners.batching_node(250), None, "no owner");
        assert_eq!(owners.batching_node(399), Some(0));
        assert_eq!(owners.batching_node(400), None);
    }

    #[test]
    fn batches_across_slots_only_where_the_server_does_it_right() {
        assert_eq!(
            version(
                "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:0\r\n",
                "redis_version"
            ),
            Some((7, 0, 15))
        );
        assert_eq!(version("redis_mode:cluster\n", "redis_version"), None);
        assert!(!cross_slot_ok("redis_mode:cluster\n"), "no version");
        for (text, ok) in [
            ("redis_version:6.2.14", false),
            ("redis_version:7.0.0", true),
            ("redis_version:7.0.15", true),
            ("redis_version:7.2.0", false),
            ("redis_version:7.2.4", false),
            ("redis_version:7.2.5", true),
            ("redis_version:7.4.1", true),
            ("redis_version:8.0.2", true),
        ] {
            assert_eq!(cross_slot_ok(text), ok, "{text}");
        }
    }

    #[test]
    fn judges_valkey_by_its_own_version() {
        // What Valkey's INFO server says: the compatible Redis version first.
        let valkey = |v: &str| {
            format!(
                "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:{v}\r\n"
            )
        };
        for (v, ok) in [
            ("7.2.5", false),
            ("7.2.11", false),
            ("8.0.0", true),
            ("8.1.4", true),
            ("9.1.2", true),
        ] {
            assert_eq!(cross_slot_ok(&valkey(v)), ok, "Valkey {v}");
        }
    }
}
