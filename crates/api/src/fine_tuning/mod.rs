//! `/v1/fine_tuning` wire types: the job-creation body and its validation
//! into resolved [`Hyperparameters`], the job, event and checkpoint objects,
//! their lists and list query, and the spec-draft trainable model list.
//!
//! The creation body is OpenAI's (`model`, `training_file`,
//! `validation_file`, `suffix`, `seed`, `hyperparameters` or
//! `method: {type: "supervised", supervised: {hyperparameters}}`) with
//! Nebius's LoRA hyperparameters. Values of the wrong JSON type are 422
//! shape C (from the parser); values out of range are 400 shape B naming
//! `hyperparameters.<name>`. `"auto"` (OpenAI) is accepted for `n_epochs`,
//! `batch_size` and `learning_rate_multiplier` and means the default.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

use crate::common::{OBJECT_LIST, OBJECT_MODEL};
use crate::error::ApiError;

/// `object` of a job.
pub const OBJECT_JOB: &str = "fine_tuning.job";
/// `object` of a job event.
pub const OBJECT_EVENT: &str = "fine_tuning.job.event";
/// `object` of a job checkpoint.
pub const OBJECT_CHECKPOINT: &str = "fine_tuning.job.checkpoint";
/// The only training method.
pub const METHOD_SUPERVISED: &str = "supervised";
/// Purpose a training or validation file must have.
pub const PURPOSE_FINE_TUNE: &str = "fine-tune";
/// Purpose of the files a job writes (its metrics CSV).
pub const PURPOSE_RESULTS: &str = "fine-tune-results";
/// Longest `suffix`.
pub const MAX_SUFFIX_CHARS: usize = 64;

/// Defaults of the hyperparameters.
pub const DEFAULT_N_EPOCHS: u32 = 3;
pub const DEFAULT_BATCH_SIZE: u32 = 8;
pub const DEFAULT_LEARNING_RATE: f64 = 1e-4;
pub const DEFAULT_WARMUP_RATIO: f64 = 0.0;
pub const DEFAULT_WEIGHT_DECAY: f64 = 0.0;
pub const DEFAULT_MAX_GRAD_NORM: f64 = 1.0;
pub const DEFAULT_PACKING: bool = true;
pub const DEFAULT_CONTEXT_LENGTH: u32 = 1024;
pub const DEFAULT_LORA_R: u32 = 8;
pub const DEFAULT_LORA_ALPHA: u32 = 16;
pub const DEFAULT_LORA_DROPOUT: f64 = 0.0;

/// Ranges (inclusive unless said otherwise).
pub const N_EPOCHS_RANGE: (u32, u32) = (1, 100);
pub const BATCH_SIZE_RANGE: (u32, u32) = (1, 256);
pub const MIN_CONTEXT_LENGTH: u32 = 8;
pub const LORA_R_RANGE: (u32, u32) = (1, 256);
pub const LORA_ALPHA_RANGE: (u32, u32) = (1, 1024);

/// A value, or OpenAI's `"auto"` (= the default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AutoOr<T> {
    Auto,
    Value(T),
}

impl<T> AutoOr<T> {
    fn value(self) -> Option<T> {
        match self {
            AutoOr::Auto => None,
            AutoOr::Value(v) => Some(v),
        }
    }
}

impl<T: Serialize> Serialize for AutoOr<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AutoOr::Auto => s.serialize_str("auto"),
            AutoOr::Value(v) => v.serialize(s),
        }
    }
}

/// Numbers `AutoOr` can hold.
pub trait AutoNumber: Sized {
    const EXPECTED: &'static str;
    fn from_i64(v: i64) -> Option<Self>;
    fn from_u64(v: u64) -> Option<Self>;
    fn from_f64(v: f64) -> Option<Self>;
}

impl AutoNumber for i64 {
    const EXPECTED: &'static str = "an integer or \"auto\"";
    fn from_i64(v: i64) -> Option<Self> {
        Some(v)
    }
    fn from_u64(v: u64) -> Option<Self> {
        i64::try_from(v).ok()
    }
    fn from_f64(_: f64) -> Option<Self> {
        None
    }
}

