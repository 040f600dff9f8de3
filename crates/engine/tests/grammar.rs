//! Constrained decoding in the engine with the default model's tokenizer
//! and weights: a JSON-schema grammar turns the same greedy request into
//! JSON of the schema, every sequence of a batch follows its own matcher,
//! and the grammar's end finishes the sequence with `stop`.

mod common;

use std::sync::Arc;

use candle_core::Device;
use hearth_core::{FinishReason, GenerateRequest, Priority, SamplingParams, TokenEvent};
use hearth_engine::grammar::GrammarCompiler;
use hearth_engine::load::load_gguf;
use hearth_engine::{EngineConfig, EngineHandle, EngineParts, TokenStream};
use serde_json::{json, Value};

fn start() -> (EngineHandle, GrammarCompiler, Arc<tokenizers::Tokenizer>) {
    let lm = load_gguf(&common::smollm_gguf(), &Device::Cpu).unwrap();
    let tokenizer = Arc::new(lm.tokenizer);
    let compiler = GrammarCompiler::new(&tokenizer, lm.eos_ids[0]).unwrap();
    let engine = EngineHandle::start(
        EngineParts {
            model: lm.model,
            tokenizer: tokenizer.clone(),
            eos_ids: lm.eos_ids,
            context_length: 2048,
        },
        EngineConfig::default(),
    )
    .unwrap();
    (engine, compiler, tokenizer)
}

fn submit(
    engine: &EngineHandle,
    prompt: Vec<u32>,
    params: SamplingParams,
    constraint: Option<Arc<dyn hearth_core::Constraint>>,
) -> TokenStream {
    engine
        .submit(GenerateRequest {
            id: "g".into(),
            prompt_ids: prompt,
            params,
            priority: Priority::Interactive,
            adapter: None,
            cache_scope: None,
            constraint,
        })
        .unwrap()
}

fn read(mut stream: TokenStream) -> (String, FinishReason) {
    let mut text = String::new();
    loop {
        match stream.blocking_recv().expect("a stream ends with Finished") {
            TokenEvent::Token { text: t, .. } => text.push_str(&t),
            TokenEvent::Finished {
                reason, text: t, ..
            } => {
                text.push_str(&t);
                return (text, reason);
            }
            TokenEvent::Error(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_schema_grammar_shapes_the_output_of_every_sequence() {
    let (engine, compiler, tokenizer) = start();
    let prompt = tokenizer
        .encode(
            "<|im_start|>user\nIs the sky blue?<|im_end|>\n<|im_start|>assistant\n",
            false,
        )
        .unwrap()
        .get_ids()
        .to_vec();
    let params = SamplingParams {
        max_tokens: Some(60),
        ..SamplingParams::greedy()
    };
    // Unconstrained, the model answers in prose.
    let (free, _) = read(submit(&engine, prompt.clone(), params.clone(), None));
    assert!(serde_json::from_str::<Value>(&free).is_err(), "{free}");

    let schema = json!({
        "type": "object",
        "properties": {
            "answer": {"type": "boolean"},
            "colour": {"enum": ["blue", "grey", "black"]}
        },
        "required": ["answer", "colour"],
        "additionalProperties": false
    });
    let grammar = compiler.json_schema(&schema).unwrap();
    // A batch of sampled sequences, each with its own matcher.
    let streams: Vec<_> = (0..4)
        .map(|i| {
            let params = SamplingParams {
                temperature: 1.0,
                seed: Some(i),
                max_tokens: Some(60),
                ..SamplingParams::default()
            };
            submit(&engine, prompt.clone(), params, Some(grammar.clone()))
        })
        .collect();
    for stream in streams {
        let (text, reason) = read(stream);
        assert_eq!(reason, FinishReason::Stop, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v["answer"].is_boolean(), "{text}");
        assert!(
            ["blue", "grey", "black"].contains(&v["colour"].as_str().unwrap()),
            "{text}"
        );
        assert_eq!(v.as_object().unwrap().len(), 2, "{text}");
    }
    // A schema the compiler cannot use is an error, not a panic.
    assert!(compiler
        .json_schema(&json!({"$ref": "#/$defs/none"}))
        .is_err());
}

/// A small JSON-schema checker for the keywords the schemas below use.
fn valid(v: &Value, s: &Value) -> bool {
    if let Some(options) = s.get("enum").and_then(Value::as_array) {
        return options.contains(v);
    }
    match s.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(o) = v.as_object() else { return false };
            let props = s["properties"].as_object().cloned().unwrap_or_default();
            let required = s["required"].as_array().cloned().unwrap_or_default();
            let closed = s["additionalProperties"] == json!(false);
            required.iter().all(|k| o.contains_key(k.as_str().unwrap()))
                && o.iter().all(|(k, x)| match props.get(k) {
                    Some(p) => valid(x, p),
                    None => !closed,
                })
        }
        Some("array") => v.as_array().is_some_and(|a| {
            a.len() as u64 >= s["minItems"].as_u64().unwrap_or(0)
                && a.len() as u64 <= s["maxItems"].as_u64().unwrap_or(u64::MAX)
                && a.iter().all(|x| valid(x, &s["items"]))
        }),
        Some("string") => v.as_str().is_some_and(|t| {
            t.chars().count() as u64 <= s["maxLength"].as_u64().unwrap_or(u64::MAX)
        }),
        Some("integer") => v.as_i64().is_some_and(|n| {
            n >= s["minimum"].as_i64().unwrap_or(i64::MIN)
                && n <= s["maximum"].as_i64().unwrap_or(i64::MAX)
        }),
        Some("number") => v.as_f64().is_some_and(|n| {
            n >= s["minimum"].as_f64().unwrap_or(f64::MIN)
                && n <= s["maximum"].as_f64().unwrap_or(f64::MAX)
        }),
        Some("boolean") => v.is_boolean(),
        _ => true,
    }
}

#[test]
fn twenty_prompts_with_varied_schemas_all_validate() {
    let (engine, compiler, tokenizer) = start();
    let s = |n: u64| format!("{n}");
    let schemas = [
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"]}),
        json!({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["age"]}),
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}),
        json!({"type": "object", "properties": {"mood": {"enum": ["happy", "sad", "calm"]}}, "required": ["mood"]}),
        json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}}, "required": ["tags"]}),
        json!({"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000}}, "required": ["price"]}),
        json!({"type": "object", "properties": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -10, "maximum": 10}, "y": {"type": "integer", "minimum": -10, "maximum": 10}}, "required": ["x", "y"], "additionalProperties": false}}, "required": ["point"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99}, "done": {"type": "boolean"}}, "required": ["id", "done"], "additionalProperties": false}, "maxItems": 3}}, "required": ["items"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"enum": ["FR", "DE", "JP"]}}, "required": ["city", "country"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 5}),
    ];
    let prompts = [
        "Give a name.",
        "How old?",
        "Is it fine?",
        "How do you feel?",
        "Tag this photo.",
        "What does it cost?",
        "Pick a point.",
        "List tasks.",
        "Where do you live?",
        "Some digits.",
    ];
    let mut streams = Vec::new();
    for i in 0..20 {
        // Closed objects, as strict structured output asks for: an open
        // one lets a sampling model add properties until it runs out.
        let mut schema = schemas[i % schemas.len()].clone();
        if schema["type"] == "object" && schema.get("additionalProperties").is_none() {
            schema["additionalProperties"] = json!(false);
        }
        let schema = &schema;
        let text = format!(
            "<|im_start|>user\n{} Answer in JSON.<|im_end|>\n<|im_start|>assistant\n",
            prompts[i % prompts.len()]
        );
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        let params = SamplingParams {
            temperature: 0.9,
            seed: Some(i as u64),
            max_tokens: Some(120),
            ..SamplingParams::default()
        };
        let grammar = compiler.json_schema(schema).unwrap();
        streams.push((
            s(i as u64),
            schema.clone(),
            submit(&engine, ids, params, Some(grammar)),
        ));
    }
    for (i, schema, stream) in streams {
        let (text, reason) = read(stream);
        assert_eq!(reason, FinishReason::Stop, "{i}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{i}: {e}: {text}"));
        assert!(valid(&v, &schema), "{i}: {text} does not match {schema}");
    }
}

