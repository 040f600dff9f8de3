//! `/v1/responses` with the real default model, in-process: whole and
//! streamed responses, `incomplete`, stored responses and chaining, the
//! by-id routes across projects, and bad input in the API's shapes.

mod common;

use common::raw::{other_project, shape_a, shape_c};
use common::*;
use serde_json::{json, Value};

async fn create(body: Value) -> Value {
    let reply = post(&with_model(), "/v1/responses", &body.to_string()).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text);
    reply.json()
}

fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|item| item["content"].as_array().unwrap().iter())
        .filter(|part| part["type"] == "output_text")
        .map(|part| part["text"].as_str().unwrap().to_string())
        .collect()
}

fn colours(text: &str) -> usize {
    let lower = text.to_lowercase();
    ["red", "blue", "yellow"]
        .iter()
        .filter(|c| lower.contains(*c))
        .count()
}

async fn raw(method: &str, uri: &str, key: &str, body: Option<Value>) -> common::raw::Raw {
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let content_type = (!bytes.is_empty()).then_some("application/json");
    common::raw::request(&with_model(), method, uri, Some(key), content_type, bytes).await
}

#[tokio::test]
async fn a_string_input_gets_a_completed_response() {
    let r = create(json!({
        "model": MODEL, "input": "List three primary colors.",
        "temperature": 0, "max_output_tokens": 64, "metadata": {"case": "colours"},
    }))
    .await;
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed", "{r}");
    assert!(r["error"].is_null() && r["incomplete_details"].is_null());
    assert_eq!(r["model"], MODEL);
    assert_eq!(r["metadata"], json!({"case": "colours"}));
    assert_eq!(
        (r["store"].clone(), r["tools"].clone()),
        (json!(true), json!([]))
    );
    assert_eq!(r["max_output_tokens"], 64);
    assert!(r["top_logprobs"].is_null(), "{r}");
    let item = &r["output"][0];
    assert_eq!(item["type"], "message");
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        (item["role"].as_str(), item["status"].as_str()),
        (Some("assistant"), Some("completed"))
    );
    assert_eq!(item["content"][0]["type"], "output_text");
    assert_eq!(item["content"][0]["annotations"], json!([]));
    // No log-probabilities unless `include` asks for them.
    assert_eq!(item["content"][0]["logprobs"], json!([]), "{r}");
    assert_eq!(colours(&output_text(&r)), 3, "{r}");
    let usage = &r["usage"];
    let (input, output) = (
        usage["input_tokens"].as_u64().unwrap(),
        usage["output_tokens"].as_u64().unwrap(),
    );
    assert!(input > 5 && output > 0, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), input + output);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    assert!(usage["input_tokens_details"]["cached_tokens"].is_u64());
    // Every field of OpenAI's Response object (its API reference), and no
    // other.
    let mut fields: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "background",
            "created_at",
            "error",
            "id",
            "incomplete_details",
            "instructions",
            "max_output_tokens",
            "metadata",
            "model",
            "object",
            "output",
            "parallel_tool_calls",
            "previous_response_id",
            "reasoning",
            "service_tier",
            "status",
            "store",
            "temperature",
            "text",
            "tool_choice",
            "tools",
            "top_logprobs",
            "top_p",
            "truncation",
            "usage",
            "user",
        ]
    );
    let usage_fields: Vec<&str> = usage
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        usage_fields,
        [
            "input_tokens",
            "input_tokens_details",
            "output_tokens",
            "output_tokens_details",
            "total_tokens"
        ]
    );
}

