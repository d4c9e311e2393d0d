//! `inspect`, `list` and `release --force`.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::time::Duration;

use lockflight::fence::FencedKey;
use std::collections::BTreeMap;

use futures::StreamExt as _;
use lockflight::inspect::{
    Inspector, InstanceCard, KeyState, LeaseState, ListedKey, Listing, WaiterState,
};
use serde_json::{Value, json};

use crate::report::plural;
use crate::{EXIT_NOT_CONFIRMED, KeyConn, cluster_primaries, connect, redact};

/// Where `inspect` and `list` looked, for an operator who finds nothing: the
/// prefix, the database and how a key's lock is named there.
fn looked_in(url: &str, cluster: bool, prefix: &str, key: &str) -> String {
    let db = if cluster {
        0
    } else {
        redis::IntoConnectionInfo::into_connection_info(url).map_or(0, |i| i.redis_settings().db())
    };
    let name = String::from_utf8_lossy(&Inspector::new(prefix).lock_name(&key.into())).into_owned();
    format!(
        "prefix `{prefix}` in database {db}, where the lock of `{key}` is named `{name}`; \
         a service with another prefix (LockerBuilder::prefix) or database needs --prefix / the URL's /N"
    )
}

/// Whether Redis holds nothing at all for the key: no lease, no waiter, no fence.
fn nothing_stored(s: &KeyState) -> bool {
    !s.is_held()
        && s.fence_epoch.is_none()
        && s.write_epoch.is_none()
        && s.queue.is_empty()
        && s.claim.is_none()
        && s.waiting_writers.is_empty()
        && s.rw_waiting.is_empty()
        && s.permit_count.is_none()
        && s.permit_queue.is_empty()
        && s.leader.is_none()
}

/// At most this many instance cards are read for one key.
const MAX_CARDS: usize = 64;

/// The cards of `ids` (at most [`MAX_CARDS`]); an id whose card is missing or
/// unreadable (an ACL without GET on it) maps to `None`.
async fn cards<'a>(
    inspector: &Inspector,
    conn: &mut KeyConn,
    ids: impl IntoIterator<Item = &'a str>,
) -> BTreeMap<String, Option<InstanceCard>> {
    let mut found = BTreeMap::new();
    for id in ids.into_iter().take(MAX_CARDS) {
        let card = inspector.instance(conn, id).await.ok().flatten();
        found.insert(id.to_owned(), card);
    }
    found
}

/// An instance as an operator knows it: `billing-7 (web-3, pid 42), instance <id>`.
fn who(cards: &BTreeMap<String, Option<InstanceCard>>, id: &str) -> String {
    match cards.get(id) {
        Some(Some(card)) if card.name.is_some() || card.host.is_some() || card.pid.is_some() => {
            format!("{card}, instance {id}")
        }
        _ => format!("instance {id} (no card: stopped over 3 minutes ago, or unreadable)"),
    }
}

fn card_json(card: &Option<InstanceCard>) -> Value {
    card.as_ref().map_or(Value::Null, |c| {
        json!({
            "name": c.name,
            "host": c.host,
            "pid": c.pid,
            "started_ms": c.started_ms,
            "lockflight": c.version,
        })
    })
}

fn ms(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(d.as_millis() as u64))
}

fn lease_json(l: &LeaseState) -> Value {
    json!({ "token": l.token, "instance": l.instance(), "ttl_ms": ms(l.ttl) })
}

fn waiter_json(w: &WaiterState) -> Value {
    json!({ "instance": w.instance, "waited_ms": ms(w.waited), "expires_in_ms": ms(w.expires_in) })
}

