//! Operations of `/v1/usage` and the admin budget and quota routes.

#![allow(dead_code)]

use hearth_api::schemas::UpstreamError;
use hearth_api::usage::{
    BudgetObject, QuotaList, QuotaObject, SetBudgetRequest, SetQuotaRequest, UsageQuery,
    UsageReport,
};
use hearth_api::ProjectQuery;

#[utoipa::path(
    get,
    path = "/v1/usage",
    tag = "Usage",
    operation_id = "getUsage",
    summary = "What the project used, per day, model, credential and class",
    description = "Sums of requests, input, output and cached tokens and their cost at the \
        catalogue's prices (batch prices for the requests of batches), per UTC day, model, \
        credential (API key or service account) and class (`interactive` or `batch`), with \
        totals and the project's budget. Includes the requests answered just before.",
    params(UsageQuery),
    responses(
        (status = 200, description = "The usage.", body = UsageReport),
        (status = 400, description = "A date that is not YYYY-MM-DD, or `end_date` before \
            `start_date`.", body = UpstreamError),
    )
)]
pub fn get_usage() {}

#[utoipa::path(
    get,
    path = "/v1/admin/projects/{project_id}/budget",
    tag = "Admin",
    operation_id = "getProjectBudget",
    summary = "A project's spending budget and what it has spent",
    params(
        ("project_id" = String, Path, description = "The project's id."),
        ProjectQuery,
    ),
    responses((status = 200, description = "The budget (`amount` null: none).", body = BudgetObject))
)]
pub fn get_budget() {}

#[utoipa::path(
    put,
    path = "/v1/admin/projects/{project_id}/budget",
    tag = "Admin",
    operation_id = "setProjectBudget",
    summary = "Set or remove a project's spending budget",
    description = "Once the project has spent `amount` (this calendar month, or in total) at \
        the catalogue's prices, inference requests and new fine-tuning jobs answer 402; \
        requests already running finish. `amount` is required; `amount: null` removes the \
        budget. `currency` is three capital letters (an ISO 4217 code).",
    params(
        ("project_id" = String, Path, description = "The project's id."),
        ProjectQuery,
    ),
    request_body = SetBudgetRequest,
    responses(
        (status = 200, description = "The budget.", body = BudgetObject),
        (status = 400, description = "An amount out of range, an unknown period or a currency \
            that is not three capital letters (`param` names it).", body = UpstreamError),
    )
)]
pub fn set_budget() {}

#[utoipa::path(
    get,
    path = "/v1/admin/projects/{project_id}/quotas",
    tag = "Admin",
    operation_id = "listProjectQuotas",
    summary = "A project's token quotas",
    params(
        ("project_id" = String, Path, description = "The project's id."),
        ProjectQuery,
    ),
    responses((status = 200, description = "The quotas.", body = QuotaList))
)]
pub fn list_quotas() {}

#[utoipa::path(
    put,
    path = "/v1/admin/projects/{project_id}/quotas",
    tag = "Admin",
    operation_id = "setProjectQuota",
    summary = "Set or remove a project's token quota for a model",
    description = "Tokens (and optionally requests) per minute for `model`, or `*` for every \
        model without a quota of its own; it replaces the catalogue's limit. A request the \
        quota cannot hold now answers 429 with `Retry-After`. No limits removes the quota.",
    params(
        ("project_id" = String, Path, description = "The project's id."),
        ProjectQuery,
    ),
    request_body = SetQuotaRequest,
    responses(
        (status = 200, description = "The quota.", body = QuotaObject),
        (status = 400, description = "A limit below 1 (`param` names it).", body = UpstreamError),
    )
)]
pub fn set_quota() {}