impl AutoNumber for f64 {
    const EXPECTED: &'static str = "a number or \"auto\"";
    fn from_i64(v: i64) -> Option<Self> {
        Some(v as f64)
    }
    fn from_u64(v: u64) -> Option<Self> {
        Some(v as f64)
    }
    fn from_f64(v: f64) -> Option<Self> {
        Some(v)
    }
}

impl<'de, T: AutoNumber> Deserialize<'de> for AutoOr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<T: AutoNumber> Visitor<'_> for V<T> {
            type Value = AutoOr<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(T::EXPECTED)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                if v == "auto" {
                    Ok(AutoOr::Auto)
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(v), &self))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                T::from_i64(v)
                    .map(AutoOr::Value)
                    .ok_or_else(|| E::invalid_type(de::Unexpected::Signed(v), &self))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                T::from_u64(v)
                    .map(AutoOr::Value)
                    .ok_or_else(|| E::invalid_type(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                T::from_f64(v)
                    .map(AutoOr::Value)
                    .ok_or_else(|| E::invalid_type(de::Unexpected::Float(v), &self))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Hyperparameters as a client sends them: every field optional.
/// Integers are read as `i64` so that a negative value is a range error
/// (400), not a type error (422). A name not listed here is a 422 naming
/// it (a misspelt `lora_rank` would otherwise train with the default
/// rank without a word).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HyperparametersInput {
    #[serde(default)]
    #[schema(schema_with = crate::schemas::auto_integer)]
    pub n_epochs: Option<AutoOr<i64>>,
    #[serde(default)]
    #[schema(schema_with = crate::schemas::auto_integer)]
    pub batch_size: Option<AutoOr<i64>>,
    #[serde(default)]
    pub learning_rate: Option<f64>,
    /// OpenAI's: the learning rate is this times the default.
    #[serde(default)]
    #[schema(schema_with = crate::schemas::auto_number)]
    pub learning_rate_multiplier: Option<AutoOr<f64>>,
    #[serde(default)]
    pub warmup_ratio: Option<f64>,
    #[serde(default)]
    pub weight_decay: Option<f64>,
    #[serde(default)]
    pub max_grad_norm: Option<f64>,
    #[serde(default)]
    pub packing: Option<bool>,
    #[serde(default)]
    pub context_length: Option<i64>,
    #[serde(default)]
    pub lora: Option<bool>,
    #[serde(default)]
    pub lora_r: Option<i64>,
    #[serde(default)]
    pub lora_alpha: Option<i64>,
    #[serde(default)]
    pub lora_dropout: Option<f64>,
}

/// `method.supervised`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SupervisedInput {
    #[serde(default)]
    pub hyperparameters: Option<HyperparametersInput>,
}

/// `method`: `{type: "supervised", supervised: {hyperparameters}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MethodInput {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub supervised: Option<SupervisedInput>,
}

/// Body of `POST /v1/fine_tuning/jobs`. Unknown top-level fields
/// (`integrations`, ...) are accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FineTuneRequest {
    pub model: String,
    pub training_file: String,
    #[serde(default)]
    pub validation_file: Option<String>,
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub hyperparameters: Option<HyperparametersInput>,
    #[serde(default)]
    pub method: Option<MethodInput>,
    /// Up to 16 string pairs kept with the job and shown on it (keys up to
    /// 64 characters, values up to 512).
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// The resolved hyperparameters of a job (every default filled): what is
/// stored with the job, shown in the job object, and read by the trainer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Hyperparameters {
    pub n_epochs: u32,
    pub batch_size: u32,
    pub learning_rate: f64,
    /// OpenAI's: `learning_rate` over the default learning rate, as given,
    /// or what a given `learning_rate` (or the default: 1) amounts to.
    /// (Jobs stored before it was kept read as 1; the job object shows
    /// theirs from `learning_rate`, see [`with_multiplier`].)
    #[serde(default = "default_multiplier")]
    pub learning_rate_multiplier: f64,
    pub warmup_ratio: f64,
    pub weight_decay: f64,
    /// 0 means no clipping.
    pub max_grad_norm: f64,
    pub packing: bool,
    pub context_length: u32,
    /// Always true: only LoRA fine-tuning is supported.
    pub lora: bool,
    pub lora_r: u32,
    pub lora_alpha: u32,
    pub lora_dropout: f64,
}

