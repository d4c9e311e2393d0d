//! The fenced-write cases, written **once** over a [`Rig`] that is either a
//! `FencedKey` on a real server or the test kit's `SimFencedKey`, and
//! instantiated for both by [`on_both!`] (`<case>::redis`, `<case>::kit`): the
//! kit's fenced resource must give what Redis gives, outcome for outcome and
//! error text for error text.
//!
//! On Redis the writes go through a fault proxy (a lost reply is a reply the
//! proxy loses after the server ran the script) and the value is read on a
//! connection of its own; on the kit a lost reply is `lose_reply(Op::Fenced)`
//! and the value is read with `get` and `hget`. The kit's cases run on a paused
//! clock, Redis' on the real one; no case bounds a wall-clock time.

use std::sync::Arc;
use std::time::Duration;

use lockflight::fence::{Fenced, FencedKey, WriteId};
use lockflight::testing::{Op, SimFencedKey, SimServer};
use lockflight::{Error, FencingToken, LockGuard, Locker};
use redis::aio::{ConnectionManager, MultiplexedConnection};
use testkit::fault_proxy::FaultProxy;
use testkit::{CountingProxy, shared, unique_prefix};

use super::{TTL, paused_then_successor, stale};

/// Where a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    /// The test kit's `SimFencedKey`, on a `SimServer`.
    Kit,
    /// `FencedKey` on the shared real server.
    Redis,
}

/// One fenced resource, on either engine.
enum Rig {
    Kit {
        server: SimServer,
        key: SimFencedKey,
    },
    Redis {
        key: FencedKey,
        /// The writes' connection, through the proxy (it reconnects after a
        /// lost reply).
        conn: ConnectionManager,
        proxy: Arc<FaultProxy>,
        /// Straight to the server: the test's own reads.
        direct: MultiplexedConnection,
        prefix: String,
    },
}

/// `epoch.seq` as a token.
fn token(epoch: u64, seq: u64) -> FencingToken {
    FencingToken::new(epoch, seq)
}

impl Rig {
    /// The resource `name` (under a prefix of its own on Redis).
    async fn new(engine: Engine, name: &str) -> Rig {
        match engine {
            Engine::Kit => {
                let server = SimServer::new();
                let key = server.fenced_key(name).expect("a valid name");
                Rig::Kit { server, key }
            }
            Engine::Redis => {
                let server = shared();
                let prefix = unique_prefix("fence-case");
                let proxy = FaultProxy::start(server).await;
                let client = redis::Client::open(proxy.url()).expect("a valid URL");
                Rig::Redis {
                    key: FencedKey::new(format!("{prefix}:{name}")).expect("a valid name"),
                    conn: ConnectionManager::new(client).await.expect("connects"),
                    proxy: Arc::new(proxy),
                    direct: server.connection().await,
                    prefix,
                }
            }
        }
    }

    /// The resource's full name, as errors name it.
    fn name(&self) -> String {
        let name = match self {
            Rig::Kit { key, .. } => key.name(),
            Rig::Redis { key, .. } => key.name(),
        };
        String::from_utf8_lossy(name).into_owned()
    }

    /// Another resource on the same engine and server, named `name`; an
    /// error as the constructor gives it.
    fn other(&self, name: &str) -> lockflight::Result<Rig> {
        Ok(match self {
            Rig::Kit { server, .. } => Rig::Kit {
                server: server.clone(),
                key: server.fenced_key(name)?,
            },
            Rig::Redis {
                conn,
                proxy,
                direct,
                prefix,
                ..
            } => Rig::Redis {
                key: FencedKey::new(name)?,
                conn: conn.clone(),
                proxy: Arc::clone(proxy),
                direct: direct.clone(),
                prefix: prefix.clone(),
            },
        })
    }

    async fn set(&self, t: FencingToken, value: &str) -> lockflight::Result<Fenced> {
        match self {
            Rig::Kit { key, .. } => key.set(t, value).await,
            Rig::Redis { key, conn, .. } => key.set(&mut conn.clone(), t, value).await,
        }
    }

