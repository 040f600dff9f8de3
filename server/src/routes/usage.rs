//! `GET /v1/usage`: what a project used, summed per day, model, credential
//! and class (interactive or batch), with totals and its budget; and the
//! admin routes that set a project's budget and quotas.

use axum::extract::State;
use axum::{Extension, Json};
use hearth_api::usage::{
    BudgetObject, QuotaList, QuotaObject, SetBudgetRequest, SetQuotaRequest, UsageCountsObject,
    UsageQuery, UsageReport, UsageRowObject,
};
use hearth_api::ApiError;
use hearth_store::usage::{day_string, parse_day, Budget, Quota, UsageCounts, DAY};

use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiPath, ApiQuery, HttpError};
use crate::state::AppState;
use crate::usage::{format_amount, parse_amount};

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

fn amount(nanos: i64) -> f64 {
    format_amount(nanos).parse().unwrap_or(0.0)
}

fn counts_object(c: &UsageCounts) -> UsageCountsObject {
    UsageCountsObject {
        requests: c.requests,
        input_tokens: c.input_tokens,
        output_tokens: c.output_tokens,
        cached_tokens: c.cached_tokens,
        total_tokens: c.input_tokens + c.output_tokens,
        cost: amount(c.cost_nanos),
    }
}

fn no_budget(project: &str) -> BudgetObject {
    BudgetObject {
        object: "budget".into(),
        project_id: project.to_string(),
        amount: None,
        period: None,
        currency: None,
        spent: None,
        remaining: None,
        exhausted: false,
        updated_at: None,
    }
}

/// A budget with what it has spent now (from the store).
async fn budget_object(state: &AppState, budget: &Budget) -> Result<BudgetObject, HttpError> {
    let first = budget.first_day(hearth_store::ids::now());
    let spent = state.store.spent_nanos(&budget.project_id, first).await?;
    Ok(BudgetObject {
        object: "budget".into(),
        project_id: budget.project_id.clone(),
        amount: Some(amount(budget.amount_nanos)),
        period: Some(budget.period.clone()),
        currency: Some(budget.currency.clone()),
        spent: Some(amount(spent)),
        remaining: Some(amount((budget.amount_nanos - spent).max(0))),
        exhausted: spent >= budget.amount_nanos,
        updated_at: Some(budget.updated_at),
    })
}

/// Writes what is pending so that sums include the requests just answered
/// (and re-reads budgets and quotas).
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
) -> Result<Json<UsageReport>, HttpError> {
    let today = hearth_store::ids::now() / DAY;
    let month = hearth_store::usage::month_start_day(today);
    let first = day_param("start_date", query.start_date.as_deref(), month)?;
    let last = day_param("end_date", query.end_date.as_deref(), today)?;
    if last < first {
        return Err(HttpError(match query.end_date {
            Some(_) => {
                ApiError::bad_request(Some("end_date"), "`end_date` is before `start_date`.")
            }
            None => ApiError::bad_request(
                Some("start_date"),
                "`start_date` is after today (`end_date` when not given).",
            ),
        }));
    }
    flush(&state).await?;
    let rows = state.store.usage(&ctx.project_id, first, last).await?;
    let mut totals = UsageCounts::default();
    let data = rows
        .iter()
        .map(|(k, c)| {
            totals.add(c);
            UsageRowObject {
                date: day_string(k.day),
                model: k.model.clone(),
                key_id: (!k.key_id.is_empty()).then(|| k.key_id.clone()),
                class: k.class.clone(),
                counts: counts_object(c),
            }
        })
        .collect();
    let budget = match state.store.budget(&ctx.project_id).await? {
        Some(b) => Some(budget_object(&state, &b).await?),
        None => None,
    };
    Ok(Json(UsageReport {
        object: "usage".into(),
        project_id: ctx.project_id.clone(),
        start_date: day_string(first),
        end_date: day_string(last),
        data,
        totals: counts_object(&totals),
        budget,
    }))
}

