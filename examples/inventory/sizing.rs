//! Sizing data for `/stats`: a small `metrics` recorder that keeps lockflight's
//! histograms (`lockflight_wait_seconds`, `lockflight_hold_seconds`,
//! `lockflight_lease_renewals`, with the library's `metrics` feature) in
//! HDR histograms, so `/stats` can show their tails. A real service would install
//! its exporter (Prometheus, StatsD, …) instead; the names and labels are the same.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hdrhistogram::Histogram as Hdr;
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use serde_json::{Value, json};

/// Values are stored as integers: seconds in microseconds, counts as they are.
fn scale(name: &str) -> f64 {
    if name.ends_with("_seconds") { 1e6 } else { 1.0 }
}

/// One histogram, shared by every handle the facade hands out for its key.
#[derive(Debug)]
struct Series {
    scale: f64,
    hdr: Mutex<Hdr<u64>>,
}

impl HistogramFn for Series {
    fn record(&self, value: f64) {
        let v = (value * self.scale).round().max(0.0) as u64;
        let mut hdr = self.hdr.lock().unwrap_or_else(|e| e.into_inner());
        hdr.saturating_record(v);
    }
}

/// The recorder: only the `lockflight_*` histograms, everything else is dropped.
#[derive(Debug, Default)]
pub struct Sizing {
    series: Mutex<BTreeMap<String, Arc<Series>>>,
}

impl Sizing {
    /// Installs a recorder as the process's global `metrics` recorder and returns
    /// it; `None` if another one is installed already.
    pub fn install() -> Option<Arc<Sizing>> {
        let sizing = Arc::new(Sizing::default());
        metrics::set_global_recorder(Shared(Arc::clone(&sizing)))
            .ok()
            .map(|()| sizing)
    }

    /// `{ "<name>{labels}": { count, p50, p99, max } }`, seconds for `*_seconds`.
    pub fn snapshot(&self) -> Value {
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = serde_json::Map::new();
        for (name, s) in series.iter() {
            let hdr = s.hdr.lock().unwrap_or_else(|e| e.into_inner());
            let q = |q: f64| hdr.value_at_quantile(q) as f64 / s.scale;
            out.insert(
                name.clone(),
                json!({ "count": hdr.len(), "p50": q(0.5), "p99": q(0.99), "max": hdr.max() as f64 / s.scale }),
            );
        }
        Value::Object(out)
    }
}

/// The global recorder must be `'static`; it shares the state with the app.
struct Shared(Arc<Sizing>);

impl Recorder for Shared {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let name = key.name();
        if !name.starts_with("lockflight_") {
            return Histogram::noop();
        }
        let mut id = name.to_owned();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        if !labels.is_empty() {
            id.push_str(&format!("{{{}}}", labels.join(",")));
        }
        let mut series = self.0.series.lock().unwrap_or_else(|e| e.into_inner());
        let s = series.entry(id).or_insert_with(|| {
            Arc::new(Series {
                scale: scale(name),
                // 1 µs (or 1 renewal) to an hour (or 3.6e9 renewals), 3
                // significant digits: fixed memory whatever the run's length;
                // larger values saturate.
                hdr: Mutex::new(
                    Hdr::new_with_bounds(1, 3_600_000_000, 3).expect("valid HDR bounds"),
                ),
            })
        });
        Histogram::from_arc(Arc::clone(s))
    }
}