fn state_json(s: &KeyState, cards: &BTreeMap<String, Option<InstanceCard>>) -> Value {
    json!({
        "key": s.key.to_string(),
        "held": s.is_held(),
        "server_time_ms": s.server_time_ms,
        "mutex": {
            "holder": s.holder.as_ref().map(lease_json),
            "held_for_ms": ms(s.held_for()),
            "fence_epoch": s.fence_epoch,
            "queue": s.queue.iter().map(waiter_json).collect::<Vec<_>>(),
            "queue_size": s.sizes.queue,
            "claim": s.claim.as_ref().map(|(id, ttl)| json!({ "instance": id, "ttl_ms": ttl.as_millis() as u64 })),
        },
        "rwlock": {
            "writer": s.writer.as_ref().map(lease_json),
            "write_held_for_ms": ms(s.write_held_for()),
            "write_epoch": s.write_epoch,
            "readers": s.readers.iter().map(lease_json).collect::<Vec<_>>(),
            "readers_size": s.sizes.readers,
            "waiting_writers": s.waiting_writers.iter().map(lease_json).collect::<Vec<_>>(),
            "waiting_instances": s.rw_waiting.iter().map(waiter_json).collect::<Vec<_>>(),
        },
        "semaphore": {
            "permits": s.permit_count,
            "free": s.free_permits(),
            "held": s.permits.iter().map(lease_json).collect::<Vec<_>>(),
            "queue": s.permit_queue.iter().map(waiter_json).collect::<Vec<_>>(),
        },
        "leader": s.leader.as_ref().map(|l| json!({
            "identity": l.identity,
            "term": l.term.to_string(),
            "since_ms": l.since.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        })),
        "instances": cards.iter().map(|(id, c)| (id.clone(), card_json(c))).collect::<serde_json::Map<_, _>>(),
    })
}

/// `, for 12.345 s` when known.
fn held(d: Option<Duration>) -> String {
    d.map_or(String::new(), |d| format!(", for {:.3} s", d.as_secs_f64()))
}

/// A key's state for an operator. Two numbers that are easy to confuse are named
/// apart: a lease's **lease token** (random; which grant, and by its first 16 hex
/// digits which instance) and the key's **fencing token** (its epoch: strictly
/// greater at every grant; what fenced resources compare).
fn print_state(s: &KeyState, cards: &BTreeMap<String, Option<InstanceCard>>) {
    let d =
        |d: Option<Duration>| d.map_or("no expiry".to_owned(), |d| format!("{} ms", d.as_millis()));
    let lease_who = |l: &LeaseState| {
        l.instance()
            .map_or("an unknown instance".to_owned(), |id| who(cards, id))
    };
    let fencing = |epoch: u64, held: bool| {
        if held {
            format!("epoch {epoch}")
        } else {
            format!("epoch {epoch} (the last granted; the next grant's is greater)")
        }
    };
    println!("key {}", s.key);
    match &s.holder {
        Some(h) => println!(
            "  mutex: held by {}{}, lease token {} ({} left)",
            lease_who(h),
            held(s.held_for()),
            h.token,
            d(h.ttl)
        ),
        None => println!("  mutex: free"),
    }
    if let Some(epoch) = s.fence_epoch {
        println!(
            "  mutex fencing token: {}",
            fencing(epoch, s.holder.is_some())
        );
    }
    if let Some(l) = &s.leader {
        let since = std::time::SystemTime::now()
            .duration_since(l.since)
            .map_or(String::new(), |d| {
                format!(", leading for {:.3} s", d.as_secs_f64())
            });
        println!(
            "  election: led by `{}` in term {}{since}",
            l.identity, l.term
        );
    }
    for w in &s.queue {
        println!(
            "  waiting: {} for {} (entry expires in {})",
            who(cards, &w.instance),
            d(w.waited),
            d(w.expires_in)
        );
    }
    if let Some((id, ttl)) = &s.claim {
        println!("  claim: {} for {} ms", who(cards, id), ttl.as_millis());
    }
    if let Some(w) = &s.writer {
        println!(
            "  write lease: held by {}{}, lease token {} ({} left)",
            lease_who(w),
            held(s.write_held_for()),
            w.token,
            d(w.ttl)
        );
    }
    if let Some(epoch) = s.write_epoch {
        println!(
            "  write fencing token: {}",
            fencing(epoch, s.writer.is_some())
        );
    }
    for r in &s.readers {
        println!(
            "  read lease: {}, lease token {} ({} left)",
            lease_who(r),
            r.token,
            d(r.ttl)
        );
    }
    for w in &s.waiting_writers {
        println!("  waiting writer: lease token {}", w.token);
    }
    if let Some(n) = s.permit_count {
        println!(
            "  semaphore: {}, {} free",
            plural(n, "permit", "permits"),
            s.free_permits().unwrap_or(0)
        );
        for p in &s.permits {
            println!(
                "    permit: {}, lease token {} ({} left)",
                lease_who(p),
                p.token,
                d(p.ttl)
            );
        }
        for w in &s.permit_queue {
            println!(
                "    waiting: {} for {}",
                who(cards, &w.instance),
                d(w.waited)
            );
        }
    }
}

