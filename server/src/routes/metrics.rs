//! `GET /metrics`: the engines' counters in the Prometheus text format, one
//! series per chat model; it takes an API key unless `--metrics-public`.

use std::fmt::Write;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use hearth_engine::image::ImageSnapshot;
use hearth_engine::EngineSnapshot;

use crate::state::AppState;

/// (name, type, help, value of a snapshot)
type Series<T = EngineSnapshot> = (&'static str, &'static str, &'static str, fn(&T) -> f64);

/// Writes each series of `series` with one line per model of `rows`.
fn write_series<T>(out: &mut String, series: &[Series<T>], rows: &[(&String, T)]) {
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (id, snap) in rows {
            let _ = writeln!(out, "{name}{{model=\"{id}\"}} {}", value(snap));
        }
    }
}

const SERIES: [Series; 10] = [
    (
        "hearth_requests_running",
        "gauge",
        "Sequences being generated.",
        |s| s.active as f64,
    ),
    (
        "hearth_requests_waiting",
        "gauge",
        "Requests queued for admission.",
        |s| s.waiting as f64,
    ),
    (
        "hearth_kv_cache_blocks_used",
        "gauge",
        "KV cache blocks held by sequences.",
        |s| s.blocks_in_use as f64,
    ),
    (
        "hearth_kv_cache_blocks_total",
        "gauge",
        "KV cache blocks in the pool (16 tokens each).",
        |s| s.blocks_total as f64,
    ),
    (
        "hearth_kv_cache_usage_ratio",
        "gauge",
        "Fraction of KV cache blocks in use.",
        |s| s.blocks_in_use as f64 / s.blocks_total.max(1) as f64,
    ),
    (
        "hearth_preemptions_total",
        "counter",
        "Sequences preempted and requeued for recompute.",
        |s| s.preemptions as f64,
    ),
    (
        "hearth_prefix_cache_hit_blocks_total",
        "counter",
        "Prompt blocks served from the prefix cache.",
        |s| s.prefix_hit_blocks as f64,
    ),
    (
        "hearth_prompt_tokens_total",
        "counter",
        "Prompt tokens run through the model (recompute included).",
        |s| s.prompt_tokens as f64,
    ),
    (
        "hearth_generation_tokens_total",
        "counter",
        "Tokens generated.",
        |s| s.generated_tokens as f64,
    ),
    (
        "hearth_engine_steps_total",
        "counter",
        "Batched forward steps run.",
        |s| s.steps as f64,
    ),
];

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let snapshots: Vec<(&String, EngineSnapshot)> = state
        .chat
        .iter()
        .map(|(id, m)| (id, m.engine.snapshot()))
        .collect();
    let mut out = String::new();
    write_series(&mut out, &SERIES, &snapshots);
    image_series(&state, &mut out);
    batch_series(&state, &mut out).await;
    endpoint_series(&state, &mut out).await;
    usage_series(&state, &mut out);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}

/// Each image model's queue, progress and totals.
fn image_series(state: &AppState, out: &mut String) {
    if state.images.is_empty() {
        return;
    }
    let snaps: Vec<_> = state
        .images
        .iter()
        .map(|(id, m)| (id, m.snapshot()))
        .collect();
    write_series(out, &IMAGE_SERIES, &snaps);
}

const IMAGE_SERIES: [Series<ImageSnapshot>; 7] = [
    (
        "hearth_image_requests_running",
        "gauge",
        "Image requests being generated.",
        |s| s.running as f64,
    ),
    (
        "hearth_image_requests_waiting",
        "gauge",
        "Image requests queued.",
        |s| s.waiting as f64,
    ),
    (
        "hearth_image_steps_done",
        "gauge",
        "Denoising steps done of the running request.",
        |s| s.progress.0 as f64,
    ),
    (
        "hearth_image_steps_planned",
        "gauge",
        "Denoising steps of the running request in all.",
        |s| s.progress.1 as f64,
    ),
    (
        "hearth_image_steps_total",
        "counter",
        "Denoising steps run.",
        |s| s.steps_total as f64,
    ),
    (
        "hearth_images_generated_total",
        "counter",
        "Images generated.",
        |s| s.images_total as f64,
    ),
    (
        "hearth_image_requests_cancelled_total",
        "counter",
        "Image requests whose client left before they finished.",
        |s| s.cancelled_total as f64,
    ),
];

