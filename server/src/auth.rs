//! Bearer-key authentication and project selection for every route but
//! `/health`, signed downloads and the cloud API.
//!
//! A key is either one of the extra `--api-key` keys (default project only),
//! a cloud access token of a service account (its account's projects;
//! `viewer` reads only), or a stored key, looked up by its hash on every request (so a revoke
//! takes effect at once). `ai_project_id` in the query then picks the
//! project: missing means the key's default, malformed is 400, one the key
//! does not reach is 403 (all shape A). Handlers read the outcome as the
//! [`RequestContext`] extension.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hearth_api::ApiError;
use hearth_store::Caller;

use crate::error::HttpError;
use crate::state::AppState;

/// Who is calling, and in which project.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub caller: Caller,
    /// The project named by `ai_project_id`, else the key's default one.
    pub project_id: String,
    /// Whether `ai_project_id` named the project (by-id routes then insist
    /// that the resource is in it).
    pub project_named: bool,
    /// The engine's class for this request's sequences: interactive for
    /// HTTP callers, batch for the requests of `/v1/batches`.
    pub priority: hearth_core::Priority,
}

impl RequestContext {
    /// Checks that a resource of `project_id` (found by its id) is the
    /// caller's: in the named project when `ai_project_id` was given, else
    /// in any project the caller's account reaches. A resource the caller
    /// may not use is [`StoreError::NotFound`]`(kind)`, answered exactly as
    /// a missing one (403 shape A).
    pub async fn check_owner(
        &self,
        store: &hearth_store::Store,
        project_id: &str,
        kind: &'static str,
    ) -> Result<(), HttpError> {
        let allowed = if project_id == self.project_id {
            true
        } else if self.project_named {
            false
        } else {
            store.caller_reaches(&self.caller, project_id).await?
        };
        if allowed {
            Ok(())
        } else {
            Err(hearth_store::StoreError::NotFound(kind).into())
        }
    }

    /// 403 unless the caller's key is an admin key.
    pub fn require_admin(&self) -> Result<(), HttpError> {
        if self.caller.is_admin {
            Ok(())
        } else {
            Err(HttpError(ApiError::forbidden(
                "This route needs an admin API key.",
            )))
        }
    }
}

/// How long a key's `last_used_at` may lag behind (saves a write per request).
const TOUCH_EVERY_SECS: i64 = 60;

/// Records that the caller's stored key was used (in the background, at
/// most once per [`TOUCH_EVERY_SECS`]): by the API or through the console.
pub(crate) fn note_key_use(state: &AppState, caller: &Caller) {
    let Some(key_id) = &caller.key_id else {
        return;
    };
    let now = hearth_store::ids::now();
    if caller
        .last_used_at
        .is_some_and(|t| now - t < TOUCH_EVERY_SECS)
    {
        return;
    }
    let store = state.store.clone();
    let key_id = key_id.clone();
    tokio::spawn(async move {
        if let Err(e) = store.touch_key(&key_id).await {
            tracing::warn!("recording a key's last use: {e}");
        }
    });
}