impl Default for Hyperparameters {
    fn default() -> Self {
        Self {
            n_epochs: DEFAULT_N_EPOCHS,
            batch_size: DEFAULT_BATCH_SIZE,
            learning_rate: DEFAULT_LEARNING_RATE,
            learning_rate_multiplier: 1.0,
            warmup_ratio: DEFAULT_WARMUP_RATIO,
            weight_decay: DEFAULT_WEIGHT_DECAY,
            max_grad_norm: DEFAULT_MAX_GRAD_NORM,
            packing: DEFAULT_PACKING,
            context_length: DEFAULT_CONTEXT_LENGTH,
            lora: true,
            lora_r: DEFAULT_LORA_R,
            lora_alpha: DEFAULT_LORA_ALPHA,
            lora_dropout: DEFAULT_LORA_DROPOUT,
        }
    }
}

fn default_multiplier() -> f64 {
    1.0
}

/// Stored resolved hyperparameters with `learning_rate_multiplier` filled
/// from `learning_rate` when they lack it (jobs created before it was
/// kept), for the job object.
pub fn with_multiplier(mut hyperparameters: Value) -> Value {
    if let Some(hp) = hyperparameters.as_object_mut() {
        if !hp.contains_key("learning_rate_multiplier") {
            if let Some(lr) = hp.get("learning_rate").and_then(Value::as_f64) {
                hp.insert(
                    "learning_rate_multiplier".to_string(),
                    json!(lr / DEFAULT_LEARNING_RATE),
                );
            }
        }
    }
    hyperparameters
}

/// A creation request that passed every check that needs no store.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidFineTuneRequest {
    pub model: String,
    pub training_file: String,
    pub validation_file: Option<String>,
    pub suffix: Option<String>,
    pub seed: i64,
    pub hyperparameters: Hyperparameters,
    /// `supervised`.
    pub method: String,
    pub metadata: Option<BTreeMap<String, String>>,
}

fn bad(name: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(Some(&format!("hyperparameters.{name}")), message)
}

fn int_in(
    name: &str,
    value: Option<i64>,
    default: u32,
    (lo, hi): (u32, u32),
) -> Result<u32, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if (i64::from(lo)..=i64::from(hi)).contains(&v) => Ok(v as u32),
        Some(v) => Err(bad(
            name,
            format!("`{name}` must be between {lo} and {hi}, got {v}."),
        )),
    }
}

/// A float checked by `ok`, or the default; `rule` words the range.
fn float_in(
    name: &str,
    value: Option<f64>,
    default: f64,
    ok: impl Fn(f64) -> bool,
    rule: &str,
) -> Result<f64, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if v.is_finite() && ok(v) => Ok(v),
        Some(v) => Err(bad(name, format!("`{name}` must be {rule}, got {v}."))),
    }
}

/// Whether `suffix` is at most 64 letters, digits, `-`, `_` and `.`.
pub fn check_suffix(suffix: &str) -> Result<(), ApiError> {
    if suffix.chars().count() > MAX_SUFFIX_CHARS {
        return Err(ApiError::bad_request(
            Some("suffix"),
            format!("`suffix` must be at most {MAX_SUFFIX_CHARS} characters long."),
        ));
    }
    if let Some(c) = suffix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(ApiError::bad_request(
            Some("suffix"),
            format!("`suffix` may hold only letters, digits, `-`, `_` and `.`; found {c:?}."),
        ));
    }
    Ok(())
}

