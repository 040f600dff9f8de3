//! Tools through a chat template that knows them: the default model's
//! weights under a catalogue entry whose `chat_template` is in the Hermes
//! style (tools listed in the system turn, calls in `<tool_call>` tags,
//! results in `tool` messages). Calls are enforced and parsed in that
//! format on chat and on the Responses API, whole and streamed, and the
//! tool messages render through the template.

mod common;

use common::raw::Raw;
use common::*;
use hearth_server::AppState;
use serde_json::{json, Value};
use std::sync::OnceLock;

const HERMES: &str = "test/smollm2-hermes";

/// A Hermes-style template over ChatML turns.
const TEMPLATE: &str = r#"{%- if tools -%}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call these functions:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call one with <tool_call>
{"name": <function name>, "arguments": <arguments object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' -%}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{% for m in messages -%}
{% if m.role == 'system' and loop.first -%}
{% elif m.role == 'assistant' and m.tool_calls -%}
<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>
{% endfor %}<|im_end|>
{% elif m.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif -%}
{% endfor -%}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

fn state() -> AppState {
    static STATE: OnceLock<AppState> = OnceLock::new();
    STATE
        .get_or_init(|| {
            let dir = temp_dir();
            let path = dir.join("catalog.toml");
            let folder = data_dir().join("models/HuggingFaceTB--SmolLM2-135M-Instruct");
            std::fs::write(
                &path,
                format!(
                    "[[model]]\nid = \"{HERMES}\"\nkind = \"chat\"\nformat = \"gguf\"\n\
                     context_length = 8192\n\
                     source = {{ type = \"local\", path = \"{}\" }}\n\
                     files = [{{ path = \"SmolLM2-135M-Instruct.Q4_1.gguf\" }}]\n\
                     chat_template = '''{TEMPLATE}'''\n",
                    folder.display()
                ),
            )
            .unwrap();
            let mut args = serve_args(vec![HERMES.to_string()], 64, 8);
            args.store.catalog = Some(path);
            let (store, project) = new_store();
            hearth_server::serve::build_state(&args, vec![KEY.to_string()], store, &project)
                .expect("loading the Hermes-template entry")
        })
        .clone()
}

async fn post(uri: &str, body: &Value) -> Raw {
    common::raw::post_json(&state(), uri, body).await
}

fn weather() -> Value {
    json!({"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30},
                       "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": false})
}

fn chat_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The current weather of a city.", "parameters": weather()}}])
}

fn check_arguments(arguments: &str) {
    let args: Value = serde_json::from_str(arguments).expect("arguments are JSON");
    assert!(args["city"].is_string(), "{args}");
    assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()));
}

#[tokio::test]
async fn chat_calls_come_in_the_templates_format_and_results_go_back() {
    let ask = json!({"model": HERMES, "tools": chat_tools(), "tool_choice": "required",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "max_tokens": 80, "temperature": 0.7, "seed": 1});
    let mut with_logprobs = ask.clone();
    with_logprobs["logprobs"] = json!(true);
    let reply = post("/v1/chat/completions", &with_logprobs).await;
    reply.expect_status(200);
    let body = reply.json();
    let choice = &body["choices"][0];
    // What the model wrote: the template's format, not Hearth's JSON array.
    let written: String = choice["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert!(
        written.starts_with("<tool_call>\n{\"name\": \"get_weather\""),
        "{written}"
    );
    assert!(written.trim_end().ends_with("</tool_call>"), "{written}");
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty());
    for call in calls {
        assert_eq!(call["function"]["name"], "get_weather");
        check_arguments(call["function"]["arguments"].as_str().unwrap());
    }
    // Streamed: the calls arrive whole at the end.
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let reply = post("/v1/chat/completions", &streamed).await;
    reply.expect_status(200);
    let text = String::from_utf8(reply.bytes.clone()).unwrap();
    assert!(text.contains("\"tool_calls\":[{"), "{text}");
    assert!(text.contains("\"finish_reason\":\"tool_calls\""), "{text}");
    assert!(!text.contains("<tool_call>"), "{text}");
    // The result goes back as a `tool` message the template renders.
    let reply = post(
        "/v1/chat/completions",
        &json!({"model": HERMES, "tools": chat_tools(), "max_tokens": 60, "temperature": 0,
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, clear sky"}
        ]}),
    )
    .await;
    reply.expect_status(200);
    let body = reply.json();
    let message = &body["choices"][0]["message"];
    // Under `auto` the answer is text or a call of the template's format.
    match body["choices"][0]["finish_reason"].as_str().unwrap() {
        "tool_calls" => check_arguments(
            message["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap(),
        ),
        "stop" => assert!(!message["content"].as_str().unwrap().starts_with('<')),
        // Cut by `max_tokens`: a call's prefix comes back as text.
        reason => assert_eq!(reason, "length"),
    }
}

#[tokio::test]
async fn responses_calls_come_in_the_templates_format() {
    let tools = json!([{"type": "function", "name": "get_weather", "parameters": weather()}]);
    let reply = post(
        "/v1/responses",
        &json!({"model": HERMES, "tools": tools, "tool_choice": "required",
            "input": "What is the weather in Oslo?", "max_output_tokens": 80,
            "parallel_tool_calls": false, "temperature": 0}),
    )
    .await;
    reply.expect_status(200);
    let first = reply.json();
    let output = first["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{first}");
    assert_eq!(output[0]["type"], "function_call");
    check_arguments(output[0]["arguments"].as_str().unwrap());
    let reply = post(
        "/v1/responses",
        &json!({"model": HERMES, "previous_response_id": first["id"], "tools": tools,
            "tool_choice": "none", "max_output_tokens": 30, "temperature": 0,
            "input": [{"type": "function_call_output", "call_id": output[0]["call_id"],
                       "output": "-3 degrees and snow"}]}),
    )
    .await;
    reply.expect_status(200);
    assert_eq!(reply.json()["output"][0]["type"], "message");
}
