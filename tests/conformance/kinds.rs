//! The lock kinds as the cells see them: one way to take, hold and release each,
//! through a [`Locker`] (what users call) or through the backend trait (what the
//! lease protocol sends).

use std::sync::OnceLock;
use std::time::Duration;

use lockflight::backend::rw::RwBackend;
use lockflight::backend::semaphore::SemaphoreBackend;
use lockflight::backend::{Acquire, LeaseToken, LockBackend, RedlockBackend, WhenBusy};
use lockflight::guard::{Loss, MultiGuard};
use lockflight::rwlock::{ReadGuard, WriteGuard};
use lockflight::semaphore::Permit;
use lockflight::{
    Contention, Error, FencingToken, LockGuard, LockKey, Locker, MemoryBackend, RedisBackend,
    Result,
};
use tokio::sync::OnceCell;

use testkit::cluster::Cluster;
use testkit::sentinel::{MASTER, Sentinels};
use testkit::{RedisServer, shared, unique_prefix};

/// Where the lockers of a cell keep their locks. The Redis topologies are started
/// once per test binary, on first use, and shared by the cells (each under its own
/// prefix; no cell disturbs them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One `MemoryBackend`, shared by the instances of one process.
    Memory,
    /// One Redis server (the test binary's shared one, under a fresh prefix).
    OneServer,
    /// A 3-primary Redis Cluster with a replica each.
    Cluster,
    /// A primary with two replicas behind three sentinels.
    Sentinel,
    /// Redlock over three independent primaries.
    Redlock,
    /// One Redis server, with per-process coalescing off
    /// (`Contention::PerTask`: every task asks the backend itself).
    Uncoalesced,
    /// The test kit's simulated server (`lockflight::testing`): each instance is
    /// one of its backends, with its own instance id and message channel.
    #[cfg(feature = "testing")]
    Sim,
}

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(Cluster::start)
}

async fn sentinels() -> &'static Sentinels {
    static SENTINELS: OnceCell<Sentinels> = OnceCell::const_new();
    SENTINELS.get_or_init(Sentinels::start).await
}

fn redlock_nodes() -> &'static [RedisServer; 3] {
    static NODES: OnceLock<[RedisServer; 3]> = OnceLock::new();
    NODES.get_or_init(|| std::array::from_fn(|_| RedisServer::start()))
}

/// The simulated server of the instances made under `prefix`, made on first use
/// (kept for the test binary's life, as the Redis topologies are), so that a cell
/// can break it as it breaks a Redis server.
#[cfg(feature = "testing")]
pub(crate) fn sim_server(prefix: &str) -> lockflight::testing::SimServer {
    use std::collections::HashMap;
    use std::sync::Mutex;

    static SERVERS: OnceLock<Mutex<HashMap<String, lockflight::testing::SimServer>>> =
        OnceLock::new();
    let servers = SERVERS.get_or_init(Mutex::default);
    let mut servers = servers.lock().unwrap_or_else(|e| e.into_inner());
    servers.entry(prefix.to_owned()).or_default().clone()
}

impl Topology {
    /// `n` independent instances (each its own backend connection and instance id
    /// where the topology has them) with leases of `ttl`, under a fresh prefix
    /// named after `cell`; also returns the prefix.
    pub(crate) async fn instances(
        self,
        cell: &str,
        n: usize,
        ttl: Duration,
    ) -> (Vec<Locker>, String) {
        self.instances_with_entries(cell, n, ttl, None).await
    }

    /// [`instances`](Self::instances) whose queue entries, on the Redis
    /// topologies that queue waiting instances (one server, Cluster, Sentinel),
    /// live `entry_ttl` (`RedisBackendBuilder::queue_entry_ttl`; a waiting
    /// instance refreshes its entry every third of it) instead of the default.
    pub(crate) async fn instances_with_entries(
        self,
        cell: &str,
        n: usize,
        ttl: Duration,
        entry_ttl: Option<Duration>,
    ) -> (Vec<Locker>, String) {
        let prefix = unique_prefix(cell);
        let memory = MemoryBackend::new();
        #[cfg(feature = "testing")]
        let sim = sim_server(&prefix);
        let mut lockers = Vec::with_capacity(n);
        for _ in 0..n {
            let builder = match self {
                Topology::Memory => Locker::builder(memory.clone()),
                #[cfg(feature = "testing")]
                Topology::Sim => Locker::builder(sim.backend()),
                _ => self.connected_builder(&prefix, entry_ttl).await,
            };
            lockers.push(
                builder
                    .lease_ttl(ttl)
                    .wait_timeout(Duration::from_secs(30))
                    .build()
                    .expect("build the locker"),
            );
        }
        (lockers, prefix)
    }

