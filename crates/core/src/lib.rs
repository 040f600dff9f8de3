//! Plain shared types of Hearth.
//!
//! Everything here is framework-free data: what a generation request asks for
//! ([`SamplingParams`], [`GenerateRequest`]), what the engine answers with
//! ([`TokenEvent`]) and how it fails ([`EngineError`]). The HTTP layer and the
//! engine both depend on this crate; it depends on neither.

mod constraint;
mod error;
mod sampling;

pub use constraint::{is_allowed, Constraint, ConstraintState, FromField};
pub use error::EngineError;
pub use sampling::{SamplingParams, MAX_STOP_SEQUENCES, MAX_TOP_LOGPROBS};

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Why a sequence stopped producing tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string was produced.
    Stop,
    /// `max_tokens` or the model's context length was reached.
    Length,
    /// The answer is tool calls (set by the server, never by the engine).
    ToolCalls,
    /// The answer is a call of OpenAI's deprecated `functions` (set by the
    /// server).
    FunctionCall,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::FunctionCall => "function_call",
        }
    }
}

/// Token accounting of one sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache when
    /// the sequence was first scheduled.
    #[serde(default)]
    pub cached_tokens: usize,
}

impl Usage {
    pub fn total_tokens(&self) -> usize {
        self.prompt_tokens + self.completion_tokens
    }
}

/// A candidate token with its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenCandidate {
    pub id: u32,
    /// The token's text; lossy where the token is not valid UTF-8 on its own.
    pub text: String,
    /// The token's raw bytes.
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// Log-probability information for one sampled token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprobs {
    pub chosen: TokenCandidate,
    /// The most likely candidates, best first (`top_logprobs` of them).
    pub top: Vec<TokenCandidate>,
}

/// One generation request for one sequence, already tokenized.
///
/// Requests with `n > 1` are submitted as `n` sequences by the caller.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Identifier for logs and tracing.
    pub id: String,
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    pub priority: Priority,
    /// Key of the LoRA adapter to run with (`None`: the base model). The
    /// engine resolves it through its adapter cache
    /// (`hearth_engine::adapters`); it also separates the prefix cache.
    pub adapter: Option<Arc<str>>,
    /// Who may share cached prompt blocks: sequences of different scopes
    /// never reuse each other's prefix cache (the server sets the project,
    /// so one tenant cannot probe what another's prompts were). `None`: the
    /// shared scope.
    pub cache_scope: Option<Arc<str>>,
    /// A grammar the generated tokens must follow (structured output);
    /// each sequence starts its own matcher.
    pub constraint: Option<Arc<dyn Constraint>>,
}

/// Scheduling class of a request: interactive requests are admitted before
/// batch work, and batch work is preempted first when the KV cache runs out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    #[default]
    Interactive,
    Batch,
}

/// What the engine sends back for a sequence, in order: any number of
/// `Token`s, then exactly one `Finished` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenEvent {
    Token {
        id: u32,
        /// Text that became final with this token (may be empty while a
        /// multi-byte character or a possible stop string is held back).
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
        /// Held-back text released at the end (never part of a stop string).
        text: String,
    },
    Error(EngineError),
}

/// One message of a chat conversation, after the API layer has flattened its
/// content parts into text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}