    async fn set_once(&self, t: FencingToken, value: &str, id: u64) -> lockflight::Result<Fenced> {
        let id = WriteId::from(id);
        match self {
            Rig::Kit { key, .. } => key.set_once(t, value, id).await,
            Rig::Redis { key, conn, .. } => key.set_once(&mut conn.clone(), t, value, id).await,
        }
    }

    async fn set_with_ttl(
        &self,
        t: FencingToken,
        value: &str,
        ttl: Duration,
    ) -> lockflight::Result<Fenced> {
        match self {
            Rig::Kit { key, .. } => key.set_with_ttl(t, value, ttl).await,
            Rig::Redis { key, conn, .. } => {
                key.set_with_ttl(&mut conn.clone(), t, value, ttl).await
            }
        }
    }

    async fn set_with_ttl_once(
        &self,
        t: FencingToken,
        value: &str,
        ttl: Duration,
        id: u64,
    ) -> lockflight::Result<Fenced> {
        let id = WriteId::from(id);
        match self {
            Rig::Kit { key, .. } => key.set_with_ttl_once(t, value, ttl, id).await,
            Rig::Redis { key, conn, .. } => {
                key.set_with_ttl_once(&mut conn.clone(), t, value, ttl, id)
                    .await
            }
        }
    }

    async fn incr_by(&self, t: FencingToken, delta: i64) -> lockflight::Result<Fenced<i64>> {
        match self {
            Rig::Kit { key, .. } => key.incr_by(t, delta).await,
            Rig::Redis { key, conn, .. } => key.incr_by(&mut conn.clone(), t, delta).await,
        }
    }

    async fn incr_by_once(
        &self,
        t: FencingToken,
        delta: i64,
        id: u64,
    ) -> lockflight::Result<Fenced<i64>> {
        let id = WriteId::from(id);
        match self {
            Rig::Kit { key, .. } => key.incr_by_once(t, delta, id).await,
            Rig::Redis { key, conn, .. } => key.incr_by_once(&mut conn.clone(), t, delta, id).await,
        }
    }

    async fn hset(&self, t: FencingToken, fields: &[(&str, &str)]) -> lockflight::Result<Fenced> {
        let fields = fields.iter().copied();
        match self {
            Rig::Kit { key, .. } => key.hset(t, fields).await,
            Rig::Redis { key, conn, .. } => key.hset(&mut conn.clone(), t, fields).await,
        }
    }

    async fn hset_once(
        &self,
        t: FencingToken,
        fields: &[(&str, &str)],
        id: u64,
    ) -> lockflight::Result<Fenced> {
        let (fields, id) = (fields.iter().copied(), WriteId::from(id));
        match self {
            Rig::Kit { key, .. } => key.hset_once(t, fields, id).await,
            Rig::Redis { key, conn, .. } => key.hset_once(&mut conn.clone(), t, fields, id).await,
        }
    }

    async fn delete(&self, t: FencingToken) -> lockflight::Result<Fenced> {
        match self {
            Rig::Kit { key, .. } => key.delete(t).await,
            Rig::Redis { key, conn, .. } => key.delete(&mut conn.clone(), t).await,
        }
    }

    async fn delete_once(&self, t: FencingToken, id: u64) -> lockflight::Result<Fenced> {
        let id = WriteId::from(id);
        match self {
            Rig::Kit { key, .. } => key.delete_once(t, id).await,
            Rig::Redis { key, conn, .. } => key.delete_once(&mut conn.clone(), t, id).await,
        }
    }

    async fn advance(&self, t: FencingToken) -> lockflight::Result<Fenced> {
        match self {
            Rig::Kit { key, .. } => key.advance(t).await,
            Rig::Redis { key, conn, .. } => key.advance(&mut conn.clone(), t).await,
        }
    }

    async fn last_token(&self) -> Option<FencingToken> {
        match self {
            Rig::Kit { key, .. } => key.last_token().await,
            Rig::Redis { key, conn, .. } => key.last_token(&mut conn.clone()).await,
        }
        .expect("the fence is read")
    }

