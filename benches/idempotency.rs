//! What the idempotency layer costs a request, side by side in one run (one
//! process, one local redis-server reached through a counting proxy, requests
//! one at a time):
//!
//! * **bare**: the handler alone (a tower `service_fn` answering 62 bytes);
//! * **first**: the same handler behind `IdempotencyLayer`, every request with a
//!   key of its own: the record read, the lease, the record's fence, the store
//!   and the release;
//! * **replay**: a request whose key's response is stored: the record read.
//!
//! The rows run interleaved, in rounds of [`BATCH`] requests each (the row that
//! starts a round rotates), so a machine's noise falls on all three alike.
//! Reported per row: p50 and p99 latency, what each adds to bare's, and the
//! Redis commands per request (counted by the proxy, background traffic included).
//! Each run measures loopback and a 0.5 ms round trip (the proxy delays every
//! request by 500 µs).
//!
//! ```text
//! cargo bench --bench idempotency                          # 40 rounds per round trip
//! LOCKFLIGHT_BENCH_ROUNDS=100 cargo bench --bench idempotency
//! ```
//!
//! Without `--bench` (as `cargo test --benches` runs it) a tiny smoke
//! configuration runs, and checks that a replay made one Redis request.

// Only its runtime: this bench sizes its run in rounds, not seconds.
#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use lockflight::layer::IdempotencyLayer;
use lockflight::{Locker, RedisBackend};
use testkit::{CountingProxy, RedisServer};
use tower::{BoxError, Layer, ServiceExt, service_fn};

/// Requests per row and round.
const BATCH: usize = 50;
/// The handler's answer.
const ANSWER: &[u8] = b"{\"payment\":\"accepted\",\"amount\":500,\"currency\":\"EUR\",\"ok\":true}";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    Bare,
    First,
    Replay,
}

const ROWS: [Row; 3] = [Row::Bare, Row::First, Row::Replay];

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::Bare => "bare handler",
            Row::First => "first request (layer)",
            Row::Replay => "replay (layer)",
        }
    }
}

#[derive(Default)]
struct Measured {
    latencies: Vec<Duration>,
    commands: u64,
}

impl Measured {
    fn percentile(&mut self, p: usize) -> Duration {
        self.latencies.sort_unstable();
        let i = (self.latencies.len() * p / 100).min(self.latencies.len() - 1);
        self.latencies[i]
    }
}

async fn handler(
    _req: http::Request<Full<Bytes>>,
) -> Result<http::Response<Full<Bytes>>, BoxError> {
    Ok(http::Response::new(Full::new(Bytes::from_static(ANSWER))))
}

fn request(key: &str) -> http::Request<Full<Bytes>> {
    http::Request::post("/payments")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{\"amount\":500}")))
        .expect("a valid request")
}

/// Measures every row for `rounds` rounds through `proxy` (delaying each request
/// by `delay`); returns the rows in [`ROWS`]'s order.
async fn measure(proxy: &CountingProxy, delay: Duration, rounds: usize) -> Vec<Measured> {
    let backend = RedisBackend::builder(proxy.url())
        .prefix(format!("bench-idem-{}", delay.as_micros()))
        .connect()
        .await
        .expect("connect");
    let locker = Locker::builder(backend).build().expect("a locker");
    let layered = IdempotencyLayer::new(locker).layer(service_fn(handler));
    let bare = service_fn(handler);
    // The replayed key's response, stored once.
    let stored = layered.clone().oneshot(request("stored")).await.unwrap();
    assert_eq!(
        stored.into_body().collect().await.unwrap().to_bytes(),
        ANSWER
    );
    proxy.set_delay(delay);

    let mut measured: Vec<Measured> = ROWS.iter().map(|_| Measured::default()).collect();
    let mut next_key = 0u64;
    for round in 0..rounds {
        for turn in 0..ROWS.len() {
            let i = (round + turn) % ROWS.len();
            let before = proxy.commands();
            for _ in 0..BATCH {
                let started = Instant::now();
                let body: Bytes = match ROWS[i] {
                    Row::Bare => {
                        let response = bare.oneshot(request("-")).await.unwrap();
                        response.into_body().collect().await.unwrap().to_bytes()
                    }
                    Row::First => {
                        next_key += 1;
                        let key = format!("first-{next_key}");
                        let response = layered.clone().oneshot(request(&key)).await.unwrap();
                        response.into_body().collect().await.unwrap().to_bytes()
                    }
                    Row::Replay => {
                        let response = layered.clone().oneshot(request("stored")).await.unwrap();
                        response.into_body().collect().await.unwrap().to_bytes()
                    }
                };
                measured[i].latencies.push(started.elapsed());
                assert_eq!(body, ANSWER, "{:?}", ROWS[i]);
            }
            measured[i].commands += proxy.commands() - before;
        }
    }
    proxy.set_delay(Duration::ZERO);
    measured
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let rounds = if bench {
        std::env::var("LOCKFLIGHT_BENCH_ROUNDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(40)
    } else {
        2
    };
    let delays: &[Duration] = if bench {
        &[Duration::ZERO, Duration::from_micros(500)]
    } else {
        &[Duration::ZERO]
    };
    common::runtime().block_on(async move {
        let server = RedisServer::start();
        let proxy = CountingProxy::start(&server).await;
        println!("{rounds} rounds of {BATCH} requests per row, interleaved, one request at a time\n");
        println!(
            "| round trip | row | requests | p50 | p99 | p50 over bare | p99 over bare | Redis commands / request |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|---:|");
        for &delay in delays {
            let mut rows = measure(&proxy, delay, rounds).await;
            let (bare50, bare99) = (rows[0].percentile(50), rows[0].percentile(99));
            let trip = if delay.is_zero() {
                "loopback".to_owned()
            } else {
                format!("+{} µs", delay.as_micros())
            };
            for (row, m) in ROWS.iter().zip(rows.iter_mut()) {
                let (p50, p99) = (m.percentile(50), m.percentile(99));
                let n = m.latencies.len();
                println!(
                    "| {trip} | {} | {n} | {} µs | {} µs | {} µs | {} µs | {:.2} |",
                    row.label(),
                    p50.as_micros(),
                    p99.as_micros(),
                    p50.saturating_sub(bare50).as_micros(),
                    p99.saturating_sub(bare99).as_micros(),
                    m.commands as f64 / n as f64,
                );
            }
            let replay = &rows[2];
            // A replay is one record read; background traffic (renewal scans,
            // subscriptions) may add a little.
            let per_replay = replay.commands as f64 / replay.latencies.len() as f64;
            assert!(per_replay < 1.5, "a replay made {per_replay:.2} Redis commands");
        }
    });
}
