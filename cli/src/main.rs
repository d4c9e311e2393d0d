//! `lockflight`: check a Redis deployment for lockflight, inspect and force-release
//! lock keys, run a bounded self-check. See the guide, `lockflight::guide::operating`.
//!
//! Exit codes (for CI): [`EXIT_CODES`], printed by `--help`.
//!
//! TLS: `rediss://` URLs (or `redis://` ones with `--tls`), with the certificates
//! of `--tls-ca-file`, `--tls-cert-file` and `--tls-key-file` (redis-cli's
//! `--cacert`, `--cert` and `--key`; see `tls`).

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

mod doctor;
mod ops;
mod proxy;
mod report;
mod selfcheck;
mod sentinel;
mod tls;

/// Exit code: a check failed.
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit code: bad usage (clap's own code for a usage error, too).
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code: the server could not be reached, or refused.
pub(crate) const EXIT_UNREACHABLE: u8 = 3;
/// Exit code: a forced release was not confirmed.
pub(crate) const EXIT_NOT_CONFIRMED: u8 = 4;

/// Every exit code of the command, as `--help` lists them (after the options).
const EXIT_CODES: &str = "\
Exit codes:
  0  done; every check passed (warnings allowed, unless --strict)
  1  a check failed (or warned or was unknown, with doctor --strict); selfcheck found a violation
  2  bad usage: an unknown option, a missing argument, an unreadable or wrong TLS file
  3  the server could not be reached, or refused the operation
  4  release --force was not confirmed (no --yes, and the key was not typed)";

#[derive(Parser, Debug)]
#[command(
    name = "lockflight",
    version,
    about = "Check and operate lockflight's Redis locks",
    after_help = EXIT_CODES
)]
struct Cli {
    /// Machine-readable output (one JSON document on stdout).
    #[arg(long, global = true)]
    json: bool,
    /// The key prefix of the lockers (`RedisBackendBuilder::prefix`).
    #[arg(
        long,
        global = true,
        env = "LOCKFLIGHT_PREFIX",
        default_value = "lockflight"
    )]
    prefix: String,
    /// Connect with TLS: a redis:// URL is taken as rediss:// (as redis-cli's
    /// --tls).
    #[arg(long, global = true)]
    tls: bool,
    /// PEM file of the CA certificate(s) that signed the servers' TLS
    /// certificates, trusted for rediss:// URLs instead of the system's roots
    /// (e.g. a private CA, or a managed Redis's own CA).
    #[arg(long, global = true, value_name = "PATH", visible_alias = "cacert")]
    tls_ca_file: Option<PathBuf>,
    /// PEM file of the client certificate presented to servers that require
    /// one (`tls-auth-clients yes`): X.509 v3; needs --tls-key-file.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        requires = "tls_key_file",
        visible_alias = "cert"
    )]
    tls_cert_file: Option<PathBuf>,
    /// PEM file of the private key of --tls-cert-file.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        requires = "tls_cert_file",
        visible_alias = "key"
    )]
    tls_key_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Checks a Redis server (or, with --cluster, every primary of a Cluster; with
    /// --sentinel, the sentinels and the primary they name) for what lockflight
    /// needs: version, scripts, ACL rights, eviction, persistence, replicas,
    /// clocks, script PUBLISH, latency; quorum and replicas of a Sentinel set.
    Doctor {
        /// redis://[user:password@]host:port[/db] (rediss://… for TLS); with
        /// --cluster, any node; with --sentinel, one or more sentinels.
        #[arg(required = true, value_name = "URL")]
        urls: Vec<String>,
        /// The URL is a node of a Redis Cluster: check every primary.
        #[arg(long, conflicts_with = "sentinel")]
        cluster: bool,
        /// The URLs are sentinels and this is the master name: ask them for the
        /// primary, the quorum and the replicas, then check the primary.
        #[arg(long, value_name = "MASTER")]
        sentinel: Option<String>,
        /// With --sentinel: the ACL username of the primary and its replicas
        /// (`primary_connection_info`); default: the environment's
        /// LOCKFLIGHT_SENTINEL_PRIMARY_USERNAME. Their password is read from
        /// LOCKFLIGHT_SENTINEL_PRIMARY_PASSWORD, never from the command line. The
        /// sentinels' own password goes in their URLs.
        #[arg(long, value_name = "USER", requires = "sentinel")]
        primary_user: Option<String>,
        /// The replica acknowledgement the backend will ask for
        /// (`replica_ack(n, …)`): check that `n` replicas acknowledge a WAIT.
        #[arg(long, value_name = "N")]
        replica_ack: Option<u32>,
        /// Exit 1 on warnings too.
        #[arg(long)]
        strict: bool,
    },
    /// Shows everything lockflight stores for one key: holders with their lease
    /// tokens and TTLs, fencing tokens, waiting instances with their ages,
    /// claims, read leases, permits.
    Inspect {
        /// redis://…; with --cluster, any node.
        url: String,
        /// The lock key (as given to `Locker::lock`).
        key: String,
        /// The URL is a node of a Redis Cluster: ask the key's node.
        #[arg(long)]
        cluster: bool,
    },
    /// Lists held keys with their kind, holder and TTL (SCAN, bounded; with
    /// --cluster, on every primary).
    List {
        /// redis://…; with --cluster, any node.
        url: String,
        /// The URL is a node of a Redis Cluster: scan every primary.
        #[arg(long)]
        cluster: bool,
        /// Only keys that start with this.
        #[arg(long = "match", value_name = "KEY_PREFIX", default_value = "")]
        key_prefix: String,
        /// At most this many keys.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Frees a stuck key: deletes its leases (mutex holder, write and read
    /// leases, permits), advances its fences, and tells each holder's instance
    /// that its lease is lost. Only the resources named with --fence refuse the
    /// old holder's late fenced writes at once; another resource refuses them only
    /// once it has accepted a newer fencing token.
    Release {
        /// Required: this frees a lock that somebody else holds.
        #[arg(long)]
        force: bool,
        /// redis://…; with --cluster, any node.
        url: String,
        /// The lock key.
        key: String,
        /// The URL is a node of a Redis Cluster: the key's node is used.
        #[arg(long)]
        cluster: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// Also record the new fencing token in the fence of this `FencedKey`
        /// resource (repeatable), so the old holder's late fenced writes to it
        /// are refused now, before any new holder writes. Without it, such a
        /// write is applied if the resource has not seen a newer fencing token
        /// yet.
        #[arg(long = "fence", value_name = "REDIS_KEY")]
        fence: Vec<String>,
    },
    /// Runs lockflight's safety checks against the server under a private prefix,
    /// bounded in time, and reports violations.
    Selfcheck {
        /// redis://…
        url: String,
        /// How long at most.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
    },
}

impl Command {
    /// The server URLs given on the command line.
    fn urls(&self) -> Vec<&str> {
        match self {
            Command::Doctor { urls, .. } => urls.iter().map(String::as_str).collect(),
            Command::Inspect { url, .. }
            | Command::List { url, .. }
            | Command::Release { url, .. }
            | Command::Selfcheck { url, .. } => vec![url.as_str()],
        }
    }

    /// The server URLs given on the command line, to rewrite.
    fn urls_mut(&mut self) -> Vec<&mut String> {
        match self {
            Command::Doctor { urls, .. } => urls.iter_mut().collect(),
            Command::Inspect { url, .. }
            | Command::List { url, .. }
            | Command::Release { url, .. }
            | Command::Selfcheck { url, .. } => vec![url],
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lockflight: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    let code = runtime.block_on(run(cli));
    ExitCode::from(code)
}

async fn run(mut cli: Cli) -> u8 {
    let json = cli.json;
    let files = tls::TlsFiles {
        ca: cli.tls_ca_file,
        cert: cli.tls_cert_file,
        key: cli.tls_key_file,
    };
    if let Err(e) = tls::init(&files) {
        eprintln!("lockflight: {e}");
        return EXIT_USAGE;
    }
    if cli.tls {
        for url in cli.command.urls_mut() {
            *url = tls::with_tls(url);
        }
    }
    if files.any()
        && let Some(plain) = cli.command.urls().into_iter().find(|u| !tls::is_tls_url(u))
    {
        eprintln!(
            "lockflight: --tls-ca-file, --tls-cert-file and --tls-key-file are for rediss:// URLs (or redis:// ones with --tls); {} is not one",
            redact(plain)
        );
        return EXIT_USAGE;
    }
    let result = match cli.command {
        Command::Doctor {
            urls,
            cluster,
            sentinel,
            primary_user,
            replica_ack,
            strict,
        } => {
            let primary_auth = match sentinel::primary_auth(primary_user) {
                Ok(auth) => auth,
                Err(e) => {
                    eprintln!("lockflight doctor: {e}");
                    return EXIT_USAGE;
                }
            };
            let target = match (&sentinel, cluster, urls.as_slice()) {
                (Some(master), _, sentinels) => {
                    doctor::Target::Sentinel(sentinels, master, primary_auth.as_ref())
                }
                (None, true, [url]) => doctor::Target::Cluster(url),
                (None, false, [url]) => doctor::Target::Server(url),
                (None, _, _) => {
                    eprintln!(
                        "lockflight doctor: one URL (several only with --sentinel, for the sentinels)"
                    );
                    return EXIT_USAGE;
                }
            };
            doctor::run(target, &cli.prefix, replica_ack, strict, json).await
        }
        Command::Inspect { url, key, cluster } => {
            ops::inspect(&url, cluster, &cli.prefix, &key, json).await
        }
        Command::List {
            url,
            cluster,
            key_prefix,
            limit,
        } => ops::list(&url, cluster, &cli.prefix, &key_prefix, limit, json).await,
        Command::Release {
            force,
            url,
            key,
            cluster,
            yes,
            fence,
        } => {
            if !force {
                eprintln!(
                    "lockflight release: --force is required (it frees a lock that somebody else holds; add --fence for each resource that must refuse that holder's late writes)"
                );
                return EXIT_USAGE;
            }
            ops::release(&url, cluster, &cli.prefix, &key, yes, &fence, json).await
        }
        Command::Selfcheck { url, seconds } => {
            selfcheck::run(&url, Duration::from_secs(seconds.clamp(1, 600)), json).await
        }
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            if json {
                println!("{}", serde_json::json!({ "error": message }));
            }
            eprintln!("lockflight: {message}");
            EXIT_UNREACHABLE
        }
    }
}

/// A progress bar on stderr for `len` steps, shown only on a terminal and never
/// with `--json`.
pub(crate) fn progress(len: u64, json: bool) -> ProgressBar {
    let target = if json || !std::io::stderr().is_terminal() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// A multiplexed connection to `url` with explicit timeouts (5 s to connect, 10 s
/// per reply: redis-rs's 500 ms default counts queueing time); a `rediss://` URL
/// with the certificates of the `--tls-…` options.
pub(crate) async fn connect(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    let client = tls::client(url).map_err(|e| format!("bad URL {}: {e}", redact(url)))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    match client
        .get_multiplexed_async_connection_with_config(&config)
        .await
    {
        Ok(conn) => Ok(conn),
        Err(e) => Err(format!(
            "cannot connect to {}: {e}{}",
            redact(url),
            tls::explain(url, &e).await
        )),
    }
}

/// A connection for one key's operations: to the server, or (`cluster`) a
/// cluster connection through the node at `url`, which routes each script to the
/// node of its key's slot.
pub(crate) enum KeyConn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl KeyConn {
    pub(crate) async fn open(url: &str, cluster: bool) -> Result<KeyConn, String> {
        if !cluster {
            return Ok(KeyConn::Single(connect(url).await?));
        }
        let client = tls::cluster_builder(url)
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("bad URL {}: {e}", redact(url)))?;
        match client.get_async_connection().await {
            Ok(conn) => Ok(KeyConn::Cluster(conn)),
            Err(e) => Err(format!(
                "cannot connect to the cluster at {}: {e}{}",
                redact(url),
                tls::explain(url, &e).await
            )),
        }
    }
}

impl redis::aio::ConnectionLike for KeyConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            KeyConn::Single(c) => c.req_packed_command(cmd),
            KeyConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            KeyConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            KeyConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            KeyConn::Single(c) => c.get_db(),
            KeyConn::Cluster(c) => c.get_db(),
        }
    }
}

