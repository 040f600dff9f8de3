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