    /// One more instance under the `prefix` of [`instances`](Self::instances),
    /// connected on the runtime that calls this (so its connections' tasks run
    /// there, as in a program whose `main` makes its locker); `None` on the
    /// in-process topologies, whose instances share one backend value and have no
    /// connection.
    /// `configure` sets what the cell needs beyond the TTL.
    pub(crate) async fn instance_at(
        self,
        prefix: &str,
        ttl: Duration,
        configure: impl FnOnce(lockflight::LockerBuilder) -> lockflight::LockerBuilder,
    ) -> Option<Locker> {
        match self {
            Topology::Memory => None,
            #[cfg(feature = "testing")]
            Topology::Sim => None,
            _ => Some(
                configure(self.connected_builder(prefix, None).await)
                    .lease_ttl(ttl)
                    .wait_timeout(Duration::from_secs(30))
                    .build()
                    .expect("build the locker"),
            ),
        }
    }

    /// A builder on a new connection to this Redis topology under `prefix`, with
    /// queue entries living `entry_ttl` where given (not on Redlock).
    async fn connected_builder(
        self,
        prefix: &str,
        entry_ttl: Option<Duration>,
    ) -> lockflight::LockerBuilder {
        match self {
            Topology::OneServer | Topology::Cluster | Topology::Sentinel => {
                Locker::builder(self.redis_backend_with(prefix, entry_ttl).await)
            }
            Topology::Uncoalesced => {
                Locker::builder(self.redis_backend_with(prefix, entry_ttl).await)
                    .contention(Contention::PerTask)
            }
            Topology::Redlock => {
                let urls: Vec<String> = redlock_nodes().iter().map(RedisServer::url).collect();
                let backend = RedlockBackend::builder(urls)
                    .prefix(prefix)
                    .connect()
                    .await
                    .expect("connect to the Redlock nodes");
                Locker::builder(backend)
            }
            Topology::Memory => panic!("the memory backend has no connection"),
            #[cfg(feature = "testing")]
            Topology::Sim => panic!("the simulated server has no connection"),
        }
    }

    /// A subscribed backend of this single-keyspace Redis topology (one server,
    /// Cluster, Sentinel) under `prefix`.
    pub(crate) async fn redis_backend(self, prefix: &str) -> RedisBackend {
        self.redis_backend_with(prefix, None).await
    }

    /// [`redis_backend`](Self::redis_backend) with queue entries living
    /// `entry_ttl`, where given.
    async fn redis_backend_with(self, prefix: &str, entry_ttl: Option<Duration>) -> RedisBackend {
        let builder = match self {
            Topology::OneServer | Topology::Uncoalesced => RedisBackend::builder(shared().url()),
            Topology::Cluster => RedisBackend::cluster(cluster().urls()),
            Topology::Sentinel => RedisBackend::sentinel(sentinels().await.sentinel_urls(), MASTER),
            Topology::Memory | Topology::Redlock => panic!("{self:?} has no single Redis keyspace"),
            #[cfg(feature = "testing")]
            Topology::Sim => panic!("{self:?} has no single Redis keyspace"),
        };
        let builder = builder.prefix(prefix);
        let builder = match entry_ttl {
            Some(entry_ttl) => builder.queue_entry_ttl(entry_ttl),
            None => builder,
        };
        builder
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to the {self:?} topology: {e}"))
    }

    /// Deletes the Redis `names` (all of one hash slot) behind the lockers' backs,
    /// on the node(s) that keep them: the shared server, the slot's primary, the
    /// Sentinel primary, or every Redlock node. Returns how many names existed.
    pub(crate) async fn delete(self, names: &[String]) -> u64 {
        let del = |mut con: redis::aio::MultiplexedConnection| async move {
            redis::cmd("DEL")
                .arg(names)
                .query_async::<u64>(&mut con)
                .await
                .expect("DEL")
        };
        match self {
            Topology::OneServer | Topology::Uncoalesced => del(shared().connection().await).await,
            Topology::Cluster => {
                let slot = Cluster::slot(names[0].as_bytes());
                let primary = cluster().primary_of_slot(slot).await;
                del(cluster().by_addr(&primary.addr).connection().await).await
            }
            Topology::Sentinel => del(sentinels().await.primary().await.connection().await).await,
            Topology::Redlock => {
                let mut n = 0;
                for node in redlock_nodes() {
                    n += del(node.connection().await).await;
                }
                n
            }
            Topology::Memory => panic!("the memory backend has no Redis names"),
            #[cfg(feature = "testing")]
            Topology::Sim => panic!("the simulated server has no Redis names"),
        }
    }

