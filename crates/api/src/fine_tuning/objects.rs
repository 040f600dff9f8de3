//! The wire objects of `/v1/fine_tuning`: jobs, events, checkpoints, their
//! lists and list query, and the spec-draft trainable model list.

use super::*;

/// `method` of a job object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobMethod {
    #[serde(rename = "type")]
    pub kind: String,
    pub supervised: SupervisedMethod,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SupervisedMethod {
    #[schema(value_type = Hyperparameters)]
    pub hyperparameters: Value,
}

/// A fine-tuning job, as OpenAI returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FineTuningJob {
    pub id: String,
    /// `fine_tuning.job`.
    pub object: String,
    pub model: String,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    /// `validating_files`, `queued`, `running`, `succeeded`, `failed` or `cancelled`.
    pub status: String,
    /// Set once the job succeeded.
    pub fine_tuned_model: Option<String>,
    /// The project's id.
    pub organization_id: String,
    pub training_file: String,
    pub validation_file: Option<String>,
    /// The resolved [`Hyperparameters`].
    #[schema(value_type = Hyperparameters)]
    pub hyperparameters: Value,
    pub method: JobMethod,
    pub seed: i64,
    pub trained_tokens: Option<i64>,
    pub trained_steps: i64,
    pub total_steps: Option<i64>,
    /// On success: the metrics CSV (`step_metrics.csv`), then the final
    /// adapter's `adapter_model.safetensors` and `adapter_config.json`
    /// (purpose `fine-tune-results`).
    pub result_files: Vec<String>,
    /// `{code, message, param}` when the job failed.
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub suffix: Option<String>,
    pub estimated_finish: Option<i64>,
    pub integrations: Vec<Value>,
    /// The string pairs given at creation, if any.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
}

/// One event of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FineTuningEvent {
    pub id: String,
    /// `fine_tuning.job.event`.
    pub object: String,
    pub created_at: i64,
    pub level: String,
    /// `message` or `metrics`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    #[schema(value_type = Option<Object>)]
    pub data: Option<Value>,
}

/// One checkpoint of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FineTuningCheckpoint {
    pub id: String,
    /// `fine_tuning.job.checkpoint`.
    pub object: String,
    pub created_at: i64,
    pub fine_tuning_job_id: String,
    pub step_number: i64,
    pub fine_tuned_model_checkpoint: String,
    #[schema(value_type = Object)]
    pub metrics: Value,
    /// The checkpoint's adapter as files of the job's project (purpose
    /// `fine-tune-results`): `adapter_model.safetensors` and
    /// `adapter_config.json`, in PEFT's format (Hearth's addition; left
    /// out for checkpoints that published none, e.g. saved before adapters
    /// were published).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub result_files: Vec<String>,
}

/// A page of jobs, events or checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FineTuningList<T> {
    /// `list`.
    pub object: String,
    pub data: Vec<T>,
    pub has_more: bool,
}

impl<T> FineTuningList<T> {
    pub fn new(data: Vec<T>, has_more: bool) -> Self {
        Self {
            object: OBJECT_LIST.to_string(),
            data,
            has_more,
        }
    }
}

/// Largest `limit` of the fine-tuning lists.
pub const MAX_LIST_LIMIT: i64 = 1000;
/// Default `limit` of the job and event lists (OpenAI's).
pub const DEFAULT_LIST_LIMIT: i64 = 20;
/// Default `limit` of the checkpoint list (OpenAI's).
pub const DEFAULT_CHECKPOINT_LIMIT: i64 = 10;

/// Query of the job, event and checkpoint lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FineTuningListQuery {
    /// Items per page (1 to 1000, else 422); default 20 (checkpoints: 10).
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// An id: the page starts after it.
    #[serde(default)]
    pub after: Option<String>,
    /// The project (see [`crate::ProjectQuery`]).
    #[serde(default)]
    #[param(pattern = r"^(project-[0-9A-HJKMNP-TV-Z]{26})?$")]
    pub ai_project_id: Option<String>,
}

impl FineTuningListQuery {
    /// The checked `limit` (`default` when absent); outside 1..=1000 is 422
    /// shape C as pydantic words it.
    pub fn limit(&self, default: i64) -> Result<i64, ApiError> {
        crate::common::list_limit(self.limit, default, MAX_LIST_LIMIT)
    }