/// The primaries of the cluster that `url` is a node of (`CLUSTER NODES`), as
/// URLs with the same credentials.
pub(crate) async fn cluster_primaries(url: &str) -> Result<Vec<String>, String> {
    let mut conn = connect(url).await?;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("CLUSTER NODES on {}: {e}", redact(url)))?;
    primaries_in(&nodes, url)
}

/// The primaries listed in a `CLUSTER NODES` reply: nodes flagged `master` that
/// serve at least one slot and are not failing. A master without slots stores no
/// lock (it is new, or a node the seed has not yet seen become a replica).
fn primaries_in(nodes: &str, url: &str) -> Result<Vec<String>, String> {
    let base = redis::parse_redis_url(url).ok_or("bad URL")?;
    let mut out = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let flags = fields.get(2).copied().unwrap_or_default();
        let serves_slots = fields.iter().skip(8).any(|f| !f.is_empty());
        if flags.split(',').any(|f| f == "master")
            && serves_slots
            && !flags
                .split(',')
                .any(|f| matches!(f, "fail" | "fail?" | "noaddr" | "handshake"))
        {
            let addr = fields[1].split(['@', ',']).next().unwrap_or_default();
            let (host, port) = addr.rsplit_once(':').ok_or("bad CLUSTER NODES line")?;
            let mut node = base.clone();
            let _ = node.set_host(Some(host));
            let _ = node.set_port(port.parse().ok());
            out.push(node.to_string());
        }
    }
    if out.is_empty() {
        return Err(format!("CLUSTER NODES on {} lists no primary", redact(url)));
    }
    Ok(out)
}

/// `url` without its password.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{primaries_in, redact};

    /// A master that serves no slot (here one the seed still sees as a master
    /// while it becomes a replica) is not a primary to check.
    #[test]
    fn primaries_are_masters_that_serve_slots() {
        let nodes = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7003@17003 master - 0 0 3 connected 10923-16383
d4 127.0.0.1:7004@17004 master - 0 0 0 connected
e5 127.0.0.1:7005@17005 slave a1 0 0 1 connected
f6 127.0.0.1:7006@17006 master,fail - 0 0 4 connected 16383
";
        let got = primaries_in(nodes, "redis://app:pw@127.0.0.1:7001/").unwrap();
        assert_eq!(
            got,
            [
                "redis://app:pw@127.0.0.1:7001/",
                "redis://app:pw@127.0.0.1:7002/",
                "redis://app:pw@127.0.0.1:7003/",
            ]
        );
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("redis://app:secret@h:1/"), "redis://app:***@h:1/");
        assert_eq!(redact("redis://h:1/"), "redis://h:1/");
    }
}