    /// A connection to the node that keeps the Redis name `name` (one hash slot)
    /// on this single-keyspace topology: the shared server, the slot's primary,
    /// the Sentinel primary.
    pub(crate) async fn connection_for(self, name: &[u8]) -> redis::aio::MultiplexedConnection {
        match self {
            Topology::OneServer | Topology::Uncoalesced => shared().connection().await,
            Topology::Cluster => {
                let primary = cluster().primary_of_slot(Cluster::slot(name)).await;
                cluster().by_addr(&primary.addr).connection().await
            }
            Topology::Sentinel => sentinels().await.primary().await.connection().await,
            Topology::Memory | Topology::Redlock => panic!("{self:?} has no single Redis keyspace"),
            #[cfg(feature = "testing")]
            Topology::Sim => panic!("{self:?} has no single Redis keyspace"),
        }
    }

    /// Whether this topology offers `kind`: Redlock has only the mutex.
    pub(crate) fn offers(self, kind: Kind) -> bool {
        self != Topology::Redlock || matches!(kind, Kind::Mutex | Kind::Many)
    }

    /// For a kind this topology does not offer: checks that asking for it is the
    /// typed `Error::Unsupported` naming the key (never a silent difference), and
    /// returns `true`; the cell then has nothing more to check.
    pub(crate) async fn refuses(self, kind: Kind) -> bool {
        if self.offers(kind) {
            return false;
        }
        let (lockers, _) = self
            .instances("unsupported", 1, Duration::from_secs(5))
            .await;
        for result in [
            kind.acquire(&lockers[0], "k", Duration::from_secs(1))
                .await
                .err(),
            kind.try_acquire(&lockers[0], "k").await.err(),
        ] {
            match result {
                Some(e @ Error::Unsupported { .. }) => {
                    assert_eq!(e.key(), Some(&LockKey::from("k")));
                    assert_eq!(e.code(), "lock_unsupported");
                }
                other => panic!("{kind:?} on {self:?}: expected Unsupported, got {other:?}"),
            }
        }
        true
    }
}

/// A lock kind. The semaphore has one permit, so that every kind is exclusive
/// against another instance asking for the same kind (two read leases are not:
/// the read cells use a writer as the other instance where they need exclusion).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Mutex,
    Read,
    Write,
    Permit,
    /// `lock_many` over the key and a second key (`<key>#2`): mutexes taken in
    /// order, all or nothing.
    Many,
}

/// The permits of the semaphore cells.
const PERMITS: u32 = 1;

/// One held lock of any kind.
pub(crate) enum Held {
    Lock(LockGuard),
    Read(ReadGuard),
    Write(WriteGuard),
    Permit(Permit),
    Many(MultiGuard),
}

impl Kind {
    /// Takes `key` through `locker`, waiting up to `wait`.
    pub(crate) async fn acquire(self, locker: &Locker, key: &str, wait: Duration) -> Result<Held> {
        Ok(match self {
            Kind::Mutex => Held::Lock(
                locker
                    .lock_with_options(key, lockflight::LockOptions::new().wait_timeout(wait))
                    .await?,
            ),
            Kind::Read => Held::Read(
                locker
                    .rwlock(key)
                    .read_with_options(lockflight::LockOptions::new().wait_timeout(wait))
                    .await?,
            ),
            Kind::Write => Held::Write(
                locker
                    .rwlock(key)
                    .write_with_options(lockflight::LockOptions::new().wait_timeout(wait))
                    .await?,
            ),
            Kind::Permit => Held::Permit(
                locker
                    .semaphore(key, PERMITS)
                    .acquire_with_options(lockflight::LockOptions::new().wait_timeout(wait))
                    .await?,
            ),
            // lock_many waits up to the locker's wait timeout.
            Kind::Many => Held::Many(locker.lock_many(Self::many_keys(key)).await?),
        })
    }

    /// Takes `key` through `locker` if it is free now.
    pub(crate) async fn try_acquire(self, locker: &Locker, key: &str) -> Result<Option<Held>> {
        Ok(match self {
            Kind::Mutex => locker.try_lock(key).await?.map(Held::Lock),
            Kind::Read => locker.rwlock(key).try_read().await?.map(Held::Read),
            Kind::Write => locker.rwlock(key).try_write().await?.map(Held::Write),
            Kind::Permit => locker
                .semaphore(key, PERMITS)
                .try_acquire()
                .await?
                .map(Held::Permit),
            // lock_many has no single-attempt form: it waits (within the locker's
            // wait timeout) for keys another instance holds.
            Kind::Many => Some(Held::Many(locker.lock_many(Self::many_keys(key)).await?)),
        })
    }

