//! Test-support harness for lockflight's integration tests.
//!
//! Use it from any `tests/*.rs` file with `mod support;`.
//!
//! # Real Redis servers
//!
//! [`RedisServer::start`] runs a real `redis-server` (it must be on `PATH`; the
//! tests never skip themselves silently) on a free port of 127.0.0.1, with no
//! persistence and its own temporary directory. Dropping the value kills and
//! reaps the server; if the drop happens while the test is panicking, the last
//! lines of the server's log are printed to stderr, so they show up in
//! `cargo test`'s report of the failing test.
//!
//! **Which server to use:**
//!
//! * [`shared()`] is one lazily started server per test binary. Use it for
//!   tests that only need *a* Redis, and keep every key of such a test under
//!   its own [`unique_prefix`] so parallel tests never collide. Such a test must
//!   never pause, kill, restart, `FLUSHALL`/`FLUSHDB`, `CONFIG SET`, `DEBUG` or
//!   otherwise disturb the server, and must not count global things such as
//!   `DBSIZE` or `INFO` stats.
//! * A test that pauses, kills, restarts or flushes the server, or that needs
//!   global counts, starts its **own** server with [`RedisServer::start`].
//!   (`pause`, `kill`, `restart` and `flushall` panic on the shared server.)
//!
//! No server outlives the test run: every server runs under a tiny `sh`
//! supervisor whose stdin is a pipe held by the test process. When the test
//! process dies for any reason (even `SIGKILL`, or a static that is never
//! dropped), the pipe closes and the supervisor kills the server.
//!
//! Linux only: process states are read from `/proc`; signals are sent with
//! `nix` (a safe wrapper of `kill(2)`).
//!
//! # Fault injection
//!
//! [`CountingProxy`] sits between a client and a server: it counts the RESP
//! commands the client sends, and can delay, black-hole or reset the traffic.
//! [`fault_proxy::FaultProxy`] parses both directions and can lose the reply of
//! chosen commands after the server applied them. [`nemesis`] stops and continues
//! any process (a child holder), kills client connections, and samples Zipf ranks.
//!
//! # Things to know about redis-rs 1.8
//!
//! * A connection made with default settings has a **500 ms response timeout**
//!   and a 1 s connection timeout. The connections made by this module
//!   ([`RedisServer::connection`], [`CountingProxy::connection`]) use 10 s / 5 s
//!   instead, so that a loaded CI machine does not cause spurious failures.
//! * Every new connection pipelines two `CLIENT SETINFO` commands (`LIB-NAME`
//!   and `LIB-VER`) during its handshake, so a fresh connection through a
//!   [`CountingProxy`] already counts 2 commands (before it returns). Call
//!   [`CountingProxy::reset`] after connecting, or use
//!   [`CountingProxy::quiet_client`], whose handshake sends nothing. There is
//!   no URL setting for this, and `ConnectionInfo`'s fields are no longer
//!   public: use `ConnectionInfo::redis_settings()` /
//!   `set_redis_settings(..)` with `RedisConnectionInfo::set_skip_set_lib_name()`.
//! * Do not combine these servers with `#[tokio::test(start_paused = true)]`:
//!   with a paused clock, tokio jumps time forward whenever the runtime waits
//!   on I/O, so every response timeout fires at once.
#![allow(dead_code)]

use std::collections::HashSet;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

pub(crate) mod cluster;
pub(crate) mod fault_proxy;
pub(crate) mod nemesis;
pub(crate) mod sentinel;

const REDIS_NOT_FOUND: &str = "redis-server not found: install it (apt-get install -y redis-server) or run scripts/test, which does";