    /// `after`, an empty value read as absent.
    pub fn after(&self) -> Option<&str> {
        self.after.as_deref().filter(|a| !a.is_empty())
    }
}

/// The job list's metadata filter: every `metadata[<key>]=<value>` pair of
/// the query `query` (OpenAI's `metadata` list parameter), in order. A job
/// is listed when its metadata holds every pair. A parameter named
/// `metadata` that is not of that form (`metadata=x`, `metadata[]=x`,
/// `metadata[a][b]=x`), a key given twice, more than 16 pairs, or a key
/// or value longer than metadata may hold is 400 shape B naming
/// `metadata`.
pub fn metadata_filter(query: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    use crate::batches::{MAX_METADATA_KEY, MAX_METADATA_PAIRS, MAX_METADATA_VALUE};
    let bad = |message: String| ApiError::bad_request(Some("metadata"), message);
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if name != "metadata" && !name.starts_with("metadata[") {
            continue;
        }
        let key = name
            .strip_prefix("metadata[")
            .and_then(|rest| rest.strip_suffix(']'))
            .filter(|key| !key.is_empty() && !key.contains(['[', ']']))
            .ok_or_else(|| {
                bad(format!(
                    "`{name}` is not a metadata filter; filter with `metadata[<key>]=<value>`."
                ))
            })?;
        if key.chars().count() > MAX_METADATA_KEY {
            return Err(bad(format!(
                "the `metadata` key `{key}` is longer than {MAX_METADATA_KEY} characters."
            )));
        }
        if value.chars().count() > MAX_METADATA_VALUE {
            return Err(bad(format!(
                "the `metadata` value of `{key}` is longer than {MAX_METADATA_VALUE} characters."
            )));
        }
        if pairs.iter().any(|(k, _)| k == key) {
            return Err(bad(format!("the `metadata` key `{key}` is given twice.")));
        }
        pairs.push((key.to_string(), value.into_owned()));
    }
    if pairs.len() > MAX_METADATA_PAIRS {
        return Err(bad(format!(
            "the filter holds {} `metadata` pairs; at most {MAX_METADATA_PAIRS} are allowed.",
            pairs.len()
        )));
    }
    Ok(pairs)
}

/// Billing price bucket of a trainable model, by its parameter count:
/// `small` up to 1B, `medium` up to 14B, `large` above, and `large` when
/// the count is unknown (never under-priced).
pub fn price_bucket(parameters: Option<f64>) -> &'static str {
    match parameters {
        Some(p) if p <= 1.0e9 => "small",
        Some(p) if p <= 14.0e9 => "medium",
        _ => "large",
    }
}

/// The parameter count a model name or description states, like `135M`,
/// `1.7B`, `7b` or `8x7B` (experts multiplied): the first such token.
pub fn parameter_count(text: &str) -> Option<f64> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let boundary = i == 0 || (!bytes[i - 1].is_ascii_alphanumeric() && bytes[i - 1] != b'.');
        if boundary && bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                i += 1;
            }
            let mut number: Option<f64> = text[start..i].parse().ok();
            // `8x7B`: experts times size.
            if i < bytes.len() && bytes[i] == b'x' {
                let s2 = i + 1;
                let mut j = s2;
                while j < bytes.len() && (bytes[j].is_ascii_digit() || bytes[j] == b'.') {
                    j += 1;
                }
                if j > s2 {
                    if let (Some(a), Ok(b)) = (number, text[s2..j].parse::<f64>()) {
                        number = Some(a * b);
                        i = j;
                    }
                }
            }
            let unit = bytes.get(i).map(|b| b.to_ascii_uppercase());
            let after_unit_ok = bytes.get(i + 1).is_none_or(|b| !b.is_ascii_alphabetic());
            let scale = match unit {
                Some(b'M') if after_unit_ok => Some(1.0e6),
                Some(b'B') if after_unit_ok => Some(1.0e9),
                Some(b'T') if after_unit_ok => Some(1.0e12),
                _ => None,
            };
            if let (Some(n), Some(scale)) = (number, scale) {
                return Some(n * scale);
            }
        } else {
            i += 1;
        }
    }
    None
}

/// `pricing` of a trainable model: the catalogue's prices per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TrainablePricing {
    pub input_per_million: f64,
    pub output_per_million: f64,
}

