//! `POST /items/{sku}/reserve`: the reservation critical section.
//!
//! Under lockflight (every mode but `plain`) the route runs behind [`LockLayer`],
//! keyed by the SKU (the router's `{sku}`), in its body-aware form
//! ([`LockLayer::lock_in_handler`]): the handler's last argument,
//! [`Locked<ReserveBody>`](Locked), first receives and validates the request (JSON
//! body, `qty` ≥ 1, a valid SKU), and only then takes the SKU's lock. A slow upload
//! holds no lock; a bad request is refused (400) without ever locking. The handler
//! then reads the stock, checks it and writes the decrement while holding the lock,
//! and it receives the lock's [`FencingToken`] in the [`LockInfo`]. The write is
//! **fenced** at the database by lockflight's fence helper
//! ([`FencedUpdate`](lockflight::fence::FencedUpdate), in `db::fenced_write`),
//! which runs
//!
//! ```sql
//! UPDATE items SET stock = stock - ?, fence_epoch = ?, fence_seq = ?
//!  WHERE sku = ? AND (fence_epoch, fence_seq) < (?, ?) AND (stock >= ?) RETURNING stock
//! ```
//!
//! so a writer whose lease was lost (paused process, network partition) and whose
//! token is no longer the newest is rejected by the database even if it reaches it
//! after another holder wrote (counted, 503 `stale_fencing_token`). If the lease is
//! lost while the handler is still running, the lock layer drops the handler future
//! before it can write (503). A trigger logs every accepted decrement, with its
//! token, in `reservations`, within the same statement.
//!
//! Outside the lock, the route runs behind [`IdempotencyLayer`]: a client that
//! retries a reservation (a timeout, a double submit) sends the same
//! `Idempotency-Key`, and the reservation runs once across the instances; the
//! retry gets the first answer back, marked `idempotent-replayed: true`, without
//! taking the SKU's lock. The decrement is fenced by the SKU lock's token, not
//! by the idempotency lease's: a process that dies mid-request leaves no stored
//! answer, and the retry, run again once that lease expires, reserves again.
//! A request without the header runs as before; the `plain` mode has no such layer.
//!
//! In the `plain` mode the handler takes a plain Redis lock itself
//! ([`PlainLock`](super::plain_lock::PlainLock)) around the same critical section.
//! A plain lock has no fencing token, so that write is not fenced: only the lock
//! (and its TTL) keeps two writers apart, and nothing can refuse a holder that
//! outlived it.
//!
//! [`LockLayer`]: lockflight::layer::LockLayer
//! [`IdempotencyLayer`]: lockflight::layer::IdempotencyLayer
//! [`LockInfo`]: lockflight::guard::LockInfo
//! [`LockLayer::lock_in_handler`]: lockflight::layer::LockLayer::lock_in_handler

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts, Path as UrlPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lockflight::FencingToken;
use lockflight::layer::Locked;
use serde_json::json;

use super::db::WriteOutcome;
use super::plain_lock::PlainLockError;
use super::{
    AppError, AppState, Counters, Occupancy, ReserveRequest, error_response, not_found,
    out_of_stock, read_row, valid_sku,
};

/// A reservation request, received and valid: the SKU of the route and the JSON
/// body, with `qty` ≥ 1 and a valid SKU. As the inner extractor of [`Locked`] it
/// runs before the lock is taken.
pub(super) struct ReserveBody {
    sku: String,
    req: ReserveRequest,
}

impl<S: Send + Sync> FromRequest<S> for ReserveBody {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let (mut parts, body) = req.into_parts();
        let sku = match UrlPath::<String>::from_request_parts(&mut parts, state).await {
            Ok(UrlPath(sku)) => sku,
            Err(e) => return Err(e.into_response()),
        };
        let req = Request::from_parts(parts, body);
        let Json(body) = Json::<ReserveRequest>::from_request(req, state)
            .await
            .map_err(|e| {
                error_response(
                    e.status(),
                    json!({ "error": "invalid_request", "message": e.body_text() }),
                )
            })?;
        match invalid_reserve(&sku, body) {
            Some(res) => Err(res),
            None => Ok(ReserveBody { sku, req: body }),
        }
    }
}

