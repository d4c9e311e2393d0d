//! Real Redis topologies: a 3-primary Redis Cluster with one replica each.
//!
//! [`Node`] is one `redis-server` with extra arguments (cluster mode, sentinel
//! mode), supervised like [`RedisServer`](super::RedisServer): it dies with the
//! test process. Unlike `RedisServer::restart`, [`Node::restart`] keeps the node's
//! directory (its `nodes.conf` or sentinel config), so a restarted cluster node
//! rejoins the cluster (empty, as a replica once its shard failed over).
//!
//! [`Cluster::start`] runs six nodes on free loopback ports (client port and
//! cluster-bus port both reserved), `redis-cli --cluster create --cluster-replicas
//! 1 --cluster-yes`, and waits until every node sees `cluster_state:ok`. The nodes
//! use `cluster-node-timeout 1000` (a killed primary is replaced within a few
//! seconds) and `cluster-require-full-coverage no` (the other shards keep serving
//! while one fails over).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{
    Credentials, DATA_ARGS, SpawnError, Supervised, read_logs, release_port, reserve_port,
    send_signal, spawn_supervised, stop_supervised, tail, tempdir, wait_for_state,
};

/// One supervised `redis-server` with extra arguments; killed when dropped.
pub struct Node {
    port: u16,
    binary: PathBuf,
    args: Vec<String>,
    dir: tempfile::TempDir,
    state: Mutex<(Option<Supervised>, bool)>,
    /// The username (none: `default`) and password the node requires; its
    /// [`url`](Self::url) carries them.
    auth: Option<Credentials>,
}

impl Node {
    /// Starts `redis-server <config file written from conf> <args>` on a free port;
    /// `args(port)` gives the extra arguments (they may mention the port).
    pub fn start(conf: Option<&str>, args: impl Fn(u16) -> Vec<String>) -> Node {
        Node::start_inner(conf, args, None)
    }

    /// As [`start`](Self::start), for a node that `conf` or `args` make require
    /// `password` (as `username`; none: `default`): its startup check, its
    /// [`url`](Self::url), [`client`](Self::client) and [`cmd`](Self::cmd)
    /// authenticate.
    pub fn start_with_auth(
        conf: Option<&str>,
        args: impl Fn(u16) -> Vec<String>,
        username: Option<&str>,
        password: &str,
    ) -> Node {
        let auth = (username.map(str::to_owned), password.to_owned());
        Node::start_inner(conf, args, Some(auth))
    }

    fn start_inner(
        conf: Option<&str>,
        args: impl Fn(u16) -> Vec<String>,
        auth: Option<Credentials>,
    ) -> Node {
        let binary = crate::engine::server_binary();
        let dir = tempdir();
        let mut last = String::new();
        for _ in 0..8 {
            let port = reserve_port();
            let mut all = Vec::new();
            if let Some(conf) = conf {
                let path = dir.path().join("node.conf");
                std::fs::write(&path, conf).expect("write the node's config");
                all.push(path.display().to_string());
            }
            all.extend(args(port));
            match spawn_supervised(&binary, dir.path(), port, &all, &[], auth.as_ref()) {
                Ok(running) => {
                    return Node {
                        port,
                        binary,
                        args: all,
                        dir,
                        state: Mutex::new((Some(running), false)),
                        auth,
                    };
                }
                Err(SpawnError::PortConflict(m)) => {
                    release_port(port);
                    last = m;
                }
                Err(SpawnError::Failed(m)) => {
                    release_port(port);
                    panic!("{m}");
                }
            }
        }
        panic!("could not start a node on a free port: {last}");
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://[user:password@]127.0.0.1:PORT/` (credentials from
    /// [`start_with_auth`](Self::start_with_auth)).
    pub fn url(&self) -> String {
        match &self.auth {
            Some((user, password)) => format!(
                "redis://{}:{password}@127.0.0.1:{}/",
                user.as_deref().unwrap_or(""),
                self.port
            ),
            None => format!("redis://127.0.0.1:{}/", self.port),
        }
    }

    /// `127.0.0.1:PORT`
    pub fn hostport(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A client for [`url`](Self::url).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("client")
    }

    /// A multiplexed connection with generous timeouts.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        super::connection_for(&self.client()).await
    }