    async fn forget(&self) {
        match self {
            Rig::Kit { key, .. } => key.forget().await,
            Rig::Redis { key, conn, .. } => key.forget(&mut conn.clone()).await,
        }
        .expect("the fence is forgotten")
    }

    /// The resource's string value (`None` when it has none or is a hash).
    async fn string(&self) -> Option<String> {
        let bytes = match self {
            Rig::Kit { key, .. } => key.get(),
            Rig::Redis { key, direct, .. } => {
                let mut con = direct.clone();
                match kind(&mut con, key.name()).await.as_str() {
                    "string" => cmd("GET", key.name(), &mut con).await,
                    _ => None,
                }
            }
        };
        bytes.map(|b| String::from_utf8(b).expect("UTF-8"))
    }

    /// A field of the resource's hash (`None` when it has no such field or is
    /// not a hash).
    async fn field(&self, field: &str) -> Option<String> {
        let bytes = match self {
            Rig::Kit { key, .. } => key.hget(field),
            Rig::Redis { key, direct, .. } => {
                let mut con = direct.clone();
                match kind(&mut con, key.name()).await.as_str() {
                    "hash" => redis::cmd("HGET")
                        .arg(key.name())
                        .arg(field)
                        .query_async(&mut con)
                        .await
                        .expect("HGET"),
                    _ => None,
                }
            }
        };
        bytes.map(|b| String::from_utf8(b).expect("UTF-8"))
    }

    /// The reply of the next write to the resource is lost, after the write.
    fn lose_next_reply(&self) {
        match self {
            Rig::Kit { server, key } => server
                .fault()
                .on_key(key.name())
                .next(1)
                .lose_reply(Op::Fenced)
                .expect("a valid fault"),
            Rig::Redis { key, proxy, .. } => {
                let name = key.name().to_vec();
                proxy.drop_replies(
                    Arc::new(move |args: &[Vec<u8>]| {
                        args.len() > 3
                            && args[0].eq_ignore_ascii_case(b"EVALSHA")
                            && args[3] == name
                    }),
                    1,
                );
            }
        }
    }

    /// Holder A, paused past its lease, and its successor B on the lock `key`:
    /// B's token is newer, A does not know for sure that it lost the lease. The
    /// returned proxy, on Redis, holds A's connection in a black hole.
    async fn paused_then_successor(
        &self,
        key: &str,
    ) -> (LockGuard, LockGuard, Option<CountingProxy>) {
        match self {
            Rig::Kit { server, .. } => {
                let locker = || {
                    Locker::builder(server.backend())
                        .lease_ttl(TTL)
                        .wait_timeout(Duration::from_secs(10))
                        .build()
                        .expect("valid settings")
                };
                let (a, b) = (locker(), locker());
                let held_by_a = a.lock(key).await.expect("A locks");
                // A is paused: its renewals never arrive.
                server
                    .fault()
                    .on_key(key)
                    .fail(Op::Renew)
                    .expect("a valid fault");
                let held_by_b = b.lock(key).await.expect("B locks once A's lease expired");
                server.clear_faults();
                (held_by_a, held_by_b, None)
            }
            Rig::Redis { prefix, .. } => {
                let (a, b, proxy) = paused_then_successor(shared(), prefix, key).await;
                (a, b, Some(proxy))
            }
        }
    }
}

async fn kind(con: &mut MultiplexedConnection, name: &[u8]) -> String {
    redis::cmd("TYPE")
        .arg(name)
        .query_async(con)
        .await
        .expect("TYPE")
}

async fn cmd(command: &str, name: &[u8], con: &mut MultiplexedConnection) -> Option<Vec<u8>> {
    redis::cmd(command)
        .arg(name)
        .query_async(con)
        .await
        .expect(command)
}

/// The text of a write refused by the server with `detail`.
fn refused_text(name: &str, code: &str, detail: &str) -> String {
    format!(
        "lock {name}: the server refused the command while writing: {code}: {detail} (nothing was written)"
    )
}