impl HyperparametersInput {
    /// The resolved values: defaults filled, ranges checked (400 shape B,
    /// `param` = `hyperparameters.<name>`). `model_context_length` bounds
    /// `context_length`.
    pub fn resolve(&self, model_context_length: u32) -> Result<Hyperparameters, ApiError> {
        let d = Hyperparameters::default();
        if self.lora == Some(false) {
            return Err(bad("lora", "only LoRA fine-tuning is supported"));
        }
        let n_epochs = int_in(
            "n_epochs",
            self.n_epochs.and_then(AutoOr::value),
            d.n_epochs,
            N_EPOCHS_RANGE,
        )?;
        let batch_size = int_in(
            "batch_size",
            self.batch_size.and_then(AutoOr::value),
            d.batch_size,
            BATCH_SIZE_RANGE,
        )?;
        let multiplier = self.learning_rate_multiplier.and_then(AutoOr::value);
        let (learning_rate, learning_rate_multiplier) = match (self.learning_rate, multiplier) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "learning_rate_multiplier",
                    "give `learning_rate` or `learning_rate_multiplier`, not both.",
                ))
            }
            (None, Some(m)) => {
                let max = 1.0 / DEFAULT_LEARNING_RATE;
                if !(m.is_finite() && m > 0.0 && m <= max) {
                    return Err(bad(
                        "learning_rate_multiplier",
                        format!(
                            "`learning_rate_multiplier` must be above 0 and at most {max}, got {m}."
                        ),
                    ));
                }
                (m * DEFAULT_LEARNING_RATE, m)
            }
            (None, None) => (d.learning_rate, d.learning_rate_multiplier),
            (lr, None) => {
                let lr = float_in(
                    "learning_rate",
                    lr,
                    d.learning_rate,
                    |v| v > 0.0 && v <= 1.0,
                    "above 0 and at most 1",
                )?;
                (lr, lr / DEFAULT_LEARNING_RATE)
            }
        };
        let warmup_ratio = float_in(
            "warmup_ratio",
            self.warmup_ratio,
            d.warmup_ratio,
            |v| (0.0..=1.0).contains(&v),
            "between 0 and 1",
        )?;
        let weight_decay = float_in(
            "weight_decay",
            self.weight_decay,
            d.weight_decay,
            |v| (0.0..=1.0).contains(&v),
            "between 0 and 1",
        )?;
        let max_grad_norm = float_in(
            "max_grad_norm",
            self.max_grad_norm,
            d.max_grad_norm,
            |v| v >= 0.0,
            "at least 0 (0: no clipping)",
        )?;
        let max_context = model_context_length.max(MIN_CONTEXT_LENGTH);
        let context_length = int_in(
            "context_length",
            self.context_length,
            d.context_length.min(max_context),
            (MIN_CONTEXT_LENGTH, max_context),
        )?;
        let lora_r = int_in("lora_r", self.lora_r, d.lora_r, LORA_R_RANGE)?;
        let lora_alpha = int_in(
            "lora_alpha",
            self.lora_alpha,
            d.lora_alpha,
            LORA_ALPHA_RANGE,
        )?;
        let lora_dropout = float_in(
            "lora_dropout",
            self.lora_dropout,
            d.lora_dropout,
            |v| (0.0..1.0).contains(&v),
            "at least 0 and below 1",
        )?;
        Ok(Hyperparameters {
            n_epochs,
            batch_size,
            learning_rate,
            learning_rate_multiplier,
            warmup_ratio,
            weight_decay,
            max_grad_norm,
            packing: self.packing.unwrap_or(d.packing),
            context_length,
            lora: true,
            lora_r,
            lora_alpha,
            lora_dropout,
        })
    }
}

