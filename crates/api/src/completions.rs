//! Wire types of `POST /v1/completions`: the request (with its `prompt`
//! union), the response, the stream chunk and the log-probability object.
//!
//! Validation into engine parameters lives in [`crate::validate`].

use std::collections::BTreeMap;
use std::fmt;

use hearth_core::{FinishReason, TokenLogprobs};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Unexpected, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::common::{Completion, Stop, StreamOptions, UsageInfo, OBJECT_TEXT_COMPLETION};

/// Body of `POST /v1/completions`. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    /// Default 16.
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Number of top candidates to return per token, 0 to 20.
    #[serde(default)]
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// Token id (as a string) to a bias in [-100, 100].
    #[serde(default)]
    pub logit_bias: Option<BTreeMap<String, f64>>,
    #[serde(default)]
    pub seed: Option<i64>,
    /// Text after the completion (insertion): not supported, so only null
    /// or empty; anything else is a 400 rather than being ignored.
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    /// Only 1 or `n` (no selection among extra candidates).
    #[serde(default)]
    pub best_of: Option<i64>,
    /// Extension: keep the k most likely tokens; -1 or 0 disables it.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Extension: min-p sampling, 0 to 1.
    #[serde(default)]
    pub min_p: Option<f64>,
    /// Extension: CTRL-style repetition penalty, > 0 (1 disables it).
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    /// Extension: keep generating past end-of-sequence tokens.
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Extension (as vLLM): the output is JSON of this schema.
    #[serde(default)]
    pub guided_json: Option<Value>,
    /// Extension: the output matches this regular expression.
    #[serde(default)]
    pub guided_regex: Option<String>,
    /// Extension: the output is exactly one of these strings.
    #[serde(default)]
    pub guided_choice: Option<Vec<String>>,
    /// Extension: the output follows this Lark grammar.
    #[serde(default)]
    pub guided_grammar: Option<String>,
}

/// `prompt`: a string, an array of strings, an array of token ids, or an
/// array of arrays of token ids. An empty array is `Texts(vec![])`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenBatches(Vec<Vec<i64>>),
}

/// One element of a prompt array, before the array is known to be uniform.
enum PromptItem {
    Text(String),
    Token(i64),
    Tokens(Vec<i64>),
}

