//! The load: a burst of reservations, a fixed number of them a fixed number at a
//! time, and what came back.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lockflight::FencingToken;
use serde_json::json;
use tokio::task::JoinSet;

use super::{CONCURRENCY, Mode, REQUESTS};
use crate::client::Http;

pub(super) fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[derive(Debug, Default)]
pub(super) struct Burst {
    pub(super) reserved: u64,
    pub(super) out_of_stock: u64,
    pub(super) unavailable: u64,
    pub(super) errors: u64,
    pub(super) latencies: Vec<Duration>,
    pub(super) elapsed: Duration,
    pub(super) fence_order_ok: bool,
}

/// `(sku, remaining, fencing token)` of one acknowledged reservation.
type Ack = (String, i64, FencingToken);

/// Fires `REQUESTS` reservations, `CONCURRENCY` at a time. Request `i` reserves
/// `skus[i % n]` at `targets[i % m]`, so every SKU reaches every instance.
pub(super) async fn burst(
    http: &Http,
    targets: &[String],
    skus: &[String],
    mode: Mode,
    label: &str,
) -> Burst {
    let bar = ProgressBar::with_draw_target(Some(REQUESTS as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{prefix:>30} [{bar:30}] {pos:>4}/{len} {per_sec:>12}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_owned());
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (http, next, bar) = (http.clone(), Arc::clone(&next), bar.clone());
        let (targets, skus) = (targets.to_vec(), skus.to_vec());
        workers.spawn(async move {
            let mut out = Burst::default();
            let mut acks: Vec<Ack> = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= REQUESTS {
                    break;
                }
                let sku = &skus[i % skus.len()];
                let url = format!(
                    "{}/items/{sku}/{}",
                    targets[i % targets.len()],
                    mode.endpoint
                );
                let t0 = Instant::now();
                let res = http.post(&url, &json!({ "qty": 1 })).await;
                out.latencies.push(t0.elapsed());
                match res {
                    Ok(r) if r.status == http::StatusCode::OK && !mode.fenced() => {
                        out.reserved += 1;
                    }
                    Ok(r) if r.status == http::StatusCode::OK => {
                        out.reserved += 1;
                        let body = r.json();
                        let token = &body["fencing_token"];
                        acks.push((
                            sku.clone(),
                            body["remaining"].as_i64().unwrap_or(-1),
                            FencingToken::new(
                                token["epoch"].as_u64().unwrap_or(0),
                                token["seq"].as_u64().unwrap_or(0),
                            ),
                        ));
                    }
                    Ok(r) if r.error_code().as_deref() == Some("out_of_stock") => {
                        out.out_of_stock += 1;
                    }
                    // Stale writes are counted from the instances' /stats; 503s
                    // here are those plus lock timeouts and lost leases.
                    Ok(r) if r.status == http::StatusCode::SERVICE_UNAVAILABLE => {
                        out.unavailable += 1;
                    }
                    Ok(r) => {
                        if out.errors == 0 {
                            bar.println(format!("unexpected reply: {} {}", r.status, r.text()));
                        }
                        out.errors += 1;
                    }
                    Err(e) => {
                        if out.errors == 0 {
                            bar.println(format!("request failed: {e}"));
                        }
                        out.errors += 1;
                    }
                }
                bar.inc(1);
            }
            (out, acks)
        });
    }
    let mut total = Burst::default();
    let mut acks: Vec<Ack> = Vec::new();
    while let Some(done) = workers.join_next().await {
        let Ok((part, part_acks)) = done else {
            total.errors += 1;
            continue;
        };
        total.reserved += part.reserved;
        total.out_of_stock += part.out_of_stock;
        total.unavailable += part.unavailable;
        total.errors += part.errors;
        total.latencies.extend(part.latencies);
        acks.extend(part_acks);
    }
    total.elapsed = started.elapsed();
    bar.finish_and_clear();
    println!(
        "{:>30}: {REQUESTS} requests in {:.2} s",
        label,
        total.elapsed.as_secs_f64()
    );
    // Per SKU, the later a reservation (the less stock it left), the newer its
    // fencing token must be.
    let mut per_sku: HashMap<String, Vec<(i64, FencingToken)>> = HashMap::new();
    for (sku, remaining, token) in acks {
        per_sku.entry(sku).or_default().push((remaining, token));
    }
    total.fence_order_ok = per_sku.values_mut().all(|v| {
        v.sort_by_key(|(remaining, _)| std::cmp::Reverse(*remaining));
        v.windows(2).all(|w| w[0].0 > w[1].0 && w[0].1 < w[1].1)
    });
    total
}
