//! Wire types of `POST /v1/embeddings` and their validation.
//!
//! - `input`: a string, an array of strings, an array of token ids or an
//!   array of arrays of token ids (the same union as a completion's `prompt`).
//!   Empty strings, an empty array and more than [`MAX_EMBEDDING_INPUTS`]
//!   inputs are 422 (shape C); a bad token id is 400 (shape B).
//! - `encoding_format`: `float` (default) or `base64`: the vector's
//!   little-endian f32 bytes in standard base64, as the OpenAI SDK decodes it.
//! - `dimensions`: keep the first `d` components, then scale to unit length
//!   ([`apply_dimensions`]); more than the model has is 422 (checked by the
//!   server, which knows the model).
//! - `user`: accepted; `truncate` (extension): cut inputs longer than the
//!   model's maximum instead of failing.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

use crate::common::OBJECT_LIST;
use crate::completions::Prompt;
use crate::error::{ApiError, Loc, ValidationItem};
use crate::validate::PromptInput;

/// Most inputs in one embeddings request.
pub const MAX_EMBEDDING_INPUTS: usize = 2048;
/// `object` of one embedding.
pub const OBJECT_EMBEDDING: &str = "embedding";

/// `encoding_format` of an embeddings request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

/// Body of `POST /v1/embeddings`. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: Prompt,
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
    #[serde(default)]
    pub dimensions: Option<i64>,
    #[serde(default)]
    pub user: Option<String>,
    /// Extension: truncate inputs longer than the model's maximum.
    #[serde(default)]
    pub truncate: Option<bool>,
}

/// A validated embeddings request.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidEmbedding {
    pub model: String,
    /// At least one, at most [`MAX_EMBEDDING_INPUTS`]; no empty text or id list.
    pub inputs: Vec<PromptInput>,
    pub encoding_format: EncodingFormat,
    /// At least 1 when given.
    pub dimensions: Option<usize>,
    pub truncate: bool,
    pub user: Option<String>,
}

/// A 422 item in pydantic's words.
pub(crate) fn item(kind: &str, loc: Vec<Loc>, msg: String, input: Value, ctx: Value) -> ApiError {
    ApiError::validation(vec![ValidationItem {
        kind: kind.into(),
        loc,
        msg,
        input,
        ctx: Some(ctx),
    }])
}

/// An optional count that must be at least 1 when given (422 otherwise).
pub(crate) fn optional_positive(
    field: &str,
    value: Option<i64>,
) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v >= 1 => Ok(Some(v as usize)),
        Some(v) => Err(item(
            "greater_than_equal",
            vec![Loc::from("body"), Loc::from(field)],
            "Input should be greater than or equal to 1".into(),
            json!(v),
            json!({"ge": 1}),
        )),
    }
}

/// 422 for a list with fewer than `min` or more than `max` items.
pub(crate) fn check_list_len(
    field: &str,
    len: usize,
    min: usize,
    max: usize,
    input: impl FnOnce() -> Value,
) -> Result<(), ApiError> {
    let loc = vec![Loc::from("body"), Loc::from(field)];
    if len < min {
        return Err(item(
            "too_short",
            loc,
            format!("List should have at least {min} item after validation, not {len}"),
            input(),
            json!({"field_type": "List", "min_length": min, "actual_length": len}),
        ));
    }
    if len > max {
        return Err(item(
            "too_long",
            loc,
            format!("List should have at most {max} items after validation, not {len}"),
            input(),
            json!({"field_type": "List", "max_length": max, "actual_length": len}),
        ));
    }
    Ok(())
}

/// 422 for an empty string at `loc`.
pub(crate) fn empty_string(loc: Vec<Loc>) -> ApiError {
    item(
        "string_too_short",
        loc,
        "String should have at least 1 character".into(),
        json!(""),
        json!({"min_length": 1}),
    )
}

fn token_ids(ids: &[i64], index: usize, single: bool) -> Result<Vec<u32>, ApiError> {
    let mut loc = vec![Loc::from("body"), Loc::from("input")];
    if !single {
        loc.push(Loc::Index(index));
    }
    if ids.is_empty() {
        return Err(item(
            "too_short",
            loc,
            "List should have at least 1 item after validation, not 0".into(),
            json!([]),
            json!({"field_type": "List", "min_length": 1, "actual_length": 0}),
        ));
    }
    ids.iter()
        .map(|&id| {
            u32::try_from(id).map_err(|_| {
                ApiError::bad_request(
                    Some("input"),
                    format!("Input {index} holds an invalid token id {id}."),
                )
            })
        })
        .collect()
}

