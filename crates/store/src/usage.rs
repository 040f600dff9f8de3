//! Usage metering, token quotas and spending budgets of projects.
//!
//! Usage rows are sums per UTC day, project, model, credential and class;
//! the server adds to them in batches ([`Store::add_usage`], one
//! transaction of upserts). Costs are kept in billionths of the currency
//! unit so a single token of a cheap model still counts.

use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::{Result, StoreError};
use crate::ids::now;
use crate::Store;

/// Seconds in a day; usage days are `secs / DAY`.
pub const DAY: i64 = 86_400;

/// What a usage row is summed over.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct UsageKey {
    /// Days since the epoch (UTC).
    pub day: i64,
    pub project_id: String,
    pub model: String,
    /// An API key id, a service account id, or empty for command-line keys.
    pub key_id: String,
    /// `interactive` or `batch`.
    pub class: String,
}

/// Sums of one usage row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UsageCounts {
    pub requests: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cached_tokens: i64,
    pub cost_nanos: i64,
}

impl UsageCounts {
    pub fn add(&mut self, other: &UsageCounts) {
        self.requests += other.requests;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_tokens += other.cached_tokens;
        self.cost_nanos += other.cost_nanos;
    }
}

/// A project's spending budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Budget {
    pub project_id: String,
    /// Billionths of the currency unit.
    pub amount_nanos: i64,
    /// `month` (the calendar month, UTC) or `total`.
    pub period: String,
    pub currency: String,
    pub updated_at: i64,
}

impl Budget {
    /// The first usage day the budget counts at time `now`.
    pub fn first_day(&self, now: i64) -> i64 {
        if self.period == "month" {
            month_start_day(now / DAY)
        } else {
            i64::MIN
        }
    }
}

/// A project's token quota for one model (`*`: every model without its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Quota {
    pub project_id: String,
    pub model: String,
    pub tokens_per_minute: Option<i64>,
    pub requests_per_minute: Option<i64>,
    /// Tokens that may be spent at once (default: a minute's worth).
    pub burst_tokens: Option<i64>,
    pub updated_at: i64,
}

/// The first day of the month holding `day` (days since the epoch).
pub fn month_start_day(day: i64) -> i64 {
    let (y, m, _) = civil_from_days(day);
    days_from_civil(y, m, 1)
}

