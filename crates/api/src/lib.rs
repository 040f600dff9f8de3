//! Wire types of the Hearth HTTP API, its error bodies and request validation.
//!
//! Framework-free: the server crate does the HTTP; this crate says what goes
//! over the wire.
//!
//! - [`error`]: [`ApiError`] with the spec's body shapes A, B and C and the
//!   SSE error event; `EngineError -> ApiError`.
//! - [`output_format`]: `response_format` (structured output) checked.
//! - [`parse`]: [`parse_json_body`] and [`parse_query`], failing with 422.
//! - [`de`]: lenient (pydantic-style) booleans for query structs.
//! - [`admin`]: `/v1/admin` keys and projects.
//! - [`batches`]: `/v1/batches` creation, the batch object and list, the
//!   lines of input and result files.
//! - [`cloud`]: the cloud platform API's error model (`{code, message}`),
//!   token exchange, profile, service accounts, authorized keys, groups.
//! - [`common`], [`completions`], [`chat`], [`models`]: request and response types.
//! - [`endpoints`]: `/v0/dedicated_endpoints` templates, bodies, the
//!   endpoint object and list.
//! - [`embeddings`], [`rerank`]: `/v1/embeddings` and `/v1/rerank` types,
//!   their validation, base64 vectors and `dimensions`.
//! - [`files`]: `/v1/files` objects, lists, links and purposes.
//! - [`fine_tuning`]: `/v1/fine_tuning` job creation (validation into
//!   resolved hyperparameters), job, event and checkpoint objects, lists,
//!   and the spec-draft trainable model list.
//! - [`responses`]: `/v1/responses` requests (validated into the engine's
//!   parameters), the response object, its stream events, input items.
//! - [`tools`]: function calling: tools, tool choice, call parsing.
//! - [`training_data`]: lines of fine-tuning datasets (chat or prompt/completion).
//! - [`schemas`]: schemas of the shapes without a struct (error bodies,
//!   the upload form), for the server's OpenAPI document.
//! - [`usage`]: `/v1/usage` and the admin budget and quota bodies.
//! - [`validate`]: `validate()` on requests, giving [`ValidCompletion`] and
//!   [`ValidChat`] with the engine's `SamplingParams`.

pub mod admin;
pub mod batches;
pub mod chat;
mod chat_unsupported;
pub mod cloud;
pub mod common;
pub mod completions;
pub mod datasets;
pub mod de;
pub mod embeddings;
pub mod endpoints;
pub mod error;
pub mod files;
pub mod fine_tuning;
pub mod images;
mod legacy_functions;
pub mod models;
pub mod output_format;
pub mod parse;
pub mod rerank;
pub mod responses;
pub mod schemas;
mod tool_turns;
pub mod tools;
pub mod training_data;
pub mod usage;
pub mod validate;

pub use chat::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatLogprobs, ChatRequestMessage, ChatResponseMessage,
    ChatTokenLogprob, ChatTopLogprob, ContentPart, MessageContent,
};
pub use common::{
    Completion, ProjectQuery, PromptTokensDetails, Stop, StreamOptions, UsageInfo, MAX_N,
    SERVICE_TIER,
};
pub use completions::{
    CompletionChoice, CompletionChunk, CompletionLogprobs, CompletionRequest, CompletionResponse,
    Prompt, TopLogprobs,
};
pub use embeddings::{
    apply_dimensions, decode_base64, dimensions_too_large, encode_base64, EmbeddingList,
    EmbeddingObject, EmbeddingRequest, EmbeddingUsage, EmbeddingVector, EncodingFormat,
    ValidEmbedding, MAX_EMBEDDING_INPUTS,
};
pub use error::{ApiError, ErrorBody, Loc, ValidationItem, INVALID_REQUEST_PREFIX};
pub use files::{FileDeleted, FileLink, FileList, FileObject, FilesQuery, LinkQuery};
pub use fine_tuning::{
    FineTuneRequest, FineTuningCheckpoint, FineTuningEvent, FineTuningJob, FineTuningList,
    FineTuningListQuery, Hyperparameters, HyperparametersInput, TrainableModel, TrainableModelList,
    ValidFineTuneRequest,
};
pub use models::{ModelDeleted, ModelList, ModelObject, ModelPricing, ModelsQuery};
pub use parse::{parse_json_body, parse_query};
pub use rerank::{
    RerankDocument, RerankRequest, RerankResponse, RerankResult, RerankResultDocument, ValidRerank,
    MAX_RERANK_DOCUMENTS,
};
pub use validate::{PromptInput, ValidChat, ValidCompletion, DEFAULT_COMPLETION_MAX_TOKENS};
