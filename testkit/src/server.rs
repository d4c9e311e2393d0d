//! The real `redis-server` of a test: [`RedisServer`], the shared one, and small helpers.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::*;

/// How long `start` / `restart` wait for the server to answer.
pub(crate) const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the startup wait polls.
pub(crate) const STARTUP_POLL: Duration = Duration::from_millis(10);
/// How many lines of the log are printed when a test panics.
pub(crate) const LOG_TAIL_LINES: usize = 50;
/// Response timeout of the connections made by this module.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connection timeout of the connections made by this module.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

/// A real `redis-server` process on 127.0.0.1, killed when dropped.
///
/// All methods take `&self`, so a server can be shared (e.g. in an `Arc`)
/// between tasks. The blocking methods (`start`, `restart`, `kill`, `pause`,
/// `resume`) block the calling thread for a few milliseconds; that is fine in
/// `#[tokio::test]` of either flavor.
pub struct RedisServer {
    port: u16,
    binary: PathBuf,
    dir: tempfile::TempDir,
    state: Mutex<ServerState>,
}

pub(crate) struct ServerState {
    running: Option<Supervised>,
    paused: bool,
    last_pid: u32,
}

impl RedisServer {
    /// Starts a new server on a free port and waits until it answers.
    ///
    /// Panics with a clear message if the run's server binary (`redis-server`,
    /// or `valkey-server` with `LOCKFLIGHT_TEST_ENGINE=valkey`) is missing or does
    /// not come up within 10 s (the message includes the server's log).
    pub fn start() -> RedisServer {
        let binary = crate::engine::server_binary();
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
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TCP port (stays the same across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The pid of the `redis-server` process (the last one, once killed).
    pub fn pid(&self) -> u32 {
        self.lock().last_pid
    }

    /// Whether the server process is running (it may be paused).
    pub fn is_running(&self) -> bool {
        self.lock().running.is_some()
    }

    /// The server's own temporary directory (holds `redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client for [`url`](Self::url).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis::Client::open on the test server's URL")
    }

    /// A new multiplexed connection, with a 10 s response timeout and a 5 s
    /// connection timeout (not redis-rs's 500 ms / 1 s defaults).
    ///
    /// Panics if the server cannot be reached.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        connection_for(&self.client()).await
    }

    /// `FLUSHALL` — only on a server of your own: panics on [`shared()`].
    pub async fn flushall(&self) {
        self.forbid_on_shared("FLUSHALL");
        let mut con = self.connection().await;
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut con)
            .await
            .expect("FLUSHALL on the test server");
    }

    /// Stops the server with `SIGSTOP`: it keeps its connections open but
    /// answers nothing until [`resume`](Self::resume).
    pub fn pause(&self) {
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
    pub fn resume(&self) {
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
    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// Kills the server with `SIGKILL` and reaps it: the port is closed and
    /// all data is lost. Does nothing if it is not running. See
    /// [`restart`](Self::restart) to bring it back.
    pub fn kill(&self) {
        self.forbid_on_shared("kill()");
        let mut state = self.lock();
        if let Some(running) = state.running.take() {
            stop_supervised(running, state.paused);
        }
        state.paused = false;
    }

    /// Kills the server if it is running, then starts a new one **on the same
    /// port** with an empty dataset, and waits until it answers.
    pub fn restart(&self) {
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
    pub fn log(&self) -> String {
        read_logs(self.dir.path())
    }

    /// A guard that prints the last lines of this server's log to stderr if it
    /// is dropped while the thread panics. Useful with [`shared()`], which is
    /// never dropped (an owned server already does this in its `Drop`).
    pub fn log_on_panic(&self) -> LogOnPanic<'_> {
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
                "{what} on testkit::shared(): other tests use it at the same time; \
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
pub struct LogOnPanic<'a> {
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
pub fn shared() -> &'static RedisServer {
    SHARED.get_or_init(RedisServer::start)
}

pub(crate) static SHARED: OnceLock<RedisServer> = OnceLock::new();

/// How most tests start: the [`shared`] server, a guard that prints its log if the
/// test panics, and a new [`unique_prefix`] (from `name`) for the test's keys.
pub fn shared_scene(name: &str) -> (&'static RedisServer, LogOnPanic<'static>, String) {
    let server = shared();
    (server, server.log_on_panic(), unique_prefix(name))
}

/// A key prefix unique to this call: `lftest:<name>:<pid>:<counter>`.
///
/// `name` is sanitized (anything but ASCII alphanumerics, `_` and `-` becomes
/// `_`) so the prefix is safe in `KEYS`/`SCAN` patterns, and the counter has a
/// fixed width, so `format!("{prefix}*")` never matches another prefix.
pub fn unique_prefix(name: &str) -> String {
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

/// The number of keys matching the glob `pattern` (via `KEYS`), release records
/// (`…}:rel:<token>`) and instance cards (`<prefix>:inst:<id>`) left out: each
/// released lease leaves a record, which expires by itself after the release
/// schedule's window (see `RedisBackendBuilder::response_timeout`), and each
/// instance keeps a card while it runs (3 minutes after), and the server's life
/// stays for good; what must not be left behind is lock state.
pub async fn key_count(server: &RedisServer, pattern: &str) -> usize {
    let mut con = server.connection().await;
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut con)
        .await
        .expect("KEYS on the test server");
    keys.iter()
        .filter(|k| !is_release_record(k) && !is_instance_card(k) && !is_life(k))
        .count()
}

/// Whether `name` is a server's life, `<prefix>:life` (on a Cluster
/// `<prefix>:life:{<tag>}`): the one key lockflight keeps for good, which says
/// which data set the server holds.
pub fn is_life(name: &[u8]) -> bool {
    name.ends_with(b":life")
        || name
            .windows(7)
            .rposition(|w| w == b":life:{")
            .is_some_and(|at| name.ends_with(b"}") && !name[..at].contains(&b'{'))
}

/// Whether `name` is an instance's card, `<prefix>:inst:<16 hex digits>`.
pub(crate) fn is_instance_card(name: &[u8]) -> bool {
    name.len() > 22
        && name[name.len() - 22..].starts_with(b":inst:")
        && name[name.len() - 16..].iter().all(u8::is_ascii_hexdigit)
        && !name.contains(&b'{')
}

/// Whether `name` is a lease's release record, `<prefix>:{<key>}:rel:<token>`.
pub(crate) fn is_release_record(name: &[u8]) -> bool {
    name.windows(6).any(|w| w == b"}:rel:")
}

/// Polls `f` every 5 ms until it returns `true` (then returns `true`) or
/// `timeout` has passed (then returns `false`). `f` is always called at least
/// once, and once more after the deadline.
pub async fn wait_until<F, Fut>(timeout: Duration, mut f: F) -> bool
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
pub async fn connection_for(client: &redis::Client) -> redis::aio::MultiplexedConnection {
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

#[cfg(test)]
mod tests {
    use super::{is_instance_card, is_release_record};

    #[test]
    fn cards_and_records_are_told_from_lock_state() {
        assert!(is_instance_card(
            b"lftest:x:1:00000001:inst:0123456789abcdef"
        ));
        assert!(!is_instance_card(b"p:{k}:inst:0123456789abcdef"));
        assert!(!is_instance_card(b"p:{k}"));
        assert!(!is_instance_card(b"p:inst:0123"));
        assert!(is_release_record(b"p:{k}:rel:00ff"));
        assert!(!is_release_record(b"p:{k}:fence"));
    }
}