    /// Runs one command on this node (a fresh connection, 5 s bounds).
    pub async fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        self.cmd_within(Duration::from_secs(5), args).await
    }

    /// [`cmd`](Self::cmd) bounded by `bound` instead of 5 s: for the commands of
    /// a slot migration, which a busy machine (a `nodes.conf` write, Valkey's wait
    /// for its replicas' acknowledgement of `SETSLOT`) can hold for seconds.
    pub async fn cmd_within<T: redis::FromRedisValue>(
        &self,
        bound: Duration,
        args: &[&str],
    ) -> redis::RedisResult<T> {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        let client = self.client();
        let fut = async move {
            let mut conn = client.get_multiplexed_async_connection().await?;
            c.query_async::<T>(&mut conn).await
        };
        match tokio::time::timeout(bound, fut).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
        }
    }

    /// Whether this node has `name`, asked as a cluster replica may be (after
    /// `READONLY`); `false` when it does not answer.
    pub async fn has_key(&self, name: &str) -> bool {
        let mut con = self.connection().await;
        redis::cmd("READONLY")
            .query_async::<()>(&mut con)
            .await
            .ok();
        redis::cmd("EXISTS")
            .arg(name)
            .query_async::<bool>(&mut con)
            .await
            .unwrap_or(false)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<Supervised>, bool)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the process runs (possibly paused).
    pub fn is_running(&self) -> bool {
        self.lock().0.is_some()
    }

    /// `SIGKILL`; the data in memory is lost, the directory stays.
    pub fn kill(&self) {
        let mut s = self.lock();
        if let Some(r) = s.0.take() {
            stop_supervised(r, s.1);
        }
        s.1 = false;
    }

    /// `SIGSTOP`.
    pub fn pause(&self) {
        let mut s = self.lock();
        let pid = s.0.as_ref().map(|r| r.pid).expect("pause: not running");
        if !s.1 {
            send_signal(pid, "STOP");
            wait_for_state(pid, |st| st == Some('T') || st == Some('t'));
            s.1 = true;
        }
    }

    /// `SIGCONT`.
    pub fn resume(&self) {
        let mut s = self.lock();
        let pid = s.0.as_ref().map(|r| r.pid).expect("resume: not running");
        if s.1 {
            send_signal(pid, "CONT");
            wait_for_state(pid, |st| st != Some('T') && st != Some('t'));
            s.1 = false;
        }
    }

    /// Kills the node if it runs and starts it again on the same port, with the
    /// same directory (cluster `nodes.conf`, sentinel config) and arguments.
    pub fn restart(&self) {
        let mut s = self.lock();
        if let Some(r) = s.0.take() {
            stop_supervised(r, s.1);
        }
        s.1 = false;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match spawn_supervised(
                &self.binary,
                self.dir.path(),
                self.port,
                &self.args,
                &[],
                self.auth.as_ref(),
            ) {
                Ok(r) => {
                    s.0 = Some(r);
                    return;
                }
                Err(SpawnError::PortConflict(m)) if Instant::now() < deadline => {
                    let _ = m;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(SpawnError::PortConflict(m) | SpawnError::Failed(m)) => {
                    drop(s);
                    panic!("restart: {m}");
                }
            }
        }
    }

    /// The last lines of the node's log.
    pub fn log_tail(&self) -> String {
        tail(&read_logs(self.dir.path()), 30)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        release_port(self.port);
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// The node id.
    pub id: String,
    /// `127.0.0.1:PORT`
    pub addr: String,
    /// Whether it is a primary.
    pub primary: bool,
    /// Whether it is flagged failing.
    pub failed: bool,
    /// The primary's id (replicas).
    pub of: Option<String>,
    /// Slot ranges (primaries).
    pub slots: Vec<(u16, u16)>,
}

/// A 3-primary, 3-replica Redis Cluster on loopback.
pub struct Cluster {
    /// The six nodes, in creation order (`redis-cli` makes the first three primaries).
    pub nodes: Vec<Node>,
}