#[tokio::test]
async fn message_items_with_instructions_answer_as_chat_does() {
    let input = json!([{"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "List three primary colors."}]}]);
    let r = create(
        json!({"model": MODEL, "input": input, "instructions": "Answer in a few words.",
        "temperature": 0, "max_output_tokens": 24}),
    )
    .await;
    assert_eq!(r["instructions"], "Answer in a few words.");
    // The same conversation through chat: the same prompt, the same text.
    let chat = post(
        &with_model(),
        "/v1/chat/completions",
        &json!({"model": MODEL, "temperature": 0, "max_tokens": 24, "messages": [
            {"role": "system", "content": "Answer in a few words."},
            {"role": "user", "content": "List three primary colors."},
        ]})
        .to_string(),
    )
    .await
    .json();
    assert_eq!(
        output_text(&r),
        chat["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
    assert!(colours(&output_text(&r)) >= 2, "{r}");
}

#[tokio::test]
async fn max_output_tokens_cuts_to_incomplete() {
    let r = create(
        json!({"model": MODEL, "input": "Write a long story about a dragon.",
        "max_output_tokens": 4, "temperature": 0}),
    )
    .await;
    assert_eq!(r["status"], "incomplete", "{r}");
    assert_eq!(
        r["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(r["output"][0]["status"], "incomplete");
    assert_eq!(r["usage"]["output_tokens"], 4);
}

#[tokio::test]
async fn the_stream_sends_typed_events_in_order_then_done() {
    let reply = post(
        &with_model(),
        "/v1/responses",
        &json!({"model": MODEL, "input": "Say hello to Ada.", "stream": true,
            "temperature": 0, "max_output_tokens": 16})
        .to_string(),
    )
    .await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text);
    assert!(reply.content_type.starts_with("text/event-stream"));
    let events = sse_json(&reply.text);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64, "{e}");
    }
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.output_text.delta")
        .count();
    assert!(deltas > 0, "{kinds:?}");
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]);
    let last = *kinds.last().unwrap();
    assert!(
        ["response.completed", "response.incomplete"].contains(&last),
        "{kinds:?}"
    );
    expected.push(last);
    assert_eq!(kinds, expected);
    assert_eq!(events[0]["response"]["status"], "in_progress");
    let joined: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let done = events.last().unwrap()["response"].clone();
    assert_eq!(output_text(&done), joined);
    assert_eq!(events[deltas + 4]["text"].as_str(), Some(joined.as_str()));
    let item_id = done["output"][0]["id"].as_str().unwrap();
    assert!(events[4..4 + deltas]
        .iter()
        .all(|e| e["item_id"] == item_id));
    // Stored: the same response comes back by id.
    let got = raw(
        "GET",
        &format!("/v1/responses/{}", done["id"].as_str().unwrap()),
        KEY,
        None,
    )
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), done);
}

