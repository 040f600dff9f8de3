//! Wire types shared by several endpoints: `stop`, `stream_options`, `usage`,
//! the `ai_project_id` query and the object-name constants.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// `service_tier` of every inference response.
pub const SERVICE_TIER: &str = "default";
/// `object` of a text completion and of its stream chunks.
pub const OBJECT_TEXT_COMPLETION: &str = "text_completion";
/// `object` of a chat completion.
pub const OBJECT_CHAT_COMPLETION: &str = "chat.completion";
/// `object` of a chat completion stream chunk.
pub const OBJECT_CHAT_CHUNK: &str = "chat.completion.chunk";
/// `object` of list results.
pub const OBJECT_LIST: &str = "list";
/// `object` of a model.
pub const OBJECT_MODEL: &str = "model";
/// Most choices (`n`) a completion or chat request may ask for.
pub const MAX_N: i64 = 16;

/// The query of every POST inference route: `?ai_project_id=...`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectQuery {
    #[serde(default)]
    pub ai_project_id: Option<String>,
}

impl ProjectQuery {
    /// The project id, with an empty value treated as absent.
    pub fn project_id(&self) -> Option<&str> {
        self.ai_project_id.as_deref().filter(|id| !id.is_empty())
    }
}

/// `stream_options` of completion and chat requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// `stop`: one string or an array of strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

impl<'de> Deserialize<'de> for Stop {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StopVisitor;
        impl<'de> Visitor<'de> for StopVisitor {
            type Value = Stop;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Stop, E> {
                Ok(Stop::One(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Stop, E> {
                Ok(Stop::One(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Stop, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(Stop::Many(out))
            }
        }
        deserializer.deserialize_any(StopVisitor)
    }
}

/// `usage` of inference responses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageInfo {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl UsageInfo {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

impl From<hearth_core::Usage> for UsageInfo {
    fn from(usage: hearth_core::Usage) -> Self {
        Self::new(usage.prompt_tokens, usage.completion_tokens)
    }
}
