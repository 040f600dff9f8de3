//! Usage metering, token quotas (429) and spending budgets (402).
//!
//! Every inference request is admitted by [`Ledger::admit`] before the
//! engine sees it: the project's budget must not be spent (402) and its
//! quota for the model must hold the prompt (429 with `Retry-After`;
//! requests of batches are exempt: the scheduler already runs them only in
//! spare capacity). The [`Ticket`] it returns records the request and its
//! prompt once the engine took it, the output tokens as they are produced
//! (quota) and the engine's final counts when each sequence ends (usage).
//! Against a budget, a request holds at admission what it may cost: its
//! prompt and, when it sets `max_tokens`, that much output (so that
//! requests admitted together see each other's holds; a request whose hold
//! does not fit what is left is refused); output past the hold is charged
//! as it is produced, and what the hold did not use goes back when the
//! request ends (all of it when it never started).
//! Usage collects in memory and is written in one transaction per flush
//! ([`Ledger::flush`], every two seconds and before `/v1/usage` answers),
//! so the hot path never waits on the database.
//!
//! Across several nodes of one store: budgets are read back from the store
//! (every node's flushed usage) at each flush, so a spent budget stops
//! every node within a flush or two; quotas are split, each alive node
//! (the registry of nodes, `crate::nodes`) enforcing `1 / nodes` of the
//! rate and the burst ([`Ledger::set_alive_nodes`]).

mod quota;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hearth_api::ApiError;
use hearth_core::Priority;
use hearth_engine::catalog::CatalogEntry;
use hearth_store::usage::{Budget, Quota, UsageCounts, UsageKey, DAY};
use hearth_store::Store;

use crate::auth::RequestContext;
use crate::error::HttpError;
pub use quota::Bucket;

/// How often pending usage is written and budgets and quotas re-read.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// The meter, quotas and budgets of a server; cheap to clone.
#[derive(Clone, Default)]
pub struct Ledger {
    inner: Arc<Mutex<Inner>>,
    /// Serialises flushes (a flush and `/v1/usage` may race).
    flushing: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Default)]
struct Inner {
    /// Not yet written.
    pending: HashMap<UsageKey, UsageCounts>,
    /// Everything recorded since start, per (model, class), for `/metrics`.
    totals: HashMap<(String, String), UsageCounts>,
    budgets: HashMap<String, BudgetState>,
    /// Recorded cost, per project, of usage already charged to its budget
    /// and not yet written: what a flush takes off `unflushed`.
    charged_pending: HashMap<String, i64>,
    /// Project quotas by (project, model); model `*` for every model.
    quotas: HashMap<(String, String), Quota>,
    /// Token and request buckets by (project, model).
    tokens: HashMap<(String, String), Bucket>,
    requests: HashMap<(String, String), Bucket>,
    /// Alive nodes sharing the store (0 until known: taken as 1). Each
    /// node enforces its share of a quota, `1 / nodes` of the rate and the
    /// burst, so that together they keep the project's limit.
    nodes: usize,
}

struct BudgetState {
    budget: Budget,
    /// Spent as of the last read of the store.
    stored: i64,
    /// Charged since, not yet counted in `stored`.
    unflushed: i64,
}

/// Where one request's usage goes and what it costs.
#[derive(Debug, Clone)]
struct Account {
    /// (project, model): what usage is kept by and the quota's buckets
    /// are keyed by (held as one pair so the per-token lookup allocates
    /// nothing).
    bucket: (String, String),
    key_id: String,
    class: &'static str,
    /// Price per million input and output tokens.
    prices: (f64, f64),
    /// Whether its output is taken from the quota's bucket.
    metered: bool,
    /// Whether its project had a budget when it was admitted: its prompt
    /// and output are charged to it as they come.
    budgeted: bool,
}

/// The limits that apply to one project and model.
struct Limits {
    tokens_per_minute: Option<u64>,
    requests_per_minute: Option<u64>,
    burst: Option<u64>,
}

