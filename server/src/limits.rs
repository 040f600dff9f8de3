//! Per-request limits of the generation routes, checked before any work:
//! bytes of prompt text (before tokenizing), sequences per request, stop
//! string length, and a token budget the context can still hold. Each
//! refusal is 400 shape B naming the field.

use std::sync::Arc;

use hearth_api::{ApiError, PromptInput};
use hearth_core::ChatMessage;
use tokio::sync::Semaphore;

use crate::config::LimitArgs;
use crate::error::HttpError;

/// The limits in force, shared by every request.
#[derive(Clone)]
pub struct Limits {
    pub max_choices: usize,
    pub max_stop_bytes: usize,
    pub max_prompt_bytes: usize,
    /// Permits for the training-file checks that run at once.
    pub validations: Arc<Semaphore>,
}

impl Limits {
    /// From the flags; `max_choices` is kept below `max_waiting` so that one
    /// request can never fill a model's queue by itself.
    pub fn new(args: &LimitArgs, max_waiting: usize) -> Self {
        Self {
            max_choices: args
                .max_choices
                .clamp(1, max_waiting.saturating_sub(1).max(1)),
            max_stop_bytes: args.max_stop_bytes,
            max_prompt_bytes: args.max_prompt_bytes,
            validations: Arc::new(Semaphore::new(args.max_validations.max(1))),
        }
    }

    /// Prompt bytes and sequence count of a completion request.
    pub fn check_prompts(&self, prompts: &[PromptInput], n: usize) -> Result<(), HttpError> {
        let bytes: usize = prompts
            .iter()
            .map(|p| match p {
                PromptInput::Text(t) => t.len(),
                PromptInput::Tokens(ids) => ids.len() * 4,
            })
            .sum();
        self.check_bytes("prompt", bytes)?;
        self.check_choices("n", prompts.len(), n)
    }

    /// Message bytes and choice count of a chat request.
    pub fn check_messages(&self, messages: &[ChatMessage], n: usize) -> Result<(), HttpError> {
        let bytes = messages.iter().map(|m| m.content.len()).sum();
        self.check_bytes("messages", bytes)?;
        self.check_choices("n", 1, n)
    }

    /// Length of each stop string.
    pub fn check_stop(&self, stop: &[String]) -> Result<(), HttpError> {
        match stop.iter().find(|s| s.len() > self.max_stop_bytes) {
            Some(long) => Err(refuse(
                "stop",
                format!(
                    "A stop sequence may be at most {} bytes long, got one of {} bytes.",
                    self.max_stop_bytes,
                    long.len()
                ),
            )),
            None => Ok(()),
        }
    }

    fn check_bytes(&self, param: &str, bytes: usize) -> Result<(), HttpError> {
        if bytes > self.max_prompt_bytes {
            return Err(refuse(
                param,
                format!(
                    "The prompt text is {bytes} bytes; this server accepts at most {} bytes per request.",
                    self.max_prompt_bytes
                ),
            ));
        }
        Ok(())
    }

    fn check_choices(&self, param: &str, prompts: usize, n: usize) -> Result<(), HttpError> {
        let sequences = prompts.saturating_mul(n);
        if sequences > self.max_choices {
            return Err(refuse(
                param,
                format!(
                    "The request asks for {sequences} sequences ({prompts} prompt(s) x n = {n}); \
                     this server runs at most {} per request.",
                    self.max_choices
                ),
            ));
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::new(&LimitArgs::default(), usize::MAX)
    }
}

/// The longest prompt must leave room in the context (refused naming
/// `prompt_param`: `messages`, `prompt` or `input`), and `max_tokens` (named
/// by `param` when the request set it) must fit after it; without `param`
/// (a default budget) the engine shortens it to what fits.
pub fn check_room(
    context_length: usize,
    prompts: &[Vec<u32>],
    prompt_param: &str,
    max_tokens: Option<usize>,
    param: Option<&str>,
) -> Result<(), HttpError> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if longest >= context_length {
        return Err(refuse(
            prompt_param,
            format!(
                "This model's maximum context length is {context_length} tokens. However, your \
                 `{prompt_param}` resulted in {longest} tokens, which leaves no room for the \
                 completion. Please reduce the length of `{prompt_param}`."
            ),
        ));
    }
    let (Some(max_tokens), Some(param)) = (max_tokens, param) else {
        return Ok(());
    };
    let room = context_length - longest;
    if max_tokens > room {
        return Err(refuse(
            param,
            format!(
                "This model's maximum context length is {context_length} tokens. However, you \
                 requested {} tokens ({longest} in the prompt, {max_tokens} for the completion). \
                 Please reduce the prompt or `{param}` (at most {room} here).",
                longest.saturating_add(max_tokens)
            ),
        ));
    }
    Ok(())
}

fn refuse(param: &str, message: String) -> HttpError {
    HttpError(ApiError::bad_request(Some(param), message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_checked_only_for_a_budget_the_client_set() {
        let prompt = vec![vec![1u32; 10]];
        assert!(check_room(100, &prompt, "prompt", Some(90), Some("max_tokens")).is_ok());
        let err = check_room(100, &prompt, "prompt", Some(91), Some("max_tokens")).unwrap_err();
        assert_eq!(err.0.status(), 400);
        assert_eq!(err.0.body_json()["error"]["param"], "max_tokens");
        assert!(check_room(100, &prompt, "prompt", Some(1 << 40), None).is_ok());
    }

    #[test]
    fn a_prompt_filling_the_context_is_refused_naming_the_prompt_field() {
        let prompts = vec![vec![1u32; 3], vec![1u32; 100]];
        for max_tokens in [None, Some(5)] {
            let err =
                check_room(100, &prompts, "messages", max_tokens, Some("max_tokens")).unwrap_err();
            assert_eq!(err.0.status(), 400);
            let body = err.0.body_json();
            assert_eq!(body["error"]["param"], "messages");
            assert!(body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("100 tokens"));
        }
        assert!(check_room(101, &prompts, "messages", None, None).is_ok());
    }

    #[test]
    fn choices_stay_below_the_queue() {
        let limits = Limits::new(&LimitArgs::default(), 16);
        assert_eq!(limits.max_choices, 15);
        assert!(limits
            .check_prompts(&vec![PromptInput::Text("a".into()); 4], 4)
            .is_err());
        assert!(limits
            .check_prompts(&vec![PromptInput::Text("a".into()); 3], 5)
            .is_ok());
    }
}
