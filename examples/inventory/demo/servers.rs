//! The demo's servers: where the instances lock (a private `redis-server`, a
//! private Redis Cluster, or `REDIS_URL`), and the inventory instances and the
//! gateway as child processes of this executable.
//!
//! Everything it starts, it stops: the children run with `kill_on_drop` and also
//! exit when their stdin pipe closes (so they go even if the demo is killed
//! outright), and a private `redis-server` runs under a tiny `sh` supervisor that
//! kills it when its stdin pipe closes.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::cli::redact;
use crate::client::BoxError;

/// How long a child may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Where the instances lock: one Redis (its URL) or a Redis Cluster (its nodes).
#[derive(Clone, Debug)]
pub(super) enum Target {
    Single(String),
    Cluster(Vec<String>),
}

impl Target {
    /// The environment variable that points an instance at it.
    pub(super) fn env(&self) -> (&'static str, String) {
        match self {
            Target::Single(url) => ("REDIS_URL", url.clone()),
            Target::Cluster(nodes) => ("REDIS_CLUSTER_URLS", nodes.join(",")),
        }
    }

    /// Every server whose commands count.
    pub(super) fn servers(&self) -> Vec<String> {
        match self {
            Target::Single(url) => vec![url.clone()],
            Target::Cluster(nodes) => nodes.clone(),
        }
    }
}

/// Where the instances will lock, and the private servers started for it (stop
/// them at the end): with `cluster`, a private 3-shard Redis Cluster; else the
/// Redis of `REDIS_URL`, or a private `redis-server`, or none (the in-process
/// backend) when neither is there.
pub(super) async fn start_redis(
    cluster: bool,
) -> Result<(Option<Target>, Vec<PrivateRedis>), BoxError> {
    let mut private = Vec::new();
    let target = if cluster {
        if !cfg!(feature = "cluster") {
            return Err("--cluster needs the cluster feature: \
                        cargo run -p examples --example demo --features cluster -- --cluster"
                .into());
        }
        let bin =
            find_on_path("redis-server").ok_or("--cluster needs redis-server and redis-cli")?;
        let nodes = PrivateRedis::start_cluster(&bin, 3).await?;
        let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
        println!(
            "Redis: private 3-shard Redis Cluster on {} (temporary directories, no \
             persistence, stopped at exit)",
            urls.join(", ")
        );
        private = nodes;
        Some(Target::Cluster(urls))
    } else {
        match std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()) {
            Some(url) => {
                println!("Redis: {} (from REDIS_URL)", redact(&url));
                Some(Target::Single(url))
            }
            None => match find_on_path("redis-server") {
                Some(bin) => {
                    let redis = PrivateRedis::start(&bin, &[]).await?;
                    println!(
                        "Redis: private redis-server on {}\n\
                         (temporary directory, no persistence, stopped at exit)",
                        redis.url
                    );
                    let url = redis.url.clone();
                    private.push(redis);
                    Some(Target::Single(url))
                }
                None => {
                    println!(
                        "Redis: REDIS_URL is not set and redis-server is not installed: running ONE \
                         instance on the in-process backend (no cross-process locking to show; \
                         install redis-server, or set REDIS_URL, for the multi-process demo)"
                    );
                    None
                }
            },
        }
    };
    Ok((target, private))
}