/// The text of a write refused for a value of another type.
fn foreign_text(name: &str) -> String {
    format!(
        "lock {name}: the Redis key holds a foreign value while writing: nothing was written (the resource key holds a value of another type)"
    )
}

/// Instantiates a case `async fn(Engine)` on both engines: a module named after
/// it with the tests `kit` (on a paused clock) and `redis`.
macro_rules! on_both {
    ($case:ident) => {
        mod $case {
            #[tokio::test(start_paused = true)]
            async fn kit() {
                super::$case(super::Engine::Kit).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$case(super::Engine::Redis).await
            }
        }
    };
}

/// The rule: a write with an older token than the last accepted one is
/// `Stale { last, offered }` and changes nothing, whatever the operation; an
/// equal token writes again; a newer one moves the fence. A delete keeps the
/// fence; `advance` moves only the fence; `forget` drops it.
async fn older_tokens_are_stale_and_change_nothing(engine: Engine) {
    let rig = Rig::new(engine, "stock").await;
    let (a, b, b2) = (token(5, 0), token(6, 0), token(6, 1));

    assert_eq!(rig.set(b, "from B").await.unwrap(), Fenced::Applied(()));
    assert_eq!(rig.set(a, "from A").await.unwrap(), stale(a, b));
    assert_eq!(rig.set_once(a, "from A", 1).await.unwrap(), stale(a, b));
    let ttl = Duration::from_secs(60);
    assert_eq!(rig.set_with_ttl(a, "A", ttl).await.unwrap(), stale(a, b));
    assert_eq!(rig.incr_by(a, 1).await.unwrap(), stale(a, b).map(|()| 0));
    assert_eq!(rig.hset(a, &[("f", "v")]).await.unwrap(), stale(a, b));
    assert_eq!(rig.delete(a).await.unwrap(), stale(a, b));
    assert_eq!(rig.advance(a).await.unwrap(), stale(a, b));
    assert_eq!(rig.string().await.as_deref(), Some("from B"));
    assert_eq!(rig.last_token().await, Some(b));

    // The same section writes again; a handoff's next sequence moves the fence.
    assert!(rig.set(b, "again B").await.unwrap().is_applied());
    assert!(rig.set(b2, "from B2").await.unwrap().is_applied());
    assert_eq!(rig.set(b, "late B").await.unwrap(), stale(b, b2));
    assert_eq!(rig.last_token().await, Some(b2));

    // A delete keeps the fence: an older holder cannot recreate the value.
    assert!(rig.delete(b2).await.unwrap().is_applied());
    assert_eq!(rig.string().await, None);
    assert_eq!(rig.set(b, "recreated").await.unwrap(), stale(b, b2));
    assert_eq!(rig.string().await, None);

    let forced = token(7, 0);
    assert!(rig.advance(forced).await.unwrap().is_applied());
    assert_eq!(
        rig.set(b2, "after advance").await.unwrap(),
        stale(b2, forced)
    );
    assert_eq!(rig.last_token().await, Some(forced));
    rig.forget().await;
    assert_eq!(rig.last_token().await, None);
    assert!(rig.set(a, "after forget").await.unwrap().is_applied());
    assert_eq!(rig.string().await.as_deref(), Some("after forget"));
}
on_both!(older_tokens_are_stale_and_change_nothing);