/// (year, month, day) of days since the epoch (Howard Hinnant's algorithms).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Days since the epoch of a civil date.
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD` of a usage day.
pub fn day_string(day: i64) -> String {
    let (y, m, d) = civil_from_days(day);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The usage day of `YYYY-MM-DD`.
pub fn parse_day(s: &str) -> Option<i64> {
    let mut parts = s.split('-').map(|p| p.parse::<i64>().ok());
    let (Some(Some(y)), Some(Some(m)), Some(Some(d)), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || s.len() != 10 {
        return None;
    }
    let day = days_from_civil(y, m, d);
    (civil_from_days(day) == (y, m, d)).then_some(day)
}

fn counts(row: &AnyRow) -> Result<UsageCounts> {
    Ok(UsageCounts {
        requests: row.try_get("requests")?,
        input_tokens: row.try_get("input_tokens")?,
        output_tokens: row.try_get("output_tokens")?,
        cached_tokens: row.try_get("cached_tokens")?,
        cost_nanos: row.try_get("cost_nanos")?,
    })
}

impl Store {
    /// Adds `rows` to the stored sums, all in one transaction.
    pub async fn add_usage(&self, rows: &[(UsageKey, UsageCounts)]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for (k, c) in rows {
            sqlx::query(
                "INSERT INTO usage_daily (day, project_id, model, key_id, class, requests, \
                 input_tokens, output_tokens, cached_tokens, cost_nanos) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (day, project_id, model, key_id, class) DO UPDATE SET \
                 requests = usage_daily.requests + excluded.requests, \
                 input_tokens = usage_daily.input_tokens + excluded.input_tokens, \
                 output_tokens = usage_daily.output_tokens + excluded.output_tokens, \
                 cached_tokens = usage_daily.cached_tokens + excluded.cached_tokens, \
                 cost_nanos = usage_daily.cost_nanos + excluded.cost_nanos",
            )
            .bind(k.day)
            .bind(&k.project_id)
            .bind(&k.model)
            .bind(&k.key_id)
            .bind(&k.class)
            .bind(c.requests)
            .bind(c.input_tokens)
            .bind(c.output_tokens)
            .bind(c.cached_tokens)
            .bind(c.cost_nanos)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The usage rows of `project_id` from `first_day` to `last_day` (inclusive).
    pub async fn usage(
        &self,
        project_id: &str,
        first_day: i64,
        last_day: i64,
    ) -> Result<Vec<(UsageKey, UsageCounts)>> {
        let rows = sqlx::query(
            "SELECT day, project_id, model, key_id, class, requests, input_tokens, \
             output_tokens, cached_tokens, cost_nanos FROM usage_daily \
             WHERE project_id = $1 AND day >= $2 AND day <= $3 \
             ORDER BY day, model, key_id, class",
        )
        .bind(project_id)
        .bind(first_day)
        .bind(last_day)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    UsageKey {
                        day: r.try_get("day")?,
                        project_id: r.try_get("project_id")?,
                        model: r.try_get("model")?,
                        key_id: r.try_get("key_id")?,
                        class: r.try_get("class")?,
                    },
                    counts(r)?,
                ))
            })
            .collect()
    }

    /// What `project_id` spent from `first_day` on, in billionths.
    pub async fn spent_nanos(&self, project_id: &str, first_day: i64) -> Result<i64> {
        let row = sqlx::query(
            "SELECT COALESCE(SUM(cost_nanos), 0) AS spent FROM usage_daily \
             WHERE project_id = $1 AND day >= $2",
        )
        .bind(project_id)
        .bind(first_day)
        .fetch_one(&self.pool)
        .await?;
        // PostgreSQL sums BIGINT into NUMERIC; read either way.
        match row.try_get::<i64, _>("spent") {
            Ok(v) => Ok(v),
            Err(_) => {
                let text: String = row.try_get("spent")?;
                text.parse::<f64>()
                    .map(|v| v as i64)
                    .map_err(|_| StoreError::Invalid(format!("bad stored sum `{text}`")))
            }
        }
    }

    /// Sets (or with `None` removes) a project's budget.
    pub async fn set_budget(
        &self,
        project_id: &str,
        budget: Option<(i64, &str, &str)>,
    ) -> Result<Option<Budget>> {
        if self.project(project_id).await?.is_none() {
            return Err(StoreError::NotFound("project"));
        }
        match budget {
            None => {
                sqlx::query("DELETE FROM project_budgets WHERE project_id = $1")
                    .bind(project_id)
                    .execute(&self.pool)
                    .await?;
                Ok(None)
            }
            Some((amount_nanos, period, currency)) => {
                if amount_nanos < 0 || !matches!(period, "month" | "total") {
                    return Err(StoreError::Invalid(
                        "a budget is an amount of at least 0 per `month` or in `total`".into(),
                    ));
                }
                sqlx::query(
                    "INSERT INTO project_budgets (project_id, amount_nanos, period, currency, \
                     updated_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (project_id) DO UPDATE \
                     SET amount_nanos = excluded.amount_nanos, period = excluded.period, \
                     currency = excluded.currency, updated_at = excluded.updated_at",
                )
                .bind(project_id)
                .bind(amount_nanos)
                .bind(period)
                .bind(currency)
                .bind(now())
                .execute(&self.pool)
                .await?;
                self.budget(project_id).await
            }
        }
    }

    pub async fn budget(&self, project_id: &str) -> Result<Option<Budget>> {
        let rows = sqlx::query(&format!("{SELECT_BUDGETS} WHERE project_id = $1"))
            .bind(project_id)
            .fetch_all(&self.pool)
            .await?;
        Ok(budgets_of(&rows)?.pop())
    }

    /// Every project's budget.
    pub async fn budgets(&self) -> Result<Vec<Budget>> {
        let rows = sqlx::query(&format!("{SELECT_BUDGETS} ORDER BY project_id"))
            .fetch_all(&self.pool)
            .await?;
        budgets_of(&rows)
    }
}

const SELECT_BUDGETS: &str =
    "SELECT project_id, amount_nanos, period, currency, updated_at FROM project_budgets";

fn budgets_of(rows: &[AnyRow]) -> Result<Vec<Budget>> {
    rows.iter()
        .map(|r| {
            Ok(Budget {
                project_id: r.try_get("project_id")?,
                amount_nanos: r.try_get("amount_nanos")?,
                period: r.try_get("period")?,
                currency: r.try_get("currency")?,
                updated_at: r.try_get("updated_at")?,
            })
        })
        .collect()
}

impl Store {
    /// Sets a project's quota for `model` (`*`: all models); all limits
    /// `None` removes it.
    pub async fn set_quota(
        &self,
        project_id: &str,
        model: &str,
        tokens_per_minute: Option<i64>,
        requests_per_minute: Option<i64>,
        burst_tokens: Option<i64>,
    ) -> Result<Option<Quota>> {
        if self.project(project_id).await?.is_none() {
            return Err(StoreError::NotFound("project"));
        }
        if [tokens_per_minute, requests_per_minute, burst_tokens]
            .iter()
            .flatten()
            .any(|&v| v < 1)
        {
            return Err(StoreError::Invalid(
                "quota limits must be at least 1".into(),
            ));
        }
        if tokens_per_minute.is_none() && requests_per_minute.is_none() {
            sqlx::query("DELETE FROM project_quotas WHERE project_id = $1 AND model = $2")
                .bind(project_id)
                .bind(model)
                .execute(&self.pool)
                .await?;
            return Ok(None);
        }
        // Checked on setting only, so a bad name stored before can be cleared.
        crate::ids::check_name("model", model).map_err(StoreError::Invalid)?;
        sqlx::query(
            "INSERT INTO project_quotas (project_id, model, tokens_per_minute, \
             requests_per_minute, burst_tokens, updated_at) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (project_id, model) DO UPDATE SET \
             tokens_per_minute = excluded.tokens_per_minute, \
             requests_per_minute = excluded.requests_per_minute, \
             burst_tokens = excluded.burst_tokens, updated_at = excluded.updated_at",
        )
        .bind(project_id)
        .bind(model)
        .bind(tokens_per_minute)
        .bind(requests_per_minute)
        .bind(burst_tokens)
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(self
            .quotas()
            .await?
            .into_iter()
            .find(|q| q.project_id == project_id && q.model == model))
    }

    /// Every project quota.
    pub async fn quotas(&self) -> Result<Vec<Quota>> {
        let rows = sqlx::query(
            "SELECT project_id, model, tokens_per_minute, requests_per_minute, burst_tokens, \
             updated_at FROM project_quotas ORDER BY project_id, model",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Quota {
                    project_id: r.try_get("project_id")?,
                    model: r.try_get("model")?,
                    tokens_per_minute: r.try_get("tokens_per_minute")?,
                    requests_per_minute: r.try_get("requests_per_minute")?,
                    burst_tokens: r.try_get("burst_tokens")?,
                    updated_at: r.try_get("updated_at")?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_months() {
        assert_eq!(parse_day("1970-01-01"), Some(0));
        assert_eq!(parse_day("2000-02-29"), Some(951_782_400 / DAY));
        assert_eq!(parse_day("2001-02-29"), None);
        assert_eq!(parse_day("2026-13-01"), None);
        assert_eq!(parse_day("2026-1-01"), None);
        let d = parse_day("2026-11-25").unwrap();
        assert_eq!(day_string(d), "2026-11-25");
        assert_eq!(day_string(month_start_day(d)), "2026-11-01");
        assert_eq!(
            day_string(month_start_day(parse_day("2024-03-01").unwrap())),
            "2024-03-01"
        );
    }
}