/// Batches by status (of the whole store: every node's) and the batch
/// requests this node ran.
async fn batch_series(state: &AppState, out: &mut String) {
    match state.store.batch_counts_by_status().await {
        Ok(counts) => {
            let _ = writeln!(
                out,
                "# HELP hearth_batches Batches in the store, by status.\n# TYPE hearth_batches gauge"
            );
            for status in hearth_store::BatchStatus::ALL {
                let n = counts
                    .iter()
                    .find(|(s, _)| *s == status)
                    .map_or(0, |(_, n)| *n);
                let _ = writeln!(out, "hearth_batches{{status=\"{status}\"}} {n}");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot count batches for /metrics"),
    }
    let (completed, failed) = state.batch_counters.get();
    let _ = writeln!(
        out,
        "# HELP hearth_batch_requests_total Batch requests run on this node, by outcome.\n\
         # TYPE hearth_batch_requests_total counter\n\
         hearth_batch_requests_total{{outcome=\"completed\"}} {completed}\n\
         hearth_batch_requests_total{{outcome=\"failed\"}} {failed}"
    );
}

/// Dedicated endpoints by status (the whole store's), and this node's
/// replicas of each: how many serve, and their engines' counters summed.
async fn endpoint_series(state: &AppState, out: &mut String) {
    match state.store.endpoint_counts_by_status().await {
        Ok(counts) => {
            let _ = writeln!(
                out,
                "# HELP hearth_dedicated_endpoints Dedicated endpoints in the store, by status.\n\
                 # TYPE hearth_dedicated_endpoints gauge"
            );
            for (status, n) in counts {
                let _ = writeln!(out, "hearth_dedicated_endpoints{{status=\"{status}\"}} {n}");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot count dedicated endpoints for /metrics"),
    }
    let live = state.endpoints.all();
    let _ = writeln!(
        out,
        "# HELP hearth_endpoint_replicas Replicas of a dedicated endpoint serving on this node.\n\
         # TYPE hearth_endpoint_replicas gauge"
    );
    let mut sums = Vec::new();
    for l in &live {
        let replicas = l.replicas();
        let _ = writeln!(
            out,
            "hearth_endpoint_replicas{{endpoint=\"{}\",routing_key=\"{}\"}} {}",
            l.id,
            l.routing_key,
            replicas.len()
        );
        let mut sum = EngineSnapshot::default();
        for s in replicas.iter().filter_map(|r| r.snapshot()) {
            sum.active += s.active;
            sum.waiting += s.waiting;
            sum.blocks_in_use += s.blocks_in_use;
            sum.blocks_total += s.blocks_total;
            sum.preemptions += s.preemptions;
            sum.prefix_hit_blocks += s.prefix_hit_blocks;
            sum.prompt_tokens += s.prompt_tokens;
            sum.generated_tokens += s.generated_tokens;
            sum.steps += s.steps;
        }
        sums.push((l.id.clone(), sum));
    }
    for (name, kind, help, value) in SERIES {
        let name = name.replacen("hearth_", "hearth_endpoint_", 1);
        let _ = writeln!(
            out,
            "# HELP {name} {help} (a dedicated endpoint's replicas)\n# TYPE {name} {kind}"
        );
        for (id, snap) in &sums {
            let _ = writeln!(out, "{name}{{endpoint=\"{id}\"}} {}", value(snap));
        }
    }
}

/// What this node metered since it started, per model and class.
fn usage_series(state: &AppState, out: &mut String) {
    let totals = state.usage.totals();
    type Pick = fn(&hearth_store::usage::UsageCounts) -> i64;
    let series: [(&str, &str, Pick); 5] = [
        ("hearth_usage_requests_total", "Requests metered.", |c| {
            c.requests
        }),
        (
            "hearth_usage_input_tokens_total",
            "Prompt tokens metered.",
            |c| c.input_tokens,
        ),
        (
            "hearth_usage_output_tokens_total",
            "Output tokens metered.",
            |c| c.output_tokens,
        ),
        (
            "hearth_usage_cached_tokens_total",
            "Prompt tokens served from the prefix cache.",
            |c| c.cached_tokens,
        ),
        (
            "hearth_usage_cost_nanos_total",
            "Cost at the catalogue's prices, in billionths of the currency unit.",
            |c| c.cost_nanos,
        ),
    ];
    for (name, help, pick) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for ((model, class), counts) in &totals {
            let model = model.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(
                out,
                "{name}{{model=\"{model}\",class=\"{class}\"}} {}",
                pick(counts)
            );
        }
    }
}
