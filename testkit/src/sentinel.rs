//! A Sentinel topology on loopback: one primary, two replicas, three sentinels
//! (quorum 2, `down-after-milliseconds 1000`, `failover-timeout 5000`).
//!
//! Every node is a [`Node`]: it can be killed, paused (`SIGSTOP`) and restarted
//! (same port, same directory). [`Sentinels::failover`] runs `SENTINEL FAILOVER`;
//! [`Sentinels::wait_primary_change`] waits until the sentinels name another
//! primary and it answers `ROLE` as master.
//!
//! [`Sentinels::start_with_auth`] starts a second kind of set where every data
//! node refuses unauthenticated clients (an ACL user, the `default` user off;
//! replicas authenticate with `masteruser`/`masterauth`, sentinels with `sentinel
//! auth-user`/`auth-pass`) and the sentinels have a password of their own.

use std::time::{Duration, Instant};

use super::cluster::Node;
use super::process::data_args;

/// The monitored master's name.
pub const MASTER: &str = "lfmaster";

/// Primary + 2 replicas + 3 sentinels.
pub struct Sentinels {
    /// The data nodes: `[0]` starts as the primary.
    pub data: Vec<Node>,
    /// The sentinels.
    pub sentinels: Vec<Node>,
}

/// The credentials of a [`Sentinels::start_with_auth`] set.
#[derive(Clone, Debug)]
pub struct Auth {
    /// The ACL user of the data nodes (the only one: `default` is off).
    pub username: String,
    /// Its password.
    pub password: String,
    /// The sentinels' `requirepass`.
    pub sentinel_password: String,
}

impl Default for Auth {
    fn default() -> Auth {
        Auth {
            username: "locks".into(),
            password: "primary-secret".into(),
            sentinel_password: "sentinel-secret".into(),
        }
    }
}

impl Sentinels {
    /// Starts the topology and waits until every sentinel sees both replicas and
    /// the two other sentinels.
    pub async fn start() -> Sentinels {
        Sentinels::start_inner(None).await
    }

    /// As [`start`](Self::start), with every node requiring `auth`'s credentials
    /// (see the module docs). The nodes' [`Node::url`]s carry them.
    pub async fn start_with_auth(auth: &Auth) -> Sentinels {
        Sentinels::start_inner(Some(auth)).await
    }

    async fn start_inner(auth: Option<&Auth>) -> Sentinels {
        let data_conf = auth.map(|a| {
            format!(
                "user default off\n\
                 user {u} on >{p} ~* &* +@all\n\
                 masteruser {u}\n\
                 masterauth {p}\n",
                u = a.username,
                p = a.password
            )
        });
        let data_node = |args: &dyn Fn(u16) -> Vec<String>| match auth {
            Some(a) => {
                Node::start_with_auth(data_conf.as_deref(), args, Some(&a.username), &a.password)
            }
            None => Node::start(None, args),
        };
        let primary = data_node(&|_| data_args());
        let pport = primary.port();
        let replicas: Vec<Node> = (0..2)
            .map(|_| {
                data_node(&move |_| {
                    let mut a = data_args();
                    a.extend(["--replicaof".into(), "127.0.0.1".into(), pport.to_string()]);
                    a
                })
            })
            .collect();
        let mut conf = format!(
            "sentinel monitor {MASTER} 127.0.0.1 {pport} 2\n\
             sentinel down-after-milliseconds {MASTER} 1000\n\
             sentinel failover-timeout {MASTER} 5000\n\
             sentinel parallel-syncs {MASTER} 2\n"
        );
        if let Some(a) = auth {
            conf.push_str(&format!(
                "sentinel auth-user {MASTER} {u}\n\
                 sentinel auth-pass {MASTER} {p}\n\
                 requirepass {s}\n\
                 sentinel sentinel-pass {s}\n",
                u = a.username,
                p = a.password,
                s = a.sentinel_password
            ));
        }
        let sentinels: Vec<Node> = (0..3)
            .map(|_| {
                let args = |_| vec!["--sentinel".into()];
                match auth {
                    Some(a) => Node::start_with_auth(Some(&conf), args, None, &a.sentinel_password),
                    None => Node::start(Some(&conf), args),
                }
            })
            .collect();
        let mut data = vec![primary];
        data.extend(replicas);
        let s = Sentinels { data, sentinels };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut ok = true;
            for sn in &s.sentinels {
                let info: String = sn.cmd(&["INFO", "sentinel"]).await.unwrap_or_default();
                // master0:name=lfmaster,status=ok,address=…,slaves=2,sentinels=3
                ok &= info.contains("status=ok,")
                    && info.contains("slaves=2,")
                    && info.contains("sentinels=3");
            }
            if ok {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not discover the topology within 30 s:\n{}",
                s.sentinels[0].log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The sentinels' URLs (with their password, for a
    /// [`start_with_auth`](Self::start_with_auth) set).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Node::url).collect()
    }

    /// `127.0.0.1:PORT` of the primary as the first answering sentinel names it.
    pub async fn primary_addr(&self) -> String {
        for sn in self.sentinels.iter().filter(|n| n.is_running()) {
            if let Ok((host, port)) = sn
                .cmd::<(String, String)>(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])
                .await
            {
                return format!("{host}:{port}");
            }
        }
        panic!("no sentinel names the primary");
    }

    /// The data node at `addr`.
    pub fn by_addr(&self, addr: &str) -> &Node {
        self.data
            .iter()
            .find(|n| n.hostport() == addr)
            .unwrap_or_else(|| panic!("no data node at {addr}"))
    }

    /// The current primary.
    pub async fn primary(&self) -> &Node {
        let addr = self.primary_addr().await;
        self.by_addr(&addr)
    }

    /// `SENTINEL FAILOVER` (retried while a previous failover is still in progress).
    pub async fn failover(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.sentinels[0]
                .cmd::<()>(&["SENTINEL", "FAILOVER", MASTER])
                .await
            {
                Ok(()) => return,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "SENTINEL FAILOVER kept failing: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the sentinels name a primary other than `old` that answers
    /// `ROLE` as master; returns its address.
    pub async fn wait_primary_change(&self, old: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.primary_addr().await;
            if now != old {
                let role: Result<Vec<redis::Value>, _> = self.by_addr(&now).cmd(&["ROLE"]).await;
                if let Ok(r) = role
                    && matches!(r.first(), Some(redis::Value::BulkString(b)) if b == b"master")
                {
                    return now;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the primary did not change within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every running data node other than the primary is its
    /// replica with the link up, and every sentinel agrees on the primary.
    pub async fn wait_settled(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let primary = self.primary_addr().await;
            let mut ok = true;
            for sn in self.sentinels.iter().filter(|n| n.is_running()) {
                let named = sn
                    .cmd::<(String, String)>(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])
                    .await
                    .map(|(h, p)| format!("{h}:{p}"));
                ok &= named.as_deref() == Ok(primary.as_str());
            }
            for n in self
                .data
                .iter()
                .filter(|n| n.is_running() && n.hostport() != primary)
            {
                let info: String = n.cmd(&["INFO", "replication"]).await.unwrap_or_default();
                let port = primary.rsplit(':').next().unwrap_or("");
                ok &= info.contains("role:slave")
                    && info.contains(&format!("master_port:{port}"))
                    && info.contains("master_link_status:up");
            }
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinel topology did not settle within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
