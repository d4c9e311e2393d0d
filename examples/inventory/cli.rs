//! Command line of the `inventory` and `demo` examples (they share it: the demo
//! starts copies of its own executable as inventory instances and as the gateway),
//! parsed with clap; `--help` lists every flag.
//!
//! ```text
//! inventory [serve]               one instance (flags or env: REDIS_URL, PORT, ...)
//! inventory gateway NAME=URL ...  a gateway routing each SKU to one instance
//! inventory demo [--cluster]      the multi-process demo (on a private 3-shard
//!                                 Redis Cluster with --cluster; needs the
//!                                 `cluster` feature)
//! ```
//!
//! Every flag of `serve` may come from its environment variable (`--redis-url` from
//! `REDIS_URL`, `--locking` from `INVENTORY_LOCKING`, …): that is how the demo
//! configures its children.

use std::error::Error;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use lockflight::{Handoff, Locker, LockerBuilder, MemoryBackend, RedisBackend};

use crate::app::job::{self, JobConfig, LeaderJob};
use crate::app::plain_lock::{self, PlainLock};
use crate::app::{self, AppState};
use crate::{demo, gateway};

type BoxError = Box<dyn Error + Send + Sync>;

/// The inventory example: one instance, the SKU-routing gateway, or the demo.
#[derive(Debug, Parser)]
#[command(
    name = "inventory",
    version,
    about = "The lockflight inventory example: an axum service that reserves stock under a Redis lock, its SKU-routing gateway, and the multi-process demo"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One inventory instance (the default of the `inventory` example).
    Serve(ServeArgs),
    /// A gateway that routes each SKU to one instance.
    Gateway(GatewayArgs),
    /// The multi-process demo (the default of the `demo` example).
    Demo(DemoArgs),
}

/// Settings of one instance; each flag may also come from its environment variable.
#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Lock in this Redis (default: the in-process backend, single instance).
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// Lock in this Redis Cluster: comma-separated seed nodes (feature `cluster`).
    #[arg(long, env = "REDIS_CLUSTER_URLS", value_delimiter = ',')]
    redis_cluster_urls: Vec<String>,
    /// Listen address; loopback only (the example has no authentication).
    #[arg(long, env = "BIND", default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Listen port (0: any free port).
    #[arg(long, env = "PORT", default_value_t = 3000)]
    port: u16,
    /// SQLite file, shareable by instances (default: a file in a temporary directory).
    #[arg(long, env = "DATABASE_PATH")]
    database_path: Option<PathBuf>,
    /// How reservations lock their SKU.
    #[arg(long, env = "INVENTORY_LOCKING", value_enum, default_value_t = Locking::Handoff)]
    locking: Locking,
    /// Name in responses and logs.
    #[arg(long, env = "INSTANCE_NAME", default_value = "inventory")]
    instance_name: String,
    /// How long a request waits for its lock, in milliseconds.
    #[arg(long, env = "LOCK_WAIT_TIMEOUT_MS", default_value_t = 5000)]
    lock_wait_timeout_ms: u64,
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    exit: ExitArgs,
}

/// The leader-only job (`job.rs`): the elected instance releases expired
/// reservations.
#[derive(Debug, clap::Args)]
struct JobArgs {
    /// Campaign for the leader-only job and run it while leading (on/off).
    #[arg(
        long,
        env = "INVENTORY_LEADER_JOB",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    leader_job: bool,
    /// The job election's lease TTL, in milliseconds: about how long the
    /// instances go without a leader when it dies.
    #[arg(long, env = "JOB_LEASE_TTL_MS", default_value_t = job::DEFAULT_LEASE_TTL.as_millis() as u64)]
    job_lease_ttl_ms: u64,
    /// The period of the leader's sweeps, in milliseconds.
    #[arg(
        long,
        env = "JOB_EVERY_MS",
        default_value_t = job::DEFAULT_EVERY.as_millis() as u64,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    job_every_ms: u64,
    /// How long a reservation holds its units before the job releases them, in
    /// seconds.
    #[arg(long, env = "RESERVATION_HOLD_SECS", default_value_t = job::DEFAULT_HOLD.as_secs())]
    reservation_hold_secs: u64,
}

impl JobArgs {
    fn config(&self) -> JobConfig {
        JobConfig {
            lease_ttl: Duration::from_millis(self.job_lease_ttl_ms),
            every: Duration::from_millis(self.job_every_ms),
            hold: Duration::from_secs(self.reservation_hold_secs),
        }
    }
}

#[derive(Debug, clap::Args)]
struct GatewayArgs {
    /// Upstream instances, as NAME=http://127.0.0.1:PORT.
    #[arg(required = true, value_parser = parse_upstream)]
    upstreams: Vec<(String, String)>,
    /// Listen address; loopback only.
    #[arg(long, env = "BIND", default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Listen port (0: any free port).
    #[arg(long, env = "PORT", default_value_t = 3000)]
    port: u16,
    #[command(flatten)]
    exit: ExitArgs,
}