/// `INCRBY` and `HSET` as Redis runs them: the new value, integers in Redis'
/// form only, no overflow, no write to a value of the other type; every refusal
/// with Redis' text and nothing written (the fence stays where it was).
async fn increments_and_hashes_follow_redis(engine: Engine) {
    let rig = Rig::new(engine, "counter").await;
    let name = rig.name();
    let (t, newer) = (token(3, 0), token(4, 0));

    assert_eq!(rig.incr_by(t, 5).await.unwrap(), Fenced::Applied(5));
    assert_eq!(rig.incr_by(t, -7).await.unwrap(), Fenced::Applied(-2));
    let big = (1_i64 << 53) + 1;
    assert!(
        rig.set(t, &(i64::MAX - big).to_string())
            .await
            .unwrap()
            .is_applied()
    );
    assert_eq!(
        rig.incr_by(t, big).await.unwrap(),
        Fenced::Applied(i64::MAX)
    );
    assert_eq!(rig.string().await, Some(i64::MAX.to_string()));

    let overflow = rig.incr_by(newer, 1).await.unwrap_err();
    assert!(
        matches!(&overflow, Error::Refused { code, .. } if code == "ERR"),
        "{overflow}"
    );
    assert_eq!(
        overflow.to_string(),
        refused_text(&name, "ERR", "ERR increment or decrement would overflow")
    );
    for not_an_integer in ["abc", "05", "+5", "-0", " 5", "1.5"] {
        assert!(rig.set(t, not_an_integer).await.unwrap().is_applied());
        let e = rig.incr_by(newer, 1).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            refused_text(&name, "ERR", "ERR value is not an integer or out of range"),
            "{not_an_integer:?}"
        );
    }
    assert_eq!(
        rig.string().await.as_deref(),
        Some("1.5"),
        "nothing written"
    );
    let e = rig.hset(newer, &[("title", "one")]).await.unwrap_err();
    assert!(matches!(e, Error::ForeignValue { .. }), "{e}");
    assert_eq!(e.to_string(), foreign_text(&name));
    assert_eq!(
        rig.last_token().await,
        Some(t),
        "no refused write moved the fence"
    );

    assert!(rig.delete(t).await.unwrap().is_applied());
    let fields = [("title", "one"), ("by", "a")];
    assert!(rig.hset(t, &fields).await.unwrap().is_applied());
    assert!(rig.hset(t, &[("title", "two")]).await.unwrap().is_applied());
    assert_eq!(rig.field("title").await.as_deref(), Some("two"));
    assert_eq!(rig.field("by").await.as_deref(), Some("a"));
    assert_eq!(rig.string().await, None, "a hash is not a string");
    let e = rig.incr_by(newer, 1).await.unwrap_err();
    assert_eq!(e.to_string(), foreign_text(&name));
    let e = rig.incr_by_once(newer, 1, 1).await.unwrap_err();
    assert_eq!(e.to_string(), foreign_text(&name));
    assert_eq!(rig.last_token().await, Some(t));
    // SET replaces a value of any type.
    assert!(rig.set(newer, "plain").await.unwrap().is_applied());
    assert_eq!(rig.field("title").await, None);
    assert_eq!(rig.string().await.as_deref(), Some("plain"));
}
on_both!(increments_and_hashes_follow_redis);