fn cost_nanos(tokens: i64, price_per_million: f64) -> i64 {
    // price per million tokens = (price * 1000) billionths per token.
    (tokens as f64 * price_per_million * 1000.0).round() as i64
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets how many alive nodes share the store (each enforces its share
    /// of every quota); from the registry of nodes, at each heartbeat.
    pub fn set_alive_nodes(&self, nodes: usize) {
        self.lock().nodes = nodes;
    }

    /// Admits a request of `ctx` for `model` (the name the client sent,
    /// served by `entry`) with `prompt_tokens` and at most `max_output`
    /// output tokens (0 when it set no bound), or refuses it: 402 when the
    /// project's budget is spent (with what running requests hold), 429
    /// when its quota cannot hold it now.
    pub fn admit(
        &self,
        ctx: &RequestContext,
        model: &str,
        entry: &CatalogEntry,
        prompt_tokens: usize,
        max_output: usize,
    ) -> Result<Ticket, HttpError> {
        let batch = ctx.priority == Priority::Batch;
        let prices = if batch {
            (
                entry
                    .batch_price_input_per_million
                    .unwrap_or(entry.price_input_per_million),
                entry
                    .batch_price_output_per_million
                    .unwrap_or(entry.price_output_per_million),
            )
        } else {
            (
                entry.price_input_per_million,
                entry.price_output_per_million,
            )
        };
        let account = Account {
            bucket: (ctx.project_id.clone(), model.to_string()),
            key_id: ctx
                .caller
                .key_id
                .clone()
                .or_else(|| ctx.caller.service_account_id.clone())
                .unwrap_or_default(),
            class: if batch { "batch" } else { "interactive" },
            prices,
            metered: false,
            budgeted: false,
        };
        let now = Instant::now();
        // What the request holds of a budget: its prompt and its bound of
        // output.
        let hold_nanos = cost_nanos(prompt_tokens as i64, account.prices.0)
            + cost_nanos(max_output as i64, account.prices.1);
        let mut inner = self.lock();
        if let Some(state) = inner.budgets.get(&account.bucket.0) {
            let spent = state.stored + state.unflushed;
            if spent < state.budget.amount_nanos
                && spent.saturating_add(hold_nanos) > state.budget.amount_nanos
            {
                let (what, lower) = if max_output > 0 {
                    (
                        "its prompt and `max_tokens` of output",
                        "lower `max_tokens`, or ",
                    )
                } else {
                    ("its input", "")
                };
                return Err(HttpError(ApiError::payment_required(format!(
                    "The request may cost up to {} {} ({what}), more than the {} left of \
                     the budget of project `{}`: {lower}add funds (raise the budget).",
                    format_amount(hold_nanos),
                    state.budget.currency,
                    format_amount(state.budget.amount_nanos - spent),
                    account.bucket.0
                ))));
            }
            if spent >= state.budget.amount_nanos {
                return Err(HttpError(ApiError::payment_required(format!(
                    "The budget of project `{}` is exhausted ({} {} {}): add funds \
                     (raise the budget) to continue.",
                    account.bucket.0,
                    format_amount(state.budget.amount_nanos),
                    state.budget.currency,
                    if state.budget.period == "total" {
                        "in total"
                    } else {
                        "per month"
                    }
                ))));
            }
        }
        let mut account = account;
        account.budgeted = inner.budgets.contains_key(&account.bucket.0);
        if !batch {
            let limits = inner.limits(&account.bucket.0, model, entry);
            let key = account.bucket.clone();
            if let Some(rpm) = limits.requests_per_minute {
                let bucket = inner
                    .requests
                    .entry(key.clone())
                    .or_insert_with(|| Bucket::new(rpm, rpm, now));
                bucket.set_limit(rpm, rpm);
                if let Err(wait) = bucket.check(1, now) {
                    return Err(HttpError(ApiError::request_rate_limited(model, wait)));
                }
            }
            if let Some(tpm) = limits.tokens_per_minute {
                let burst = limits.burst.unwrap_or(tpm);
                let bucket = inner
                    .tokens
                    .entry(key.clone())
                    .or_insert_with(|| Bucket::new(tpm, burst, now));
                bucket.set_limit(tpm, burst);
                if let Err(wait) = bucket.check(prompt_tokens as u64, now) {
                    return Err(HttpError(ApiError::rate_limited(model, wait)));
                }
                bucket.take(prompt_tokens as u64, now);
                account.metered = true;
            }
            if limits.requests_per_minute.is_some() {
                if let Some(b) = inner.requests.get_mut(&key) {
                    b.take(1, now);
                }
            }
        }
        let nanos = if account.budgeted {
            inner.charge(&account.bucket.0, hold_nanos);
            hold_nanos
        } else {
            0
        };
        drop(inner);
        let hold = Hold {
            ledger: self.clone(),
            account,
            prompt_tokens,
            held_output: max_output as u64,
            produced: AtomicU64::new(0),
            released: AtomicBool::new(false),
            nanos,
        };
        Ok(Ticket {
            hold: Arc::new(hold),
        })
    }

    /// Admits an encoder request (embeddings, rerank) of `prompt_tokens`,
    /// runs it, and records it when it succeeds.
    pub async fn encode<T>(
        &self,
        ctx: &RequestContext,
        model: &str,
        entry: &CatalogEntry,
        prompt_tokens: usize,
        run: impl std::future::Future<Output = Result<T, hearth_core::EngineError>>,
    ) -> Result<T, HttpError> {
        let ticket = self.admit(ctx, model, entry, prompt_tokens, 0)?;
        match run.await {
            Ok(value) => {
                ticket.started();
                Ok(value)
            }
            Err(e) => {
                ticket.cancel();
                Err(e.into())
            }
        }
    }

    /// 402 when the project's budget is spent (new fine-tuning jobs).
    pub fn check_budget(&self, project: &str) -> Result<(), HttpError> {
        let inner = self.lock();
        match inner.budgets.get(project) {
            Some(s) if s.stored + s.unflushed >= s.budget.amount_nanos => {
                Err(HttpError(ApiError::payment_required(format!(
                    "The budget of project `{project}` is exhausted: add funds (raise the \
                     budget) to continue."
                ))))
            }
            _ => Ok(()),
        }
    }

    /// Writes pending usage, then re-reads budgets, what they have spent,
    /// and the project quotas.
    pub async fn flush(&self, store: &Store) -> hearth_store::Result<()> {
        let _one = self.flushing.lock().await;
        let (pending, flushed): (Vec<_>, HashMap<String, i64>) = {
            let mut inner = self.lock();
            (
                inner.pending.drain().collect(),
                inner.charged_pending.drain().collect(),
            )
        };
        if let Err(e) = store.add_usage(&pending).await {
            // Put it back: nothing is lost, it goes with the next flush.
            let mut inner = self.lock();
            for (k, c) in pending {
                inner.pending.entry(k).or_default().add(&c);
            }
            for (project, nanos) in flushed {
                *inner.charged_pending.entry(project).or_default() += nanos;
            }
            return Err(e);
        }
        let budgets = store.budgets().await?;
        let now = hearth_store::ids::now();
        let mut spent = Vec::with_capacity(budgets.len());
        for b in &budgets {
            spent.push(store.spent_nanos(&b.project_id, b.first_day(now)).await?);
        }
        let quotas = store.quotas().await?;
        let mut inner = self.lock();
        let mut states = HashMap::new();
        for (budget, stored) in budgets.into_iter().zip(spent) {
            let unflushed = inner
                .budgets
                .get(&budget.project_id)
                .map_or(0, |s| {
                    s.unflushed - flushed.get(&budget.project_id).unwrap_or(&0)
                })
                .max(0);
            states.insert(
                budget.project_id.clone(),
                BudgetState {
                    budget,
                    stored,
                    unflushed,
                },
            );
        }
        inner.budgets = states;
        inner.quotas = quotas
            .into_iter()
            .map(|q| ((q.project_id.clone(), q.model.clone()), q))
            .collect();
        Ok(())
    }

    /// Flushes every [`FLUSH_EVERY`] until the server stops.
    pub fn spawn_flusher(&self, store: Store) -> tokio::task::JoinHandle<()> {
        let ledger = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = ledger.flush(&store).await {
                    tracing::warn!("writing usage: {e}");
                }
                tokio::time::sleep(FLUSH_EVERY).await;
            }
        })
    }

    /// Everything recorded since start, per (model, class).
    pub fn totals(&self) -> Vec<((String, String), UsageCounts)> {
        let mut all: Vec<_> = self
            .lock()
            .totals
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

impl Inner {
    fn limits(&self, project: &str, model: &str, entry: &CatalogEntry) -> Limits {
        let share = |v: u64| (v / self.nodes.max(1) as u64).max(1);
        let limits = self.whole_limits(project, model, entry);
        Limits {
            tokens_per_minute: limits.tokens_per_minute.map(share),
            requests_per_minute: limits.requests_per_minute.map(share),
            burst: limits.burst.map(share),
        }
    }

    fn whole_limits(&self, project: &str, model: &str, entry: &CatalogEntry) -> Limits {
        let own = self
            .quotas
            .get(&(project.to_string(), model.to_string()))
            .or_else(|| self.quotas.get(&(project.to_string(), "*".to_string())));
        match own {
            Some(q) => Limits {
                tokens_per_minute: q.tokens_per_minute.map(|v| v as u64),
                requests_per_minute: q.requests_per_minute.map(|v| v as u64),
                burst: q.burst_tokens.map(|v| v as u64),
            },
            None => Limits {
                tokens_per_minute: entry.tokens_per_minute,
                requests_per_minute: entry.requests_per_minute,
                burst: None,
            },
        }
    }

    fn record(&mut self, account: &Account, mut counts: UsageCounts) {
        counts.cost_nanos = cost_nanos(counts.input_tokens, account.prices.0)
            + cost_nanos(counts.output_tokens, account.prices.1);
        let key = UsageKey {
            day: hearth_store::ids::now() / DAY,
            project_id: account.bucket.0.clone(),
            model: account.bucket.1.clone(),
            key_id: account.key_id.clone(),
            class: account.class.to_string(),
        };
        self.pending.entry(key).or_default().add(&counts);
        self.totals
            .entry((account.bucket.1.clone(), account.class.to_string()))
            .or_default()
            .add(&counts);
        if account.budgeted {
            *self
                .charged_pending
                .entry(account.bucket.0.clone())
                .or_default() += counts.cost_nanos;
        }
    }

    /// Charges `nanos` (negative: gives them back) to `project`'s budget.
    fn charge(&mut self, project: &str, nanos: i64) {
        if let Some(state) = self.budgets.get_mut(project) {
            state.unflushed = (state.unflushed + nanos).max(0);
        }
    }
}

/// One admitted request: records what it uses.
#[derive(Clone)]
pub struct Ticket {
    hold: Arc<Hold>,
}

/// What one request holds of its project's budget: its prompt and
/// `held_output` tokens of output (`nanos` in all). Output past the hold is
/// charged as it is produced; when the last clone of the ticket goes, the
/// part of the hold its output did not use is given back.
struct Hold {
    ledger: Ledger,
    account: Account,
    prompt_tokens: usize,
    held_output: u64,
    /// Output tokens produced by all the request's sequences.
    produced: AtomicU64,
    /// The unused hold went back (at the end, or all of it on cancel).
    released: AtomicBool,
    nanos: i64,
}

impl Hold {
    fn budgeted(&self) -> bool {
        self.account.budgeted
    }

    /// `tokens` more output: the cost of what goes past the hold.
    fn beyond(&self, tokens: u64) -> i64 {
        let before = self.produced.fetch_add(tokens, Ordering::Relaxed);
        let past = (before + tokens).saturating_sub(self.held_output)
            - before.saturating_sub(self.held_output);
        cost_nanos(past as i64, self.account.prices.1)
    }

    fn release(&self, nanos: i64) {
        if self.budgeted() && !self.released.swap(true, Ordering::Relaxed) {
            self.ledger.lock().charge(&self.account.bucket.0, -nanos);
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let used = self.produced.load(Ordering::Relaxed).min(self.held_output);
        self.release(cost_nanos(
            (self.held_output - used) as i64,
            self.account.prices.1,
        ));
    }
}

impl Ticket {
    fn ledger(&self) -> &Ledger {
        &self.hold.ledger
    }

    fn account(&self) -> &Account {
        &self.hold.account
    }

    /// The request reached the engine: records it and its prompt tokens.
    pub fn started(&self) {
        self.ledger().lock().record(
            self.account(),
            UsageCounts {
                requests: 1,
                input_tokens: self.hold.prompt_tokens as i64,
                ..Default::default()
            },
        );
    }

    /// The request failed before it started: its prompt goes back to the
    /// quota, and its whole hold to the budget.
    pub fn cancel(&self) {
        self.hold.release(self.hold.nanos);
        if !self.account().metered {
            return;
        }
        if let Some(b) = self.ledger().lock().tokens.get_mut(&self.account().bucket) {
            b.take_back(self.hold.prompt_tokens as u64);
        }
    }

    /// `tokens` of output were just produced: taken from the quota, and
    /// charged to the budget past the hold.
    pub fn produced(&self, tokens: u64) {
        let account = self.account();
        if !account.metered && !account.budgeted {
            return;
        }
        let past = if account.budgeted {
            self.hold.beyond(tokens)
        } else {
            0
        };
        if past == 0 && !account.metered {
            return;
        }
        let mut inner = self.ledger().lock();
        if past > 0 {
            inner.charge(&account.bucket.0, past);
        }
        if account.metered {
            if let Some(b) = inner.tokens.get_mut(&account.bucket) {
                b.take(tokens, Instant::now());
            }
        }
    }

    /// Records output (and cached prompt) tokens of a finished sequence.
    pub fn finished(&self, output_tokens: usize, cached_tokens: usize) {
        self.ledger().lock().record(
            self.account(),
            UsageCounts {
                output_tokens: output_tokens as i64,
                cached_tokens: cached_tokens as i64,
                ..Default::default()
            },
        );
    }
}

/// An amount in billionths as a decimal number.
pub fn format_amount(nanos: i64) -> String {
    let s = format!("{:.9}", nanos as f64 / 1e9);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// Parses a decimal amount into billionths.
pub fn parse_amount(s: &str) -> Option<i64> {
    let v: f64 = s.trim().parse().ok()?;
    (0.0..9e9).contains(&v).then(|| (v * 1e9).round() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_and_costs() {
        assert_eq!(parse_amount("1.5"), Some(1_500_000_000));
        assert_eq!(parse_amount("0.000001"), Some(1000));
        assert_eq!(parse_amount("-1"), None);
        assert_eq!(parse_amount("abc"), None);
        assert_eq!(format_amount(1_500_000_000), "1.5");
        assert_eq!(format_amount(0), "0");
        assert_eq!(format_amount(20), "0.00000002");
        // 1000 tokens at 0.02 per million: 0.00002 = 20,000 billionths.
        assert_eq!(cost_nanos(1000, 0.02), 20_000);
    }
}
