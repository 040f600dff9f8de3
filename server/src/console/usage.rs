//! Usage: the project's tokens and cost by day, model and key over a date range
//! (the usage API's own handler and its checks), with a bar chart of the
//! tokens of each day drawn on the server.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::Extension;
use hearth_api::usage::{UsageQuery, UsageRowObject};
use maud::{html, Markup};

use super::form;
use super::layout::{self, form_error, render, Section};
use super::session::Session;
use crate::error::ApiQuery;
use crate::state::AppState;

/// `GET /console/usage[?start_date=&end_date=]`.
pub async fn page(State(state): State<AppState>, session: Session, uri: Uri) -> Response {
    let asked = form::query(&uri);
    let query = UsageQuery {
        start_date: asked.get("start_date").map(str::to_string),
        end_date: asked.get("end_date").map(str::to_string),
        ai_project_id: None,
    };
    let report = crate::routes::usage::usage(
        State(state.clone()),
        Extension(session.ctx()),
        ApiQuery(query),
    )
    .await;
    let (status, error, report) = match report {
        Ok(r) => (StatusCode::OK, None, Some(r.0)),
        Err(e) => {
            let (status, message) = layout::error_text(&e);
            (status, Some(message), None)
        }
    };
    let body = html! {
        h1 { "Usage" }
        form method="get" action="/console/usage" {
            label for="start-date" { "From (YYYY-MM-DD, UTC)" }
            input #start-date name="start_date" placeholder="the first of this month"
                value=(asked.get("start_date").unwrap_or("")) aria-describedby=[error.as_ref().map(|_| "usage-error")];
            label for="end-date" { "To, inclusive" }
            input #end-date name="end_date" placeholder="today" value=(asked.get("end_date").unwrap_or(""));
            (form_error("usage-error", error.as_deref()))
            button type="submit" { "Show" }
        }
        @if let Some(r) = &report {
            p { "From " (r.start_date) " to " (r.end_date) ": " strong { (r.totals.total_tokens) } " tokens in "
                (r.totals.requests) " requests, cost " (format!("{:.4}", r.totals.cost)) "." }
            @if let Some(b) = &r.budget { @if let (Some(amount), Some(spent)) = (b.amount, b.spent) {
                p { "Budget: " (format!("{spent:.4}")) " spent of " (format!("{amount:.4}"))
                    @if let Some(c) = &b.currency { " " (c) } @if let Some(p) = &b.period { " per " (p) } "." }
            } }
            @if r.data.is_empty() { p { "No requests in this range." } } @else {
                (day_chart(&r.data))
                div.scroll { table {
                    caption.visually-hidden { "Usage by day, model and key" }
                    thead { tr { th scope="col" { "Day" } th scope="col" { "Model" } th scope="col" { "Key" } th scope="col" { "Class" }
                        th scope="col" { "Requests" } th scope="col" { "Input tokens" } th scope="col" { "Output tokens" }
                        th scope="col" { "Total tokens" } th scope="col" { "Cost" } } }
                    tbody { @for row in &r.data { tr {
                        td { (row.date) } td { (row.model) }
                        td { @if let Some(k) = &row.key_id { code { (k) } }
                            @else if row.class == "batch" { "batch" }
                            @else { span title="a --api-key key of the server, or a service account's access token" { "no stored key" } } } td { (row.class) }
                        td { (row.counts.requests) } td { (row.counts.input_tokens) }
                        td { (row.counts.output_tokens) } td { (row.counts.total_tokens) }
                        td { (format!("{:.4}", row.counts.cost)) }
                    } } }
                } }
            }
        }
    };
    render(&state, &session, Section::Usage, status, "Usage", body).await
}

/// Total tokens by day as bars (an SVG; a table follows with the numbers).
fn day_chart(rows: &[UsageRowObject]) -> Markup {
    let mut days: BTreeMap<&str, i64> = BTreeMap::new();
    for row in rows {
        *days.entry(row.date.as_str()).or_default() += row.counts.total_tokens;
    }
    let max = days.values().copied().max().unwrap_or(0).max(1) as f64;
    let (w, h, bottom) = (640.0, 200.0, 24.0);
    let step = w / days.len().max(1) as f64;
    let bar = (step * 0.7).max(1.0);
    html! {
        figure.chart {
            svg viewBox={ "0 0 " (w) " " (h) } role="img" aria-labelledby="usage-chart-title"
                xmlns="http://www.w3.org/2000/svg" {
                title #usage-chart-title { "Total tokens by day" }
                @for (i, (day, tokens)) in days.iter().enumerate() {
                    @let height = (*tokens as f64 / max * (h - bottom - 16.0)).max(1.0);
                    @let x = i as f64 * step + (step - bar) / 2.0;
                    rect.bar x=(format!("{x:.1}")) y=(format!("{:.1}", h - bottom - height))
                        width=(format!("{bar:.1}")) height=(format!("{height:.1}")) {
                        title { (day) ": " (tokens) " tokens" }
                    }
                    @if days.len() <= 12 || i % (days.len() / 6).max(1) == 0 {
                        text.tick x=(format!("{:.1}", x + bar / 2.0)) y=(h - 6.0) text-anchor="middle" { (&day[5..]) }
                    }
                }
            }
            figcaption { "Total tokens by day (UTC)." }
        }
    }
}