/// Checks a creation request that needs no store: `method`, where the
/// hyperparameters come from, `suffix`, and every hyperparameter (ranges,
/// `context_length` at most `model_context_length`). `random_seed` is the
/// seed used when the request names none (it is stored with the job).
/// The caller checks the model and the files.
pub fn resolve(
    req: &FineTuneRequest,
    model_context_length: u32,
    random_seed: i64,
) -> Result<ValidFineTuneRequest, ApiError> {
    let method_hp = match &req.method {
        None => None,
        Some(method) if method.kind == METHOD_SUPERVISED => method
            .supervised
            .as_ref()
            .and_then(|s| s.hyperparameters.clone()),
        Some(method) => {
            return Err(ApiError::bad_request(
                Some("method.type"),
                format!(
                    "the method `{}` is not supported; only `supervised` fine-tuning is.",
                    method.kind
                ),
            ))
        }
    };
    let input = match (&req.hyperparameters, method_hp) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                Some("hyperparameters"),
                "give the hyperparameters either at the top level or in \
                 `method.supervised.hyperparameters`, not both.",
            ))
        }
        (Some(hp), None) => hp.clone(),
        (None, Some(hp)) => hp,
        (None, None) => HyperparametersInput::default(),
    };
    let suffix = req.suffix.clone().filter(|s| !s.is_empty());
    if let Some(suffix) = &suffix {
        check_suffix(suffix)?;
    }
    if req.model.is_empty() {
        return Err(ApiError::bad_request(Some("model"), "`model` is empty."));
    }
    if let Some(metadata) = &req.metadata {
        crate::batches::check_metadata(metadata)?;
    }
    Ok(ValidFineTuneRequest {
        model: req.model.clone(),
        training_file: req.training_file.clone(),
        validation_file: req.validation_file.clone().filter(|f| !f.is_empty()),
        suffix,
        seed: req.seed.unwrap_or(random_seed),
        hyperparameters: input.resolve(model_context_length)?,
        method: METHOD_SUPERVISED.to_string(),
        metadata: req.metadata.clone(),
    })
}