/// `POST /items/{sku}/reserve` under lockflight's lock, taken by `Locked` once the
/// request is valid. If the lease is lost, the lock layer drops this future at its
/// next `.await` and answers 503. The write is fenced by the lock's token.
pub(super) async fn reserve(
    State(st): State<AppState>,
    Locked(ReserveBody { sku, req }, info): Locked<ReserveBody>,
) -> Response {
    if info.key.as_str() != Some(sku.as_str()) {
        return invalid_sku(&sku);
    }
    if let Some(entered) = &st.hooks.entered {
        let _ = entered.send(info.clone());
    }
    critical_section(&st, &sku, req, Some(info.fencing_token)).await
}

/// `POST /items/{sku}/reserve` in the plain mode: the same critical section under
/// a plain Redis lock ([`PlainLock`]). A plain lock has no fencing token, so the
/// write is not fenced and a holder that outlived the lock's TTL cannot be
/// refused; nothing drops the handler when the lock expires either.
pub(super) async fn reserve_plain(
    State(st): State<AppState>,
    UrlPath(sku): UrlPath<String>,
    Json(req): Json<ReserveRequest>,
) -> Response {
    let Some(plain) = &st.plain else {
        return AppError::Internal("the plain route without a plain lock".into()).into_response();
    };
    if let Some(res) = invalid_reserve(&sku, req) {
        return res;
    }
    let guard = match plain.lock(&sku).await {
        Ok(guard) => guard,
        Err(e) => return e.into_response(),
    };
    let res = critical_section(&st, &sku, req, None).await;
    // Written or not, the section is over: release (a lock that expired meanwhile
    // is counted in `/stats`, `plain_lock.expired_before_release`).
    if let Err(e) = guard.release().await {
        return PlainLockError::Redis(e).into_response();
    }
    res
}

/// The 400 to answer for an invalid SKU (the lock key) or quantity, if any.
fn invalid_reserve(sku: &str, req: ReserveRequest) -> Option<Response> {
    if !valid_sku(sku) {
        return Some(invalid_sku(sku));
    }
    (req.qty < 1).then(|| {
        error_response(
            StatusCode::BAD_REQUEST,
            json!({ "error": "invalid_qty", "message": "qty must be at least 1" }),
        )
    })
}

fn invalid_sku(sku: &str) -> Response {
    error_response(
        StatusCode::BAD_REQUEST,
        json!({ "error": "invalid_sku", "sku": sku }),
    )
}

/// The reservation's critical section, run while the SKU's lock is held: read
/// the stock, check it, write the decrement — fenced by `token` under lockflight,
/// unfenced (`None`) under the plain lock.
async fn critical_section(
    st: &AppState,
    sku: &str,
    req: ReserveRequest,
    token: Option<FencingToken>,
) -> Response {
    let _inside = st.hooks.occupancy.as_ref().map(Occupancy::enter);
    // Read and check under the lock ...
    let stock = match read_row::<(i64,)>(&st.db, "SELECT stock FROM items WHERE sku = ?", sku).await
    {
        Ok((stock,)) => stock,
        Err(res) => return res,
    };
    if stock < req.qty {
        Counters::bump(&st.counters.out_of_stock);
        return out_of_stock(sku, req.qty, stock);
    }
    if !st.hooks.before_write.is_zero() {
        tokio::time::sleep(st.hooks.before_write).await;
    }
    // ... and write, with the fencing token (where there is one) as the
    // database's safety net.
    let token_json = |t: FencingToken| json!({ "epoch": t.epoch, "seq": t.seq });
    match st.write_reservation(sku, req.qty, token).await {
        Ok(WriteOutcome::Reserved { remaining }) => Json(json!({
            "sku": sku,
            "reserved": req.qty,
            "remaining": remaining,
            // null in the plain mode: a plain lock has no fencing token.
            "fencing_token": token.map(token_json),
            "instance": &*st.instance,
        }))
        .into_response(),
        Ok(WriteOutcome::OutOfStock { available }) => out_of_stock(sku, req.qty, available),
        Ok(WriteOutcome::Stale { current }) => {
            let mut res = error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({
                    "error": "stale_fencing_token",
                    "message": "the database accepted a newer lock holder's write; \
                                this lock was lost, nothing was written; retry",
                    "sku": sku,
                    "fencing_token": token.map(token_json),
                    "current": token_json(current),
                }),
            );
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            res
        }
        Ok(WriteOutcome::NotFound) => not_found(sku),
        Err(e) => e.into_response(),
    }
}