/// `lockflight inspect`.
pub(crate) async fn inspect(
    url: &str,
    cluster: bool,
    prefix: &str,
    key: &str,
    json: bool,
) -> Result<u8, String> {
    let mut conn = KeyConn::open(url, cluster).await?;
    let inspector = Inspector::new(prefix);
    let state = inspector
        .key(&mut conn, key)
        .await
        .map_err(|e| e.to_string())?;
    let cards = cards(&inspector, &mut conn, state.instances()).await;
    let empty = nothing_stored(&state);
    if json {
        let mut report = state_json(&state, &cards);
        report["nothing_stored"] = json!(empty);
        if empty {
            report["looked_in"] = json!(looked_in(url, cluster, prefix, key));
        }
        println!("{report:#}");
    } else {
        print_state(&state, &cards);
        if empty {
            println!(
                "  nothing is stored for this key: looked in {}",
                looked_in(url, cluster, prefix, key)
            );
        }
    }
    Ok(0)
}

/// At most this many keys of a listing are inspected at once (for their holder
/// and TTL).
const LIST_INSPECTIONS_IN_FLIGHT: usize = 16;

/// One row of `list`: a kind that holds a key, who holds it and for how long.
struct Row {
    kind: &'static str,
    /// The lease token (mutex, write lease) or the count of holders (read
    /// leases, permits); `None` once nothing of the kind holds the key.
    holder: Option<String>,
    /// The time left of the lease (of the longest, for several holders).
    ttl: Option<Duration>,
    json: Value,
}

/// What holds `key` by `kind`, from its state.
fn row(kind: &'static str, s: &KeyState) -> Row {
    let longest = |leases: &[LeaseState]| leases.iter().filter_map(|l| l.ttl).max();
    // Holders of a sorted set: its size, less the members read that have
    // expired (a past expiry has no TTL) and are not yet pruned.
    let live = |size: usize, leases: &[LeaseState]| {
        size.saturating_sub(leases.iter().filter(|l| l.ttl.is_none()).count())
    };
    let (holder, ttl, json) = match kind {
        "mutex" | "write" => {
            let lease = if kind == "mutex" {
                &s.holder
            } else {
                &s.writer
            };
            let token = lease.as_ref().map(|l| l.token.clone());
            let ttl = lease.as_ref().and_then(|l| l.ttl);
            (
                token.clone(),
                ttl,
                json!({ "kind": kind, "token": token, "ttl_ms": ms(ttl) }),
            )
        }
        "read" => {
            let n = live(s.sizes.readers, &s.readers);
            (
                (n > 0).then(|| plural(n, "reader", "readers")),
                longest(&s.readers),
                json!({ "kind": kind, "holders": n, "ttl_ms": ms(longest(&s.readers)) }),
            )
        }
        _ => {
            let n = live(s.sizes.permits, &s.permits);
            let holder = match s.permit_count {
                Some(count) => format!("{n} of {}", plural(count, "permit", "permits")),
                None => plural(n, "permit", "permits"),
            };
            (
                (n > 0).then_some(holder),
                longest(&s.permits),
                json!({
                    "kind": kind,
                    "holders": n,
                    "permits": s.permit_count,
                    "ttl_ms": ms(longest(&s.permits)),
                }),
            )
        }
    };
    Row {
        kind,
        holder,
        ttl,
        json,
    }
}

/// A TTL as `850 ms` or `29.8 s`.
fn ttl_text(ttl: Option<Duration>) -> String {
    match ttl {
        Some(t) if t < Duration::from_secs(1) => format!("{} ms", t.as_millis()),
        Some(t) => format!("{:.1} s", t.as_secs_f64()),
        None => "-".to_owned(),
    }
}

/// `rows` as aligned columns under `header`.
fn print_table(header: [&str; 4], rows: &[[String; 4]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 4]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out
    };
    println!("{}", line(header));
    for row in rows {
        println!(
            "{}",
            line([&row[0], &row[1], &row[2], &row[3]].map(String::as_str))
        );
    }
}