/// Writes with a write id: applied at most once per token, a repeat answered
/// with the result of the write that applied, whatever happened since; a write
/// without an id is a new write; a newer token's first write with an id starts
/// a new record, where the older token's ids are new.
async fn writes_with_a_write_id_apply_once_per_token(engine: Engine) {
    let rig = Rig::new(engine, "once").await;
    let (t1, t2, t3) = (token(5, 0), token(5, 1), token(6, 0));

    assert_eq!(
        rig.incr_by_once(t1, 1, 1).await.unwrap(),
        Fenced::Applied(1)
    );
    assert_eq!(
        rig.incr_by_once(t1, 5, 2).await.unwrap(),
        Fenced::Applied(6)
    );
    assert_eq!(
        rig.incr_by_once(t1, 1, 1).await.unwrap(),
        Fenced::Applied(1),
        "as then"
    );
    assert_eq!(
        rig.incr_by(t1, 1).await.unwrap(),
        Fenced::Applied(7),
        "no id: a new write"
    );
    assert_eq!(rig.string().await.as_deref(), Some("7"));

    // The next token's ids, then the older token's: stale, even with an id it
    // applied.
    assert_eq!(
        rig.incr_by_once(t2, 1, 2).await.unwrap(),
        Fenced::Applied(8)
    );
    for id in [1, 3] {
        assert_eq!(
            rig.incr_by_once(t1, 1, id).await.unwrap(),
            stale(t1, t2).map(|()| 0)
        );
    }
    // A newer token without an id leaves t2's record; with one it starts its
    // own, where t2's id 2 is new.
    assert_eq!(rig.incr_by(t3, 1).await.unwrap(), Fenced::Applied(9));
    assert_eq!(
        rig.incr_by_once(t3, 1, 2).await.unwrap(),
        Fenced::Applied(10)
    );
    assert_eq!(
        rig.incr_by_once(t3, 1, 2).await.unwrap(),
        Fenced::Applied(10)
    );

    // A late copy of an earlier write does not undo a later one, whatever its
    // operation.
    let doc = rig.other(&format!("{}:doc", rig.name())).unwrap();
    for (id, value) in [(10, "one"), (11, "two"), (10, "one")] {
        assert_eq!(
            doc.set_once(t3, value, id).await.unwrap(),
            Fenced::Applied(())
        );
    }
    assert_eq!(doc.string().await.as_deref(), Some("two"));
    assert!(doc.delete_once(t3, 12).await.unwrap().is_applied());
    assert!(
        doc.hset_once(t3, &[("f", "v")], 13)
            .await
            .unwrap()
            .is_applied()
    );
    assert!(doc.delete_once(t3, 12).await.unwrap().is_applied());
    let ttl = Duration::from_secs(60);
    assert!(
        doc.set_with_ttl_once(t3, "late", ttl, 11)
            .await
            .unwrap()
            .is_applied()
    );
    assert_eq!(
        doc.field("f").await.as_deref(),
        Some("v"),
        "no repeat ran again"
    );
    // An id of a set, repeated by an increment: answered as the set was.
    assert_eq!(
        doc.incr_by_once(t3, 1, 10).await.unwrap(),
        Fenced::Applied(0)
    );
    assert_eq!(doc.last_token().await, Some(t3));
}
on_both!(writes_with_a_write_id_apply_once_per_token);

/// Past 96 ids under one token the record keeps the 64 newest; an id older than
/// those and not among them is refused (`WRITEID`), never applied.
async fn ids_older_than_the_record_keeps_are_refused(engine: Engine) {
    let rig = Rig::new(engine, "window").await;
    let name = rig.name();
    let t = token(4, 0);
    for id in 1..=97 {
        let applied = rig.incr_by_once(t, 1, id).await.unwrap();
        assert_eq!(applied, Fenced::Applied(id as i64));
    }
    for id in [10_u64, 33] {
        let e = rig.incr_by_once(t, 1, id).await.unwrap_err();
        assert!(
            matches!(&e, Error::Refused { code, .. } if code == "WRITEID"),
            "{e}"
        );
        let detail = format!(
            "WRITEID write id {id:016x} is older than the ids still recorded under token 4:0: \
             whether it was applied cannot be told"
        );
        assert_eq!(e.to_string(), refused_text(&name, "WRITEID", &detail));
    }
    assert_eq!(rig.string().await.as_deref(), Some("97"), "nothing applied");
    assert_eq!(
        rig.incr_by_once(t, 1, 34).await.unwrap(),
        Fenced::Applied(34)
    );
    assert_eq!(
        rig.incr_by_once(t, 1, 98).await.unwrap(),
        Fenced::Applied(98)
    );
}
on_both!(ids_older_than_the_record_keeps_are_refused);

/// A value written with a TTL expires (and counts as absent to the next
/// write); the fence never does.
async fn a_value_expires_and_its_fence_does_not(engine: Engine) {
    let rig = Rig::new(engine, "session").await;
    let (t, older) = (token(9, 1), token(9, 0));
    let long = Duration::from_secs(60);
    assert!(rig.set_with_ttl(t, "v", long).await.unwrap().is_applied());
    assert_eq!(rig.string().await.as_deref(), Some("v"));
    assert!(
        rig.set_with_ttl(t, "41", Duration::from_millis(100))
            .await
            .unwrap()
            .is_applied()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.string().await, None, "expired");
    assert_eq!(rig.last_token().await, Some(t));
    assert_eq!(rig.set(older, "late").await.unwrap(), stale(older, t));
    assert_eq!(
        rig.incr_by(t, 1).await.unwrap(),
        Fenced::Applied(1),
        "from nothing"
    );
}
on_both!(a_value_expires_and_its_fence_does_not);

