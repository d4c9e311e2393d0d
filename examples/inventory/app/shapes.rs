//! The other lock shapes of the inventory service, beside the reservation under
//! the SKU's exclusive lock (`app.rs`):
//!
//! * `POST /checkout`: a cart of several SKUs, all or nothing, under one
//!   [`Locker::lock_many`](lockflight::Locker::lock_many), written in one
//!   transaction, each line fenced by its SKU's token; at most
//!   [`TENANT_CHECKOUTS`] checkouts per tenant (`x-tenant` header) run at once,
//!   across every instance, through a semaphore;
//! * `GET /items/{sku}/stock` under the SKU's **read** lock and
//!   `POST /items/{sku}/restock` under its **write** lock: a restock writes the
//!   stock and the restock log in two statements, and a stock read sees both or
//!   neither; the reads of one instance share one read lease;
//! * `POST /items/{sku}/reserve-optimistic`: optimistic locking for comparison,
//!   a version column and bounded retries, no lock at all.

use axum::extract::{FromRequest, FromRequestParts, Path as UrlPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lockflight::LockKey;
use lockflight::fence::{Fenced, FencedUpdate};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{
    AppError, AppState, Counters, ReserveRequest, error_response, item_fence_columns, not_found,
    out_of_stock, read_row, to_sql, valid_sku,
};

/// Checkouts one tenant may run at once, across every instance.
pub const TENANT_CHECKOUTS: u32 = 4;

/// The optimistic decrement: only if nobody wrote the row since it was read.
/// Binds: qty, sku, version read, qty.
const VERSIONED_DECREMENT: &str = "UPDATE items SET stock = stock - ?, version = version + 1 \
     WHERE sku = ? AND version = ? AND stock >= ? RETURNING stock";

/// How often an optimistic reservation re-reads and retries after another writer
/// changed the row, before it answers 503 `write_conflict`.
pub const OPTIMISTIC_ATTEMPTS: u32 = 50;

/// One line of a `POST /checkout` cart.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CartLine {
    /// The SKU.
    pub sku: String,
    /// Units (at least 1).
    pub qty: i64,
}

/// `POST /checkout` body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Checkout {
    /// The cart: each SKU at most once.
    pub items: Vec<CartLine>,
}

/// Most lines a cart may have.
pub const MAX_CART_LINES: usize = 32;

/// The routes of this module (`POST /checkout` behind the per-tenant cap).
pub fn routes(state: &AppState) -> Router<AppState> {
    Router::new()
        .route(
            "/checkout",
            post(checkout).route_layer(middleware::from_fn_with_state(state.clone(), tenant_cap)),
        )
        .route("/items/{sku}/reserve-optimistic", post(reserve_optimistic))
        .route("/items/{sku}/stock", get(stock))
        .route("/items/{sku}/restock", post(restock))
}

/// At most [`TENANT_CHECKOUTS`] requests of one tenant (`x-tenant`, default
/// `public`) at a time, across every instance: a permit of the tenant's
/// semaphore is held for the whole request. Over the cap: 429 `tenant_busy` at
/// once, with `Retry-After`.
async fn tenant_cap(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let tenant = req
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("public")
        .to_owned();
    if !valid_sku(&tenant) {
        return error_response(
            StatusCode::BAD_REQUEST,
            json!({ "error": "invalid_tenant", "tenant": tenant }),
        );
    }
    let cap = st
        .locker
        .semaphore(format!("tenant:{tenant}"), TENANT_CHECKOUTS);
    let permit = match cap.try_acquire().await {
        Ok(Some(permit)) => permit,
        Ok(None) => {
            let mut res = error_response(
                StatusCode::TOO_MANY_REQUESTS,
                json!({ "error": "tenant_busy", "tenant": tenant, "limit": TENANT_CHECKOUTS }),
            );
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return res;
        }
        Err(e) => return e.into_response(),
    };
    let res = next.run(req).await;
    drop(permit); // back to the tenant's semaphore (in the background)
    res
}

/// The SKU of the path and the quantity of the JSON body, both valid: 400
/// `invalid_request` unless the SKU is valid and the quantity at least 1.
struct SkuQty(String, ReserveRequest);

impl<S: Send + Sync> FromRequest<S> for SkuQty {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let (mut parts, body) = req.into_parts();
        let UrlPath(sku) = UrlPath::<String>::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let Json(qty) =
            Json::<ReserveRequest>::from_request(Request::from_parts(parts, body), state)
                .await
                .map_err(IntoResponse::into_response)?;
        if !valid_sku(&sku) || qty.qty < 1 {
            return Err(error_response(
                StatusCode::BAD_REQUEST,
                json!({ "error": "invalid_request", "sku": sku }),
            ));
        }
        Ok(SkuQty(sku, qty))
    }
}