/// How long `start` / `restart` wait for the server to answer.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the startup wait polls.
const STARTUP_POLL: Duration = Duration::from_millis(10);
/// How many lines of the log are printed when a test panics.
const LOG_TAIL_LINES: usize = 50;
/// Response timeout of the connections made by this module.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connection timeout of the connections made by this module.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The supervisor. Arguments: `$1` = the server's directory, `$2` = the
/// redis-server binary, then redis-server's arguments.
///
/// It prints the server's pid, then blocks reading its stdin (a pipe held by
/// the test process). A line `keep` means an orderly stop by the harness; end
/// of file means the test process died, and then the directory is removed too.
/// Either way the server is killed and reaped before the supervisor exits.
const SUPERVISOR: &str = r#"
dir=$1; bin=$2; shift 2
"$bin" "$@" </dev/null >>"$dir/redis.stdout" 2>&1 &
pid=$!
trap 'kill -9 "$pid" 2>/dev/null; wait "$pid"; exit 0' HUP INT TERM
echo "$pid"
cmd=
read -r cmd
kill -9 "$pid" 2>/dev/null
wait "$pid"
[ "$cmd" = keep ] || rm -rf -- "$dir"
"#;

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

/// A real `redis-server` process on 127.0.0.1, killed when dropped.
///
/// All methods take `&self`, so a server can be shared (e.g. in an `Arc`)
/// between tasks. The blocking methods (`start`, `restart`, `kill`, `pause`,
/// `resume`) block the calling thread for a few milliseconds; that is fine in
/// `#[tokio::test]` of either flavor.
pub(crate) struct RedisServer {
    port: u16,
    binary: PathBuf,
    dir: tempfile::TempDir,
    state: Mutex<ServerState>,
}

struct ServerState {
    running: Option<Supervised>,
    paused: bool,
    last_pid: u32,
}

struct Supervised {
    supervisor: Child,
    pid: u32,
}

enum SpawnError {
    /// The port was taken by somebody else: try again (another port).
    PortConflict(String),
    /// Anything else: give up.
    Failed(String),
}

impl RedisServer {
    /// Starts a new server on a free port and waits until it answers.
    ///
    /// Panics with a clear message if `redis-server` is not on `PATH` or does
    /// not come up within 10 s (the message includes the server's log).
    pub(crate) fn start() -> RedisServer {
        let binary = find_redis_server().unwrap_or_else(|| panic!("{REDIS_NOT_FOUND}"));
        let dir = tempdir();
        let mut last_error = String::new();
        for _ in 0..8 {
            let port = reserve_port();
            match spawn_redis(&binary, dir.path(), port) {
                Ok(running) => {
                    return RedisServer {
                        port,
                        binary,
                        dir,
                        state: Mutex::new(ServerState {
                            last_pid: running.pid,
                            running: Some(running),
                            paused: false,
                        }),
                    };
                }
                Err(SpawnError::PortConflict(message)) => {
                    release_port(port);
                    last_error = message;
                }
                Err(SpawnError::Failed(message)) => {
                    release_port(port);
                    panic!("{message}");
                }
            }
        }
        panic!(
            "could not start redis-server on a free port after 8 attempts; last error: {last_error}"
        );
    }

