//! The cloud platform API, served beside the inference API by the same
//! binary: the token exchange (`POST /oauth2/token/exchange`, no bearer),
//! and under `/iam/v1` the caller's profile and, for `admin` callers, the
//! service accounts, authorized keys and group memberships of their
//! account. Every answer here uses the cloud error model `{code, message}`
//! ([`CloudHttpError`]), never the inference API's shapes; only access
//! tokens are accepted (an API key is 401 code 16).

mod jwt;
pub mod pem;
mod routes;

use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::Router;
use hearth_api::cloud::{CloudCode, CloudError};
use hearth_store::iam::{Group, Role, ServiceAccount};
use serde::de::DeserializeOwned;

use crate::state::AppState;

pub use jwt::{verify_subject_jwt, CLOCK_SKEW_SECS};
pub(crate) use routes::key_object;

/// A [`CloudError`] on its way out.
#[derive(Debug)]
pub struct CloudHttpError(pub CloudError);

impl From<CloudError> for CloudHttpError {
    fn from(e: CloudError) -> Self {
        Self(e)
    }
}

impl IntoResponse for CloudHttpError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::warn!(code = self.0.code as u8, message = %self.0.message, "cloud request failed");
        }
        (status, axum::Json(self.0.body())).into_response()
    }
}

/// The store's errors in the cloud model: what the caller may not see and
/// what does not exist are alike (7); a taken name 6; a bad value 3.
impl From<hearth_store::StoreError> for CloudHttpError {
    fn from(e: hearth_store::StoreError) -> Self {
        use hearth_store::StoreError as E;
        Self(match &e {
            E::NotFound(kind) => no_access(kind),
            E::InUse(detail) => CloudError::new(CloudCode::AlreadyExists, detail.clone()),
            E::Invalid(detail) => CloudError::invalid(detail.clone()),
            _ => {
                tracing::error!("store: {e}");
                CloudError::internal()
            }
        })
    }
}

fn no_access(kind: &str) -> CloudError {
    CloudError::denied(format!("No access to this {kind}, or it does not exist."))
}

/// Who calls the cloud API: a service account, by its access token.
#[derive(Debug, Clone)]
pub struct CloudCaller {
    pub service_account: ServiceAccount,
    pub groups: Vec<Group>,
    pub role: Option<Role>,
    pub token_expires_at: i64,
}

impl CloudCaller {
    /// 403 code 7 unless the caller's role is at least `role`.
    fn require(&self, role: Role, what: &str) -> Result<(), CloudHttpError> {
        if self.role.is_some_and(|r| r >= role) {
            Ok(())
        } else {
            Err(CloudError::denied(format!(
                "{what} needs the `{}` role; this service account has {}.",
                role.as_str(),
                self.role
                    .map_or("none".to_string(), |r| format!("`{}`", r.as_str()))
            ))
            .into())
        }
    }
}

/// A body, whose read failures (over the size limit, cut off) are refused
/// in the cloud model (400 code 3).
pub struct CloudBytes(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for CloudBytes {
    type Rejection = CloudHttpError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        axum::body::Bytes::from_request(req, state)
            .await
            .map(CloudBytes)
            .map_err(|e| CloudError::invalid(format!("cannot read the request body: {e}")).into())
    }
}

/// A JSON body, refused in the cloud model (400 code 3).
pub struct CloudJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for CloudJson<T> {
    type Rejection = CloudHttpError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let CloudBytes(bytes) = CloudBytes::from_request(req, state).await?;
        serde_json::from_slice(&bytes)
            .map(CloudJson)
            .map_err(|e| CloudError::invalid(format!("invalid JSON body: {e}")).into())
    }
}

/// Path parameters, refused in the cloud model (400 code 3).
pub struct CloudPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> axum::extract::FromRequestParts<S>
    for CloudPath<T>
{
    type Rejection = CloudHttpError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(v)| CloudPath(v))
            .map_err(|e| CloudError::invalid(format!("invalid path: {}", e.body_text())).into())
    }
}

/// The bearer credential of a request, or why there is none (401 code 16).
pub(crate) fn bearer_token(request: &Request) -> Result<&str, CloudError> {
    let missing = || {
        CloudError::unauthenticated(
            "Missing credentials: send `Authorization: Bearer <access token>`.",
        )
    };
    let value = crate::auth::single_authorization(request.headers())
        .map_err(CloudError::unauthenticated)?
        .ok_or_else(missing)?
        .to_str()
        .map_err(|_| missing())?;
    let (scheme, token) = value.split_once(' ').ok_or_else(missing)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(missing());
    }
    Ok(token)
}

async fn require_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let token = match bearer_token(&request) {
        Ok(token) => token.to_string(),
        Err(e) => return CloudHttpError(e).into_response(),
    };
    match cloud_caller(&state, &token).await {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

async fn cloud_caller(state: &AppState, token: &str) -> Result<CloudCaller, CloudHttpError> {
    if !token.starts_with(hearth_store::iam::ACCESS_TOKEN_PREFIX) {
        return Err(CloudError::unauthenticated(
            "Not an access token (API keys are not accepted by the cloud API: exchange a service account's \
             JWT at /oauth2/token/exchange and send the access token).",
        )
        .into());
    }
    let holder = state.store.token_holder(token).await?.ok_or_else(|| {
        CloudError::unauthenticated("Invalid credentials: the access token is unknown or expired.")
    })?;
    let service_account = state
        .store
        .service_account(&holder.service_account_id)
        .await?
        .ok_or_else(|| CloudError::unauthenticated("The token's service account is gone."))?;
    let groups = state.store.member_groups(&service_account.id).await?;
    Ok(CloudCaller {
        role: ServiceAccount::role(&groups),
        service_account,
        groups,
        token_expires_at: holder.expires_at,
    })
}

async fn cloud_not_found() -> CloudHttpError {
    CloudError::not_found("No such cloud API route.").into()
}

async fn cloud_bad_method() -> CloudHttpError {
    CloudError::invalid("This route does not take this HTTP method.").into()
}

/// The cloud platform API's routes.
pub fn router(state: &AppState) -> Router<AppState> {
    let iam = Router::new()
        .route("/profiles", get(routes::profile))
        .route(
            "/serviceAccounts",
            get(routes::list_service_accounts).post(routes::create_service_account),
        )
        .route(
            "/serviceAccounts/{service_account_id}",
            get(routes::get_service_account),
        )
        .route(
            "/authorizedKeys",
            get(routes::list_keys).post(routes::upload_key),
        )
        .route(
            "/authorizedKeys/{key_id}",
            get(routes::get_key).delete(routes::revoke_key),
        )
        .route("/groups", get(routes::list_groups))
        .route("/groups/{group_id}/members", post(routes::add_member))
        .route(
            "/groups/{group_id}/members/{service_account_id}",
            delete(routes::remove_member),
        )
        .method_not_allowed_fallback(cloud_bad_method)
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .fallback(cloud_not_found);
    Router::new()
        .route(
            "/oauth2/token/exchange",
            post(routes::exchange).fallback(cloud_bad_method),
        )
        .nest("/iam/v1", iam)
        // Whatever else is under /iam answers in the cloud model too.
        .route("/iam", any(cloud_not_found))
        .route("/iam/", any(cloud_not_found))
        .route("/iam/{*rest}", any(cloud_not_found))
}
