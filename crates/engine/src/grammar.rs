//! Structured output on `llguidance`: a model's [`GrammarCompiler`] turns
//! a JSON schema into a [`hearth_core::Constraint`] whose per-sequence
//! matchers compute the allowed tokens of each step.
//!
//! The token trie is built once per model from its `tokenizer.json` (the
//! bytes of every token); grammars are compiled per request (a bad schema
//! is the client's error) and each sequence deep-clones the compiled
//! parser, so `n` choices and batches share the compilation.

use std::sync::{Arc, Mutex};

use hearth_core::{Constraint, ConstraintState};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory, TokenParser};
use serde_json::Value;
use tokenizers::Tokenizer;

/// Compiles grammars for one model's tokenizer.
pub struct GrammarCompiler {
    factory: ParserFactory,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// For `tokenizer`, whose end-of-sequence token is `eos` (the token a
    /// finished grammar allows).
    pub fn new(tokenizer: &Tokenizer, eos: u32) -> anyhow::Result<Self> {
        let json: Value = serde_json::from_str(
            &tokenizer
                .to_string(false)
                .map_err(|e| anyhow::anyhow!("serializing the tokenizer: {e}"))?,
        )?;
        let words = llguidance::token_bytes_from_tokenizer_json(&json)?;
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)?;
        // Errors are returned to the client, not printed.
        factory.set_stderr_log_level(0);
        Ok(Self { factory })
    }

    /// A constraint that only lets through JSON matching `schema`
    /// (`{"type": "object"}` for any object). The error says why the
    /// schema cannot be used.
    pub fn json_schema(&self, schema: &Value) -> Result<Arc<dyn Constraint>, String> {
        let mut schema = schema.clone();
        if schema.is_object() && schema.get("x-guidance").is_none() {
            // One layout, `{"a": 1, "b": [2, 3]}`: free whitespace lets a
            // sampling model wander in blanks until it runs out of tokens.
            JsonCompileOptions {
                item_separator: ", ".into(),
                key_separator: ": ".into(),
                whitespace_flexible: false,
                ..Default::default()
            }
            .apply_to(&mut schema);
        }
        let grammar = TopLevelGrammar::from_json_schema(schema);
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(Grammar {
            parser: Mutex::new(parser),
        }))
    }
}

/// A compiled grammar: each sequence starts from a copy of its parser.
struct Grammar {
    parser: Mutex<TokenParser>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").finish_non_exhaustive()
    }
}

impl Constraint for Grammar {
    fn start(&self) -> Box<dyn ConstraintState> {
        let parser = self
            .parser
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deep_clone();
        Box::new(GrammarState(Matcher::new(Ok(parser))))
    }
}

struct GrammarState(Matcher);

impl ConstraintState for GrammarState {
    fn allowed(&mut self) -> Result<Vec<u32>, String> {
        self.0
            .compute_mask_or_eos()
            .map(|mask| mask.as_slice().to_vec())
            .map_err(|e| e.to_string())
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        self.0.consume_token(token).map_err(|e| e.to_string())
    }

    fn is_finished(&self) -> bool {
        self.0.is_stopped()
    }
}