    /// `redis://127.0.0.1:PORT/`
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TCP port (stays the same across [`restart`](Self::restart)).
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`
    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The pid of the `redis-server` process (the last one, once killed).
    pub(crate) fn pid(&self) -> u32 {
        self.lock().last_pid
    }

    /// Whether the server process is running (it may be paused).
    pub(crate) fn is_running(&self) -> bool {
        self.lock().running.is_some()
    }

    /// The server's own temporary directory (holds `redis.log`).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client for [`url`](Self::url).
    pub(crate) fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis::Client::open on the test server's URL")
    }

    /// A new multiplexed connection, with a 10 s response timeout and a 5 s
    /// connection timeout (not redis-rs's 500 ms / 1 s defaults).
    ///
    /// Panics if the server cannot be reached.
    pub(crate) async fn connection(&self) -> redis::aio::MultiplexedConnection {
        connection_for(&self.client()).await
    }

    /// `FLUSHALL` — only on a server of your own: panics on [`shared()`].
    pub(crate) async fn flushall(&self) {
        self.forbid_on_shared("FLUSHALL");
        let mut con = self.connection().await;
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut con)
            .await
            .expect("FLUSHALL on the test server");
    }

    /// Stops the server with `SIGSTOP`: it keeps its connections open but
    /// answers nothing until [`resume`](Self::resume).
    pub(crate) fn pause(&self) {
        self.forbid_on_shared("pause()");
        let mut state = self.lock();
        let pid = state
            .running
            .as_ref()
            .map(|r| r.pid)
            .expect("pause(): the redis server is not running");
        if !state.paused {
            send_signal(pid, "STOP");
            wait_for_state(pid, |s| s == Some('T') || s == Some('t'));
            state.paused = true;
        }
    }

    /// Continues a paused server with `SIGCONT`.
    pub(crate) fn resume(&self) {
        let mut state = self.lock();
        let pid = state
            .running
            .as_ref()
            .map(|r| r.pid)
            .expect("resume(): the redis server is not running");
        if state.paused {
            send_signal(pid, "CONT");
            wait_for_state(pid, |s| s != Some('T') && s != Some('t'));
            state.paused = false;
        }
    }

    /// Whether the server is paused.
    pub(crate) fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// Kills the server with `SIGKILL` and reaps it: the port is closed and
    /// all data is lost. Does nothing if it is not running. See
    /// [`restart`](Self::restart) to bring it back.
    pub(crate) fn kill(&self) {
        self.forbid_on_shared("kill()");
        let mut state = self.lock();
        if let Some(running) = state.running.take() {
            stop_supervised(running, state.paused);
        }
        state.paused = false;
    }

    /// Kills the server if it is running, then starts a new one **on the same
    /// port** with an empty dataset, and waits until it answers.
    pub(crate) fn restart(&self) {
        self.forbid_on_shared("restart()");
        let mut state = self.lock();
        if let Some(running) = state.running.take() {
            stop_supervised(running, state.paused);
        }
        state.paused = false;
        // Leftovers of a SAVE / DEBUG RELOAD issued by a test must not be loaded.
        let _ = std::fs::remove_file(self.dir.path().join("dump.rdb"));
        let _ = std::fs::remove_dir_all(self.dir.path().join("appendonlydir"));

        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match spawn_redis(&self.binary, self.dir.path(), self.port) {
                Ok(running) => {
                    state.last_pid = running.pid;
                    state.running = Some(running);
                    return;
                }
                Err(SpawnError::PortConflict(message)) => {
                    if Instant::now() >= deadline {
                        drop(state);
                        panic!(
                            "restart(): port {} is taken by another process: {message}",
                            self.port
                        );
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(SpawnError::Failed(message)) => {
                    drop(state);
                    panic!("restart(): {message}");
                }
            }
        }
    }

    /// The whole log file of the server (all its runs, across restarts).
    pub(crate) fn log(&self) -> String {
        read_logs(self.dir.path())
    }

    /// A guard that prints the last lines of this server's log to stderr if it
    /// is dropped while the thread panics. Useful with [`shared()`], which is
    /// never dropped (an owned server already does this in its `Drop`).
    pub(crate) fn log_on_panic(&self) -> LogOnPanic<'_> {
        LogOnPanic { server: self }
    }

    /// Enforces the rule of the module docs: the shared server is never
    /// disturbed.
    fn forbid_on_shared(&self, what: &str) {
        if SHARED
            .get()
            .is_some_and(|shared| std::ptr::eq(shared, self))
        {
            panic!(
                "{what} on support::shared(): other tests use it at the same time; \
                 start a server of your own with RedisServer::start()"
            );
        }
    }

    fn lock(&self) -> MutexGuard<'_, ServerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn print_log_tail(&self) {
        eprintln!(
            "---- last {LOG_TAIL_LINES} lines of the log of redis-server on port {} (dir {}) ----\n{}\n---- end of redis log ----",
            self.port,
            self.dir.path().display(),
            tail(&self.log(), LOG_TAIL_LINES)
        );
    }
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid())
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_log_tail();
        }
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = state.running.take() {
            stop_supervised(running, state.paused);
        }
        state.paused = false;
        release_port(self.port);
    }
}

/// See [`RedisServer::log_on_panic`].
pub(crate) struct LogOnPanic<'a> {
    server: &'a RedisServer,
}

impl Drop for LogOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.server.print_log_tail();
        }
    }
}

/// The server shared by all tests of this test binary, started on first use.
///
/// Only for tests that use their own [`unique_prefix`] for every key and never
/// pause, kill, restart or flush the server (see the module docs).
pub(crate) fn shared() -> &'static RedisServer {
    SHARED.get_or_init(RedisServer::start)
}

static SHARED: OnceLock<RedisServer> = OnceLock::new();

/// A key prefix unique to this call: `lftest:<name>:<pid>:<counter>`.
///
/// `name` is sanitized (anything but ASCII alphanumerics, `_` and `-` becomes
/// `_`) so the prefix is safe in `KEYS`/`SCAN` patterns, and the counter has a
/// fixed width, so `format!("{prefix}*")` never matches another prefix.
pub(crate) fn unique_prefix(name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("lftest:{name}:{}:{n:08}", std::process::id())
}

/// The number of keys matching the glob `pattern` (via `KEYS`).
pub(crate) async fn key_count(server: &RedisServer, pattern: &str) -> usize {
    let mut con = server.connection().await;
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut con)
        .await
        .expect("KEYS on the test server");
    keys.len()
}

/// Polls `f` every 5 ms until it returns `true` (then returns `true`) or
/// `timeout` has passed (then returns `false`). `f` is always called at least
/// once, and once more after the deadline.
pub(crate) async fn wait_until<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A multiplexed connection from `client` with this module's generous timeouts
/// (10 s response, 5 s connection). Panics if it cannot connect.
pub(crate) async fn connection_for(client: &redis::Client) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_connection_timeout(Some(CONNECT_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot connect to the test redis at {:?}: {e}",
                client.get_connection_info().addr()
            )
        })
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

fn find_redis_server() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn tempdir() -> tempfile::TempDir {
    let mut builder = tempfile::Builder::new();
    builder.prefix("lockflight-redis-");
    // Integration tests get a directory of their own under target/.
    match option_env!("CARGO_TARGET_TMPDIR") {
        Some(base) if std::fs::create_dir_all(base).is_ok() => builder.tempdir_in(base),
        _ => builder.tempdir(),
    }
    .expect("create a temporary directory for redis-server")
}

/// Starts redis-server on `port` under a supervisor and waits until it answers.
fn spawn_redis(binary: &Path, dir: &Path, port: u16) -> Result<Supervised, SpawnError> {
    let standalone = [
        "--save",
        "",
        "--appendonly",
        "no",
        "--dbfilename",
        "dump.rdb",
        "--enable-debug-command",
        "yes",
    ];
    spawn_supervised(binary, dir, port, &[], &standalone)
}

/// Starts `binary <leading> --bind 127.0.0.1 --port <port> <flags>` under the
/// supervisor (logging into `dir`) and waits until it answers on `port`.
/// `leading` comes first because `redis-server` reads a config file (a
/// sentinel's) only as its first argument.
fn spawn_supervised(
    binary: &Path,
    dir: &Path,
    port: u16,
    leading: &[String],
    flags: &[&str],
) -> Result<Supervised, SpawnError> {
    let log_file = dir.join("redis.log");
    let supervisor_err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("redis.stdout"))
        .map_err(|e| SpawnError::Failed(format!("cannot create {}: {e}", dir.display())))?;
    let port_arg = port.to_string();
    let mut supervisor = Command::new("sh")
        .arg("-c")
        .arg(SUPERVISOR)
        .arg("sh")
        .arg(dir)
        .arg(binary)
        .args(leading)
        .args(["--bind", "127.0.0.1", "--port", &port_arg])
        .args(flags)
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log_file)
        .args(["--protected-mode", "no", "--daemonize", "no"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(supervisor_err))
        .spawn()
        .map_err(|e| SpawnError::Failed(format!("cannot run sh to start redis-server: {e}")))?;

    let mut line = String::new();
    let read = supervisor
        .stdout
        .take()
        .map(|out| BufReader::new(out).read_line(&mut line));
    let pid = match (read, line.trim().parse::<u32>()) {
        (Some(Ok(_)), Ok(pid)) => pid,
        _ => {
            let _ = supervisor.kill();
            let _ = supervisor.wait();
            return Err(SpawnError::Failed(format!(
                "the redis-server supervisor printed no pid (got {line:?})\n{}",
                read_logs(dir)
            )));
        }
    };
    let running = Supervised { supervisor, pid };

    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        if !process_alive(pid) {
            let logs = read_logs(dir);
            stop_supervised(running, false);
            let message = format!(
                "redis-server (pid {pid}) on port {port} exited during startup; its log:\n{logs}"
            );
            return Err(if logs.contains("Address already in use") {
                SpawnError::PortConflict(message)
            } else {
                SpawnError::Failed(message)
            });
        }
        match server_pid(port) {
            Some(answering) if answering == pid => return Ok(running),
            Some(other) => {
                stop_supervised(running, false);
                return Err(SpawnError::PortConflict(format!(
                    "port {port} is answered by another redis-server (pid {other})"
                )));
            }
            None => {}
        }
        if Instant::now() >= deadline {
            stop_supervised(running, false);
            return Err(SpawnError::Failed(format!(
                "redis-server (pid {pid}) did not answer on port {port} within {STARTUP_TIMEOUT:?}; its log:\n{}",
                read_logs(dir)
            )));
        }
        std::thread::sleep(STARTUP_POLL);
    }
}

/// Asks whatever listens on `port` for its pid (`INFO server`); `None` if
/// nothing answers properly (yet).
fn server_pid(port: u16) -> Option<u32> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = StdTcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(1)))
        .ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
    let mut reader = BufReader::new(stream);
    let mut header = String::new();
    reader.read_line(&mut header).ok()?;
    let len: usize = header.strip_prefix('$')?.trim_end().parse().ok()?;
    let mut body = vec![0; len + 2];
    reader.read_exact(&mut body).ok()?;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// Kills the server, tells the supervisor to exit (keeping the directory) and
/// reaps it (the supervisor reaps the server). Never panics; bounded.
fn stop_supervised(mut running: Supervised, paused: bool) {
    if paused {
        send_signal(running.pid, "CONT");
    }
    send_signal(running.pid, "KILL");
    if let Some(mut stdin) = running.supervisor.stdin.take() {
        let _ = stdin.write_all(b"keep\n");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match running.supervisor.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            _ => {
                let _ = running.supervisor.kill();
                let _ = running.supervisor.wait();
                return;
            }
        }
    }
}

/// Sends `SIG<NAME>` (e.g. `"STOP"`) to `pid`; `false` if the name is unknown or
/// the signal could not be sent.
fn send_signal(pid: u32, signal: &str) -> bool {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let (Ok(signal), Ok(pid)) = (format!("SIG{signal}").parse::<Signal>(), i32::try_from(pid))
    else {
        return false;
    };
    kill(Pid::from_raw(pid), signal).is_ok()
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, ...), `None`
/// if there is no such process.
pub(crate) fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether `pid` is a live (possibly stopped) process; zombies are dead.
pub(crate) fn process_alive(pid: u32) -> bool {
    !matches!(process_state(pid), None | Some('Z') | Some('X') | Some('x'))
}

fn wait_for_state(pid: u32, done: impl Fn(Option<char>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !done(process_state(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn read_logs(dir: &Path) -> String {
    let mut text = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    let stdout = std::fs::read_to_string(dir.join("redis.stdout")).unwrap_or_default();
    if !stdout.trim().is_empty() {
        text.push_str("\n-- redis-server stdout/stderr --\n");
        text.push_str(&stdout);
    }
    text
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------
// Ports
// ---------------------------------------------------------------------------

/// Ports of the servers of this process (including killed ones that may be
/// restarted), so that no other server of this process picks them.
fn reserved_ports() -> MutexGuard<'static, HashSet<u16>> {
    static RESERVED: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    RESERVED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

fn release_port(port: u16) {
    reserved_ports().remove(&port);
}

/// Picks a free loopback port for a server and reserves it in this process.
///
/// Ports are taken *below* the kernel's ephemeral range when possible: the
/// ports handed out by binding port 0 (and to outgoing connections) come from
/// that range, so while a server is killed, a port from it could be taken by
/// anything (even a client reconnecting to it, which then connects to itself),
/// and `restart` on the same port would fail or talk to the wrong peer.
fn reserve_port() -> u16 {
    let (low, high) = non_ephemeral_range();
    let mut reserved = reserved_ports();
    if high > low + 1000 {
        for _ in 0..500 {
            let candidate = low + (random_u64() % u64::from(high - low)) as u16;
            if !reserved.contains(&candidate)
                && std::net::TcpListener::bind(("127.0.0.1", candidate)).is_ok()
            {
                reserved.insert(candidate);
                return candidate;
            }
        }
    }
    // Fallback: let the kernel choose (holding the listeners we reject so it
    // does not hand the same port out again).
    let mut held = Vec::new();
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if reserved.insert(port) {
            return port;
        }
        held.push(listener);
    }
}

/// `[15000, start of the ephemeral range)`, or an empty range if unknown.
fn non_ephemeral_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    (15000, ephemeral_low.max(15000))
}

fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.finish()
}

// ---------------------------------------------------------------------------
// CountingProxy
// ---------------------------------------------------------------------------

/// A TCP proxy on 127.0.0.1 in front of a server, which counts the RESP
/// commands clients send through it and injects faults.
///
/// Every accepted connection opens its own connection to the target and is
/// served by a spawned task. Dropping the proxy stops the listener and aborts
/// every connection task (the sockets close). Must be created inside a tokio
/// runtime.
pub(crate) struct CountingProxy {
    addr: SocketAddr,
    inner: Arc<ProxyInner>,
    accept_task: JoinHandle<()>,
}

struct ProxyInner {
    target: SocketAddr,
    commands: AtomicU64,
    delay_nanos: AtomicU64,
    blackhole: watch::Sender<bool>,
    resets: watch::Sender<u64>,
    open: AtomicUsize,
    accepted: AtomicU64,
}

/// Decrements the open-connection count when a connection task ends.
struct OpenGuard(Arc<ProxyInner>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl CountingProxy {
    /// A proxy in front of `server` (it keeps working across restarts, which
    /// keep the port).
    pub(crate) async fn start(server: &RedisServer) -> CountingProxy {
        CountingProxy::start_to(server.addr()).await
    }

    /// A proxy in front of any TCP address.
    pub(crate) async fn start_to(target: SocketAddr) -> CountingProxy {
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy on 127.0.0.1:0");
        std_listener
            .set_nonblocking(true)
            .expect("set the proxy listener non-blocking");
        let addr = std_listener.local_addr().expect("proxy local_addr");
        let listener = TcpListener::from_std(std_listener).expect("register the proxy listener");
        let inner = Arc::new(ProxyInner {
            target,
            commands: AtomicU64::new(0),
            delay_nanos: AtomicU64::new(0),
            blackhole: watch::Sender::new(false),
            resets: watch::Sender::new(0),
            open: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, Arc::clone(&inner)));
        CountingProxy {
            addr,
            inner,
            accept_task,
        }
    }

    /// `redis://127.0.0.1:PROXYPORT/`
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// The proxy's port.
    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The proxy's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client for [`url`](Self::url).
    pub(crate) fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis::Client::open on the proxy's URL")
    }

    /// A client for [`url`](Self::url) whose connections skip the `CLIENT
    /// SETINFO` handshake, so that [`commands`](Self::commands) counts only
    /// the test's own commands.
    pub(crate) fn quiet_client(&self) -> redis::Client {
        use redis::IntoConnectionInfo;
        let info = self
            .url()
            .into_connection_info()
            .expect("parse the proxy's URL");
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        redis::Client::open(info.set_redis_settings(settings))
            .expect("redis::Client::open on the proxy's address")
    }

    /// A new multiplexed connection through the proxy (10 s response timeout,
    /// 5 s connection timeout). Its handshake counts 2 commands (`CLIENT
    /// SETINFO` x 2).
    pub(crate) async fn connection(&self) -> redis::aio::MultiplexedConnection {
        connection_for(&self.client()).await
    }

    /// The number of complete RESP commands forwarded from clients to the
    /// server since the start or the last [`reset`](Self::reset). A command is
    /// counted just before its last byte is forwarded, so once its reply has
    /// arrived it is always included.
    pub(crate) fn commands(&self) -> u64 {
        self.inner.commands.load(Ordering::SeqCst)
    }

    /// Sets the command count to 0.
    pub(crate) fn reset(&self) {
        self.inner.commands.store(0, Ordering::SeqCst);
    }

    /// Delays every chunk forwarded from a client to the server by `delay`
    /// (`Duration::ZERO` turns it off).
    pub(crate) fn set_delay(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.inner.delay_nanos.store(nanos, Ordering::SeqCst);
    }

    /// While on, nothing is forwarded in either direction and new connections
    /// are not connected through, but nothing is closed: like a network
    /// partition. Data that arrives meanwhile is held and delivered once it is
    /// turned off (as TCP would retransmit it).
    pub(crate) fn blackhole(&self, on: bool) {
        self.inner.blackhole.send_replace(on);
    }

    /// Closes every connection open now, abruptly (TCP RST to both the client
    /// and the server). Returns at once; the connections close within
    /// moments (see [`open_connections`](Self::open_connections)). Later
    /// connections work normally.
    pub(crate) fn reset_all(&self) {
        self.inner.resets.send_modify(|generation| *generation += 1);
    }

    /// The number of client connections open through the proxy.
    pub(crate) fn open_connections(&self) -> usize {
        self.inner.open.load(Ordering::SeqCst)
    }

    /// The number of client connections accepted since the start.
    pub(crate) fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::SeqCst)
    }
}

