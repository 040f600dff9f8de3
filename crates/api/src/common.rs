//! Wire types shared by several endpoints: `stop`, `stream_options`, `usage`,
//! the `ai_project_id` query and the object-name constants.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

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
/// Most choices (`n`) a completion or chat request may ask for (OpenAI's
/// bound; `--max-choices` then bounds prompts x `n` per request).
pub const MAX_N: i64 = 128;

/// The query of every POST inference route: `?ai_project_id=...`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProjectQuery {
    /// The project to work in (`project-` and a ULID); the key's default
    /// project when absent or empty.
    #[serde(default)]
    #[param(pattern = r"^(project-[0-9A-HJKMNP-TV-Z]{26})?$")]
    pub ai_project_id: Option<String>,
}

impl ProjectQuery {
    /// The project id, with an empty value treated as absent.
    pub fn project_id(&self) -> Option<&str> {
        self.ai_project_id.as_deref().filter(|id| !id.is_empty())
    }
}

/// `stream_options` of completion and chat requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// `stop`: one string or an array of strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
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
        Ok(
            match string_or_seq(deserializer, "a string or an array of strings")? {
                StringOrSeq::One(s) => Stop::One(s),
                StringOrSeq::Many(v) => Stop::Many(v),
            },
        )
    }
}

/// One string or an array of `T`, as [`string_or_seq`] reads it.
pub(crate) enum StringOrSeq<T> {
    One(String),
    Many(Vec<T>),
}

/// Reads one string or an array of `T`; `expecting` describes the value in
/// serde's errors.
pub(crate) fn string_or_seq<'de, D, T>(
    deserializer: D,
    expecting: &'static str,
) -> Result<StringOrSeq<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct StringOrSeqVisitor<T> {
        expecting: &'static str,
        items: PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for StringOrSeqVisitor<T> {
        type Value = StringOrSeq<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(self.expecting)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(StringOrSeq::One(v.to_string()))
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok(StringOrSeq::One(v))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element::<T>()? {
                out.push(item);
            }
            Ok(StringOrSeq::Many(out))
        }
    }
    deserializer.deserialize_any(StringOrSeqVisitor {
        expecting,
        items: PhantomData,
    })
}

/// The envelope of completion and chat responses and of completion stream
/// chunks: `id`, `object`, `created`, `model`, `choices`, `usage`,
/// `service_tier` (always `default`) and `system_fingerprint` (null), in that
/// order on the wire. `U` is [`UsageInfo`] in responses and
/// `Option<UsageInfo>` in chunks (null except in the final usage chunk).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Completion<C, U> {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<C>,
    pub usage: U,
    pub service_tier: String,
    pub system_fingerprint: Option<String>,
}

impl<C, U> Completion<C, U> {
    /// An envelope of `object` with the fixed `service_tier` and no fingerprint.
    pub(crate) fn build(
        object: &str,
        id: String,
        created: u64,
        model: String,
        choices: Vec<C>,
        usage: U,
    ) -> Self {
        Self {
            id,
            object: object.to_string(),
            created,
            model,
            choices,
            usage,
            service_tier: SERVICE_TIER.to_string(),
            system_fingerprint: None,
        }
    }
}

/// `usage` of inference responses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageInfo {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// How many of the prompt tokens came from the prefix cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose keys and values were reused from an earlier
    /// request with the same prefix (in the same project) instead of being
    /// computed again.
    pub cached_tokens: usize,
}

impl UsageInfo {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens }),
        }
    }
}

impl From<hearth_core::Usage> for UsageInfo {
    fn from(usage: hearth_core::Usage) -> Self {
        Self::new(
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_tokens,
        )
    }
}

/// A list's checked `limit`: `default` when absent; outside `1..=max` is
/// 422 shape C as pydantic words it.
pub fn list_limit(
    limit: Option<i64>,
    default: i64,
    max: i64,
) -> Result<i64, crate::error::ApiError> {
    match limit {
        None => Ok(default),
        Some(n) => query_in_range("limit", n, 1, Some(max)),
    }
}

/// Query parameter `name`'s value `n`, checked to be at least `min` and at
/// most `max`: else 422 shape C as pydantic words it.
pub fn query_in_range(
    name: &str,
    n: i64,
    min: i64,
    max: Option<i64>,
) -> Result<i64, crate::error::ApiError> {
    use crate::error::{ApiError, Loc, ValidationItem};
    use serde_json::{json, Value};
    let (kind, msg, ctx) = if n < min {
        (
            "greater_than_equal",
            format!("Input should be greater than or equal to {min}"),
            json!({"ge": min}),
        )
    } else if let Some(max) = max.filter(|&max| n > max) {
        (
            "less_than_equal",
            format!("Input should be less than or equal to {max}"),
            json!({"le": max}),
        )
    } else {
        return Ok(n);
    };
    Err(ApiError::validation(vec![ValidationItem {
        kind: kind.into(),
        loc: vec![Loc::from("query"), Loc::from(name)],
        msg,
        input: Value::String(n.to_string()),
        ctx: Some(ctx),
    }]))
}

/// A name field: non-blank and at most `max` bytes (400 shape B naming
/// `name` otherwise).
pub fn check_name(name: &str, max: usize) -> Result<(), crate::ApiError> {
    if name.trim().is_empty() {
        return Err(crate::ApiError::bad_request(
            Some("name"),
            "`name` must not be empty.",
        ));
    }
    check_len("name", name, max)
}

/// A text field of at most `max` bytes (400 shape B naming `field`).
pub fn check_len(field: &str, value: &str, max: usize) -> Result<(), crate::ApiError> {
    if value.len() > max {
        return Err(crate::ApiError::bad_request(
            Some(field),
            format!("`{field}` is longer than {max} bytes."),
        ));
    }
    Ok(())
}