/// A child running this executable (`serve` or `gateway`), listening on `url`.
#[derive(Debug)]
pub(super) struct Proc {
    pub(super) name: String,
    pub(super) url: String,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Proc {
    /// Starts `current_exe() args...` with `envs` on 127.0.0.1 and a free port, and
    /// waits until it prints its address.
    pub(super) async fn spawn(
        name: &str,
        args: &[&str],
        envs: &[(&str, String)],
    ) -> Result<Proc, BoxError> {
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .env_remove("REDIS_URL")
            .env("BIND", "127.0.0.1")
            .env("PORT", "0")
            .env("INVENTORY_EXIT_ON_STDIN_EOF", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let mut lines = BufReader::new(stdout).lines();
        let url = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some((_, url)) = line.split_once("listening on ") {
                    return Ok::<_, BoxError>(url.trim().to_owned());
                }
            }
            Err(format!("{name} exited before listening").into())
        })
        .await
        .map_err(|_| format!("{name} did not start within {START_TIMEOUT:?}"))??;
        // Keep draining its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Proc {
            name: name.to_owned(),
            url,
            child,
            stdin,
        })
    }

    /// Its process id (`None` once it has exited).
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills it at once with SIGKILL (`kill -9`): it cleans nothing up and
    /// releases nothing; its leases expire at their TTL.
    pub(super) async fn kill(mut self) -> std::io::Result<()> {
        self.child.kill().await
    }

    /// Graceful stop: close its stdin, wait up to 5 s, then kill.
    pub(super) async fn stop(mut self) {
        drop(self.stdin.take());
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// The supervisor of the private Redis: `$1` the binary, then its arguments. It
/// kills the server when its stdin (a pipe held by the demo) closes — also when the
/// demo dies without cleaning up.
const SUPERVISOR: &str = r#"
bin=$1; shift
"$bin" "$@" </dev/null >/dev/null 2>&1 &
pid=$!
trap 'kill -9 "$pid" 2>/dev/null; exit 0' HUP INT TERM
read -r _ || true
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
exit 0
"#;

/// A private `redis-server` on a free loopback port.
#[derive(Debug)]
pub(super) struct PrivateRedis {
    pub(super) url: String,
    supervisor: Child,
    stdin: Option<ChildStdin>,
    _dir: tempfile::TempDir,
}

impl PrivateRedis {
    pub(super) async fn start(bin: &Path, extra: &[&str]) -> Result<PrivateRedis, BoxError> {
        let mut last = String::new();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let dir = tempfile::tempdir()?;
            let log = dir.path().join("redis.log");
            let mut supervisor = Command::new("sh")
                .arg("-c")
                .arg(SUPERVISOR)
                .arg("sh")
                .arg(bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(extra)
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let stdin = supervisor.stdin.take();
            let redis = PrivateRedis {
                url: format!("redis://127.0.0.1:{port}/"),
                supervisor,
                stdin,
                _dir: dir,
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if ping(&redis.url).await {
                    return Ok(redis);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            last = std::fs::read_to_string(&log).unwrap_or_default();
            redis.stop().await;
        }
        Err(format!("redis-server did not start; its log:\n{last}").into())
    }

    /// `n` cluster-enabled servers joined into a Redis Cluster of `n` primaries
    /// (no replicas) by `redis-cli --cluster create`, ready when every node reports
    /// `cluster_state:ok`.
    pub(super) async fn start_cluster(bin: &Path, n: usize) -> Result<Vec<PrivateRedis>, BoxError> {
        let cli = find_on_path("redis-cli").ok_or("--cluster needs redis-cli")?;
        let mut nodes = Vec::new();
        for _ in 0..n {
            let args = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"];
            nodes.push(PrivateRedis::start(bin, &args).await?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| {
                n.url
                    .trim_start_matches("redis://")
                    .trim_end_matches('/')
                    .to_owned()
            })
            .collect();
        let out = Command::new(cli)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .await?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )
            .into());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &nodes {
            loop {
                let mut con = redis_connection(&node.url).await?;
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut con)
                    .await?;
                if info.contains("cluster_state:ok") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err("the private cluster did not reach cluster_state:ok".into());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(nodes)
    }

    pub(super) async fn stop(mut self) {
        drop(self.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.supervisor.wait()).await;
    }
}

async fn ping(url: &str) -> bool {
    let Ok(mut con) = redis_connection(url).await else {
        return false;
    };
    redis::cmd("PING")
        .query_async::<String>(&mut con)
        .await
        .is_ok()
}

pub(super) fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

pub(super) async fn redis_connection(
    url: &str,
) -> Result<redis::aio::MultiplexedConnection, BoxError> {
    let client = redis::Client::open(url)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}
