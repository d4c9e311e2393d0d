//! Tests of `lockflight_routing`: known-answer vectors, balance, minimal movement,
//! determinism, and the `KeyRouter` tower service.

mod properties;
mod router;
mod vectors;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures::future::{BoxFuture, FutureExt};
use lockflight::{LockKey, layer::KeyFrom};
use lockflight_routing::{
    HashRing, KeyRouter, Rendezvous, RoutingError, jump_bucket, jump_hash, key_hash,
};
use proptest::prelude::*;
use tower::{BoxError, Service, ServiceExt, service_fn};

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

/// The paper's explanatory form of jump hash, written independently: draw
/// `r` uniform in (0, 1] from the LCG and jump to `floor((b + 1) / r)`.
fn jump_reference(key: u64, buckets: u32) -> u32 {
    let mut state = key;
    let mut next_r = || {
        state = state.wrapping_mul(2862933555777941757).wrapping_add(1);
        ((state >> 33) + 1) as f64 / 2147483648.0
    };
    let mut b: u64 = 0;
    loop {
        let j = ((b + 1) as f64 / next_r()).floor();
        if j >= f64::from(buckets) {
            return b as u32;
        }
        b = j as u64;
    }
}

/// Four node names, for pinned picks and bounded loads.
const NODES4: [&str; 4] = ["node-a", "node-b", "node-c", "node-d"];