impl std::fmt::Debug for CountingProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingProxy")
            .field("addr", &self.addr)
            .field("target", &self.inner.target)
            .field("commands", &self.commands())
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        // The accept task owns the JoinSet of connection tasks: aborting it
        // drops the set, which aborts every connection task.
        self.accept_task.abort();
    }
}

async fn accept_loop(listener: TcpListener, inner: Arc<ProxyInner>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    inner.accepted.fetch_add(1, Ordering::SeqCst);
                    inner.open.fetch_add(1, Ordering::SeqCst);
                    let guard = OpenGuard(Arc::clone(&inner));
                    // Subscribed now: only resets from now on close it.
                    let resets = inner.resets.subscribe();
                    connections.spawn(serve_connection(client, Arc::clone(&inner), resets, guard));
                }
                // E.g. out of file descriptors: wait a little, go on.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_connection(
    mut client: TcpStream,
    inner: Arc<ProxyInner>,
    mut resets: watch::Receiver<u64>,
    _guard: OpenGuard,
) {
    let _ = client.set_nodelay(true);
    let mut blackhole = inner.blackhole.subscribe();
    let connect = async {
        wait_passable(&mut blackhole).await;
        TcpStream::connect(inner.target).await
    };
    let mut server = tokio::select! {
        connected = connect => match connected {
            Ok(server) => server,
            Err(_) => {
                // Like a refused connection: close the client abruptly.
                let _ = client.set_zero_linger();
                return;
            }
        },
        _ = resets.changed() => {
            let _ = client.set_zero_linger();
            return;
        }
    };
    let _ = server.set_nodelay(true);

    let was_reset = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        tokio::select! {
            _ = pump(client_read, server_write, true, &inner) => false,
            _ = pump(server_read, client_write, false, &inner) => false,
            _ = resets.changed() => true,
        }
    };
    if was_reset {
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
    // Dropping the sockets closes both sides (RST if reset).
}

