//! What a job's event log says about its training: the metrics event of
//! each step (written by the worker), read back to know which steps are
//! already logged (a resumed job does not log them again) and to write the
//! metrics CSV at the end.

use std::collections::BTreeMap;

use hearth_store::{Store, StoreError};
use serde_json::{json, Value};

use crate::StepReport;

/// The event message of a step.
pub(crate) fn step_message(r: &StepReport, total: usize) -> String {
    let mut m = format!("Step {}/{total}: training loss={:.4}", r.step, r.train_loss);
    if let Some(v) = r.valid_loss {
        m.push_str(&format!(", validation loss={v:.4}"));
    }
    m
}

/// The event data of a step (also a checkpoint's metrics).
pub(crate) fn step_data(r: &StepReport) -> Value {
    json!({
        "step": r.step,
        "epoch": r.epoch,
        "train_loss": r.train_loss,
        "valid_loss": r.valid_loss,
        "learning_rate": r.learning_rate,
        "tokens_per_second": r.tokens_per_second,
    })
}

/// How the event announcing the first start of training begins.
pub(crate) const STARTED: &str = "Training started";

/// What a job's log holds so far.
#[derive(Default)]
pub(crate) struct Logged {
    /// The data of the metrics events by step (a step logged twice keeps
    /// its latest values).
    pub steps: BTreeMap<i64, Value>,
    /// Whether training was announced as started.
    pub started: bool,
}

impl Logged {
    /// The last step logged (0 for none).
    pub fn last_step(&self) -> i64 {
        self.steps.keys().next_back().copied().unwrap_or(0)
    }
}

/// Reads the job's log.
pub(crate) async fn logged(store: &Store, job_id: &str) -> Result<Logged, StoreError> {
    let mut logged = Logged::default();
    let rows = &mut logged.steps;
    let mut after: Option<String> = None;
    loop {
        let (page, more) = store.list_ft_events(job_id, 1000, after.as_deref()).await?;
        for e in &page {
            logged.started |= e.kind == "message" && e.message.starts_with(STARTED);
            if e.kind == "metrics" {
                if let Some(d) = &e.data {
                    let step = d["step"].as_i64().unwrap_or(0);
                    // Pages run newest first: the first value seen is the latest.
                    rows.entry(step).or_insert_with(|| d.clone());
                }
            }
        }
        match (more, page.last()) {
            (true, Some(last)) => after = Some(last.id.clone()),
            _ => return Ok(logged),
        }
    }
}

/// The training curve as CSV.
pub(crate) fn metrics_csv(rows: &BTreeMap<i64, Value>) -> String {
    let mut csv = String::from("step,train_loss,valid_loss,learning_rate,tokens_per_second\n");
    let num = |v: &Value| v.as_f64().map(|x| x.to_string()).unwrap_or_default();
    for (step, d) in rows {
        csv.push_str(&format!(
            "{step},{},{},{},{}\n",
            num(&d["train_loss"]),
            num(&d["valid_loss"]),
            num(&d["learning_rate"]),
            num(&d["tokens_per_second"])
        ));
    }
    csv
}
