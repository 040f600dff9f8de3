//! Wire types of `POST /v1/rerank` and their validation.
//!
//! Request: `model`, `query` (non-empty), `documents` (1 to
//! [`MAX_RERANK_DOCUMENTS`] strings or `{text}` objects), `top_n` (optional,
//! at least 1), `return_documents` (default true). The answer lists results
//! in descending `relevance_score`, each with `index` = the document's
//! position in the input ([`RerankResponse::new`] sorts them).

use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use crate::embeddings::{check_list_len, empty_string, optional_positive, EmbeddingUsage};
use crate::error::{ApiError, Loc};

/// Most documents in one rerank request.
pub const MAX_RERANK_DOCUMENTS: usize = 1000;

/// A document: a string or an object with `text`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged, expecting = "a string or an object with a `text` string")]
pub enum RerankDocument {
    Text(String),
    Object { text: String },
}

impl RerankDocument {
    pub fn text(&self) -> &str {
        match self {
            RerankDocument::Text(t) | RerankDocument::Object { text: t } => t,
        }
    }
}

/// Body of `POST /v1/rerank`. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankRequest {
    pub model: String,
    pub query: String,
    pub documents: Vec<RerankDocument>,
    #[serde(default)]
    pub top_n: Option<i64>,
    #[serde(default)]
    pub return_documents: Option<bool>,
}

/// A validated rerank request.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRerank {
    pub model: String,
    pub query: String,
    /// 1 to [`MAX_RERANK_DOCUMENTS`] texts, possibly empty strings.
    pub documents: Vec<String>,
    /// Results to return (all when `None`).
    pub top_n: Option<usize>,
    pub return_documents: bool,
}

impl RerankRequest {
    pub fn validate(&self) -> Result<ValidRerank, ApiError> {
        if self.query.is_empty() {
            return Err(empty_string(vec![Loc::from("body"), Loc::from("query")]));
        }
        check_list_len(
            "documents",
            self.documents.len(),
            1,
            MAX_RERANK_DOCUMENTS,
            || json!(self.documents),
        )?;
        let top_n = optional_positive("top_n", self.top_n)?;
        Ok(ValidRerank {
            model: self.model.clone(),
            query: self.query.clone(),
            documents: self
                .documents
                .iter()
                .map(|d| d.text().to_string())
                .collect(),
            top_n,
            return_documents: self.return_documents.unwrap_or(true),
        })
    }
}

/// `document` of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RerankResultDocument {
    pub text: String,
}

/// One result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankResult {
    /// Position of the document in the request.
    pub index: usize,
    /// Absent when `return_documents` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankResultDocument>,
    pub relevance_score: f32,
}

/// Body of a `POST /v1/rerank` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankResponse {
    pub id: String,
    pub model: String,
    pub usage: EmbeddingUsage,
    pub results: Vec<RerankResult>,
}

impl RerankResponse {
    /// Sorts `scores` (one per document) descending (ties by index), keeps
    /// `top_n`, and attaches the documents when asked.
    pub fn new(
        id: String,
        model: String,
        request: &ValidRerank,
        scores: &[f32],
        prompt_tokens: usize,
    ) -> Self {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        order.truncate(request.top_n.unwrap_or(order.len()));
        let results = order
            .into_iter()
            .map(|index| RerankResult {
                index,
                document: request.return_documents.then(|| RerankResultDocument {
                    text: request.documents.get(index).cloned().unwrap_or_default(),
                }),
                relevance_score: scores[index],
            })
            .collect();
        Self {
            id,
            model,
            usage: EmbeddingUsage::new(prompt_tokens),
            results,
        }
    }
}