/// A write whose reply is lost was applied: repeated with its write id, it is
/// answered as applied and applies once; repeated without one, it applies again.
async fn a_lost_reply_is_repeated_safely_only_with_a_write_id(engine: Engine) {
    let rig = Rig::new(engine, "orders").await;
    let t = token(7, 0);

    rig.lose_next_reply();
    let first = rig.incr_by_once(t, 1, 1).await;
    assert!(matches!(&first, Err(e) if e.is_transient()), "{first:?}");
    let repeat = until_answered(|| rig.incr_by_once(t, 1, 1)).await;
    assert_eq!(repeat, Fenced::Applied(1));
    assert_eq!(rig.string().await.as_deref(), Some("1"));

    rig.lose_next_reply();
    let first = rig.incr_by(t, 1).await;
    assert!(matches!(&first, Err(e) if e.is_transient()), "{first:?}");
    let repeat = until_answered(|| rig.incr_by(t, 1)).await;
    assert_eq!(
        repeat,
        Fenced::Applied(3),
        "the lost write applied, and the repeat"
    );
}
on_both!(a_lost_reply_is_repeated_safely_only_with_a_write_id);

/// `write` until it is answered with something other than a transient error.
async fn until_answered<F, T>(mut write: impl FnMut() -> F) -> T
where
    F: Future<Output = lockflight::Result<T>>,
{
    for _ in 0..100 {
        match write().await {
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(50)).await,
            outcome => return outcome.expect("an answer"),
        }
    }
    panic!("no answer in 100 attempts");
}

/// Bad names and bad input are the same errors, with the same texts, before
/// anything is sent.
async fn bad_input_is_the_same_error(engine: Engine) {
    let rig = Rig::new(engine, "input").await;
    let name = rig.name();
    for bad in ["", "a}b", &"k".repeat(lockflight::LockKey::MAX_LEN + 1)] {
        let e = rig.other(bad).err().expect("refused");
        assert!(matches!(e, Error::InvalidKey { .. }), "{e}");
        let expected = FencedKey::new(bad).unwrap_err().to_string();
        assert_eq!(e.to_string(), expected);
    }
    let t = token(1, 0);
    let e = rig
        .set_with_ttl(t, "v", Duration::from_micros(999))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("invalid configuration: fenced write to {name}: a TTL of 999µs is under 1 ms")
    );
    let e = rig.hset(t, &[]).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("invalid configuration: fenced HSET on {name}: no fields given")
    );
    assert_eq!(rig.last_token().await, None, "nothing written");
}
on_both!(bad_input_is_the_same_error);

/// The user's test: holder A is paused past its lease, B takes the key and
/// writes, A wakes and writes late with its own token: B's write lands, A's is
/// `Stale { last: B, offered: A }`.
async fn a_paused_holders_late_write_is_refused(engine: Engine) {
    let rig = Rig::new(engine, "stock:1").await;
    let (a, b, proxy) = rig.paused_then_successor("sku:1").await;
    let (ta, tb) = (a.fencing_token(), b.fencing_token());
    assert!(tb > ta);

    assert_eq!(rig.set(tb, "from B").await.unwrap(), Fenced::Applied(()));
    assert_eq!(rig.set(ta, "from A").await.unwrap(), stale(ta, tb));
    assert_eq!(rig.incr_by(ta, 1).await.unwrap(), stale(ta, tb).map(|()| 0));
    assert_eq!(rig.string().await.as_deref(), Some("from B"));

    if let Some(proxy) = proxy {
        proxy.blackhole(false);
    }
    assert!(a.release().await.is_err(), "A's lease was lost");
    b.release().await.unwrap();
}
on_both!(a_paused_holders_late_write_is_refused);
