//! README's programs run as written, against a private `redis-server`; README's
//! Install section names this crate's dependencies; README stays a landing page.
//!
//! No test bounds the wall clock tightly: a program gets minutes to finish, and
//! the axum server's listener is waited for by retrying the connect.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use lockflight::{Locker, RedisBackend};
use testkit::RedisServer;

/// README, as the workspace has it.
const README: &str = include_str!("../../README.md");
/// This crate's manifest.
const MANIFEST: &str = include_str!("../Cargo.toml");

/// The most lines README may have: a page that fits a screen or two, as axum's
/// and tokio's; the depth goes to the guide (`lockflight::guide`).
const MAX_README_LINES: usize = 200;

/// How long a program may take to start, connect or finish, on a loaded machine.
const GENEROUS: Duration = Duration::from_secs(120);

#[test]
fn readme_is_a_landing_page() {
    let lines = README.lines().count();
    assert!(
        lines <= MAX_README_LINES,
        "README.md has {lines} lines; at most {MAX_README_LINES}: move the depth to the guide (docs/guide/)"
    );
}

/// The crates README's Install section tells a user to add are this crate's
/// dependencies (redis-rs of another version aside), with the same versions
/// and features: the doctests and programs here build with exactly that.
#[test]
fn install_section_names_this_crates_dependencies() {
    let install = toml_block_under(README, "## Install");
    let ours = table(MANIFEST, "[dependencies]");
    let readme = table(&install, "[dependencies]");
    let names = |deps: &[(String, String)]| {
        let mut names: Vec<String> = deps.iter().map(|(name, _)| name.clone()).collect();
        names.sort();
        names
    };
    let mut expected = names(&ours);
    expected.retain(|name| name != "redis");
    assert_eq!(
        names(&readme),
        expected,
        "README's Install section and readme/Cargo.toml name different crates"
    );
    for (name, spec) in &readme {
        let (_, our_spec) = ours.iter().find(|(n, _)| n == name).expect("same names");
        // lockflight is a path dependency here and a registry one for users.
        let ours = our_spec.replace(r#"path = "..", "#, "");
        assert_eq!(
            &ours, spec,
            "{name}: README says `{spec}`, readme/Cargo.toml `{our_spec}`"
        );
    }
}

#[test]
fn quick_start_runs_and_leaves_the_key_free() {
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let output = wait_with_limit(
        Command::new(env!("CARGO_BIN_EXE_readme-quickstart"))
            .env("REDIS_URL", server.url())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start README's quick start"),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the quick start failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let mut lines = stdout.lines();
    let first = lines.next().unwrap_or_default();
    assert!(
        first.starts_with("holding sku:555 with fencing token "),
        "{stdout}"
    );
    let second = lines.next().unwrap_or_default();
    assert!(second.starts_with("then fencing token "), "{stdout}");
    assert!(second.ends_with(": tokens of a key only grow"), "{stdout}");

    // It returned from `main` holding nothing: another instance takes the key at
    // once (a lease cached past the program's end would keep it until its TTL).
    runtime().block_on(async {
        let locker = Locker::builder(RedisBackend::connect(&server.url()).await.unwrap())
            .build()
            .unwrap();
        let guard = locker.try_lock("sku:555").await.unwrap();
        let guard = guard.expect("the quick start left sku:555 locked");
        guard.release().await.unwrap();
    });
}

#[test]
fn axum_example_serves_a_locked_request() {
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let app = App::start(&server);

    let ok = app.post("/items/555/reserve", r#"{"qty":2}"#);
    assert!(ok.starts_with("HTTP/1.1 200 "), "{ok}");
    let body = ok.split("\r\n\r\n").nth(1).unwrap_or_default();
    assert!(
        body.starts_with("reserved 2 of sku:555 under "),
        "the handler's answer: {ok}"
    );

    // A body the handler's extractor refuses: answered as a problem, no lock taken.
    let refused = app.post("/items/555/reserve", r#"{"qty":"two"}"#);
    assert!(refused.starts_with("HTTP/1.1 422 "), "{refused}");
    assert!(
        refused
            .to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{refused}"
    );
    assert!(refused.contains(r#""code":"invalid_request""#), "{refused}");
}

/// README's axum program, serving on a free loopback port; killed when dropped.
struct App {
    child: Child,
    addr: SocketAddr,
}

impl App {
    /// Starts the program on `server` and waits until it accepts connections.
    /// The port is free when chosen; if another process takes it before the
    /// program binds, the program exits and is started again on another.
    fn start(server: &RedisServer) -> App {
        for _ in 0..5 {
            let addr = free_port();
            let child = Command::new(env!("CARGO_BIN_EXE_readme-axum"))
                .env("REDIS_URL", server.url())
                .env("LISTEN_ADDR", addr.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start README's axum example");
            let mut app = App { child, addr };
            if app.wait_until_listening() {
                return app;
            }
        }
        panic!("README's axum example did not start listening (its errors are above)");
    }

    /// Retries the connect until the program listens (`true`) or exits (`false`).
    fn wait_until_listening(&mut self) -> bool {
        let started = Instant::now();
        loop {
            if TcpStream::connect(self.addr).is_ok() {
                return true;
            }
            if let Some(status) = self.child.try_wait().expect("the program's status") {
                eprintln!("README's axum example exited before listening: {status}");
                return false;
            }
            assert!(
                started.elapsed() < GENEROUS,
                "README's axum example is still not listening on {} after {GENEROUS:?}",
                self.addr
            );
            sleep(Duration::from_millis(20));
        }
    }

    /// Sends `POST path` with a JSON body over HTTP/1.1 and returns the whole
    /// response.
    fn post(&self, path: &str, json: &str) -> String {
        let mut stream = TcpStream::connect(self.addr).expect("connect to the axum example");
        stream.set_read_timeout(Some(GENEROUS)).unwrap();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{json}",
            self.addr,
            json.len()
        );
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .expect("read the response");
        response
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback address with a port that was free a moment ago.
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
}

/// The program's output once it exits; kills it if it runs past [`GENEROUS`].
fn wait_with_limit(mut child: Child) -> Output {
    let started = Instant::now();
    while child.try_wait().expect("the program's status").is_none() {
        if started.elapsed() > GENEROUS {
            let _ = child.kill();
            let output = child.wait_with_output().expect("the program's output");
            panic!(
                "the program did not finish within {GENEROUS:?}:\n{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("the program's output")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The first ```toml block under `heading`.
fn toml_block_under(markdown: &str, heading: &str) -> String {
    let mut lines = markdown
        .lines()
        .skip_while(|line| line.trim_end() != heading)
        .skip_while(|line| !line.starts_with("```toml"))
        .skip(1);
    let block: Vec<&str> = lines
        .by_ref()
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert!(
        !block.is_empty(),
        "README has no ```toml block under {heading}"
    );
    block.join("\n")
}

/// The `name = spec` lines of the TOML table `header` (comments dropped).
fn table(toml: &str, header: &str) -> Vec<(String, String)> {
    toml.lines()
        .skip_while(|line| line.trim() != header)
        .skip(1)
        .take_while(|line| !line.starts_with('['))
        .filter_map(|line| {
            let line = line.split('#').next().unwrap_or_default().trim();
            let (name, spec) = line.split_once('=')?;
            Some((name.trim().to_owned(), spec.trim().to_owned()))
        })
        .collect()
}