/// The stock of `sku` and the restocks that made it, under the SKU's read lock:
/// no restock is half-seen. Concurrent reads of one instance share one read lease.
async fn stock(State(st): State<AppState>, UrlPath(sku): UrlPath<String>) -> Response {
    if !valid_sku(&sku) {
        return error_response(StatusCode::BAD_REQUEST, json!({ "error": "invalid_sku" }));
    }
    let read = match st.locker.rwlock(sku.as_str()).read().await {
        Ok(read) => read,
        Err(e) => return e.into_response(),
    };
    let row: Result<Option<(i64, i64)>, _> = sqlx::query_as(
        "SELECT i.stock, (SELECT coalesce(sum(qty), 0) FROM restocks r WHERE r.sku = i.sku) \
         FROM items i WHERE i.sku = ?",
    )
    .bind(&sku)
    .fetch_optional(&st.db)
    .await;
    let last = read.last_write();
    drop(read);
    match row {
        Ok(Some((stock, restocked))) => Json(json!({
            "sku": sku,
            "stock": stock,
            "restocked": restocked,
            "last_restock": { "epoch": last.epoch, "seq": last.seq },
        }))
        .into_response(),
        Ok(None) => not_found(&sku),
        Err(e) => AppError::from(e).into_response(),
    }
}

/// Adds `qty` units under the SKU's write lock, in two statements (the stock,
/// then the restock log with the write's fencing token); the hook's pause sits
/// between them, where a reader without the read lock would see half a restock.
async fn restock(State(st): State<AppState>, SkuQty(sku, req): SkuQty) -> Response {
    let write = match st.locker.rwlock(sku.as_str()).write().await {
        Ok(write) => write,
        Err(e) => return e.into_response(),
    };
    let token = write.fencing_token();
    let epoch = match to_sql(token.epoch) {
        Ok(epoch) => epoch,
        Err(e) => return e.into_response(),
    };
    let updated = sqlx::query("UPDATE items SET stock = stock + ? WHERE sku = ?")
        .bind(req.qty)
        .bind(&sku)
        .execute(&st.db)
        .await;
    match updated {
        Ok(done) if done.rows_affected() == 1 => {}
        Ok(_) => {
            return not_found(&sku);
        }
        Err(e) => return AppError::from(e).into_response(),
    }
    if !st.hooks.before_write.is_zero() {
        tokio::time::sleep(st.hooks.before_write).await;
    }
    let logged = sqlx::query("INSERT INTO restocks (sku, qty, fence_epoch) VALUES (?, ?, ?)")
        .bind(&sku)
        .bind(req.qty)
        .bind(epoch)
        .execute(&st.db)
        .await;
    if let Err(e) = logged {
        return AppError::from(e).into_response();
    }
    if let Err(e) = write.release().await {
        return e.into_response();
    }
    Json(json!({ "sku": sku, "restocked": req.qty, "fencing_token": { "epoch": token.epoch } }))
        .into_response()
}

