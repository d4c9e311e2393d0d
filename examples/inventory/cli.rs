//! Command line of the `inventory` and `demo` examples (they share it: the demo
//! starts copies of its own executable as inventory instances and as the gateway).
//!
//! ```text
//! inventory [serve]               one instance (env: REDIS_URL, PORT, BIND, ...)
//! inventory gateway NAME=URL ...  a gateway routing each SKU to one instance
//! inventory demo [--cluster]      the multi-process demo (on a private 3-shard
//!                                 Redis Cluster with --cluster; needs the
//!                                 `cluster` feature)
//! ```
//!
//! Environment of `serve`:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `REDIS_URL` | lock in this Redis | the in-process backend (single instance) |
//! | `REDIS_CLUSTER_URLS` | lock in this Redis Cluster (comma-separated nodes; feature `cluster`) | unset |
//! | `BIND`, `PORT` | listen address (loopback only) | `127.0.0.1`, `3000` |
//! | `DATABASE_PATH` | SQLite file, shareable by instances | a file in a temporary directory |
//! | `INVENTORY_LOCKING` | `plain` (no coalescing), `coalesced`, `handoff` | `coalesced` |
//! | `INSTANCE_NAME` | name in responses and logs | `inventory` |
//! | `LOCK_WAIT_TIMEOUT_MS` | how long a request waits for its lock | `5000` |

use std::error::Error;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use lockflight::{Handoff, LockBackend, Locker, MemoryBackend, RedisBackend};

use crate::app::{self, AppState};
use crate::{demo, gateway};

type BoxError = Box<dyn Error + Send + Sync>;