impl Cluster {
    /// Starts six cluster nodes and creates the cluster; waits until it is ok.
    pub fn start() -> Cluster {
        let nodes: Vec<Node> = (0..6)
            .map(|_| {
                let bus = reserve_port();
                Node::start(None, move |_| {
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "1000",
                        "--cluster-require-full-coverage",
                        "no",
                        "--cluster-replica-validity-factor",
                        "0",
                        "--cluster-port",
                        &bus.to_string(),
                    ]
                    .iter()
                    .chain(&DATA_ARGS)
                    .map(|s| s.to_string())
                    .collect()
                })
            })
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(nodes.iter().map(Node::hostport))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster { nodes };
        cluster.wait_ok_blocking(Duration::from_secs(30));
        cluster
    }

    /// The URLs of all nodes (the seed list a backend is given).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// The node with client address `addr`.
    pub fn by_addr(&self, addr: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.hostport() == addr)
            .unwrap_or_else(|| panic!("no node at {addr}"))
    }

    fn wait_ok_blocking(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let ok = self.nodes.iter().filter(|n| n.is_running()).all(|n| {
                let out = Command::new("redis-cli")
                    .args(["-p", &n.port().to_string(), "cluster", "info"])
                    .output();
                out.is_ok_and(|o| {
                    let s = String::from_utf8_lossy(&o.stdout);
                    s.contains("cluster_state:ok")
                        && s.contains("cluster_slots_assigned:16384")
                        && s.contains("cluster_slots_ok:16384")
                })
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ok within {timeout:?}; last log lines:\n{}",
                self.nodes[0].log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every running node reports `cluster_state:ok` with all slots
    /// served, and all agree on the primaries.
    pub async fn wait_ok(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let mut ok = true;
            let mut views = Vec::new();
            for n in self.nodes.iter().filter(|n| n.is_running()) {
                match n.cmd::<String>(&["CLUSTER", "INFO"]).await {
                    Ok(s)
                        if s.contains("cluster_state:ok")
                            && s.contains("cluster_slots_ok:16384") => {}
                    _ => ok = false,
                }
                if let Ok(v) = n.cmd::<String>(&["CLUSTER", "NODES"]).await {
                    let mut p: Vec<String> = parse(&v)
                        .into_iter()
                        .filter(|i| i.primary && !i.failed && !i.slots.is_empty())
                        .map(|i| i.addr)
                        .collect();
                    p.sort();
                    views.push(p);
                } else {
                    ok = false;
                }
            }
            views.dedup();
            if ok && views.len() == 1 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not settle within {timeout:?}: views {views:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `CLUSTER NODES` as seen by the first running node that answers.
    pub async fn topology(&self) -> Vec<NodeInfo> {
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            if let Ok(v) = n.cmd::<String>(&["CLUSTER", "NODES"]).await {
                return parse(&v);
            }
        }
        panic!("no cluster node answers CLUSTER NODES");
    }

    /// The slot of a Redis name.
    pub fn slot(name: &[u8]) -> u16 {
        // The hash tag: the bytes between the first `{` and the next `}`, if any.
        let tagged = name
            .iter()
            .position(|&b| b == b'{')
            .and_then(|open| {
                let rest = &name[open + 1..];
                let close = rest.iter().position(|&b| b == b'}')?;
                (close > 0).then(|| &rest[..close])
            })
            .unwrap_or(name);
        crc16(tagged) % 16384
    }

    /// The primary that serves `slot` now.
    pub async fn primary_of_slot(&self, slot: u16) -> NodeInfo {
        self.topology()
            .await
            .into_iter()
            .find(|i| {
                i.primary && !i.failed && i.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
            })
            .unwrap_or_else(|| panic!("no primary serves slot {slot}"))
    }

    /// The replicas of primary `id`.
    pub async fn replicas_of(&self, id: &str) -> Vec<NodeInfo> {
        self.topology()
            .await
            .into_iter()
            .filter(|i| i.of.as_deref() == Some(id))
            .collect()
    }

    /// The current primaries with slots, sorted by their first slot.
    pub async fn primaries(&self) -> Vec<NodeInfo> {
        let mut p: Vec<NodeInfo> = self
            .topology()
            .await
            .into_iter()
            .filter(|i| i.primary && !i.failed && !i.slots.is_empty())
            .collect();
        p.sort_by_key(|i| i.slots[0].0);
        p
    }

    /// The primary that serves `slot` now, and another primary (where to move it).
    pub async fn slot_move(&self, slot: u16) -> (NodeInfo, NodeInfo) {
        let from = self.primary_of_slot(slot).await;
        let to = self
            .primaries()
            .await
            .into_iter()
            .find(|p| p.id != from.id)
            .expect("a cluster has another primary");
        (from, to)
    }

    /// Moves `slot` (and its keys) from primary `from` to primary `to` the way
    /// `redis-cli --cluster reshard` does: `SETSLOT IMPORTING` on the target,
    /// `SETSLOT MIGRATING` on the source, `MIGRATE` of every key, `SETSLOT NODE`
    /// on both. `between` runs after the slot is marked migrating and before the
    /// keys move (the window in which clients get `ASK`).
    pub async fn migrate_slot<F: std::future::Future<Output = ()>>(
        &self,
        slot: u16,
        from: &NodeInfo,
        to: &NodeInfo,
        between: F,
    ) {
        let src = self.by_addr(&from.addr);
        let dst = self.by_addr(&to.addr);
        let s = slot.to_string();
        let _: () = self
            .admin(dst, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from.id])
            .await;
        let _: () = self
            .admin(src, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to.id])
            .await;
        between.await;
        loop {
            let keys: Vec<String> = self
                .admin(src, &["CLUSTER", "GETKEYSINSLOT", &s, "100"])
                .await;
            if keys.is_empty() {
                break;
            }
            let port = dst.port().to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let _: redis::Value = self.admin(src, &args).await;
        }
        for n in [dst, src] {
            let _: () = self
                .admin(n, &["CLUSTER", "SETSLOT", &s, "NODE", &to.id])
                .await;
        }
        // Tell the others at once (they would learn it from the bus anyway).
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            let _ = n
                .cmd::<()>(&["CLUSTER", "SETSLOT", &s, "NODE", &to.id])
                .await;
        }
    }

    /// One command of a slot migration on `node`, bounded generously (30 s): only
    /// a server that is really stuck fails the test here, and then the panic
    /// carries what every node reported (replication, clients, slots, log).
    async fn admin<T: redis::FromRedisValue>(&self, node: &Node, args: &[&str]) -> T {
        const ADMIN: Duration = Duration::from_secs(30);
        match node.cmd_within(ADMIN, args).await {
            Ok(v) => v,
            Err(e) => panic!(
                "{} on {}: {e}\n{}",
                args[..args.len().min(4)].join(" "),
                node.hostport(),
                self.report().await
            ),
        }
    }

    /// What each node says about itself: for the message of a failed test.
    pub async fn report(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            out += &format!("--- {} (running: {})\n", n.hostport(), n.is_running());
            for args in [
                &["INFO", "replication"][..],
                &["CLIENT", "LIST"],
                &["CLUSTER", "NODES"],
            ] {
                let r = n.cmd_within::<String>(Duration::from_secs(2), args).await;
                out += &format!(
                    "{}: {}\n",
                    args.join(" "),
                    r.unwrap_or_else(|e| e.to_string())
                );
            }
            out += &n.log_tail();
            out += "\n";
        }
        out
    }
}

/// Parses `CLUSTER NODES`.
pub fn parse(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => {
                        let n = s.parse().ok()?;
                        Some((n, n))
                    }
                })
                .collect();
            Some(NodeInfo {
                id: f[0].to_owned(),
                addr: f[1].split('@').next().unwrap_or("").to_owned(),
                primary: flags.contains(&"master"),
                failed: flags.iter().any(|x| *x == "fail" || *x == "fail?"),
                of: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// CRC16-CCITT (XMODEM), the Redis Cluster key hash.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}