/// An object schema of `count` properties of `property`, the first
/// `required` of them required.
fn wide(count: usize, property: Value, required: usize) -> Value {
    let properties: serde_json::Map<String, Value> = (0..count)
        .map(|i| (format!("p{i}"), property.clone()))
        .collect();
    let required: Vec<String> = (0..required).map(|i| format!("p{i}")).collect();
    json!({"type": "object", "properties": properties, "required": required})
}

#[test]
fn wide_schemas_compile_and_run_within_the_limits() {
    let (_engine, compiler, tokenizer) = start();
    for (name, schema) in [
        (
            "2000 integers",
            wide(2000, json!({"type": "integer"}), 2000),
        ),
        ("2000 numbers", wide(2000, json!({"type": "number"}), 2000)),
        (
            "2000 booleans",
            wide(2000, json!({"type": "boolean"}), 2000),
        ),
        (
            "500 optional integers",
            wide(500, json!({"type": "integer"}), 0),
        ),
    ] {
        let started = std::time::Instant::now();
        let grammar = compiler
            .json_schema(&schema)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut state = grammar.start();
        // Steps along the lowest allowed token: every mask is computed.
        let mut text = String::new();
        for _ in 0..40 {
            let mask = state.allowed().unwrap_or_else(|e| panic!("{name}: {e}"));
            let token = (0..tokenizer.get_vocab_size(true) as u32)
                .find(|&t| hearth_core::is_allowed(&mask, t))
                .unwrap();
            text.push_str(&tokenizer.decode(&[token], false).unwrap());
            state.accept(token).unwrap();
        }
        eprintln!("{name}: {:?} {text}", started.elapsed());
        assert!(text.starts_with("{\"p"), "{name}: {text}");
    }
}

/// Whether `constraint` takes `text` (as the tokenizer splits it) and may
/// end after it.
fn takes_whole(
    constraint: &Arc<dyn hearth_core::Constraint>,
    tokenizer: &tokenizers::Tokenizer,
    eos: u32,
    text: &str,
) -> bool {
    let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    let mut state = constraint.start();
    for id in ids {
        if state.accept(id).is_err() {
            return false;
        }
    }
    let mask = state.allowed().unwrap();
    state.is_finished() || hearth_core::is_allowed(&mask, eos)
}

#[test]
fn tagged_tool_calls_hold_at_most_their_bound() {
    let lm = load_gguf(&common::smollm_gguf(), &Device::Cpu).unwrap();
    let eos = lm.eos_ids[0];
    let compiler = GrammarCompiler::new(&lm.tokenizer, eos).unwrap();
    let schema = json!({"type": "object",
        "properties": {"name": {"const": "f"}, "arguments": {"type": "object", "properties": {}}},
        "required": ["name", "arguments"], "additionalProperties": false});
    let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    for (max, calls, taken) in [(1, 1, true), (1, 2, false), (3, 3, true), (3, 4, false)] {
        let grammar = compiler.tagged_tool_calls(&schema, max, false).unwrap();
        let text = vec![call; calls].join("\n");
        assert_eq!(
            takes_whole(&grammar, &lm.tokenizer, eos, &text),
            taken,
            "{calls} calls against a bound of {max}"
        );
    }
}