/// Forwards `from` to `to` until end of file or an error. `to_server`:
/// count commands and apply the delay.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    to_server: bool,
    inner: &ProxyInner,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut counter = RespCommandCounter::default();
    let mut blackhole = inner.blackhole.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        wait_passable(&mut blackhole).await;
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if to_server {
            let delay = Duration::from_nanos(inner.delay_nanos.load(Ordering::SeqCst));
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
        // Turned on while the read was pending: hold the data.
        wait_passable(&mut blackhole).await;
        if to_server {
            let complete = counter.feed(&buf[..n]);
            if complete > 0 {
                inner.commands.fetch_add(complete, Ordering::SeqCst);
            }
        }
        to.write_all(&buf[..n]).await?;
    }
}

async fn wait_passable(blackhole: &mut watch::Receiver<bool>) {
    // The sender lives in ProxyInner, which outlives every connection task.
    let _ = blackhole.wait_for(|on| !*on).await;
}

// ---------------------------------------------------------------------------
// RESP command counting
// ---------------------------------------------------------------------------

/// Counts the commands in a client-to-server RESP byte stream, fed in chunks
/// of any size (a command may span chunks; a chunk may hold many commands).
///
/// A command is an array `*<n>\r\n` of `n` bulk strings `$<len>\r\n<bytes>\r\n`
/// (arrays with `n <= 0` are no command, as in Redis), or an inline command:
/// a line with some non-blank character.
#[derive(Debug, Default, Clone)]
pub(crate) struct RespCommandCounter {
    state: RespState,
}