/// `GET /v1/admin/projects/{project_id}/budget`.
pub async fn get_budget(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(project): ApiPath<String>,
) -> Result<Json<BudgetObject>, HttpError> {
    ctx.require_admin()?;
    flush(&state).await?;
    match state.store.budget(&project).await? {
        Some(b) => Ok(Json(budget_object(&state, &b).await?)),
        None => {
            known_project(&state, &project).await?;
            Ok(Json(no_budget(&project)))
        }
    }
}

/// 403 (as for any project out of reach) unless `project` exists.
async fn known_project(state: &AppState, project: &str) -> Result<(), HttpError> {
    state
        .store
        .project(project)
        .await?
        .ok_or(hearth_store::StoreError::NotFound("project"))?;
    Ok(())
}

/// `PUT /v1/admin/projects/{project_id}/budget`.
pub async fn set_budget(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(project): ApiPath<String>,
    ApiJson(body): ApiJson<SetBudgetRequest>,
) -> Result<Json<BudgetObject>, HttpError> {
    ctx.require_admin()?;
    let period = body.period.as_deref().unwrap_or("month");
    if !matches!(period, "month" | "total") {
        return Err(HttpError(ApiError::bad_request(
            Some("period"),
            format!("`period` must be `month` or `total`, got `{period}`."),
        )));
    }
    let currency = body.currency.as_deref().unwrap_or("USD");
    if let Some(problem) = hearth_api::usage::currency_problem(currency) {
        return Err(HttpError(ApiError::bad_request(Some("currency"), problem)));
    }
    let nanos = body
        .amount
        .flatten()
        .map(|a| {
            parse_amount(&a.to_string()).ok_or_else(|| {
                HttpError(ApiError::bad_request(
                    Some("amount"),
                    "`amount` must be a number from 0 to less than 9000000000.",
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
        Some(b) => Ok(Json(budget_object(&state, &b).await?)),
        None => Ok(Json(no_budget(&project))),
    }
}

fn quota_object(q: &Quota) -> QuotaObject {
    QuotaObject {
        object: "quota".into(),
        project_id: q.project_id.clone(),
        model: q.model.clone(),
        tokens_per_minute: q.tokens_per_minute,
        requests_per_minute: q.requests_per_minute,
        burst_tokens: q.burst_tokens,
        updated_at: Some(q.updated_at),
    }
}

/// `GET /v1/admin/projects/{project_id}/quotas`.
pub async fn list_quotas(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(project): ApiPath<String>,
) -> Result<Json<QuotaList>, HttpError> {
    ctx.require_admin()?;
    known_project(&state, &project).await?;
    let data = state
        .store
        .quotas()
        .await?
        .iter()
        .filter(|q| q.project_id == project)
        .map(quota_object)
        .collect();
    Ok(Json(QuotaList {
        object: "list".into(),
        data,
    }))
}

/// `PUT /v1/admin/projects/{project_id}/quotas`.
pub async fn set_quota(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(project): ApiPath<String>,
    ApiJson(body): ApiJson<SetQuotaRequest>,
) -> Result<Json<QuotaObject>, HttpError> {
    ctx.require_admin()?;
    for (field, limit) in [
        ("tokens_per_minute", body.tokens_per_minute),
        ("requests_per_minute", body.requests_per_minute),
        ("burst_tokens", body.burst_tokens),
    ] {
        if let Some(n) = limit.filter(|&n| n < 1) {
            return Err(HttpError(ApiError::bad_request(
                Some(field),
                format!("`{field}` must be at least 1 (leave it out for no limit), got {n}."),
            )));
        }
    }
    if body.burst_tokens.is_some() && body.tokens_per_minute.is_none() {
        return Err(HttpError(ApiError::bad_request(
            Some("burst_tokens"),
            "`burst_tokens` bounds a token rate: give `tokens_per_minute` with it (leave out \
             every limit to remove the quota).",
        )));
    }
    if body.tokens_per_minute.is_some() || body.requests_per_minute.is_some() {
        // Any model name, served now or not (a fine-tuned model may come later).
        crate::routes::admin::check_name("model", &body.model)?;
    }
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
        Some(q) => quota_object(&q),
        None => QuotaObject {
            object: "quota".into(),
            project_id: project,
            model: body.model,
            tokens_per_minute: None,
            requests_per_minute: None,
            burst_tokens: None,
            updated_at: None,
        },
    }))
}
