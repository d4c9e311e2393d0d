//! Supervised child processes: spawning, signals, `/proc` states, logs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// The supervisor. Arguments: `$1` = the server's directory, `$2` = the
/// redis-server binary, then redis-server's arguments.
///
/// It prints the server's pid, then blocks reading its stdin (a pipe held by
/// the test process). A line `keep` means an orderly stop by the harness; end
/// of file means the test process died, and then the directory is removed too.
/// Either way the server is killed and reaped before the supervisor exits.
pub(crate) const SUPERVISOR: &str = r#"
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

pub(crate) struct Supervised {
    pub(crate) supervisor: Child,
    pub(crate) pid: u32,
}

pub(crate) enum SpawnError {
    /// The port was taken by somebody else: try again (another port).
    PortConflict(String),
    /// Anything else: give up.
    Failed(String),
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

pub(crate) fn tempdir() -> tempfile::TempDir {
    let mut builder = tempfile::Builder::new();
    builder.prefix("lockflight-redis-");
    // In memory where the system has a tmpfs: a cluster node fsyncs `nodes.conf`
    // and a sentinel its config at every change, in its event loop, and on a disk
    // still writing back a build an fsync can stall the server for seconds.
    if let Ok(dir) = builder.tempdir_in("/dev/shm") {
        return dir;
    }
    // Else test and bench binaries get a directory of their own under target/.
    match target_tmpdir() {
        Some(base) if std::fs::create_dir_all(&base).is_ok() => builder.tempdir_in(base),
        _ => builder.tempdir(),
    }
    .expect("create a temporary directory for redis-server")
}

/// `<target>/tmp` (cargo's `CARGO_TARGET_TMPDIR` of integration tests and benches)
/// for a binary that runs from `<target>/<profile>/deps/`, as the test and bench
/// binaries do; `None` for any other binary (the system's temporary directory is
/// used then). Found at run time: cargo sets `CARGO_TARGET_TMPDIR` only when it
/// compiles an integration test or a bench, never this library.
fn target_tmpdir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    Some(deps.parent()?.parent()?.join("tmp"))
}

/// Every data node's arguments: no persistence, and a replica's full sync starts
/// at once (by default a primary waits 5 s for more replicas to share it).
pub(crate) const DATA_ARGS: [&str; 6] = [
    "--save",
    "",
    "--appendonly",
    "no",
    "--repl-diskless-sync-delay",
    "0",
];

/// [`DATA_ARGS`] as owned strings, for a node's argument builder.
pub(crate) fn data_args() -> Vec<String> {
    DATA_ARGS.iter().map(|s| s.to_string()).collect()
}

/// Starts redis-server on `port` under a supervisor and waits until it answers.
pub(crate) fn spawn_redis(binary: &Path, dir: &Path, port: u16) -> Result<Supervised, SpawnError> {
    let mut standalone = DATA_ARGS.to_vec();
    standalone.extend(["--dbfilename", "dump.rdb", "--enable-debug-command", "yes"]);
    spawn_supervised(binary, dir, port, &[], &standalone, None)
}

/// The username (none: `default`) and password a started server requires.
pub(crate) type Credentials = (Option<String>, String);

