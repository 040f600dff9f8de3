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

/// Work to build a grammar's lexer (llguidance's default is 1,000,000,
/// about 20 ms): 2,000 integer properties need more; ten times the
/// default still bounds a compilation to about 200 ms.
const INITIAL_LEXER_FUEL: u64 = 10_000_000;
/// Earley items of one row (llguidance's default is 2,000): every optional
/// property, or every alternative of an `anyOf`, that may come next holds
/// a few, so 500 optional properties already pass the default.
const MAX_ITEMS_IN_ROW: usize = 10_000;
/// Earley items of one token's mask (llguidance's default is 50,000, about
/// 2.5 ms): the bound on the work of each step, about 10 ms.
const STEP_MAX_ITEMS: usize = 200_000;

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
        // Errors are returned to the client, not printed; they are kept to
        // their reason, without the parser's state.
        factory.set_stderr_log_level(0);
        let limits = factory.limits_mut();
        limits.verbose_errors = false;
        limits.initial_lexer_fuel = INITIAL_LEXER_FUEL;
        limits.max_items_in_row = MAX_ITEMS_IN_ROW;
        limits.step_max_items = STEP_MAX_ITEMS;
        Ok(Self { factory })
    }

    /// A constraint that only lets through JSON matching `schema`
    /// (`{"type": "object"}` for any object; an object schema that lists
    /// `properties` but does not say what other properties it allows
    /// allows none). The error says why the
    /// schema cannot be used.
    pub fn json_schema(&self, schema: &Value) -> Result<Arc<dyn Constraint>, String> {
        self.compile(TopLevelGrammar::from_json_schema(prepared(schema)))
    }

    /// Tool calls: JSON matching `calls_schema`, or (when `may_answer`)
    /// plain text instead, chosen by the first character: `[` starts calls.
    pub fn tool_calls(
        &self,
        calls_schema: &Value,
        may_answer: bool,
    ) -> Result<Arc<dyn Constraint>, String> {
        if !may_answer {
            return self.json_schema(calls_schema);
        }
        let schema = serde_json::to_string(&prepared(calls_schema)).map_err(|e| e.to_string())?;
        let lark = format!("start: calls | TEXT\ncalls: %json {schema}\nTEXT: /[^\\[](?s:.)*/\n");
        self.compile(TopLevelGrammar::from_lark(lark))
    }

    /// Tool calls in `<tool_call>` tags, each a JSON object matching
    /// `call_schema`, one per line (at most `max_calls`); or (when
    /// `may_answer`) plain text instead, which must not start with `<`.
    pub fn tagged_tool_calls(
        &self,
        call_schema: &Value,
        max_calls: usize,
        may_answer: bool,
    ) -> Result<Arc<dyn Constraint>, String> {
        let schema = serde_json::to_string(&prepared(call_schema)).map_err(|e| e.to_string())?;
        let start = if may_answer { "calls | TEXT" } else { "calls" };
        let calls = match max_calls {
            0 | 1 => "call".to_string(),
            n => format!("call (\"\\n\" call){{0,{}}}", n - 1),
        };
        let mut lark = format!(
            "start: {start}\ncalls: {calls}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\n\
             body: %json {schema}\n"
        );
        if may_answer {
            lark.push_str("TEXT: /[^<](?s:.)*/\n");
        }
        self.compile(TopLevelGrammar::from_lark(lark))
    }

    /// Text matching the regular expression `regex`.
    pub fn regex(&self, regex: &str) -> Result<Arc<dyn Constraint>, String> {
        self.compile(TopLevelGrammar::from_regex(regex))
    }

    /// Text of the Lark grammar `lark` (llguidance's dialect).
    pub fn lark(&self, lark: &str) -> Result<Arc<dyn Constraint>, String> {
        self.compile(TopLevelGrammar::from_lark(lark.to_string()))
    }

    fn compile(&self, grammar: TopLevelGrammar) -> Result<Arc<dyn Constraint>, String> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| reason(&e.to_string()))?;
        Ok(Arc::new(Grammar {
            parser: Mutex::new(parser),
        }))
    }
}

/// The first line of a grammar engine error, without the `<non-verbose/>`
/// marker: the reason, not the parser's state.
pub fn reason(error: &str) -> String {
    let line = error
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(error);
    line.replace("<non-verbose/>", "").trim().to_string()
}