/// Optimistic locking, for comparison: no distributed lock at all. Read the row
/// with its version, check the stock, write only if the version is unchanged;
/// when zero rows change another writer got there first: read again and retry (up
/// to [`OPTIMISTIC_ATTEMPTS`] times, then 503 `write_conflict`). Cheap when
/// writers rarely meet; under contention most attempts are wasted reads and
/// writes.
async fn reserve_optimistic(State(st): State<AppState>, SkuQty(sku, req): SkuQty) -> Response {
    for _ in 0..OPTIMISTIC_ATTEMPTS {
        let (stock, version) = match read_row::<(i64, i64)>(
            &st.db,
            "SELECT stock, version FROM items WHERE sku = ?",
            &sku,
        )
        .await
        {
            Ok(row) => row,
            Err(res) => return res,
        };
        if stock < req.qty {
            Counters::bump(&st.counters.out_of_stock);
            return out_of_stock(&sku, req.qty, stock);
        }
        if !st.hooks.before_write.is_zero() {
            tokio::time::sleep(st.hooks.before_write).await;
        }
        let written: Option<i64> = match sqlx::query_scalar(VERSIONED_DECREMENT)
            .bind(req.qty)
            .bind(&sku)
            .bind(version)
            .bind(req.qty)
            .fetch_optional(&st.db)
            .await
        {
            Ok(written) => written,
            Err(e) => return AppError::from(e).into_response(),
        };
        match written {
            Some(remaining) => {
                Counters::bump(&st.counters.reservations);
                return Json(json!({
                    "sku": sku,
                    "reserved": req.qty,
                    "remaining": remaining,
                    "version": version + 1,
                    "instance": &*st.instance,
                }))
                .into_response();
            }
            None => Counters::bump(&st.counters.version_conflicts),
        }
    }
    let mut res = error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({
            "error": "write_conflict",
            "message": "other writers kept changing the row; nothing was written; retry",
            "sku": sku,
            "attempts": OPTIMISTIC_ATTEMPTS,
        }),
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

/// A cart checkout: every SKU of the cart or none. The SKUs' locks are taken
/// together with [`Locker::lock_many`] (one canonical order, so two carts that
/// share SKUs never deadlock, and a checkout excludes the single-SKU reservations
/// of the same SKUs, which lock the same keys), then every line is checked and
/// written in ONE database transaction, each write fenced by its SKU's token.
async fn checkout(State(st): State<AppState>, Json(cart): Json<Checkout>) -> Response {
    let mut skus: Vec<&str> = cart.items.iter().map(|l| l.sku.as_str()).collect();
    skus.sort_unstable();
    skus.dedup();
    if cart.items.is_empty()
        || cart.items.len() > MAX_CART_LINES
        || skus.len() != cart.items.len()
        || cart.items.iter().any(|l| !valid_sku(&l.sku) || l.qty < 1)
    {
        return error_response(
            StatusCode::BAD_REQUEST,
            json!({
                "error": "invalid_cart",
                "message": format!("1-{MAX_CART_LINES} lines, each a valid SKU once, qty >= 1"),
            }),
        );
    }
    let held = match st.locker.lock_many(skus.iter().copied()).await {
        Ok(held) => held,
        // 503 + Retry-After for a timeout, 400 for a bad key, … (lockflight's
        // own mapping, as the lock layer uses it).
        Err(e) => return e.into_response(),
    };
    let columns = match item_fence_columns() {
        Ok(columns) => columns,
        Err(e) => return e.into_response(),
    };
    let mut tx = match st.db.begin().await {
        Ok(tx) => tx,
        Err(e) => return AppError::from(e).into_response(),
    };
    let mut lines = Vec::new();
    for line in &cart.items {
        let Some(token) = held.fencing_token(&LockKey::from(line.sku.as_str())) else {
            return AppError::Internal(format!("{} is not in the held set", line.sku))
                .into_response();
        };
        // lockflight's fence helper, inside the cart's transaction: the line is
        // written only if the token is newer than the item's last one (one write
        // per token) and enough stock is left.
        let qty = line.qty;
        let written = FencedUpdate::new(&columns, token, line.sku.as_str())
            .set(move |q| {
                q.push("stock = stock - ").push_bind(qty);
            })
            .and_where(move |q| {
                q.push("stock >= ").push_bind(qty);
            })
            .fetch_optional::<(i64,)>(&mut tx, "stock")
            .await;
        match written {
            Ok(Fenced::Applied(Some((remaining,)))) => lines.push(json!({
                "sku": line.sku,
                "reserved": line.qty,
                "remaining": remaining,
                "fencing_token": { "epoch": token.epoch, "seq": token.seq },
            })),
            // A stale token: nothing of the cart is written (the transaction rolls
            // back when dropped).
            Ok(Fenced::Stale { .. }) => {
                Counters::bump(&st.counters.stale_rejected);
                return error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({ "error": "stale_fencing_token", "sku": line.sku }),
                );
            }
            // Not written: out of stock or unknown. Nothing of the cart is written.
            Ok(Fenced::Applied(None)) => {
                let available: Option<i64> =
                    sqlx::query_scalar("SELECT stock FROM items WHERE sku = ?")
                        .bind(&line.sku)
                        .fetch_optional(&mut *tx)
                        .await
                        .unwrap_or(None);
                return match available {
                    Some(a) => {
                        Counters::bump(&st.counters.out_of_stock);
                        out_of_stock(&line.sku, line.qty, a)
                    }
                    None => not_found(&line.sku),
                };
            }
            Err(e) => return AppError::from(e).into_response(),
        }
    }
    if held.is_lost() {
        // Every write was fenced, but say so rather than commit a cart whose lock
        // is known to be gone.
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": "lease_lost", "message": "a cart lock was lost; nothing was written" }),
        );
    }
    if let Err(e) = tx.commit().await {
        return AppError::from(e).into_response();
    }
    Counters::bump(&st.counters.checkouts);
    drop(held);
    Json(json!({ "checkout": lines, "instance": &*st.instance })).into_response()
}