#[derive(Debug, Default, clap::Args)]
struct DemoArgs {
    /// Run the instances on a private 3-shard Redis Cluster (feature `cluster`).
    #[arg(long)]
    cluster: bool,
}

#[derive(Debug, clap::Args)]
struct ExitArgs {
    /// Also stop when standard input reaches its end (set by the demo for its
    /// children).
    #[arg(
        long,
        env = "INVENTORY_EXIT_ON_STDIN_EOF",
        hide = true,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    exit_on_stdin_eof: bool,
}

fn parse_upstream(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(n, u)| (n.to_owned(), u.to_owned()))
        .ok_or_else(|| format!("expected NAME=URL, got {s:?}"))
}

/// Runs the command line; `default` (`"serve"` or `"demo"`) when no subcommand is
/// given (flags after it belong to that default).
pub async fn main(default: &str) -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let has_command = args.get(1).and_then(|a| a.to_str()).is_some_and(|a| {
        ["serve", "gateway", "demo", "help"].contains(&a)
            || matches!(a, "-h" | "--help" | "-V" | "--version")
    });
    if !has_command {
        args.insert(1.min(args.len()), default.into());
    }
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Some(Command::Serve(a)) => serve(a).await,
        Some(Command::Gateway(a)) => run_gateway(a).await,
        Some(Command::Demo(a)) => demo_until_interrupted(a.cluster).await,
        None => unreachable!("a default command is inserted above"),
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

/// Locking modes of an instance (of `POST /items/{sku}/reserve`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Locking {
    /// No lockflight: a plain Redis lock (SET <key> <random token> NX PX 30000,
    /// retried every 1 ms until the wait timeout, released by a compare-and-delete
    /// script) per request; no fencing token, so the write is not fenced. Needs
    /// Redis. The other routes keep lockflight's locks.
    Plain,
    /// lockflight with its defaults: one competitor per SKU per process
    /// (coalescing), and a held lease passed to the next local waiter without a
    /// Redis request (handoff, `Handoff::enabled()`, on by default in the library).
    Handoff,
    /// lockflight with handoff turned off (`Handoff::disabled()`): still one
    /// competitor per SKU per process, but every critical section acquires its
    /// lease from Redis.
    Coalesced,
}

impl Locking {
    /// The mode's name on the command line (`INVENTORY_LOCKING`).
    pub fn name(self) -> &'static str {
        match self {
            Locking::Plain => "plain",
            Locking::Coalesced => "coalesced",
            Locking::Handoff => "handoff",
        }
    }
}

/// `bind`:`port`, refusing anything but loopback (the example has no auth).
fn listen_addr(bind: IpAddr, port: u16) -> Result<SocketAddr, BoxError> {
    if !bind.is_loopback() {
        return Err(format!(
            "BIND={bind}: this example listens on loopback addresses only (it has no authentication)"
        )
        .into());
    }
    Ok(SocketAddr::new(bind, port))
}