/// `schema` with closed objects, bounded integers and one layout, `{"a": 1, "b": [2, 3]}`:
/// free whitespace lets a sampling model wander in blanks until it runs
/// out of tokens.
fn prepared(schema: &Value) -> Value {
    let mut schema = schema.clone();
    close_objects(&mut schema, false);
    bound_integers(&mut schema);
    if schema.is_object() && schema.get("x-guidance").is_none() {
        JsonCompileOptions {
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            whitespace_flexible: false,
            ..Default::default()
        }
        .apply_to(&mut schema);
    }
    schema
}

/// Keywords whose value is one schema.
const SCHEMA_KEYWORDS: [&str; 12] = [
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
];
/// Keywords whose value is a map of names to schemas.
const SCHEMA_MAP_KEYWORDS: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];
/// Keywords whose value is a list of schemas.
const SCHEMA_LIST_KEYWORDS: [&str; 4] = ["anyOf", "oneOf", "allOf", "prefixItems"];

/// Closes every object schema that lists `properties` but does not say what
/// other properties it allows (`additionalProperties` or
/// `unevaluatedProperties`) to the properties it lists, as vLLM's default
/// grammar backend does: a sampling model otherwise invents keys. A bare
/// `{"type": "object"}` (no `properties`) stays any object, as JSON Schema
/// reads it. `in_all_of`: the schema is one part of an `allOf`, whose parts
/// together list the properties, so it stays open.
fn close_objects(schema: &mut Value, in_all_of: bool) {
    let o = match schema {
        Value::Object(o) => o,
        // `items` as a list (a tuple, before `prefixItems`).
        Value::Array(list) => return list.iter_mut().for_each(|s| close_objects(s, false)),
        _ => return,
    };
    if o.contains_key("x-guidance") {
        return;
    }
    if o.contains_key("properties")
        && !in_all_of
        && !o.contains_key("additionalProperties")
        && !o.contains_key("unevaluatedProperties")
    {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in o.iter_mut() {
        let key = key.as_str();
        if SCHEMA_KEYWORDS.contains(&key) {
            close_objects(value, false);
        } else if SCHEMA_MAP_KEYWORDS.contains(&key) {
            if let Value::Object(map) = value {
                map.values_mut().for_each(|s| close_objects(s, false));
            }
        } else if SCHEMA_LIST_KEYWORDS.contains(&key) {
            if let Value::Array(list) = value {
                let all_of = key == "allOf";
                list.iter_mut().for_each(|s| close_objects(s, all_of));
            }
        }
    }
}

/// Largest integer JSON parsers read exactly (2^53 - 1).
const SAFE_INTEGER: i64 = 9_007_199_254_740_991;

/// Gives every `"type": "integer"` without bounds the range JSON parsers
/// read exactly: an unbounded integer lets a sampling model append digits
/// until it runs out of tokens.
fn bound_integers(schema: &mut Value) {
    match schema {
        Value::Object(o) => {
            let integer = match o.get("type") {
                Some(Value::String(t)) => t == "integer",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
                _ => false,
            };
            if integer {
                if !o.contains_key("minimum") && !o.contains_key("exclusiveMinimum") {
                    o.insert("minimum".into(), Value::from(-SAFE_INTEGER));
                }
                if !o.contains_key("maximum") && !o.contains_key("exclusiveMaximum") {
                    o.insert("maximum".into(), Value::from(SAFE_INTEGER));
                }
            }
            for (key, value) in o.iter_mut() {
                // Literal values are data, not schemas.
                if key != "const" && key != "enum" && key != "default" && key != "examples" {
                    bound_integers(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(bound_integers),
        _ => {}
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
            .map(Vec::from)
            .map_err(|e| reason(&e.to_string()))
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        self.0
            .consume_token(token)
            .map_err(|e| reason(&e.to_string()))
    }

    fn is_finished(&self) -> bool {
        self.0.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A byte-level word tokenizer of eight tokens, one per JSON piece.
    fn tiny_tokenizer() -> Tokenizer {
        let json = json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 7, "content": "<eos>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            // Byte-level: the space byte is written `Ġ`.
            "model": {"type": "WordLevel", "unk_token": "<eos>",
                      "vocab": {"{": 0, "}": 1, "\"": 2, "a": 3, ":": 4, "\u{120}": 5, "1": 6, "<eos>": 7}}
        });
        json.to_string().parse().unwrap()
    }

    fn allowed(state: &mut dyn ConstraintState) -> Vec<u32> {
        let mask = state.allowed().unwrap();
        (0..8)
            .filter(|&t| hearth_core::is_allowed(&mask, t))
            .collect()
    }

    #[test]
    fn masks_follow_the_grammar_token_by_token() {
        let compiler = GrammarCompiler::new(&tiny_tokenizer(), 7).unwrap();
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                            "required": ["a"], "additionalProperties": false});
        let mut state = compiler.json_schema(&schema).unwrap().start();
        // {"a": 1}  =  { " a " : space 1 }
        let path = [0u32, 2, 3, 2, 4, 5, 6, 1];
        for &token in &path {
            let ok = allowed(state.as_mut());
            assert_eq!(ok, vec![token], "only {token} may come next, not {ok:?}");
            state.accept(token).unwrap();
        }
        // The object is complete: only the end may follow.
        assert_eq!(allowed(state.as_mut()), vec![7]);
        // A token the grammar does not allow is an error, not a panic.
        let mut other = compiler.json_schema(&schema).unwrap().start();
        assert!(other.accept(1).is_err());
    }

    #[test]
    fn objects_allow_other_keys_only_when_their_schema_says_so() {
        let compiler = GrammarCompiler::new(&tiny_tokenizer(), 7).unwrap();
        // No properties listed (a tool without parameters): only `{}`.
        for schema in [
            json!({"type": "object", "properties": {}}),
            json!({"type": ["object"], "properties": {}, "required": []}),
        ] {
            let mut state = compiler.json_schema(&schema).unwrap().start();
            assert_eq!(allowed(state.as_mut()), vec![0]);
            state.accept(0).unwrap();
            assert_eq!(allowed(state.as_mut()), vec![1], "{schema}");
        }
        // Stated open, or a bare object schema: a key may start.
        for schema in [
            json!({"type": "object"}),
            json!({"type": "object", "additionalProperties": true}),
            json!({"type": "object", "additionalProperties": {"type": "integer"}}),
        ] {
            let mut state = compiler.json_schema(&schema).unwrap().start();
            state.accept(0).unwrap();
            assert_eq!(allowed(state.as_mut()), vec![1, 2], "{schema}");
        }
    }

    #[test]
    fn nested_object_schemas_are_closed_but_data_and_all_of_parts_are_not() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "a": {"properties": {"x": {"type": "string"}}},
                "properties": {"type": "object", "additionalProperties": {"type": "object", "properties": {}}},
                "b": {"type": "array", "items": {"type": ["object", "null"], "properties": {"y": {}}}},
                "c": {"const": {"type": "object", "properties": {}}},
                "d": {"allOf": [{"type": "object", "properties": {}}]},
                "f": {"type": "object"}
            },
            "$defs": {"e": {"type": "object", "properties": {}}},
            "anyOf": [{"type": "object", "properties": {}}]
        });
        close_objects(&mut schema, false);
        let p = &schema["properties"];
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(p["a"]["additionalProperties"], false);
        assert!(p.get("additionalProperties").is_none());
        assert_eq!(
            p["properties"]["additionalProperties"]["additionalProperties"],
            false
        );
        assert_eq!(p["b"]["items"]["additionalProperties"], false);
        assert!(p["c"]["const"].get("additionalProperties").is_none());
        assert!(p["d"]["allOf"][0].get("additionalProperties").is_none());
        assert_eq!(schema["$defs"]["e"]["additionalProperties"], false);
        assert_eq!(schema["anyOf"][0]["additionalProperties"], false);
        // A bare object schema stays any object.
        assert!(p["f"].get("additionalProperties").is_none());
    }

    #[test]
    fn errors_keep_their_reason_not_the_parser_state() {
        let long = "Current row has 2007 items; max is 2000\n<state>\nTokens: ...\n</state>";
        assert_eq!(reason(long), "Current row has 2007 items; max is 2000");
        assert_eq!(reason("too big\n<non-verbose/>"), "too big");
    }

    #[test]
    fn integers_get_bounds_unless_they_have_their_own() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "b": {"type": ["integer", "null"], "minimum": 0},
                "c": {"type": "array", "items": {"type": "integer"}},
                "d": {"const": {"type": "integer"}},
                "properties": {"type": "string"}
            }
        });
        bound_integers(&mut schema);
        let p = &schema["properties"];
        assert_eq!(p["a"]["maximum"], SAFE_INTEGER);
        assert_eq!(p["a"]["minimum"], -SAFE_INTEGER);
        assert_eq!(p["b"]["minimum"], 0);
        assert_eq!(p["b"]["maximum"], SAFE_INTEGER);
        assert_eq!(p["c"]["items"]["maximum"], SAFE_INTEGER);
        assert!(p["d"]["const"].get("maximum").is_none());
        assert!(p["properties"].get("maximum").is_none());
    }
}
