//! [`Locked`]: the axum extractor that takes the route's lock once the request's
//! body is received and valid (feature `axum`).

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::problem::{PROBLEM_JSON, Problem};
use crate::error::Error;
use crate::guard::LockInfo;
use crate::layer::request::WithLockInfo;
use crate::layer::ticket::Ticket;

/// The longest rejection text of the inner extractor quoted in the response.
const MAX_DETAIL: usize = 1024;

/// The body extractor `T`, run first, and then the lock of the route's key: the
/// handler's **last** argument on a route behind
/// [`LockLayer::lock_in_handler`](crate::layer::LockLayer::lock_in_handler).
///
/// `T` receives and validates the body (a `Json<Debit>` parses, a `Form<_>` decodes)
/// while no lock is held; a request that `T` refuses takes no lock. Then the lock is
/// taken (the layer's key, prefix and [`LockOptions`](crate::LockOptions)), and the
/// handler runs holding it, with its [`LockInfo`] (key, fencing token, loss signal) as
/// the second field. The layer keeps the guard until the response future ends, and
/// under [`LossPolicy::Abort`](crate::LossPolicy::Abort) drops the handler when the
/// lease is lost.
///
/// ```
/// use axum::{Json, Router, routing::post};
/// use lockflight::layer::{LockLayer, Locked, KeyFrom};
/// use lockflight::Locker;
///
/// #[derive(serde::Deserialize)]
/// struct Debit {
///     cents: u64,
/// }
///
/// async fn debit(Locked(Json(debit), lock): Locked<Json<Debit>>) -> String {
///     // The body was read and parsed before the account was locked.
///     format!("debited {} from {} under {}", debit.cents, lock.key, lock.fencing_token)
/// }
///
/// fn app(locker: Locker) -> Router {
///     Router::new().route("/accounts/{id}/debit", post(debit)).route_layer(
///         LockLayer::new(locker, KeyFrom::path_param("id"))
///             .key_prefix("account:")
///             .lock_in_handler()
///             .handle_errors(),
///     )
/// }
/// # let _ = app;
/// ```
///
/// # Rejections
///
/// Every rejection is a [`Problem`] response: the layer's errors as in the table on
/// `IntoResponse for Error`; a request `T` refuses keeps `T`'s status, with the code
/// `invalid_request` and `T`'s message as `detail` (a rejection that is already
/// `application/problem+json` passes unchanged). Without `lock_in_handler` on the
/// route, `Locked` refuses every request with `500 invalid_config`: it never runs the
/// handler unlocked.
#[derive(Debug)]
pub struct Locked<T>(pub T, pub LockInfo);

impl<S, T> FromRequest<S> for Locked<T>
where
    S: Send + Sync,
    T: FromRequest<S> + Send,
{
    type Rejection = Response;

    /// # Cancel safety
    ///
    /// Cancel safe: dropped while `T` runs, it holds nothing; dropped while waiting
    /// for the lock, it leaves as [`Locker::lock`](crate::Locker::lock) does.
    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Some(ticket) = req.extensions().get::<Ticket>().cloned() else {
            let route = req.route();
            tracing::warn!(
                route = route.as_str(),
                "lockflight: Locked<_> on a route without LockLayer::lock_in_handler: refused"
            );
            return Err(Error::InvalidConfig {
                reason: format!("{route}: Locked<_> needs LockLayer::lock_in_handler on its route"),
            }
            .into_response());
        };
        let value = T::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response);
        let value = match value {
            Ok(value) => value,
            Err(rejection) => {
                ticket.refuse();
                return Err(invalid_request(rejection).await);
            }
        };
        let info = ticket
            .acquire()
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Locked(value, info))
    }
}

/// The inner extractor's rejection as a problem: its status and its text (a
/// rejection that is already a problem is kept as it is).
async fn invalid_request(rejection: Response) -> Response {
    let is_problem = rejection
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == PROBLEM_JSON.as_bytes());
    if is_problem {
        return rejection;
    }
    let status = rejection.status();
    let code = if status.is_client_error() {
        "invalid_request"
    } else {
        "internal"
    };
    let text = match axum::body::to_bytes(rejection.into_body(), MAX_DETAIL).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let mut problem = Problem::new(
        if status.is_success() {
            StatusCode::BAD_REQUEST
        } else {
            status
        },
        code,
    );
    if !text.is_empty() {
        problem = problem.detail(text);
    }
    problem.into_response()
}
