//! Turning [`TrainingExample`]s into tokens and loss masks.
//!
//! Chat examples are rendered with the model's own chat template. For each
//! trained assistant message (`TrainingMessage::trained`), the conversation
//! up to it is rendered with the generation prompt (the prefix) and the
//! conversation including it without; the tokens between the two carry loss,
//! up to and including the first end-of-turn token (an `eos_ids` token such as
//! `<|im_end|>`); what the template writes after it (ChatML's newline) does
//! not. The full conversation is tokenised once, as the server tokenises
//! prompts (`encode(.., add_special = false)`), and each boundary is checked
//! to tokenise stably: the prefix's own tokens must be a prefix of the full
//! tokens. When one is not, the example is tokenised piece by piece between
//! the boundaries instead (counted in [`DataStats::unstable_prefix`]).
//!
//! Prompt/completion examples: `encode(prompt, add_special = true)` (as the
//! completions endpoint does), then `encode(completion)` and the first EOS id,
//! which carry loss. No template.
//!
//! Examples longer than the context length are truncated to it (counted in
//! [`DataStats::truncated`]); an example left with no loss token is dropped
//! (counted in [`DataStats::dropped`]).

use hearth_api::training_data::TrainingExample;
use hearth_engine::chat_template::ChatTemplate;
use hearth_engine::tokenizer::encode;
use serde::Serialize;
use tokenizers::Tokenizer;

use super::model::TokenizedExample;
use crate::TrainError;

/// What tokenisation did to a dataset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataStats {
    /// Examples kept (train, validation).
    pub train_examples: usize,
    pub valid_examples: usize,
    /// Examples cut to the context length.
    pub truncated: usize,
    /// Examples dropped because no loss token was left after truncation.
    pub dropped: usize,
    /// Chat examples whose template prefixes did not tokenise stably (they
    /// were tokenised piece by piece).
    pub unstable_prefix: usize,
    /// Tokens and loss tokens of the kept training examples (one epoch).
    pub train_tokens: usize,
    pub train_loss_tokens: usize,
}

#[derive(Serialize)]
struct Msg<'a> {
    role: &'a str,
    content: &'a str,
}

fn tok(t: &Tokenizer, text: &str, special: bool) -> Result<Vec<u32>, TrainError> {
    encode(t, text, special).map_err(|e| TrainError::Data(e.to_string()))
}

/// Tokens and loss mask of one example, before truncation; the flag says
/// whether the chat prefixes tokenised stably.
pub fn tokenize_example(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    eos_ids: &[u32],
    example: &TrainingExample,
) -> Result<(TokenizedExample, bool), TrainError> {
    match example {
        TrainingExample::Completion { prompt, completion } => {
            let mut tokens = tok(tokenizer, prompt, true)?;
            let n = tokens.len();
            tokens.extend(tok(tokenizer, completion, false)?);
            tokens.extend(eos_ids.first());
            let loss = (0..tokens.len()).map(|i| i >= n).collect();
            Ok((TokenizedExample { tokens, loss }, true))
        }
        TrainingExample::Chat(messages) => {
            let msgs: Vec<Msg> = messages
                .iter()
                .map(|m| Msg {
                    role: &m.role,
                    content: &m.content,
                })
                .collect();
            let render = |m: &[Msg], gen: bool| {
                template
                    .render_with(m, gen, None)
                    .map_err(|e| TrainError::Template(e.to_string()))
            };
            let full = render(&msgs, false)?;
            // Byte spans [prefix end, turn end) of the trained turns.
            let mut spans = Vec::new();
            for (i, m) in messages.iter().enumerate() {
                if !m.trained() {
                    continue;
                }
                let pre = render(&msgs[..i], true)?;
                let end = render(&msgs[..=i], false)?;
                if !full.starts_with(&pre) || !full.starts_with(&end) || pre.len() > end.len() {
                    return Err(TrainError::Template(format!(
                        "the chat template does not render message {i} as an extension of the \
                         conversation before it, so its tokens cannot be masked"
                    )));
                }
                spans.push((pre.len(), end.len()));
            }
            let tokens = tok(tokenizer, &full, false)?;
            let mut cuts: Vec<usize> = spans.iter().flat_map(|&(a, b)| [a, b]).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut at = Vec::with_capacity(cuts.len()); // byte cut -> token index
            let mut stable = true;
            for &c in &cuts {
                let p = tok(tokenizer, &full[..c], false)?;
                if tokens.starts_with(&p) {
                    at.push(p.len());
                } else {
                    stable = false;
                    break;
                }
            }
            let tokens = if stable {
                tokens
            } else {
                // Piece by piece between the cuts, so each cut is a token boundary.
                let mut t = Vec::new();
                let mut prev = 0;
                at.clear();
                for &c in cuts.iter().chain(std::iter::once(&full.len())) {
                    t.extend(tok(tokenizer, &full[prev..c], false)?);
                    at.push(t.len());
                    prev = c;
                }
                at.pop();
                t
            };
            let index = |byte: usize| at[cuts.binary_search(&byte).expect("a cut")];
            let mut loss = vec![false; tokens.len()];
            for &(a, b) in &spans {
                for i in index(a)..index(b) {
                    loss[i] = true;
                    if eos_ids.contains(&tokens[i]) {
                        break;
                    }
                }
            }
            Ok((TokenizedExample { tokens, loss }, stable))
        }
    }
}

/// Tokenises a dataset, truncating to `context` tokens and dropping
/// examples left without loss tokens; updates `stats` (examples, truncated,
/// dropped, unstable).
pub(crate) fn tokenize_all(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    eos_ids: &[u32],
    examples: &[TrainingExample],
    context: usize,
    stats: &mut DataStats,
) -> Result<Vec<TokenizedExample>, TrainError> {
    let mut out = Vec::with_capacity(examples.len());
    for (n, e) in examples.iter().enumerate() {
        let (t, stable) =
            tokenize_example(tokenizer, template, eos_ids, e).map_err(|e| match e {
                TrainError::Template(m) => TrainError::Template(format!("example {}: {m}", n + 1)),
                other => other,
            })?;
        stats.unstable_prefix += usize::from(!stable);
        out.push(t);
    }
    Ok(fit_to_context(out, context, stats))
}

/// Truncates to `context` tokens and drops examples without loss tokens.
pub(crate) fn fit_to_context(
    examples: Vec<TokenizedExample>,
    context: usize,
    stats: &mut DataStats,
) -> Vec<TokenizedExample> {
    let mut out = Vec::with_capacity(examples.len());
    for mut t in examples {
        if t.tokens.len() > context {
            t.tokens.truncate(context);
            t.loss.truncate(context);
            stats.truncated += 1;
        }
        if t.loss_tokens() == 0 {
            stats.dropped += 1;
            continue;
        }
        out.push(t);
    }
    out
}