#[tokio::test]
async fn previous_response_id_continues_the_conversation() {
    let first = create(
        json!({"model": MODEL, "temperature": 0, "max_output_tokens": 12,
        "instructions": "Be brief.",
        "input": "Remember this number: 4817. Reply with OK."}),
    )
    .await;
    let second = create(
        json!({"model": MODEL, "temperature": 0, "max_output_tokens": 12,
        "previous_response_id": first["id"], "input": "Which number did I ask you to remember?"}),
    )
    .await;
    assert_eq!(second["previous_response_id"], first["id"]);
    // The engine saw turn 1 (not its instructions) then turn 2: exactly the
    // prompt chat builds from that conversation.
    let chat = post(
        &with_model(),
        "/v1/chat/completions",
        &json!({"model": MODEL, "temperature": 0, "max_tokens": 12, "messages": [
            {"role": "user", "content": "Remember this number: 4817. Reply with OK."},
            {"role": "assistant", "content": output_text(&first)},
            {"role": "user", "content": "Which number did I ask you to remember?"},
        ]})
        .to_string(),
    )
    .await
    .json();
    assert_eq!(
        second["usage"]["input_tokens"],
        chat["usage"]["prompt_tokens"]
    );
    // Turn 1's prompt blocks were still in the prefix cache.
    let cached = second["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 16, "{second}");
    assert!(cached < second["usage"]["input_tokens"].as_u64().unwrap());
    assert_eq!(
        output_text(&second),
        chat["choices"][0]["message"]["content"].as_str().unwrap()
    );
    // A third turn chains through both.
    let third = create(
        json!({"model": MODEL, "temperature": 0, "max_output_tokens": 4,
        "previous_response_id": second["id"], "input": "Thanks."}),
    )
    .await;
    assert!(
        third["usage"]["input_tokens"].as_u64() > second["usage"]["input_tokens"].as_u64(),
        "{third}"
    );
    // Unknown, or not stored: 400 naming the field.
    for id in ["resp_nope", "resp_"] {
        let reply = raw(
            "POST",
            "/v1/responses",
            KEY,
            Some(json!({"model": MODEL, "input": "x", "previous_response_id": id})),
        )
        .await;
        assert_eq!(
            reply.status,
            400,
            "{}",
            String::from_utf8_lossy(&reply.bytes)
        );
        assert_eq!(reply.json()["error"]["param"], "previous_response_id");
    }
    let unstored =
        create(json!({"model": MODEL, "input": "hi", "store": false, "max_output_tokens": 2}))
            .await;
    assert_eq!(unstored["store"], false);
    let reply = raw(
        "POST",
        "/v1/responses",
        KEY,
        Some(json!({"model": MODEL, "input": "x", "previous_response_id": unstored["id"]})),
    )
    .await;
    assert_eq!(reply.status, 400);
    let got = raw(
        "GET",
        &format!("/v1/responses/{}", unstored["id"].as_str().unwrap()),
        KEY,
        None,
    )
    .await;
    shape_a(&got, 403);
}

#[tokio::test]
async fn stored_responses_are_got_listed_deleted_and_private() {
    let r = create(json!({"model": MODEL, "max_output_tokens": 3, "input": [
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Bye"}]},
    ]}))
    .await;
    let id = r["id"].as_str().unwrap();
    // Nothing runs in the background, so nothing streams again.
    // pydantic's booleans, as OpenAI's server takes them.
    for yes in ["true", "1", "yes"] {
        let again = raw(
            "GET",
            &format!("/v1/responses/{id}?stream={yes}"),
            KEY,
            None,
        )
        .await;
        assert_eq!(again.status, 400, "{yes}: {}", common::raw::text(&again));
        assert_eq!(again.json()["error"]["param"], "stream");
    }
    for no in ["false", "0", "off"] {
        let got = raw("GET", &format!("/v1/responses/{id}?stream={no}"), KEY, None).await;
        assert_eq!(got.json(), r, "{no}");
    }
    let bad = raw(
        "GET",
        &format!("/v1/responses/{id}?stream=maybe"),
        KEY,
        None,
    )
    .await;
    assert_eq!(bad.status, 422, "{}", common::raw::text(&bad));
    let items = raw("GET", &format!("/v1/responses/{id}/input_items"), KEY, None)
        .await
        .json();
    assert_eq!(items["object"], "list");
    let data = items["data"].as_array().unwrap();
    let roles: Vec<&str> = data.iter().map(|i| i["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user", "developer"],
        "newest first"
    );
    assert_eq!(
        data[1]["content"][0],
        json!({"type": "output_text", "text": "Hello."})
    );
    assert_eq!(
        data[0]["content"][0],
        json!({"type": "input_text", "text": "Bye"})
    );
    assert_eq!(
        (items["first_id"].clone(), items["has_more"].clone()),
        (data[0]["id"].clone(), json!(false))
    );
    let page = raw(
        "GET",
        &format!("/v1/responses/{id}/input_items?order=asc&limit=2"),
        KEY,
        None,
    )
    .await
    .json();
    assert_eq!(page["data"][0]["role"], "developer");
    assert_eq!(page["has_more"], true);
    let after = page["last_id"].as_str().unwrap();
    let rest = raw(
        "GET",
        &format!("/v1/responses/{id}/input_items?order=asc&after={after}"),
        KEY,
        None,
    )
    .await
    .json();
    assert_eq!(rest["data"].as_array().unwrap().len(), 2);
    assert_eq!(rest["has_more"], false);
    let bad = raw(
        "GET",
        &format!("/v1/responses/{id}/input_items?limit=0"),
        KEY,
        None,
    )
    .await;
    assert_eq!(bad.status, 400);

    // Another account sees nothing: 403, as for a missing id.
    let (_, stranger) = other_project(&with_model()).await;
    let theirs = raw("GET", &format!("/v1/responses/{id}"), &stranger, None).await;
    let missing = raw("GET", "/v1/responses/resp_missing", &stranger, None).await;
    assert_eq!(shape_a(&theirs, 403), shape_a(&missing, 403));
    shape_a(
        &raw("DELETE", &format!("/v1/responses/{id}"), &stranger, None).await,
        403,
    );
    shape_a(
        &raw(
            "GET",
            &format!("/v1/responses/{id}/input_items"),
            &stranger,
            None,
        )
        .await,
        403,
    );

    let deleted = raw("DELETE", &format!("/v1/responses/{id}"), KEY, None).await;
    assert_eq!(
        deleted.json(),
        json!({"id": id, "object": "response.deleted", "deleted": true})
    );
    shape_a(
        &raw("GET", &format!("/v1/responses/{id}"), KEY, None).await,
        403,
    );
    shape_a(
        &raw("DELETE", &format!("/v1/responses/{id}"), KEY, None).await,
        403,
    );
}

#[tokio::test]
async fn bad_input_gets_the_api_shapes() {
    let missing_model = raw("POST", "/v1/responses", KEY, Some(json!({"input": "x"}))).await;
    assert_eq!(shape_c(&missing_model)["loc"], json!(["body", "model"]));
    let wrong_input = raw(
        "POST",
        "/v1/responses",
        KEY,
        Some(json!({"model": MODEL, "input": 42})),
    )
    .await;
    shape_c(&wrong_input);
    let unknown = raw(
        "POST",
        "/v1/responses",
        KEY,
        Some(json!({"model": "no/such-model", "input": "x"})),
    )
    .await;
    shape_a(&unknown, 404);
    for (extra, param) in [
        (
            json!({"tools": [{"type": "file_search", "vector_store_ids": []}]}),
            "tools[0].type",
        ),
        (
            json!({"text": {"format": {"type": "json_schema"}}}),
            "text.format",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"max_output_tokens": 1_000_000_000_000i64}),
            "max_output_tokens",
        ),
        (json!({"include": ["bogus.thing"]}), "include"),
        (json!({"include": ["file_search_call.results"]}), "include"),
        (json!({"top_logprobs": 21}), "top_logprobs"),
        (json!({"conversation": "conv_1"}), "conversation"),
        (json!({"prompt": {"id": "pmpt_1"}}), "prompt"),
        (json!({"text": {"verbosity": "low"}}), "text.verbosity"),
        // Truncation drops turns, but cannot make room for an output
        // budget past the context: that is the budget's fault.
        (
            json!({"truncation": "auto", "max_output_tokens": 1_000_000}),
            "max_output_tokens",
        ),
        (
            json!({"text": {"format": {"type": "json_schema", "name": "x"}}}),
            "text.format.schema",
        ),
    ] {
        let mut body = json!({"model": MODEL, "input": "x"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let reply = raw("POST", "/v1/responses", KEY, Some(body.clone())).await;
        assert_eq!(
            reply.status,
            400,
            "{body}: {}",
            String::from_utf8_lossy(&reply.bytes)
        );
        assert_eq!(reply.json()["error"]["param"], param, "{body}");
    }
    // And the server answers normally afterwards; `text` without `format`
    // is plain text.
    let ok = create(
        json!({"model": MODEL, "input": "Hi", "max_output_tokens": 2,
        "text": {"verbosity": "medium"}}),
    )
    .await;
    assert_eq!(ok["status"], "incomplete");
    assert_eq!(ok["text"]["format"], json!({"type": "text"}));
}

/// `value` with every float rounded to f32.
fn f32s(value: &Value) -> Value {
    match value {
        Value::Number(n) if n.is_f64() => json!(n.as_f64().unwrap() as f32),
        Value::Array(items) => Value::Array(items.iter().map(f32s).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), f32s(v))).collect())
        }
        other => other.clone(),
    }
}