impl EmbeddingRequest {
    /// Checks the request (everything that does not need the model).
    pub fn validate(&self) -> Result<ValidEmbedding, ApiError> {
        let inputs = match &self.input {
            Prompt::Text(text) => {
                if text.is_empty() {
                    return Err(empty_string(vec!["body".into(), "input".into()]));
                }
                vec![PromptInput::Text(text.clone())]
            }
            Prompt::Texts(texts) => {
                check_list_len("input", texts.len(), 1, MAX_EMBEDDING_INPUTS, || {
                    json!(texts)
                })?;
                if let Some(i) = texts.iter().position(String::is_empty) {
                    return Err(empty_string(vec![
                        "body".into(),
                        "input".into(),
                        Loc::Index(i),
                    ]));
                }
                texts.iter().cloned().map(PromptInput::Text).collect()
            }
            Prompt::Tokens(ids) => vec![PromptInput::Tokens(token_ids(ids, 0, true)?)],
            Prompt::TokenBatches(batches) => {
                check_list_len("input", batches.len(), 1, MAX_EMBEDDING_INPUTS, || {
                    json!(batches)
                })?;
                batches
                    .iter()
                    .enumerate()
                    .map(|(i, ids)| token_ids(ids, i, false).map(PromptInput::Tokens))
                    .collect::<Result<_, _>>()?
            }
        };
        let dimensions = optional_positive("dimensions", self.dimensions)?;
        Ok(ValidEmbedding {
            model: self.model.clone(),
            inputs,
            encoding_format: self.encoding_format.unwrap_or_default(),
            dimensions,
            truncate: self.truncate.unwrap_or(false),
            user: self.user.clone(),
        })
    }
}

/// 422 for `dimensions` above what the model produces.
pub fn dimensions_too_large(requested: usize, model_dimensions: usize) -> ApiError {
    item(
        "less_than_equal",
        vec!["body".into(), "dimensions".into()],
        format!(
            "Input should be less than or equal to {model_dimensions} (the model's dimensions)"
        ),
        json!(requested),
        json!({"le": model_dimensions}),
    )
}

/// Keeps the first `dimensions` components and rescales to unit L2 norm
/// (a zero vector stays zero).
pub fn apply_dimensions(vector: &[f32], dimensions: usize) -> Vec<f32> {
    let mut v: Vec<f32> = vector.iter().take(dimensions).copied().collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// The vector's little-endian f32 bytes in standard base64.
pub fn encode_base64(vector: &[f32]) -> String {
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The inverse of [`encode_base64`]; `None` when it is not such a string.
pub fn decode_base64(text: &str) -> Option<Vec<f32>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    if bytes.len() % 4 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// `embedding` of one item: numbers, or a base64 string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

impl EmbeddingVector {
    pub fn new(vector: &[f32], format: EncodingFormat) -> Self {
        match format {
            EncodingFormat::Float => Self::Float(vector.to_vec()),
            EncodingFormat::Base64 => Self::Base64(encode_base64(vector)),
        }
    }
}

/// One item of `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingObject {
    /// Always `embedding`.
    pub object: String,
    pub embedding: EmbeddingVector,
    pub index: usize,
}

/// `usage` of embeddings and rerank: input tokens only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

impl EmbeddingUsage {
    pub fn new(prompt_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            total_tokens: prompt_tokens,
        }
    }
}

/// Body of a `POST /v1/embeddings` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<EmbeddingObject>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

impl EmbeddingList {
    /// One item per vector, `index` = input position.
    pub fn new(
        model: String,
        vectors: &[Vec<f32>],
        format: EncodingFormat,
        prompt_tokens: usize,
    ) -> Self {
        let data = vectors
            .iter()
            .enumerate()
            .map(|(index, v)| EmbeddingObject {
                object: OBJECT_EMBEDDING.to_string(),
                embedding: EmbeddingVector::new(v, format),
                index,
            })
            .collect();
        Self {
            object: OBJECT_LIST.to_string(),
            data,
            model,
            usage: EmbeddingUsage::new(prompt_tokens),
        }
    }
}
