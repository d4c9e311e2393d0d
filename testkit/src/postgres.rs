//! A real PostgreSQL server for the tests of lockflight's fenced SQL writes.
//!
//! [`Postgres::start`] runs `initdb` and `postgres` (the Debian package
//! `postgresql`; `scripts/test` installs it) in a temporary directory, listening on
//! a free port of 127.0.0.1 only, with durability off (`fsync`,
//! `synchronous_commit`) since nothing outlives the test. PostgreSQL refuses to run
//! as root: under root both run as the system user `postgres` (created by the
//! package), which then owns the directory.
//!
//! Like the Redis servers, the server runs under a small `sh` supervisor whose
//! stdin is a pipe held by the test process: when the test process ends for any
//! reason the pipe closes, and the supervisor stops the server (fast shutdown) and
//! removes the directory. Dropping the value does the same at once.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::is_executable;

/// The supervisor: `$1` = directory, `$2` = the postgres binary, then its
/// arguments. Prints the server's pid, waits for stdin to close (or a line), then
/// stops the server with SIGINT (fast shutdown), waits for it and removes the
/// directory.
const SUPERVISOR: &str = r#"
dir=$1; bin=$2; shift 2
"$bin" "$@" </dev/null >>"$dir/postgres.log" 2>&1 &
pid=$!
trap 'kill -INT "$pid" 2>/dev/null; wait "$pid"; rm -rf -- "$dir"; exit 0' HUP INT TERM
echo "$pid"
read -r cmd
kill -INT "$pid" 2>/dev/null
wait "$pid"
rm -rf -- "$dir"
"#;

const NOT_FOUND: &str = "PostgreSQL (initdb, postgres) not found: install the Debian package `postgresql` \
     (scripts/test does), or put its bin directory (/usr/lib/postgresql/<version>/bin) on PATH";

/// A PostgreSQL server of the test process; see the [module docs](self).
pub struct Postgres {
    port: u16,
    dir: PathBuf,
    supervisor: Option<Child>,
}

impl Postgres {
    /// Starts a server on a free loopback port and waits until it accepts
    /// connections (at most 60 s).
    ///
    /// Panics with a clear message if PostgreSQL is not installed or does not come
    /// up (the message includes its log).
    pub fn start() -> Postgres {
        let bin = bin_dir().unwrap_or_else(|| panic!("{NOT_FOUND}"));
        let dir = tempfile::Builder::new()
            .prefix("lockflight-postgres-")
            .tempdir()
            .expect("create a temporary directory for PostgreSQL")
            .keep();
        let user = run_as();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the directory");
        }
        let data = dir.join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
                "-D",
            ])
            .arg(&data)
            .stdin(Stdio::null());
        as_user(&mut initdb, user);
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut last = String::new();
        for _ in 0..8 {
            let port = crate::ports::reserve_port();
            let mut command = Command::new("sh");
            command
                .arg("-c")
                .arg(SUPERVISOR)
                .arg("sh")
                .arg(&dir)
                .arg(bin.join("postgres"))
                .arg("-D")
                .arg(&data)
                .args(["-p", &port.to_string(), "-k"])
                .arg(&dir)
                .args([
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=50",
                    "-c",
                    "shared_buffers=16MB",
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            as_user(&mut command, user);
            let mut supervisor = command.spawn().expect("run sh to start postgres");
            let mut line = String::new();
            let _ = supervisor
                .stdout
                .take()
                .map(|out| BufReader::new(out).read_line(&mut line));
            let mut server = Postgres {
                port,
                dir: dir.clone(),
                supervisor: Some(supervisor),
            };
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if server.ready(&bin) {
                    return server;
                }
                let log = server.log();
                let exited = server
                    .supervisor
                    .as_mut()
                    .is_some_and(|s| matches!(s.try_wait(), Ok(Some(_))));
                if exited || log.contains("could not bind") || Instant::now() > deadline {
                    last = log;
                    server.stop(false);
                    crate::ports::release_port(port);
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if !last.contains("could not bind") && !last.contains("already in use") {
                break;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!("PostgreSQL did not start; its log:\n{last}");
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres` (trust authentication).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
    }

    fn ready(&self, bin: &Path) -> bool {
        let tool = bin.join("pg_isready");
        let tool = if is_executable(&tool) {
            tool
        } else {
            PathBuf::from("pg_isready")
        };
        Command::new(tool)
            .args([
                "-q",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-t",
                "1",
            ])
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Stops the server (fast shutdown) and removes its directory; bounded.
    fn stop(&mut self, _panicking: bool) {
        let Some(mut supervisor) = self.supervisor.take() else {
            return;
        };
        if let Some(mut stdin) = supervisor.stdin.take() {
            let _ = stdin.write_all(b"stop\n");
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match supervisor.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    let _ = supervisor.kill();
                    let _ = supervisor.wait();
                    return;
                }
            }
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- PostgreSQL log (port {}) ---\n{}",
                self.port,
                crate::process::tail(&self.log(), 40)
            );
        }
        self.stop(std::thread::panicking());
    }
}

/// One server per test binary, started at first use (stopped when the test
/// process exits: its supervisor's stdin closes). Keep each test's rows apart
/// (a table or keys of its own).
pub fn shared_postgres() -> &'static Postgres {
    static SHARED: OnceLock<Postgres> = OnceLock::new();
    SHARED.get_or_init(Postgres::start)
}

/// The directory of `initdb` and `postgres`: the one of `initdb` on `PATH`
/// (symlinks resolved), else the newest `/usr/lib/postgresql/<version>/bin`.
fn bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("initdb"))
            .find(|candidate| is_executable(candidate))
    });
    if let Some(initdb) = on_path {
        let real = std::fs::canonicalize(&initdb).unwrap_or(initdb);
        let dir = real.parent()?.to_path_buf();
        if is_executable(&dir.join("postgres")) {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            is_executable(&bin.join("initdb")).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Under root, the uid and gid of the system user `postgres` (PostgreSQL refuses
/// to run as root); `None` otherwise.
fn run_as() -> Option<(u32, u32)> {
    if !nix::unistd::Uid::effective().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            panic!("running as root, and there is no system user `postgres` to run PostgreSQL as (the package `postgresql` creates it)")
        });
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

fn as_user(command: &mut Command, user: Option<(u32, u32)>) {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = user {
        command
            .uid(uid)
            .gid(gid)
            .env("HOME", "/tmp")
            .current_dir("/tmp");
    }
}
