//! Wire types of `GET /v1/usage` and of the admin routes that set a
//! project's budget and token quotas.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// The query of `GET /v1/usage`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// First day, `YYYY-MM-DD` (UTC; default: the first of this month).
    #[serde(default)]
    pub start_date: Option<String>,
    /// Last day, inclusive (default: today).
    #[serde(default)]
    pub end_date: Option<String>,
    /// The project (default: the key's).
    #[serde(default)]
    pub ai_project_id: Option<String>,
}

/// Sums over some requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageCountsObject {
    pub requests: i64,
    /// Prompt tokens (inputs of embeddings and rerank).
    pub input_tokens: i64,
    pub output_tokens: i64,
    /// Prompt tokens served from the prefix cache (also in `input_tokens`).
    pub cached_tokens: i64,
    pub total_tokens: i64,
    /// At the catalogue's per-million-token prices (batch prices for batches).
    pub cost: f64,
}

/// One day's usage of one model by one credential in one class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageRowObject {
    /// `YYYY-MM-DD` (UTC).
    pub date: String,
    /// The model as requests named it.
    pub model: String,
    /// The API key id or service account id; null for command-line keys.
    pub key_id: Option<String>,
    /// `interactive` or `batch`.
    pub class: String,
    #[serde(flatten)]
    pub counts: UsageCountsObject,
}

/// A project's spending budget and what it has spent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetObject {
    /// `budget`.
    pub object: String,
    pub project_id: String,
    /// Null: no budget.
    pub amount: Option<f64>,
    /// `month` (calendar month, UTC) or `total`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<f64>,
    /// Whether inference and new fine-tuning jobs answer 402.
    #[serde(default)]
    pub exhausted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<i64>,
}

/// `GET /v1/usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    /// `usage`.
    pub object: String,
    pub project_id: String,
    pub start_date: String,
    pub end_date: String,
    /// Per day, model, credential and class, by day.
    pub data: Vec<UsageRowObject>,
    pub totals: UsageCountsObject,
    /// The project's budget, if it has one.
    pub budget: Option<BudgetObject>,
}

/// Body of `PUT /v1/admin/projects/{project_id}/budget`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetBudgetRequest {
    /// In currency units (e.g. 25.5); null removes the budget. Required
    /// (a body without it is 422, so that `{}` never lifts a budget).
    #[serde(deserialize_with = "crate::de::double_option")]
    #[schema(value_type = Option<f64>, required = true)]
    pub amount: Option<Option<f64>>,
    /// `month` (default) or `total`.
    #[serde(default)]
    pub period: Option<String>,
    /// Three capital letters (an ISO 4217 code); default `USD`.
    #[serde(default)]
    pub currency: Option<String>,
}

/// A project's token quota for a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaObject {
    /// `quota`.
    pub object: String,
    pub project_id: String,
    /// A model name, or `*` for every model without a quota of its own.
    pub model: String,
    pub tokens_per_minute: Option<i64>,
    pub requests_per_minute: Option<i64>,
    /// Tokens that may be spent at once (default: a minute's worth).
    pub burst_tokens: Option<i64>,
    pub updated_at: Option<i64>,
}

/// `GET /v1/admin/projects/{project_id}/quotas`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaList {
    /// `list`.
    pub object: String,
    pub data: Vec<QuotaObject>,
}

/// Body of `PUT /v1/admin/projects/{project_id}/quotas`; no limit removes
/// the quota.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetQuotaRequest {
    pub model: String,
    #[serde(default)]
    pub tokens_per_minute: Option<i64>,
    #[serde(default)]
    pub requests_per_minute: Option<i64>,
    #[serde(default)]
    pub burst_tokens: Option<i64>,
}

/// `None` when `currency` is three capital letters (the shape of an ISO
/// 4217 code), else what is wrong with it.
pub fn currency_problem(currency: &str) -> Option<String> {
    if currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase()) {
        None
    } else {
        Some(format!(
            "`currency` must be three capital letters (an ISO 4217 code such as `USD`), got `{currency}`."
        ))
    }
}