#[derive(Debug, Default, Clone, Copy)]
enum RespState {
    /// Between commands.
    #[default]
    Idle,
    /// In `*<n>` (after the `*`).
    ArrayLen { value: u64, negative: bool },
    /// Expecting the `$` of the next bulk string; `left` elements remain.
    BulkStart { left: u64 },
    /// In `$<len>` (after the `$`).
    BulkLen {
        left: u64,
        value: u64,
        negative: bool,
    },
    /// In a bulk string's payload and its `\r\n`: `bytes` remain.
    BulkBody { left: u64, bytes: u64 },
    /// In an inline command line.
    Inline { nonblank: bool },
    /// After a protocol error (Redis closes such a connection).
    Broken,
}

impl RespCommandCounter {
    /// Feeds the next chunk; returns how many commands it completed.
    pub(crate) fn feed(&mut self, data: &[u8]) -> u64 {
        use RespState::*;
        let mut completed = 0;
        let mut i = 0;
        while i < data.len() {
            let byte = data[i];
            self.state = match self.state {
                Idle => match byte {
                    b'*' => ArrayLen {
                        value: 0,
                        negative: false,
                    },
                    b'\n' => Idle,
                    _ => Inline {
                        nonblank: !byte.is_ascii_whitespace(),
                    },
                },
                ArrayLen { value, negative } => match byte {
                    b'0'..=b'9' => ArrayLen {
                        value: push_digit(value, byte),
                        negative,
                    },
                    b'-' => ArrayLen {
                        value,
                        negative: true,
                    },
                    b'\n' if negative || value == 0 => Idle,
                    b'\n' => BulkStart { left: value },
                    _ => ArrayLen { value, negative },
                },
                BulkStart { left } => match byte {
                    b'$' => BulkLen {
                        left,
                        value: 0,
                        negative: false,
                    },
                    _ => Broken,
                },
                BulkLen {
                    left,
                    value,
                    negative,
                } => match byte {
                    b'0'..=b'9' => BulkLen {
                        left,
                        value: push_digit(value, byte),
                        negative,
                    },
                    b'-' => BulkLen {
                        left,
                        value,
                        negative: true,
                    },
                    // A null bulk string: no payload.
                    b'\n' if negative => element_done(left, &mut completed),
                    b'\n' => BulkBody {
                        left,
                        bytes: value.saturating_add(2),
                    },
                    _ => BulkLen {
                        left,
                        value,
                        negative,
                    },
                },
                BulkBody { left, bytes } => {
                    let available = (data.len() - i) as u64;
                    let take = bytes.min(available);
                    // `take >= 1`; the loop's `i += 1` takes the last one.
                    i += take as usize - 1;
                    if take == bytes {
                        element_done(left, &mut completed)
                    } else {
                        BulkBody {
                            left,
                            bytes: bytes - take,
                        }
                    }
                }
                Inline { nonblank } => match byte {
                    b'\n' => {
                        if nonblank {
                            completed += 1;
                        }
                        Idle
                    }
                    _ => Inline {
                        nonblank: nonblank || !byte.is_ascii_whitespace(),
                    },
                },
                Broken => Broken,
            };
            i += 1;
        }
        completed
    }
}

fn push_digit(value: u64, digit: u8) -> u64 {
    value
        .saturating_mul(10)
        .saturating_add(u64::from(digit - b'0'))
}

fn element_done(left: u64, completed: &mut u64) -> RespState {
    if left <= 1 {
        *completed += 1;
        RespState::Idle
    } else {
        RespState::BulkStart { left: left - 1 }
    }
}