pub async fn require_key(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let header = match single_authorization(request.headers()) {
        Ok(header) => header.cloned(),
        Err(detail) => return HttpError(ApiError::unauthorized(detail)).into_response(),
    };
    let query = request.uri().query().map(str::to_string);
    match resolve(&state, header.as_ref(), query.as_deref()).await {
        Ok(context) if context.caller.read_only && !request.method().is_safe() => {
            HttpError(ApiError::forbidden(
                "This service account has the `viewer` role only: it may read but not \
                 create or change anything (the `editor` role may).",
            ))
            .into_response()
        }
        Ok(context) => {
            request.extensions_mut().insert(context);
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

/// Inside [`require_key`]: 403 unless the caller's key is an admin key,
/// before the handler's extractors run (so before a body is validated).
pub async fn require_admin_key(request: Request, next: Next) -> Response {
    match request.extensions().get::<RequestContext>() {
        Some(ctx) => match ctx.require_admin() {
            Ok(()) => next.run(request).await,
            Err(e) => e.into_response(),
        },
        None => HttpError(ApiError::unauthorized("An API key is needed.")).into_response(),
    }
}

async fn resolve(
    state: &AppState,
    header: Option<&axum::http::HeaderValue>,
    query: Option<&str>,
) -> Result<RequestContext, HttpError> {
    let key = bearer(header).map_err(|detail| HttpError(ApiError::unauthorized(detail)))?;
    let caller = if key.starts_with(hearth_store::iam::ACCESS_TOKEN_PREFIX) {
        token_caller(state, key).await?
    } else if state
        .api_keys
        .iter()
        .any(|k| constant_time_eq(k.as_bytes(), key.as_bytes()))
    {
        Caller {
            key_id: None,
            account_id: None,
            is_admin: false,
            default_project_id: state.default_project.to_string(),
            last_used_at: None,
            service_account_id: None,
            read_only: false,
        }
    } else {
        state.store.authenticate(key).await?.ok_or_else(|| {
            HttpError(ApiError::unauthorized(
                "Invalid API key: the key sent is not valid for this server.",
            ))
        })?
    };
    note_key_use(state, &caller);
    let asked = project_in_query(query)?;
    let project_named = asked.is_some();
    let project_id = match asked {
        None => caller.default_project_id.clone(),
        Some(id) => {
            if !hearth_store::projects::is_well_formed(&id) {
                return Err(HttpError(ApiError::project(format!(
                    "Invalid project id `{id}`: expected `project-` and 26 characters."
                ))));
            }
            if !state.store.caller_reaches(&caller, &id).await? {
                return Err(HttpError(ApiError::forbidden(format!(
                    "No access to the project `{id}`, or it does not exist."
                ))));
            }
            id
        }
    };
    Ok(RequestContext {
        caller,
        project_id,
        project_named,
        priority: hearth_core::Priority::Interactive,
    })
}

/// The caller a cloud access token stands for: its service account, acting
/// in its account's projects with its groups' strongest role (`viewer`:
/// reads only; no role: refused).
async fn token_caller(state: &AppState, token: &str) -> Result<Caller, HttpError> {
    let holder = state.store.token_holder(token).await?.ok_or_else(|| {
        HttpError(ApiError::unauthorized(
            "Invalid access token: it is unknown or expired, or the key it was issued for is revoked.",
        ))
    })?;
    let groups = state
        .store
        .member_groups(&holder.service_account_id)
        .await?;
    let role = hearth_store::iam::ServiceAccount::role(&groups).ok_or_else(|| {
        HttpError(ApiError::forbidden(format!(
            "The service account `{}` is in no group with a role: an admin must add it to the \
             `editors` (or `viewers`) group.",
            holder.service_account_id
        )))
    })?;
    Ok(Caller {
        key_id: None,
        account_id: Some(holder.account_id),
        is_admin: false,
        default_project_id: holder.default_project_id,
        last_used_at: None,
        service_account_id: Some(holder.service_account_id),
        read_only: role == hearth_store::iam::Role::Viewer,
    })
}

/// `ai_project_id` of the query string (empty counts as absent). Named
/// twice: 422 shape C rather than a silent choice of one.
fn project_in_query(query: Option<&str>) -> Result<Option<String>, HttpError> {
    let Some(query) = query else {
        return Ok(None);
    };
    let first = single_query_value(query, "ai_project_id").map_err(|[first, second]| {
        HttpError(ApiError::validation(vec![hearth_api::ValidationItem {
            kind: "duplicate_parameter".into(),
            loc: vec!["query".into(), "ai_project_id".into()],
            msg: "`ai_project_id` may be given once".into(),
            input: serde_json::json!([first, second]),
            ctx: None,
        }]))
    })?;
    Ok(first.filter(|id| !id.is_empty()))
}

/// The value of query parameter `name` in `query`, if given; given more
/// than once, its first two values (each route refuses that in its own
/// error shape rather than silently choose one).
pub(crate) fn single_query_value(query: &str, name: &str) -> Result<Option<String>, [String; 2]> {
    let mut values = form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned());
    match (values.next(), values.next()) {
        (Some(first), Some(second)) => Err([first, second]),
        (first, _) => Ok(first),
    }
}

/// The request's one `Authorization` header, if any: two or more are
/// refused (which one counts would be up to whoever added the second).
pub(crate) fn single_authorization(
    headers: &axum::http::HeaderMap,
) -> Result<Option<&axum::http::HeaderValue>, &'static str> {
    let mut all = headers.get_all(AUTHORIZATION).iter();
    match (all.next(), all.next()) {
        (first, None) => Ok(first),
        _ => Err("Not authenticated: the request has more than one Authorization header. Send exactly one."),
    }
}

fn bearer(header: Option<&axum::http::HeaderValue>) -> Result<&str, &'static str> {
    let header = header.ok_or("Not authenticated: the Authorization header is missing. Send `Authorization: Bearer <API key>`.")?;
    let value = header
        .to_str()
        .map_err(|_| "Not authenticated: the Authorization header is not valid text.")?;
    let (scheme, key) = value
        .split_once(' ')
        .ok_or("Not authenticated: the Authorization header must be `Bearer <API key>`.")?;
    let key = key.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || key.is_empty() {
        return Err("Not authenticated: the Authorization header must be `Bearer <API key>`.");
    }
    Ok(key)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares_keys_exactly() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