/// The text part's log-probabilities, checked for shape.
fn part_logprobs(response: &Value, top: usize) -> Vec<Value> {
    let part = &response["output"][0]["content"][0];
    let logprobs = part["logprobs"].as_array().expect("logprobs").clone();
    for lp in &logprobs {
        assert!(lp["token"].is_string() && lp["bytes"].is_array(), "{lp}");
        assert!(lp["logprob"].as_f64().unwrap() <= 0.0, "{lp}");
        assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), top, "{lp}");
    }
    logprobs
}

#[tokio::test]
async fn include_gives_the_text_part_and_its_deltas_logprobs() {
    let body = json!({"model": MODEL, "input": "hi", "max_output_tokens": 3, "temperature": 0,
        "top_logprobs": 2, "include": ["message.output_text.logprobs"]});
    let r = create(body.clone()).await;
    assert_eq!(r["top_logprobs"], 2, "{r}");
    let logprobs = part_logprobs(&r, 2);
    assert_eq!(logprobs.len(), 3, "{r}");
    // The same numbers chat completions give for the same conversation.
    let chat = post(
        &with_model(),
        "/v1/chat/completions",
        &json!({"model": MODEL, "temperature": 0, "max_tokens": 3, "logprobs": true,
            "top_logprobs": 2, "messages": [{"role": "user", "content": "hi"}]})
        .to_string(),
    )
    .await
    .json();
    assert_eq!(
        json!(logprobs),
        chat["choices"][0]["logprobs"]["content"],
        "{chat}"
    );
    // Kept with the stored response.
    let got = raw(
        "GET",
        &format!("/v1/responses/{}", r["id"].as_str().unwrap()),
        KEY,
        None,
    )
    .await;
    assert_eq!(got.json(), r);

    // Streamed: the deltas carry them, joined they are the part's.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let reply = post(&with_model(), "/v1/responses", &streamed.to_string()).await;
    let events = sse_json(&reply.text);
    let deltas: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .flat_map(|e| e["logprobs"].as_array().unwrap().clone())
        .collect();
    let done = &events.last().unwrap()["response"];
    // The same numbers, printed alike in every event: the completed
    // response's part equals the stored (and whole) response's.
    assert_eq!(
        json!(part_logprobs(done, 2)),
        json!(part_logprobs(&r, 2)),
        "{done}"
    );
    assert!(
        !reply.text.contains("00000000") && !reply.text.contains("99999999"),
        "widened f32 digits in the stream: {}",
        reply.text
    );
    assert_eq!(f32s(&json!(deltas)), f32s(&json!(logprobs)));
    let text_done = events
        .iter()
        .find(|e| e["type"] == "response.output_text.done")
        .unwrap();
    assert_eq!(f32s(&text_done["logprobs"]), f32s(&json!(logprobs)));

    // Without `include`: `top_logprobs` echoed, deltas' lists empty.
    let mut plain = streamed;
    plain.as_object_mut().unwrap().remove("include");
    let reply = post(&with_model(), "/v1/responses", &plain.to_string()).await;
    let events = sse_json(&reply.text);
    assert!(events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .all(|e| e["logprobs"] == json!([])));
    let done = &events.last().unwrap()["response"];
    assert_eq!(done["top_logprobs"], 2);
    assert_eq!(done["output"][0]["content"][0]["logprobs"], json!([]));
}