/// Starts `binary <leading> --bind 127.0.0.1 --port <port> <flags>` under the
/// supervisor (logging into `dir`) and waits until it answers on `port`.
/// `leading` comes first because `redis-server` reads a config file (a
/// sentinel's) only as its first argument. A server that requires a password is
/// asked with `auth`.
pub(crate) fn spawn_supervised(
    binary: &Path,
    dir: &Path,
    port: u16,
    leading: &[String],
    flags: &[&str],
    auth: Option<&Credentials>,
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
        match server_pid(port, auth) {
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

/// Asks whatever listens on `port` for its pid (`INFO server`, after `AUTH`
/// with `auth`); `None` if nothing answers properly (yet).
pub(crate) fn server_pid(port: u16, auth: Option<&Credentials>) -> Option<u32> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = StdTcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(1)))
        .ok()?;
    if let Some((user, password)) = auth {
        let args: Vec<&str> = ["AUTH"]
            .into_iter()
            .chain(user.as_deref())
            .chain([password.as_str()])
            .collect();
        let mut cmd = format!("*{}\r\n", args.len());
        for a in args {
            cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream.write_all(cmd.as_bytes()).ok()?;
    }
    stream.write_all(b"INFO server\r\n").ok()?;
    let mut reader = BufReader::new(stream);
    if auth.is_some() {
        let mut ok = String::new();
        reader.read_line(&mut ok).ok()?;
        if !ok.starts_with("+OK") {
            return None;
        }
    }
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
pub(crate) fn stop_supervised(mut running: Supervised, paused: bool) {
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
pub(crate) fn send_signal(pid: u32, signal: &str) -> bool {
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

pub(crate) fn wait_for_state(pid: u32, done: impl Fn(Option<char>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !done(process_state(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(crate) fn read_logs(dir: &Path) -> String {
    let mut text = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    let stdout = std::fs::read_to_string(dir.join("redis.stdout")).unwrap_or_default();
    if !stdout.trim().is_empty() {
        text.push_str("\n-- redis-server stdout/stderr --\n");
        text.push_str(&stdout);
    }
    text
}

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A child process running one test of this test binary (an `#[ignore]`d test
/// that acts as the child when `envs` names its environment variable): stdout
/// piped, stderr inherited, killed when dropped.
pub fn spawn_test_child(
    test: &str,
    envs: &[(&str, String)],
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    use tokio::io::AsyncBufReadExt;

    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = tokio::process::Command::new(exe);
    command
        .args([
            "--exact",
            test,
            "--nocapture",
            "--include-ignored",
            "--test-threads",
            "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    for (name, value) in envs {
        command.env(name, value);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("spawn the child {test}: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    (child, tokio::io::BufReader::new(stdout).lines())
}

/// The rest of the child's first line that contains `marker` (what follows it,
/// trimmed), waiting up to 30 s; panics if the child ends first.
pub async fn child_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    marker: &str,
) -> String {
    let wait = async {
        while let Some(line) = lines.next_line().await.expect("read the child's stdout") {
            if let Some(at) = line.find(marker) {
                return line[at + marker.len()..].trim().to_owned();
            }
        }
        panic!("the child exited before printing {marker:?}");
    };
    match tokio::time::timeout(Duration::from_secs(30), wait).await {
        Ok(rest) => rest,
        Err(_) => panic!("the child did not print {marker:?} within 30 s"),
    }
}

/// In a child holder test (spawned by [`spawn_holder_child`]): `None` in an
/// ordinary test run (`child_env` is not set; the test then does nothing), else a
/// backend on the parent's server under its prefix, and the key to hold.
pub async fn holder_child_target(child_env: &str) -> Option<(lockflight::RedisBackend, String)> {
    std::env::var_os(child_env)?;
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let backend = lockflight::RedisBackend::builder(var("LOCKFLIGHT_CHILD_URL"))
        .prefix(var("LOCKFLIGHT_CHILD_PREFIX"))
        .connect()
        .await
        .expect("child: connect");
    Some((backend, var("LOCKFLIGHT_CHILD_KEY")))
}

/// Spawns the child holder test `test` (the full test path; it calls
/// [`holder_child_target`] with `child_env`) on the server at `url`, under
/// `prefix`, holding `key`.
pub fn spawn_holder_child(
    test: &str,
    child_env: &str,
    url: String,
    prefix: &str,
    key: &str,
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    spawn_test_child(
        test,
        &[
            (child_env, "1".to_owned()),
            ("LOCKFLIGHT_CHILD_URL", url),
            ("LOCKFLIGHT_CHILD_PREFIX", prefix.to_owned()),
            ("LOCKFLIGHT_CHILD_KEY", key.to_owned()),
        ],
    )
}

/// In a child process: prints `line` on a line of its own, flushed at once, for
/// the parent's [`child_line`].
pub fn tell_parent(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "\n{line}").unwrap();
    out.flush().unwrap();
}