mod objects;
pub use objects::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_json_body;

    fn req(body: Value) -> Result<ValidFineTuneRequest, ApiError> {
        let req: FineTuneRequest = parse_json_body(body.to_string().as_bytes())?;
        resolve(&req, 8192, 42)
    }

    #[test]
    fn defaults_are_filled() {
        let v = req(json!({"model": "m", "training_file": "file-1"})).unwrap();
        assert_eq!(v.hyperparameters, Hyperparameters::default());
        assert_eq!(v.seed, 42);
        assert_eq!(v.method, "supervised");
        let v = req(json!({"model": "m", "training_file": "f", "seed": 7,
            "hyperparameters": {"n_epochs": "auto", "batch_size": 4, "learning_rate_multiplier": 2}}))
        .unwrap();
        assert_eq!(v.seed, 7);
        assert_eq!(v.hyperparameters.n_epochs, 3);
        assert_eq!(v.hyperparameters.batch_size, 4);
        assert!((v.hyperparameters.learning_rate - 2e-4).abs() < 1e-12);
        assert_eq!(v.hyperparameters.learning_rate_multiplier, 2.0);
        // "auto" and absent train at the default rate: 1; a given rate
        // shows the multiplier it amounts to.
        let v = req(json!({"model": "m", "training_file": "f",
            "hyperparameters": {"learning_rate_multiplier": "auto"}}))
        .unwrap();
        assert_eq!(v.hyperparameters.learning_rate_multiplier, 1.0);
        let v = req(json!({"model": "m", "training_file": "f",
            "hyperparameters": {"learning_rate": 5e-4}}))
        .unwrap();
        assert!((v.hyperparameters.learning_rate_multiplier - 5.0).abs() < 1e-9);
        // Jobs stored without it show it from their learning rate.
        let old = with_multiplier(json!({"learning_rate": 3e-4}));
        assert!((old["learning_rate_multiplier"].as_f64().unwrap() - 3.0).abs() < 1e-9);
        let kept = with_multiplier(json!({"learning_rate": 2e-4, "learning_rate_multiplier": 2}));
        assert_eq!(kept["learning_rate_multiplier"], 2);
        let v = req(json!({"model": "m", "training_file": "f",
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"lora_r": 16}}}}))
        .unwrap();
        assert_eq!(v.hyperparameters.lora_r, 16);
    }

    #[test]
    fn out_of_range_is_400_naming_the_parameter() {
        let cases = [
            ("n_epochs", json!(0)),
            ("n_epochs", json!(101)),
            ("batch_size", json!(0)),
            ("batch_size", json!(257)),
            ("learning_rate", json!(0)),
            ("learning_rate", json!(1.5)),
            ("learning_rate_multiplier", json!(-1)),
            ("warmup_ratio", json!(1.5)),
            ("weight_decay", json!(-0.1)),
            ("max_grad_norm", json!(-1)),
            ("context_length", json!(4)),
            ("context_length", json!(8193)),
            ("lora", json!(false)),
            ("lora_r", json!(0)),
            ("lora_r", json!(300)),
            ("lora_alpha", json!(0)),
            ("lora_alpha", json!(2000)),
            ("lora_dropout", json!(1.0)),
        ];
        for (name, value) in cases {
            let err =
                req(json!({"model": "m", "training_file": "f", "hyperparameters": {name: value}}))
                    .unwrap_err();
            assert_eq!(err.status(), 400, "{name}={value}");
            assert_eq!(
                err.param(),
                Some(format!("hyperparameters.{name}").as_str())
            );
        }
    }

    #[test]
    fn wrong_types_are_422() {
        for hp in [
            json!({"n_epochs": "many"}),
            json!({"n_epochs": 1.5}),
            json!({"batch_size": true}),
            json!({"learning_rate": "fast"}),
            json!({"packing": "yes"}),
        ] {
            let err = req(json!({"model": "m", "training_file": "f", "hyperparameters": hp}))
                .unwrap_err();
            assert_eq!(err.status(), 422, "{hp}");
        }
        assert_eq!(
            req(json!({"training_file": "f"})).unwrap_err().status(),
            422
        );
        assert_eq!(
            req(json!({"model": "m", "training_file": "f", "seed": "x"}))
                .unwrap_err()
                .status(),
            422
        );
    }

    #[test]
    fn method_and_suffix_rules() {
        let err = req(json!({"model": "m", "training_file": "f", "method": {"type": "dpo"}}))
            .unwrap_err();
        assert_eq!((err.status(), err.param()), (400, Some("method.type")));
        let err = req(
            json!({"model": "m", "training_file": "f", "hyperparameters": {},
            "method": {"type": "supervised", "supervised": {"hyperparameters": {}}}}),
        )
        .unwrap_err();
        assert_eq!((err.status(), err.param()), (400, Some("hyperparameters")));
        let err =
            req(json!({"model": "m", "training_file": "f", "suffix": "x".repeat(65)})).unwrap_err();
        assert_eq!((err.status(), err.param()), (400, Some("suffix")));
        let err = req(json!({"model": "m", "training_file": "f", "suffix": "a b"})).unwrap_err();
        assert_eq!(err.param(), Some("suffix"));
        let ok =
            req(json!({"model": "m", "training_file": "f", "suffix": "my-model_v1.2"})).unwrap();
        assert_eq!(ok.suffix.as_deref(), Some("my-model_v1.2"));
    }

    #[test]
    fn parameter_counts_and_buckets() {
        assert_eq!(
            parameter_count("HuggingFaceTB/SmolLM2-135M-Instruct"),
            Some(135.0e6)
        );
        assert_eq!(parameter_count("Qwen2.5-1.5B-Instruct"), Some(1.5e9));
        assert_eq!(parameter_count("meta-llama/Llama-3.1-8b"), Some(8.0e9));
        assert_eq!(parameter_count("Mixtral-8x7B"), Some(56.0e9));
        assert_eq!(parameter_count("all-MiniLM-L6-v2"), None);
        assert_eq!(price_bucket(Some(135.0e6)), "small");
        assert_eq!(price_bucket(Some(8.0e9)), "medium");
        assert_eq!(price_bucket(Some(70.0e9)), "large");
        assert_eq!(price_bucket(None), "large");
    }

    #[test]
    fn list_limits() {
        let q = FineTuningListQuery::default();
        assert_eq!(q.limit(20).unwrap(), 20);
        let q = FineTuningListQuery {
            limit: Some(0),
            ..Default::default()
        };
        assert_eq!(q.limit(20).unwrap_err().status(), 422);
        let q = FineTuningListQuery {
            limit: Some(1001),
            ..Default::default()
        };
        assert_eq!(q.limit(20).unwrap_err().status(), 422);
    }
}
