//! `hearth projects budget ...` and `hearth projects quota ...`: a
//! project's spending budget and token quotas, on the same store `serve`
//! uses (a running server applies changes within two seconds).

use anyhow::Context;
use clap::Subcommand;

use crate::config::StoreLocation;
use crate::keys_cli::open;
use crate::usage::{format_amount, parse_amount};

#[derive(Debug, Subcommand)]
pub enum BudgetCommand {
    /// Set a project's budget: once spent (at the catalogue's prices),
    /// inference and new fine-tuning jobs answer 402.
    Set {
        #[arg(long)]
        project: String,
        /// Amount in currency units, e.g. 25 or 0.50.
        #[arg(long)]
        amount: String,
        /// Per calendar `month` (UTC) or in `total`.
        #[arg(long, default_value = "month", value_parser = ["month", "total"])]
        period: String,
        #[arg(long, default_value = "USD")]
        currency: String,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// Show budgets (all, or one project's) with what they have spent.
    Show {
        #[arg(long)]
        project: Option<String>,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// Remove a project's budget.
    Clear {
        #[arg(long)]
        project: String,
        #[command(flatten)]
        location: StoreLocation,
    },
}

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Set a project's quota for a model (or `*`: every model without its
    /// own); it replaces the catalogue's. Past it, requests answer 429.
    Set {
        #[arg(long)]
        project: String,
        #[arg(long, default_value = "*")]
        model: String,
        #[arg(long = "tokens-per-minute")]
        tokens_per_minute: Option<i64>,
        #[arg(long = "requests-per-minute")]
        requests_per_minute: Option<i64>,
        /// Tokens that may be spent at once (default: a minute's worth);
        /// with `--tokens-per-minute` only.
        #[arg(long = "burst-tokens", requires = "tokens_per_minute")]
        burst_tokens: Option<i64>,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// Show quotas (all, or one project's).
    Show {
        #[arg(long)]
        project: Option<String>,
        #[command(flatten)]
        location: StoreLocation,
    },
    /// Remove a project's quota for a model.
    Clear {
        #[arg(long)]
        project: String,
        #[arg(long, default_value = "*")]
        model: String,
        #[command(flatten)]
        location: StoreLocation,
    },
}

pub async fn budget(command: BudgetCommand) -> anyhow::Result<()> {
    match command {
        BudgetCommand::Set {
            project,
            amount,
            period,
            currency,
            location,
        } => {
            let nanos = parse_amount(&amount).with_context(|| {
                format!("`{amount}` is not an amount from 0 to less than 9000000000")
            })?;
            if let Some(problem) = hearth_api::usage::currency_problem(&currency) {
                anyhow::bail!(problem);
            }
            let store = open(&location).await?;
            store
                .set_budget(&project, Some((nanos, &period, &currency)))
                .await
                .context("setting the budget")?;
            println!(
                "Budget of {project}: {} {currency} per {period}.",
                format_amount(nanos)
            );
        }
        BudgetCommand::Show { project, location } => {
            let store = open(&location).await?;
            println!(
                "{:<34} {:>14} {:>14} {:<8} PERIOD",
                "PROJECT", "AMOUNT", "SPENT", "CURRENCY"
            );
            for b in store.budgets().await? {
                if project.as_ref().is_some_and(|p| *p != b.project_id) {
                    continue;
                }
                let spent = store
                    .spent_nanos(&b.project_id, b.first_day(hearth_store::ids::now()))
                    .await?;
                println!(
                    "{:<34} {:>14} {:>14} {:<8} {}{}",
                    b.project_id,
                    format_amount(b.amount_nanos),
                    format_amount(spent),
                    b.currency,
                    b.period,
                    if spent >= b.amount_nanos {
                        " (exhausted)"
                    } else {
                        ""
                    }
                );
            }
        }
        BudgetCommand::Clear { project, location } => {
            let store = open(&location).await?;
            store.set_budget(&project, None).await?;
            println!("{project} has no budget.");
        }
    }
    Ok(())
}

pub async fn quota(command: QuotaCommand) -> anyhow::Result<()> {
    match command {
        QuotaCommand::Set {
            project,
            model,
            tokens_per_minute,
            requests_per_minute,
            burst_tokens,
            location,
        } => {
            anyhow::ensure!(
                tokens_per_minute.is_some() || requests_per_minute.is_some(),
                "give --tokens-per-minute and/or --requests-per-minute (or use `quota clear`)"
            );
            let store = open(&location).await?;
            store
                .set_quota(
                    &project,
                    &model,
                    tokens_per_minute,
                    requests_per_minute,
                    burst_tokens,
                )
                .await
                .context("setting the quota")?;
            println!("Quota of {project} on {model} set.");
        }
        QuotaCommand::Show { project, location } => {
            let store = open(&location).await?;
            println!(
                "{:<34} {:<40} {:>12} {:>12} {:>12}",
                "PROJECT", "MODEL", "TOKENS/MIN", "REQS/MIN", "BURST"
            );
            let show = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
            for q in store.quotas().await? {
                if project.as_ref().is_some_and(|p| *p != q.project_id) {
                    continue;
                }
                println!(
                    "{:<34} {:<40} {:>12} {:>12} {:>12}",
                    q.project_id,
                    q.model,
                    show(q.tokens_per_minute),
                    show(q.requests_per_minute),
                    show(q.burst_tokens)
                );
            }
        }
        QuotaCommand::Clear {
            project,
            model,
            location,
        } => {
            let store = open(&location).await?;
            store.set_quota(&project, &model, None, None, None).await?;
            println!("{project} has no quota of its own on {model}.");
        }
    }
    Ok(())
}