    /// Every kind.
    pub(crate) const ALL: [Kind; 5] = [
        Kind::Mutex,
        Kind::Read,
        Kind::Write,
        Kind::Permit,
        Kind::Many,
    ];

    /// The keys `lock_many` takes for `key`.
    fn many_keys(key: &str) -> [String; 2] {
        [key.to_owned(), format!("{key}#2")]
    }

    /// Whether the key is idle in `locker`'s memory for this kind (no local state).
    pub(crate) fn idle_in(self, locker: &Locker) -> bool {
        match self {
            Kind::Mutex | Kind::Many => locker.stats().keys_in_use == 0,
            Kind::Read | Kind::Write => locker.stats().keys_in_use == 0,
            Kind::Permit => locker.stats().keys_in_use == 0,
        }
    }

    /// The kind that excludes this one from another instance: a writer for a
    /// reader, the same kind otherwise.
    pub(crate) fn rival(self) -> Kind {
        match self {
            Kind::Read => Kind::Write,
            Kind::Many => Kind::Mutex,
            other => other,
        }
    }

    /// Asks `backend` for a lease of `key` with `token`, without waiting; whether
    /// it was granted.
    pub(crate) async fn backend_acquire<B: LockBackend + RwBackend + SemaphoreBackend>(
        self,
        backend: &B,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<bool> {
        let granted = |a: Acquire| matches!(a, Acquire::Acquired { .. });
        Ok(match self {
            // `lock_many` is the mutex of each key at the backend.
            Kind::Mutex | Kind::Many => {
                granted(LockBackend::acquire(backend, key, token, ttl, WhenBusy::Return).await?)
            }
            Kind::Read => granted(
                backend
                    .acquire_read(key, token, ttl, WhenBusy::Return)
                    .await?,
            ),
            Kind::Write => granted(
                backend
                    .acquire_write(key, token, ttl, WhenBusy::Return)
                    .await?,
            ),
            Kind::Permit => {
                backend
                    .acquire_permits(key, PERMITS, &[token], ttl, WhenBusy::Return)
                    .await?
                    .granted
                    == 1
            }
        })
    }

    /// Releases the lease `token` of `key` at `backend`: whether the backend says
    /// this release (or an earlier attempt of it) deleted the lease.
    pub(crate) async fn backend_release<B: LockBackend + RwBackend + SemaphoreBackend>(
        self,
        backend: &B,
        key: &LockKey,
        token: LeaseToken,
    ) -> Result<bool> {
        Ok(match self {
            Kind::Mutex | Kind::Many => LockBackend::release(backend, key, token).await?.released,
            Kind::Read => backend.release_read(key, token).await?.released,
            Kind::Write => backend.release_write(key, token).await?.released,
            Kind::Permit => backend.release_permit(key, token).await?,
        })
    }
}

impl Held {
    /// The fencing token of this section, for the kinds that have their own: the
    /// mutex and the write lease.
    pub(crate) fn fencing_token(&self) -> Option<FencingToken> {
        match self {
            Held::Lock(g) => Some(g.fencing_token()),
            Held::Many(g) => g.fencing_token(g.keys().next()?),
            Held::Write(g) => Some(g.fencing_token()),
            Held::Read(_) | Held::Permit(_) => None,
        }
    }

    /// Resolves when the lease is lost.
    pub(crate) fn lost(&self) -> Loss {
        match self {
            Held::Lock(g) => g.lost(),
            Held::Read(g) => g.lost(),
            Held::Write(g) => g.lost(),
            Held::Permit(p) => p.lost(),
            Held::Many(g) => g.lost(),
        }
    }

    /// Whether the lease is lost (its loss signalled, or its validity ended).
    pub(crate) fn is_lost(&self) -> bool {
        match self {
            Held::Lock(g) => g.is_lost(),
            Held::Read(g) => g.is_lost(),
            Held::Write(g) => g.is_lost(),
            Held::Permit(p) => p.is_lost(),
            Held::Many(g) => g.is_lost(),
        }
    }

    /// Whether this section shares the key with others of its kind (a read lease).
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, Held::Read(_))
    }

    /// Releases the lock, reporting what the backend said.
    pub(crate) async fn release(self) -> Result<()> {
        match self {
            Held::Lock(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Write(g) => g.release().await,
            Held::Permit(p) => p.release().await,
            Held::Many(g) => g.release().await,
        }
    }
}
