//! `GET /v1/usage`: what a project used, summed per day, model, credential
//! and class (interactive or batch), with totals and its budget; and the
//! admin routes that set a project's budget and quotas.

use axum::extract::State;
use axum::{Extension, Json};
use hearth_api::ApiError;
use hearth_store::usage::{day_string, parse_day, Budget, Quota, UsageCounts, DAY};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::state::AppState;
use crate::usage::{format_amount, parse_amount};

#[derive(Debug, Deserialize)]
pub struct UsageQuery {
    /// First day, `YYYY-MM-DD` (default: the first of this month, UTC).
    #[serde(default)]
    start_date: Option<String>,
    /// Last day, inclusive (default: today, UTC).
    #[serde(default)]
    end_date: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    ai_project_id: Option<String>,
}

fn day_param(name: &str, value: Option<&str>, default: i64) -> Result<i64, HttpError> {
    match value {
        None | Some("") => Ok(default),
        Some(v) => parse_day(v).ok_or_else(|| {
            HttpError(ApiError::bad_request(
                Some(name),
                format!("`{name}` must be a date as YYYY-MM-DD, not `{v}`."),
            ))
        }),
    }
}

fn amount(nanos: i64) -> Value {
    format_amount(nanos)
        .parse::<f64>()
        .map_or(Value::Null, Value::from)
}

fn counts_json(c: &UsageCounts) -> Value {
    json!({
        "requests": c.requests,
        "input_tokens": c.input_tokens,
        "output_tokens": c.output_tokens,
        "cached_tokens": c.cached_tokens,
        "total_tokens": c.input_tokens + c.output_tokens,
        "cost": amount(c.cost_nanos),
    })
}

pub(crate) fn budget_json(budget: &Budget, spent: i64) -> Value {
    json!({
        "object": "budget",
        "project_id": budget.project_id,
        "amount": amount(budget.amount_nanos),
        "period": budget.period,
        "currency": budget.currency,
        "spent": amount(spent),
        "remaining": amount((budget.amount_nanos - spent).max(0)),
        "exhausted": spent >= budget.amount_nanos,
        "updated_at": budget.updated_at,
    })
}

/// What a budget has spent now (from the store, after a flush).
async fn spent(state: &AppState, budget: &Budget) -> Result<i64, HttpError> {
    let first = budget.first_day(hearth_store::ids::now());
    Ok(state.store.spent_nanos(&budget.project_id, first).await?)
}

/// Writes what is pending so that sums include the requests just answered.
async fn flush(state: &AppState) -> Result<(), HttpError> {
    state
        .usage
        .flush(&state.store)
        .await
        .map_err(HttpError::from)
}