/// Hides the password of `redis://user:password@host`.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// One inventory instance.
async fn serve(args: ServeArgs) -> Result<(), BoxError> {
    let name = args.instance_name;
    let locking = args.locking;
    let wait_ms = args.lock_wait_timeout_ms;
    let addr = listen_addr(args.bind, args.port)?;
    let redis_url = args.redis_url.filter(|u| !u.is_empty());
    let cluster_urls: Vec<String> = args
        .redis_cluster_urls
        .into_iter()
        .filter(|u| !u.is_empty())
        .collect();

    let plain = match locking {
        Locking::Plain => Some(plain_lock(&cluster_urls, redis_url.as_deref(), wait_ms).await?),
        _ => None,
    };
    // Two lockers over one backend: the reservations' and the leader-only job's
    // (its own lease TTL, and its lease kept out of the reservations' counters).
    let (builder, job_builder, kind) = match (!cluster_urls.is_empty(), redis_url) {
        (true, _) => {
            let (builder, job_builder) = cluster_backend(&name, &cluster_urls).await?;
            (builder, job_builder, "redis-cluster")
        }
        (false, Some(url)) => {
            let backend = RedisBackend::connect(&url).await?;
            println!("[{name}] locking in Redis at {}", redact(&url));
            (
                Locker::builder(backend.clone()),
                Locker::builder(backend),
                "redis",
            )
        }
        (false, None) => {
            println!(
                "[{name}] REDIS_URL is not set: running single-instance on the in-process \
                 backend (locks are not shared with other processes)"
            );
            let backend = MemoryBackend::new();
            (
                Locker::builder(backend.clone()),
                Locker::builder(backend),
                "memory",
            )
        }
    };
    // In the plain mode this locker serves only the other routes (the shared
    // reads, the checkout, the read-write lock), with lockflight's defaults
    // (handoff on); `coalesced` turns handoff off.
    let locker = builder
        .wait_timeout(Duration::from_millis(wait_ms))
        .handoff(if locking == Locking::Handoff {
            Handoff::enabled()
        } else {
            Handoff::disabled()
        })
        .build()?;

    let _tmp; // keeps a temporary database directory alive until exit
    let db_path: PathBuf = match args.database_path {
        Some(path) => path,
        None => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("inventory.db");
            _tmp = dir;
            path
        }
    };
    let db = app::open_db(Some(&db_path)).await?;
    println!("[{name}] database {}", db_path.display());

    let mut state = AppState::new(db, locker, &name).describe(kind, locking.name());
    if let Some(plain) = plain {
        state = state.with_plain_lock(plain);
    }
    if let Some(sizing) = crate::sizing::Sizing::install() {
        state.more_stats = Some(app::MoreStats(Arc::new(move || sizing.snapshot())));
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    if args.job.leader_job {
        // The identity: the instance's name and port (unique among instances
        // on one machine, even when they share a name).
        let identity = format!("{name}@{}", local.port());
        let config = args.job.config();
        println!(
            "[{name}] campaigning for {} as {identity} (lease TTL {} ms)",
            job::ELECTION,
            config.lease_ttl.as_millis()
        );
        let job = LeaderJob::start(job_builder, state.db.clone(), &identity, config)?;
        state = state.with_job(job);
    }
    println!(
        "[{name}] locking mode {}; listening on http://{local}",
        locking.name()
    );
    let watch_stdin = args.exit.exit_on_stdin_eof;
    axum::serve(listener, app::app(state))
        .with_graceful_shutdown(shutdown_signal(watch_stdin))
        .await?;
    println!("[{name}] stopped");
    Ok(())
}

/// The plain mode's lock, on the same Redis (or Redis Cluster) as the locker.
async fn plain_lock(
    cluster_urls: &[String],
    redis_url: Option<&str>,
    wait_ms: u64,
) -> Result<PlainLock, BoxError> {
    let con = match (cluster_urls, redis_url) {
        #[cfg(feature = "cluster")]
        ([_, ..], _) => plain_lock::Connection::cluster(cluster_urls).await?,
        (_, Some(url)) => plain_lock::Connection::single(url).await?,
        _ => {
            return Err("--locking plain is a plain Redis lock: it needs REDIS_URL \
                        (or REDIS_CLUSTER_URLS)"
                .into());
        }
    };
    Ok(PlainLock::new(
        con,
        "inventory:plain:",
        Duration::from_millis(wait_ms),
    ))
}

/// `gateway NAME=URL ...`: the SKU-routing gateway.
async fn run_gateway(args: GatewayArgs) -> Result<(), BoxError> {
    let upstreams = args.upstreams;
    let (router, members) = gateway::gateway(&upstreams);
    let listener = tokio::net::TcpListener::bind(listen_addr(args.bind, args.port)?).await?;
    let local = listener.local_addr()?;
    let names: Vec<String> = members.members().into_iter().map(|(n, _)| n).collect();
    println!(
        "[gateway] routing each SKU to one of {}; listening on http://{local}",
        names.join(", ")
    );
    let watch_stdin = args.exit.exit_on_stdin_eof;
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal(watch_stdin))
        .await?;
    Ok(())
}

/// Resolves on Ctrl-C, on SIGTERM, and — with `watch_stdin` — when standard input
/// reaches its end (the demo holds a pipe to each child's stdin, so children stop
/// even if the demo is killed outright).
pub async fn shutdown_signal(watch_stdin: bool) {
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

/// Two locker builders over one backend on the Redis Cluster whose nodes are
/// `urls` (comma-separated).
#[cfg(feature = "cluster")]
async fn cluster_backend(
    name: &str,
    nodes: &[String],
) -> Result<(LockerBuilder, LockerBuilder), BoxError> {
    let backend = RedisBackend::cluster(nodes.iter().cloned())
        .connect()
        .await?;
    println!(
        "[{name}] locking in a Redis Cluster of {} seed node(s)",
        nodes.len()
    );
    Ok((Locker::builder(backend.clone()), Locker::builder(backend)))
}

#[cfg(not(feature = "cluster"))]
async fn cluster_backend(
    _name: &str,
    _nodes: &[String],
) -> Result<(LockerBuilder, LockerBuilder), BoxError> {
    Err(
        "REDIS_CLUSTER_URLS is set, but this build has no Redis Cluster support: \
         build with --features cluster"
            .into(),
    )
}