#[tokio::test]
async fn a_stream_the_engine_ends_with_an_error_is_stored_failed() {
    // A fresh engine that runs one sequence: a long completion holds it,
    // the streamed response waits in the queue, then the engine stops.
    let state = with_tiny_queue();
    let long = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": true});
    let s1 = state.clone();
    let first = tokio::spawn(async move { post(&s1, "/v1/completions", &long.to_string()).await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let s2 = state.clone();
    let body = json!({"model": MODEL, "input": "Say hi.", "stream": true, "max_output_tokens": 8});
    let streamed = tokio::spawn(async move { post(&s2, "/v1/responses", &body.to_string()).await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    state.chat[MODEL].engine.stop();
    let reply = streamed.await.unwrap();
    first.await.unwrap();
    let events: Vec<Value> = sse_events(&reply.text)
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "response.created", "{}", reply.text);
    assert_eq!(events.last().unwrap()["type"], "error", "{}", reply.text);
    let id = events[0]["response"]["id"].as_str().unwrap();
    let got = common::raw::get(&state, &format!("/v1/responses/{id}"), Some(KEY)).await;
    assert_eq!(got.status, 200);
    let got = got.json();
    assert_eq!(got["status"], "failed", "{got}");
    assert!(
        got["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not running"),
        "{got}"
    );
}

#[tokio::test]
async fn input_tokens_counts_what_create_would_send() {
    async fn count(body: Value) -> common::raw::Raw {
        raw("POST", "/v1/responses/input_tokens", KEY, Some(body)).await
    }
    let body = json!({"model": MODEL, "instructions": "Be brief.",
        "input": "Name a large animal.", "max_output_tokens": 1});
    let counted = count(body.clone()).await;
    assert_eq!(counted.status, 200, "{}", common::raw::text(&counted));
    let counted = counted.json();
    assert_eq!(counted["object"], "response.input_tokens");
    let made = create(body).await;
    assert_eq!(counted["input_tokens"], made["usage"]["input_tokens"]);
    // The conversation of `previous_response_id` and the tools count too.
    let follow = json!({"model": MODEL, "previous_response_id": made["id"],
        "input": "Where does it live?", "max_output_tokens": 1});
    let alone = count(json!({"model": MODEL, "input": "Where does it live?"}))
        .await
        .json()["input_tokens"]
        .as_u64()
        .unwrap();
    let chained = count(follow.clone()).await.json();
    assert!(
        chained["input_tokens"].as_u64().unwrap() > alone,
        "{chained}"
    );
    assert_eq!(
        chained["input_tokens"],
        create(follow).await["usage"]["input_tokens"]
    );
    let tools = json!([{"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let with_tools = count(json!({"model": MODEL, "input": "Where does it live?", "tools": tools}))
        .await
        .json();
    assert!(
        with_tools["input_tokens"].as_u64().unwrap() > alone,
        "{with_tools}"
    );
    // Checked as create checks: the same errors, in the API's shapes.
    shape_c(&count(json!({"input": "x"})).await);
    shape_a(
        &count(json!({"model": "no/such-model", "input": "x"})).await,
        404,
    );
    let unknown =
        count(json!({"model": MODEL, "input": "x", "previous_response_id": "resp_nope"})).await;
    assert_eq!(unknown.status, 400);
    assert_eq!(unknown.json()["error"]["param"], "previous_response_id");
    let hosted =
        count(json!({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]})).await;
    assert_eq!(hosted.status, 400);
    assert_eq!(hosted.json()["error"]["param"], "tools[0].type");
    // Only POST; a GET is not taken for a response id.
    let get = raw("GET", "/v1/responses/input_tokens", KEY, None).await;
    assert_eq!(get.status, 405, "{}", common::raw::text(&get));
}