pub async fn usage(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> Result<Json<Value>, HttpError> {
    let today = hearth_store::ids::now() / DAY;
    let first = day_param(
        "start_date",
        query.start_date.as_deref(),
        hearth_store::usage::month_start_day(today),
    )?;
    let last = day_param("end_date", query.end_date.as_deref(), today)?;
    if last < first {
        return Err(HttpError(ApiError::bad_request(
            Some("end_date"),
            "`end_date` is before `start_date`.",
        )));
    }
    flush(&state).await?;
    let rows = state.store.usage(&ctx.project_id, first, last).await?;
    let mut totals = UsageCounts::default();
    let data: Vec<Value> = rows
        .iter()
        .map(|(k, c)| {
            totals.add(c);
            let mut row = counts_json(c);
            row["date"] = json!(day_string(k.day));
            row["model"] = json!(k.model);
            row["key_id"] = if k.key_id.is_empty() {
                Value::Null
            } else {
                json!(k.key_id)
            };
            row["class"] = json!(k.class);
            row
        })
        .collect();
    let budget = match state.store.budget(&ctx.project_id).await? {
        Some(b) => budget_json(&b, spent(&state, &b).await?),
        None => Value::Null,
    };
    Ok(Json(json!({
        "object": "usage",
        "project_id": ctx.project_id,
        "start_date": day_string(first),
        "end_date": day_string(last),
        "data": data,
        "totals": counts_json(&totals),
        "budget": budget,
    })))
}

#[derive(Debug, Deserialize)]
pub struct SetBudget {
    /// In currency units (e.g. 25.50); null removes the budget.
    amount: Option<f64>,
    /// `month` (default) or `total`.
    #[serde(default)]
    period: Option<String>,
    /// Default `USD`.
    #[serde(default)]
    currency: Option<String>,
}

/// `GET /v1/admin/projects/{project_id}/budget`.
pub async fn get_budget(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(project): ApiPath<String>,
) -> Result<Json<Value>, HttpError> {
    ctx.require_admin()?;
    flush(&state).await?;
    match state.store.budget(&project).await? {
        Some(b) => Ok(Json(budget_json(&b, spent(&state, &b).await?))),
        None => {
            state
                .store
                .project(&project)
                .await?
                .ok_or(hearth_store::StoreError::NotFound("project"))?;
            Ok(Json(
                json!({"object": "budget", "project_id": project, "amount": null}),
            ))
        }
    }
}

/// `PUT /v1/admin/projects/{project_id}/budget` `{amount, period?, currency?}`.
pub async fn set_budget(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(project): ApiPath<String>,
    ApiJson(body): ApiJson<SetBudget>,
) -> Result<Json<Value>, HttpError> {
    ctx.require_admin()?;
    let period = body.period.as_deref().unwrap_or("month");
    let currency = body.currency.as_deref().unwrap_or("USD");
    let nanos = body
        .amount
        .map(|a| {
            parse_amount(&a.to_string()).ok_or_else(|| {
                HttpError(ApiError::bad_request(
                    Some("amount"),
                    "`amount` must be a number of at least 0.",
                ))
            })
        })
        .transpose()?;
    let set = state
        .store
        .set_budget(&project, nanos.map(|n| (n, period, currency)))
        .await?;
    flush(&state).await?;
    match set {
        Some(b) => Ok(Json(budget_json(&b, spent(&state, &b).await?))),
        None => Ok(Json(
            json!({"object": "budget", "project_id": project, "amount": null}),
        )),
    }
}

pub(crate) fn quota_json(q: &Quota) -> Value {
    json!({
        "object": "quota",
        "project_id": q.project_id,
        "model": q.model,
        "tokens_per_minute": q.tokens_per_minute,
        "requests_per_minute": q.requests_per_minute,
        "burst_tokens": q.burst_tokens,
        "updated_at": q.updated_at,
    })
}

#[derive(Debug, Deserialize)]
pub struct SetQuota {
    /// A model name, or `*` for every model without a quota of its own.
    model: String,
    #[serde(default)]
    tokens_per_minute: Option<i64>,
    #[serde(default)]
    requests_per_minute: Option<i64>,
    #[serde(default)]
    burst_tokens: Option<i64>,
}

/// `GET /v1/admin/projects/{project_id}/quotas`.
pub async fn list_quotas(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(project): ApiPath<String>,
) -> Result<Json<Value>, HttpError> {
    ctx.require_admin()?;
    let quotas: Vec<Value> = state
        .store
        .quotas()
        .await?
        .iter()
        .filter(|q| q.project_id == project)
        .map(quota_json)
        .collect();
    Ok(Json(json!({"object": "list", "data": quotas})))
}

/// `PUT /v1/admin/projects/{project_id}/quotas` `{model, tokens_per_minute?,
/// requests_per_minute?, burst_tokens?}`; no limits removes the quota.
pub async fn set_quota(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(project): ApiPath<String>,
    ApiJson(body): ApiJson<SetQuota>,
) -> Result<Json<Value>, HttpError> {
    ctx.require_admin()?;
    let quota = state
        .store
        .set_quota(
            &project,
            &body.model,
            body.tokens_per_minute,
            body.requests_per_minute,
            body.burst_tokens,
        )
        .await?;
    flush(&state).await?;
    Ok(Json(match quota {
        Some(q) => quota_json(&q),
        None => {
            json!({"object": "quota", "project_id": project, "model": body.model, "tokens_per_minute": null, "requests_per_minute": null})
        }
    }))
}