impl<'de> Deserialize<'de> for PromptItem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = PromptItem;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, a token id or an array of token ids")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PromptItem, E> {
                Ok(PromptItem::Text(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<PromptItem, E> {
                Ok(PromptItem::Text(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PromptItem, E> {
                Ok(PromptItem::Token(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PromptItem, E> {
                i64::try_from(v)
                    .map(PromptItem::Token)
                    .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PromptItem, A::Error> {
                let mut out = Vec::new();
                while let Some(id) = seq.next_element::<i64>()? {
                    out.push(id);
                }
                Ok(PromptItem::Tokens(out))
            }
        }
        deserializer.deserialize_any(ItemVisitor)
    }
}

/// The items of a prompt array, all of the kind `pick` takes, or the error
/// of a mixed array.
fn uniform<T, E: de::Error>(
    items: Vec<PromptItem>,
    pick: fn(PromptItem) -> Option<T>,
) -> Result<Vec<T>, E> {
    items
        .into_iter()
        .map(|i| {
            pick(i).ok_or_else(|| {
                E::custom(
                    "a prompt array must hold only strings, only token ids \
                     or only arrays of token ids",
                )
            })
        })
        .collect()
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PromptVisitor;
        impl<'de> Visitor<'de> for PromptVisitor {
            type Value = Prompt;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a string, an array of strings, an array of token ids \
                     or an array of arrays of token ids",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Prompt, E> {
                Ok(Prompt::Text(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Prompt, E> {
                Ok(Prompt::Text(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<PromptItem>()? {
                    items.push(item);
                }
                match items.first() {
                    None | Some(PromptItem::Text(_)) => uniform(items, |i| match i {
                        PromptItem::Text(s) => Some(s),
                        _ => None,
                    })
                    .map(Prompt::Texts),
                    Some(PromptItem::Token(_)) => uniform(items, |i| match i {
                        PromptItem::Token(t) => Some(t),
                        _ => None,
                    })
                    .map(Prompt::Tokens),
                    Some(PromptItem::Tokens(_)) => uniform(items, |i| match i {
                        PromptItem::Tokens(t) => Some(t),
                        _ => None,
                    })
                    .map(Prompt::TokenBatches),
                }
            }
        }
        deserializer.deserialize_any(PromptVisitor)
    }
}

/// Response of a non-streamed completion: `id` is `cmpl-...`, `object`
/// always `text_completion`.
pub type CompletionResponse = Completion<CompletionChoice, UsageInfo>;

impl CompletionResponse {
    pub fn new(
        id: String,
        created: u64,
        model: String,
        choices: Vec<CompletionChoice>,
        usage: UsageInfo,
    ) -> Self {
        Self::build(OBJECT_TEXT_COMPLETION, id, created, model, choices, usage)
    }
}

/// One choice of a completion, or its increment in a stream chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    /// Set in responses; in chunks null until the choice's last one.
    #[schema(value_type = Option<crate::schemas::FinishReason>)]
    pub finish_reason: Option<FinishReason>,
}

/// A stream chunk of a completion: `object` = `text_completion`; `usage` is
/// null except in the final usage chunk (`stream_options.include_usage`),
/// whose `choices` is empty.
pub type CompletionChunk = Completion<CompletionChoice, Option<UsageInfo>>;

impl CompletionChunk {
    /// A chunk carrying choice increments.
    pub fn new(id: String, created: u64, model: String, choices: Vec<CompletionChoice>) -> Self {
        Self::build(OBJECT_TEXT_COMPLETION, id, created, model, choices, None)
    }

    /// The final usage chunk: no choices, `usage` set.
    pub fn usage(id: String, created: u64, model: String, usage: UsageInfo) -> Self {
        Self::build(
            OBJECT_TEXT_COMPLETION,
            id,
            created,
            model,
            Vec::new(),
            Some(usage),
        )
    }
}

/// `logprobs` of a completion choice (OpenAI's legacy shape).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<TopLogprobs>>,
    /// Character offset of each token in the choice's `text`.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends one token at character offset `text_offset`. Its
    /// `top_logprobs` entry always holds the sampled token too (up to
    /// `logprobs + 1` entries, as OpenAI's legacy completions have it).
    pub fn push(&mut self, logprobs: &TokenLogprobs, text_offset: usize) {
        let chosen = &logprobs.chosen;
        self.tokens.push(chosen.text.clone());
        self.token_logprobs.push(Some(chosen.logprob));
        let mut top: Vec<(String, f32)> = logprobs
            .top
            .iter()
            .map(|c| (c.text.clone(), c.logprob))
            .collect();
        if !top.iter().any(|(text, _)| *text == chosen.text) {
            top.push((chosen.text.clone(), chosen.logprob));
        }
        self.top_logprobs.push(Some(TopLogprobs(top)));
        self.text_offset.push(text_offset);
    }

    /// Builds the object for consecutive tokens whose text starts at character
    /// `start_offset` (e.g. the echoed prompt's length); offsets advance by
    /// each token's text length in characters.
    pub fn from_tokens(tokens: &[TokenLogprobs], start_offset: usize) -> Self {
        let mut out = Self::default();
        let mut offset = start_offset;
        for token in tokens {
            out.push(token, offset);
            offset += token.chosen.text.chars().count();
        }
        out
    }
}

/// `{token: logprob}` of one position, best first (order is kept).
#[derive(Debug, Clone, Default, PartialEq, ToSchema)]
#[schema(value_type = BTreeMap<String, f32>)]
pub struct TopLogprobs(pub Vec<(String, f32)>);

impl Serialize for TopLogprobs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for TopLogprobs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> Visitor<'de> for MapVisitor {
            type Value = TopLogprobs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of tokens to log-probabilities")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopLogprobs, A::Error> {
                let mut out = Vec::new();
                while let Some((token, logprob)) = map.next_entry::<String, f32>()? {
                    out.push((token, logprob));
                }
                Ok(TopLogprobs(out))
            }
        }
        deserializer.deserialize_map(MapVisitor)
    }
}