/// One model of the spec-draft list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TrainableModel {
    /// The catalogue id (the `model` of a job).
    pub id: String,
    /// `model`.
    pub object: String,
    pub owned_by: String,
    pub context_length: u64,
    /// `small`, `medium` or `large` (see [`price_bucket`]).
    pub price_bucket: String,
    pub pricing: TrainablePricing,
    /// Each hyperparameter's type, default and range
    /// ([`hyperparameter_spec`]).
    #[schema(value_type = Object)]
    pub hyperparameters: Value,
}

impl TrainableModel {
    pub fn new(
        id: impl Into<String>,
        owned_by: impl Into<String>,
        context_length: u32,
        price_bucket: &str,
        pricing: TrainablePricing,
    ) -> Self {
        Self {
            id: id.into(),
            object: OBJECT_MODEL.to_string(),
            owned_by: owned_by.into(),
            context_length: u64::from(context_length),
            price_bucket: price_bucket.to_string(),
            pricing,
            hyperparameters: hyperparameter_spec(context_length),
        }
    }
}

/// `GET /v1/fine_tuning/models/spec-draft`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TrainableModelList {
    /// `list`.
    pub object: String,
    pub data: Vec<TrainableModel>,
}

impl TrainableModelList {
    pub fn new(data: Vec<TrainableModel>) -> Self {
        Self {
            object: OBJECT_LIST.to_string(),
            data,
        }
    }
}

/// Type, default and range of each hyperparameter for a model of
/// `model_context_length` tokens (`exclusive_min`/`exclusive_max` mark open
/// bounds).
pub fn hyperparameter_spec(model_context_length: u32) -> Value {
    let d = Hyperparameters::default();
    let max_context = model_context_length.max(MIN_CONTEXT_LENGTH);
    json!({
        "n_epochs": {"type": "integer", "default": d.n_epochs, "min": N_EPOCHS_RANGE.0, "max": N_EPOCHS_RANGE.1},
        "batch_size": {"type": "integer", "default": d.batch_size, "min": BATCH_SIZE_RANGE.0, "max": BATCH_SIZE_RANGE.1},
        "learning_rate": {"type": "number", "default": d.learning_rate, "min": 0.0, "exclusive_min": true, "max": 1.0},
        "warmup_ratio": {"type": "number", "default": d.warmup_ratio, "min": 0.0, "max": 1.0},
        "weight_decay": {"type": "number", "default": d.weight_decay, "min": 0.0, "max": 1.0},
        "max_grad_norm": {"type": "number", "default": d.max_grad_norm, "min": 0.0},
        "packing": {"type": "boolean", "default": d.packing},
        "context_length": {"type": "integer", "default": d.context_length.min(max_context), "min": MIN_CONTEXT_LENGTH, "max": max_context},
        "lora": {"type": "boolean", "default": true, "allowed": [true]},
        "lora_r": {"type": "integer", "default": d.lora_r, "min": LORA_R_RANGE.0, "max": LORA_R_RANGE.1},
        "lora_alpha": {"type": "integer", "default": d.lora_alpha, "min": LORA_ALPHA_RANGE.0, "max": LORA_ALPHA_RANGE.1},
        "lora_dropout": {"type": "number", "default": d.lora_dropout, "min": 0.0, "max": 1.0, "exclusive_max": true},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_are_read_from_the_query() {
        let pairs =
            metadata_filter(Some("limit=2&metadata%5Bwho%5D=qa2&metadata[team]=a%20b")).unwrap();
        assert_eq!(
            pairs,
            vec![
                ("who".to_string(), "qa2".to_string()),
                ("team".to_string(), "a b".to_string())
            ]
        );
        assert!(metadata_filter(None).unwrap().is_empty());
        assert!(metadata_filter(Some("after=x&metadatax=1"))
            .unwrap()
            .is_empty());
        let long_key = format!("metadata[{}]=v", "k".repeat(65));
        let many = (0..17)
            .map(|i| format!("metadata[k{i}]=v"))
            .collect::<Vec<_>>()
            .join("&");
        for bad in [
            "metadata=x",
            "metadata[]=x",
            "metadata[a][b]=x",
            "metadata[a=x",
            "metadata[a]=1&metadata[a]=2",
            long_key.as_str(),
            many.as_str(),
        ] {
            let err = metadata_filter(Some(bad)).unwrap_err();
            assert_eq!(
                (err.status(), err.param()),
                (400, Some("metadata")),
                "{bad}"
            );
        }
    }
}