/// Runs the command line; `default` (`"serve"` or `"demo"`) when no subcommand is
/// given.
pub(crate) async fn main(default: &str) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // A leading flag (`demo --cluster` run as `cargo run --example demo -- --cluster`)
    // belongs to the default command.
    let command = args
        .first()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .unwrap_or(default);
    let result = match command {
        "serve" => serve().await,
        "demo" => demo_until_interrupted(args.iter().any(|a| a == "--cluster")).await,
        "gateway" => run_gateway(args.get(1..).unwrap_or_default()).await,
        other => {
            eprintln!(
                "unknown command {other:?}\n\nusage:\n  inventory [serve]\n  \
                 inventory gateway NAME=http://127.0.0.1:PORT ...\n  inventory demo [--cluster]"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The demo, stopped early (and cleaned up: children and Redis are killed when the
/// demo's future is dropped) on Ctrl-C or SIGTERM.
async fn demo_until_interrupted(cluster: bool) -> Result<(), BoxError> {
    tokio::select! {
        result = demo::run(cluster) => result,
        () = shutdown_signal(false) => {
            eprintln!("\ninterrupted: stopping the instances and Redis");
            Ok(())
        }
    }
}

/// Locking modes of an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Locking {
    /// `coalescing(false)`: every request competes at Redis on its own.
    Plain,
    /// lockflight's default: one competitor per SKU per process.
    Coalesced,
    /// Coalescing plus local lease handoff.
    Handoff,
}

impl Locking {
    /// Parses `plain`, `coalesced` or `handoff`.
    pub(crate) fn parse(s: &str) -> Option<Locking> {
        match s {
            "plain" => Some(Locking::Plain),
            "coalesced" => Some(Locking::Coalesced),
            "handoff" => Some(Locking::Handoff),
            _ => None,
        }
    }

    /// The name `parse` takes.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Locking::Plain => "plain",
            Locking::Coalesced => "coalesced",
            Locking::Handoff => "handoff",
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `BIND`:`PORT`, refusing anything but loopback (the example has no auth).
fn listen_addr() -> Result<SocketAddr, BoxError> {
    let ip: IpAddr = env("BIND")
        .unwrap_or_else(|| "127.0.0.1".into())
        .parse()
        .map_err(|e| format!("BIND: {e}"))?;
    if !ip.is_loopback() {
        return Err(format!(
            "BIND={ip}: this example listens on loopback addresses only (it has no authentication)"
        )
        .into());
    }
    let port: u16 = env("PORT")
        .unwrap_or_else(|| "3000".into())
        .parse()
        .map_err(|e| format!("PORT: {e}"))?;
    Ok(SocketAddr::new(ip, port))
}

/// Hides the password of `redis://user:password@host`.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// One inventory instance, configured from the environment.
async fn serve() -> Result<(), BoxError> {
    let name = env("INSTANCE_NAME").unwrap_or_else(|| "inventory".into());
    let locking = match env("INVENTORY_LOCKING") {
        Some(s) => Locking::parse(&s).ok_or_else(|| {
            format!("INVENTORY_LOCKING={s}: expected plain, coalesced or handoff")
        })?,
        None => Locking::Coalesced,
    };
    let wait_ms: u64 = env("LOCK_WAIT_TIMEOUT_MS")
        .map(|v| v.parse())
        .transpose()
        .map_err(|e| format!("LOCK_WAIT_TIMEOUT_MS: {e}"))?
        .unwrap_or(5000);
    let addr = listen_addr()?;

    let (backend, kind): (Arc<dyn LockBackend>, &str) =
        match (env("REDIS_CLUSTER_URLS"), env("REDIS_URL")) {
            (Some(urls), _) => (cluster_backend(&name, &urls).await?, "redis-cluster"),
            (None, Some(url)) => {
                let backend = RedisBackend::connect(&url).await?;
                println!("[{name}] locking in Redis at {}", redact(&url));
                (Arc::new(backend), "redis")
            }
            (None, None) => {
                println!(
                    "[{name}] REDIS_URL is not set: running single-instance on the in-process \
                 backend (locks are not shared with other processes)"
                );
                (Arc::new(MemoryBackend::new()), "memory")
            }
        };
    let locker = Locker::builder(backend)
        .wait_timeout(Duration::from_millis(wait_ms))
        .coalescing(locking != Locking::Plain)
        .handoff(if locking == Locking::Handoff {
            Handoff::enabled()
        } else {
            Handoff::disabled()
        })
        .build()?;

    let _tmp; // keeps a temporary database directory alive until exit
    let db_path: PathBuf = match env("DATABASE_PATH") {
        Some(path) => PathBuf::from(path),
        None => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("inventory.db");
            _tmp = dir;
            path
        }
    };
    let db = app::open_db(Some(&db_path)).await?;
    println!("[{name}] database {}", db_path.display());

    let state = AppState::new(db, locker, &name).describe(kind, locking.name());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    println!(
        "[{name}] locking mode {}; listening on http://{local}",
        locking.name()
    );
    let watch_stdin = env("INVENTORY_EXIT_ON_STDIN_EOF").is_some();
    axum::serve(listener, app::app(state))
        .with_graceful_shutdown(shutdown_signal(watch_stdin))
        .await?;
    println!("[{name}] stopped");
    Ok(())
}

/// `gateway NAME=URL ...`: the SKU-routing gateway.
async fn run_gateway(args: &[String]) -> Result<(), BoxError> {
    let upstreams: Vec<(String, String)> = args
        .iter()
        .map(|a| {
            a.split_once('=')
                .map(|(n, u)| (n.to_owned(), u.to_owned()))
                .ok_or_else(|| format!("expected NAME=URL, got {a:?}"))
        })
        .collect::<Result<_, _>>()?;
    if upstreams.is_empty() {
        return Err("usage: inventory gateway NAME=http://127.0.0.1:PORT ...".into());
    }
    let (router, members) = gateway::gateway(&upstreams);
    let listener = tokio::net::TcpListener::bind(listen_addr()?).await?;
    let local = listener.local_addr()?;
    let names: Vec<String> = members.members().into_iter().map(|(n, _)| n).collect();
    println!(
        "[gateway] routing each SKU to one of {}; listening on http://{local}",
        names.join(", ")
    );
    let watch_stdin = env("INVENTORY_EXIT_ON_STDIN_EOF").is_some();
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal(watch_stdin))
        .await?;
    Ok(())
}

/// Resolves on Ctrl-C, on SIGTERM, and — with `watch_stdin` — when standard input
/// reaches its end (the demo holds a pipe to each child's stdin, so children stop
/// even if the demo is killed outright).
pub(crate) async fn shutdown_signal(watch_stdin: bool) {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        #[cfg(unix)]
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
            return;
        }
        std::future::pending::<()>().await;
    };
    let stdin_eof = async {
        if !watch_stdin {
            return std::future::pending::<()>().await;
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            let _ = tx.send(());
        });
        let _ = rx.await;
    };
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
        () = stdin_eof => {}
    }
}

/// A backend on the Redis Cluster whose nodes are `urls` (comma-separated).
#[cfg(feature = "cluster")]
async fn cluster_backend(name: &str, urls: &str) -> Result<Arc<dyn LockBackend>, BoxError> {
    let nodes: Vec<&str> = urls.split(',').filter(|u| !u.is_empty()).collect();
    let backend = RedisBackend::cluster(nodes.iter().copied())
        .connect()
        .await?;
    println!(
        "[{name}] locking in a Redis Cluster of {} seed node(s)",
        nodes.len()
    );
    Ok(Arc::new(backend))
}

#[cfg(not(feature = "cluster"))]
async fn cluster_backend(_name: &str, _urls: &str) -> Result<Arc<dyn LockBackend>, BoxError> {
    Err(
        "REDIS_CLUSTER_URLS is set, but this build has no Redis Cluster support: \
         build with --features axum,cluster"
            .into(),
    )
}
