use thiserror::Error;

/// Errors of the engine layer. Mapped to HTTP (and to SSE error events) once,
/// at the server's edge.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum EngineError {
    /// The waiting queue is full; the client should retry later.
    #[error("the engine is overloaded: {0} requests are already waiting")]
    Overloaded(usize),
    /// The prompt does not fit the model's context.
    #[error("the prompt has {prompt_tokens} tokens, which leaves no room in the model's context of {context_length} tokens")]
    PromptTooLong {
        prompt_tokens: usize,
        context_length: usize,
    },
    /// A parameter the engine cannot honour (names the parameter).
    #[error("invalid parameter `{param}`: {message}")]
    InvalidParameter { param: String, message: String },
    /// The model failed while running (a bug or resource problem, not the client's).
    #[error("the model failed to process the request: {0}")]
    Model(String),
    /// The engine has shut down.
    #[error("the engine is not running")]
    Stopped,
}