/// `lockflight list`: on one server, or on every primary of a cluster (each
/// scan bounded by `limit`, the merged listing cut at `limit`); then each listed
/// key is inspected on its server for its holders and TTLs
/// ([`LIST_INSPECTIONS_IN_FLIGHT`] at a time).
pub(crate) async fn list(
    url: &str,
    cluster: bool,
    prefix: &str,
    key_prefix: &str,
    limit: usize,
    json: bool,
) -> Result<u8, String> {
    let limit = limit.max(1);
    let inspector = Inspector::new(prefix);
    let nodes = if cluster {
        cluster_primaries(url).await?
    } else {
        vec![url.to_owned()]
    };
    let mut conns = Vec::new();
    let mut keys = Vec::new();
    let mut truncated = false;
    for node in &nodes {
        let mut conn = connect(node).await?;
        let found: Listing = inspector
            .list(&mut conn, key_prefix, limit)
            .await
            .map_err(|e| format!("{}: {e}", redact(node)))?;
        truncated |= found.truncated;
        keys.extend(found.keys.into_iter().map(|k| (conns.len(), k)));
        conns.push(conn);
    }
    // Every name of a key lives in one slot, so no key is listed by two primaries.
    keys.sort_by(|a, b| a.1.key.cmp(&b.1.key));
    if keys.len() > limit {
        keys.truncate(limit);
        truncated = true;
    }
    let states: Vec<Result<KeyState, String>> = futures::stream::iter(&keys)
        .map(|(node, listed)| {
            let mut conn = conns[*node].clone();
            let inspector = &inspector;
            async move {
                inspector
                    .key(&mut conn, listed.key.clone())
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .buffered(LIST_INSPECTIONS_IN_FLIGHT)
        .collect()
        .await;
    let unknown = states.iter().find_map(|s| s.as_ref().err()).cloned();
    let rows: Vec<(&ListedKey, Option<Vec<Row>>)> = keys
        .iter()
        .zip(&states)
        .map(|((_, listed), state)| {
            let rows = state.as_ref().ok().map(|s| {
                listed
                    .kinds
                    .iter()
                    .map(|kind| row(kind.as_str(), s))
                    .collect::<Vec<_>>()
            });
            (listed, rows)
        })
        .collect();
    if json {
        let keys: Vec<Value> = rows
            .iter()
            .map(|(k, rows)| {
                json!({
                    "key": k.key.to_string(),
                    "kinds": k.kinds.iter().map(|kind| kind.as_str()).collect::<Vec<_>>(),
                    "held": rows.as_ref().map(|rows| rows.iter().map(|r| r.json.clone()).collect::<Vec<_>>()),
                })
            })
            .collect();
        let mut report = json!({ "keys": keys, "truncated": truncated });
        if let Some(e) = &unknown {
            report["inspect_error"] = json!(e);
        }
        if rows.is_empty() {
            report["looked_in"] = json!(looked_in(url, cluster, prefix, &format!("{key_prefix}…")));
        }
        println!("{report:#}");
    } else {
        let mut table = Vec::new();
        for (k, found) in &rows {
            match found {
                Some(found) => table.extend(found.iter().map(|r| {
                    [
                        k.key.to_string(),
                        r.kind.to_owned(),
                        r.holder.clone().unwrap_or_else(|| "(free now)".to_owned()),
                        ttl_text(r.ttl),
                    ]
                })),
                None => table.extend(k.kinds.iter().map(|kind| {
                    [
                        k.key.to_string(),
                        kind.as_str().to_owned(),
                        "?".to_owned(),
                        "?".to_owned(),
                    ]
                })),
            }
        }
        if !table.is_empty() {
            print_table(["KEY", "KIND", "HOLDER", "TTL"], &table);
        }
        if let Some(e) = &unknown {
            eprintln!("(holder and TTL unknown where `?`: inspecting the key failed: {e})");
        }
        if truncated {
            eprintln!("(stopped at the limit; more keys may be held)");
        }
        if rows.is_empty() {
            eprintln!(
                "no lock key found: looked in {}",
                looked_in(url, cluster, prefix, &format!("{key_prefix}…"))
            );
        }
    }
    Ok(0)
}

/// `lockflight release --force`.
pub(crate) async fn release(
    url: &str,
    cluster: bool,
    prefix: &str,
    key: &str,
    yes: bool,
    fence: &[String],
    json: bool,
) -> Result<u8, String> {
    let resources = fence
        .iter()
        .map(|name| FencedKey::new(name.as_bytes()).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut conn = KeyConn::open(url, cluster).await?;
    let inspector = Inspector::new(prefix);
    if !yes {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            eprintln!("lockflight release: not confirmed (stdin is not a terminal; pass --yes)");
            return Ok(EXIT_NOT_CONFIRMED);
        }
        let state = inspector
            .key(&mut conn, key)
            .await
            .map_err(|e| e.to_string())?;
        let cards = cards(&inspector, &mut conn, state.instances()).await;
        print_state(&state, &cards);
        eprint!(
            "Force-release {key:?} on {}? Its holders lose their leases (their instances are told); only the resources named with --fence refuse their late writes at once. Type the key to confirm: ",
            redact(url)
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = stdin.lock().read_line(&mut answer);
        if answer.trim_end_matches(['\r', '\n']) != key {
            eprintln!("lockflight release: not confirmed, nothing changed");
            return Ok(EXIT_NOT_CONFIRMED);
        }
    }
    let done = inspector
        .force_release(&mut conn, key, &resources)
        .await
        .map_err(|e| e.to_string())?;
    // The freed leases' instances (cards outlive the release).
    let instance = |token: &Option<String>| {
        token
            .as_deref()
            .and_then(LeaseState::instance_of)
            .map(str::to_owned)
    };
    let (holder_id, writer_id) = (instance(&done.holder), instance(&done.writer));
    let cards = cards(
        &inspector,
        &mut conn,
        holder_id.iter().chain(&writer_id).map(String::as_str),
    )
    .await;
    let card_of = |id: &Option<String>| id.as_ref().map_or(Value::Null, |id| card_json(&cards[id]));
    if json {
        println!(
            "{:#}",
            json!({
                "key": key,
                "holder": done.holder,
                "holder_instance": card_of(&holder_id),
                "writer": done.writer,
                "writer_instance": card_of(&writer_id),
                "readers": done.readers,
                "fence": { "epoch": done.fence.epoch, "seq": done.fence.seq },
                "write_fence": { "epoch": done.write_fence.epoch, "seq": done.write_fence.seq },
                "woken": done.woken,
                "permits": done.permits,
                "told": done.told,
                "receivers": done.receivers,
                "fenced_resources": fence,
            })
        );
    } else {
        let lease = |token: &Option<String>, id: &Option<String>| match (token, id) {
            (Some(t), Some(id)) => format!("lease token {t} of {}", who(&cards, id)),
            (Some(t), None) => format!("lease token {t}"),
            (None, _) => "none".to_owned(),
        };
        println!(
            "released {key}: mutex holder {}, write lease {}, {}, {}; fencing tokens advanced to {} (mutex) and {} (write); {} woken",
            lease(&done.holder, &holder_id),
            lease(&done.writer, &writer_id),
            plural(done.readers, "read lease", "read leases"),
            plural(done.permits, "permit", "permits"),
            done.fence,
            done.write_fence,
            plural(done.woken, "waiting instance", "waiting instances")
        );
        println!(
            "told the holders' instances: {}, received by {}",
            plural(done.told, "loss message", "loss messages"),
            plural(done.receivers, "subscriber", "subscribers")
        );
        if done.told > done.receivers {
            println!(
                "fewer receivers than messages: on a Cluster, subscribers on other nodes are not counted; a holder whose instance gets no message learns of the loss at its next renewal"
            );
        }
        for name in fence {
            println!(
                "fenced {name} at fencing token {}",
                done.fence.max(done.write_fence)
            );
        }
        let freed =
            done.holder.is_some() || done.writer.is_some() || done.readers + done.permits > 0;
        if fence.is_empty() && freed {
            println!(
                "no resource fenced: a late fenced write of an old holder is refused only where a newer fencing token was seen (--fence R records one in R now)"
            );
        }
    }
    Ok(0)
}
