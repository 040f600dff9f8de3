//! The last touches on the generated document (as JSON): names for the
//! generic schemas, the error responses every operation shares, and
//! `info.version`.

use serde_json::{json, Map, Value};

/// Generic instances as utoipa names them, the names they get, and their
/// descriptions (the generic type's would speak of type parameters).
const RENAMES: &[(&str, &str, &str)] = &[
    (
        "Completion_ChatChoice_UsageInfo",
        "ChatCompletion",
        "A chat completion (`chat.completion`).",
    ),
    (
        "Completion_CompletionChoice_UsageInfo",
        "TextCompletion",
        "A text completion (`text_completion`).",
    ),
    (
        "Completion_CompletionChoice_Option_UsageInfo",
        "CompletionChunk",
        "A stream chunk of a completion (`text_completion`); `usage` is null except in \
         the final usage chunk, whose `choices` is empty.",
    ),
    (
        "FineTuningList_FineTuningJob",
        "FineTuningJobList",
        "A page of fine-tuning jobs.",
    ),
    (
        "FineTuningList_FineTuningEvent",
        "FineTuningEventList",
        "A page of a job's events.",
    ),
    (
        "FineTuningList_FineTuningCheckpoint",
        "FineTuningCheckpointList",
        "A page of a job's checkpoints.",
    ),
];

/// Untagged unions whose branches overlap (`[]` is each kind of array):
/// `anyOf`, since `oneOf` would refuse a value two branches accept.
const OVERLAPPING_UNIONS: &[&str] = &["Prompt"];

/// Answers of the key check (`auth.rs`), on every operation that needs a key.
const KEYED: &[(u16, &str, &str)] = &[
    (400, "ErrorDetail", "`ai_project_id` is malformed."),
    (
        401,
        "ErrorDetail",
        "The API key is missing, wrong or revoked.",
    ),
    (
        403,
        "ErrorDetail",
        "The project or the resource is not the key's, or does not exist (the same \
         answer); or an admin route without an admin key.",
    ),
    (
        422,
        "ValidationError",
        "The body or the query does not parse: a missing field, a wrong type, an unknown \
         value, `ai_project_id` given twice.",
    ),
];

/// Answers of the layers around every route (`layers.rs`).
const EVERY: &[(u16, &str, &str)] = &[
    (500, "ErrorDetail", "An unexpected error; try again later."),
    (
        503,
        "ErrorDetail",
        "As many requests in flight as `--max-concurrent-requests` allows (with \
         `Retry-After`), or the request ran over `--request-timeout-secs`.",
    ),
];

/// Operations admitted by the usage ledger (`usage/`): a spent budget is
/// 402 on each; the token quota is 429 on all but new fine-tuning jobs.
const METERED: &[(&str, bool)] = &[
    ("createCompletion", true),
    ("createChatCompletion", true),
    ("createResponse", true),
    ("createEmbedding", true),
    ("createRerank", true),
    ("createFineTuningJob", false),
];

/// The operations of app.rs's inference router, behind
/// `forward::forward_remote`: every answer names the node that made it.
const FORWARDED: &[&str] = &[
    "createCompletion",
    "createChatCompletion",
    "createResponse",
    "createEmbedding",
    "createRerank",
    "createImage",
];

const NODE_HEADER: &str = "The id of the node that made this answer (`GET /v1/admin/nodes`): \
    this one, or the node of the store that serves the model, to which the request was sent on.";

const BUDGET_SPENT: &str = "The project's spending budget is exhausted: add funds (an admin \
    raises it with PUT /v1/admin/projects/{project_id}/budget).";
const QUOTA_EXCEEDED: &str = "The project's token quota for the model cannot hold the request \
    now; the detail and `Retry-After` give the seconds to wait.";

/// Applies the renames and shared responses and sets `info.version`.
pub fn finish(doc: Value, version: &str) -> Value {
    let mut text = doc.to_string();
    for (from, to, _) in RENAMES {
        text = text.replace(&format!("\"{from}\""), &format!("\"{to}\""));
        text = text.replace(
            &format!("\"#/components/schemas/{from}\""),
            &format!("\"#/components/schemas/{to}\""),
        );
    }
    let mut doc: Value = serde_json::from_str(&text).expect("the document is JSON");
    doc["info"]["version"] = json!(version);
    let schemas = &mut doc["components"]["schemas"];
    for (_, name, description) in RENAMES {
        if let Some(schema) = schemas.get_mut(*name).and_then(Value::as_object_mut) {
            schema.insert("description".into(), json!(description));
        }
    }
    for name in OVERLAPPING_UNIONS {
        if let Some(schema) = schemas.get_mut(*name).and_then(Value::as_object_mut) {
            if let Some(branches) = schema.remove("oneOf") {
                schema.insert("anyOf".into(), branches);
            }
        }
    }
    let global_keyed = needs_key(doc.get("security"));
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for op in item.values_mut() {
                let keyed = match op.get("security") {
                    Some(security) => needs_key(Some(security)),
                    None => global_keyed,
                };
                let metered = op
                    .get("operationId")
                    .and_then(Value::as_str)
                    .and_then(|id| METERED.iter().find(|(m, _)| *m == id))
                    .map(|(_, quota)| *quota);
                let forwarded = op
                    .get("operationId")
                    .and_then(Value::as_str)
                    .is_some_and(|id| FORWARDED.contains(&id));
                let responses = op
                    .as_object_mut()
                    .expect("an operation is an object")
                    .entry("responses")
                    .or_insert_with(|| json!({}));
                if let Some(quota) = metered {
                    add_response(responses, 402, "ErrorDetail", BUDGET_SPENT);
                    if quota {
                        add_response(responses, 429, "ErrorDetail", QUOTA_EXCEEDED);
                    }
                }
                let shared = if keyed { KEYED } else { &[] };
                for (status, shape, description) in shared.iter().chain(EVERY) {
                    add_response(responses, *status, shape, description);
                }
                if forwarded {
                    add_node_header(responses);
                }
            }
        }
    }
    doc
}

/// Documents `x-hearth-node` on every response of an operation.
fn add_node_header(responses: &mut Value) {
    let responses = responses.as_object_mut().expect("responses is an object");
    for response in responses.values_mut() {
        let response = response.as_object_mut().expect("a response is an object");
        let headers = response
            .entry("headers")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("headers is an object");
        headers.insert(
            crate::forward::NODE.into(),
            json!({ "description": NODE_HEADER, "schema": { "type": "string" } }),
        );
    }
}

/// Whether a `security` list requires a key (it has a non-empty requirement).
fn needs_key(security: Option<&Value>) -> bool {
    security.and_then(Value::as_array).is_some_and(|list| {
        list.iter()
            .any(|r| r.as_object().is_some_and(|o| !o.is_empty()))
    })
}

/// Adds `status` with a JSON body of schema `shape`; when the operation
/// already documents `status`, the body becomes `anyOf` both shapes and the
/// descriptions are joined.
fn add_response(responses: &mut Value, status: u16, shape: &str, description: &str) {
    let reference = json!({ "$ref": format!("#/components/schemas/{shape}") });
    let responses = responses.as_object_mut().expect("responses is an object");
    let Some(existing) = responses.get_mut(&status.to_string()) else {
        responses.insert(
            status.to_string(),
            json!({
                "description": description,
                "content": { "application/json": { "schema": reference } },
            }),
        );
        return;
    };
    let existing = existing.as_object_mut().expect("a response is an object");
    let joined = match existing.get("description").and_then(Value::as_str) {
        Some(d) if !d.is_empty() => format!("{d} Or: {description}"),
        _ => description.to_string(),
    };
    existing.insert("description".into(), json!(joined));
    let content = existing
        .entry("content")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("content is an object");
    let media = content
        .entry("application/json")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("a media type is an object");
    let mut options: Vec<Value> = match media.remove("schema") {
        Some(Value::Object(mut schema)) => match schema.remove("anyOf") {
            Some(Value::Array(items)) => items,
            _ => vec![Value::Object(schema)],
        },
        _ => Vec::new(),
    };
    if !options.contains(&reference) {
        options.push(reference);
    }
    let schema = if options.len() == 1 {
        options.pop().unwrap_or_default()
    } else {
        let mut any = Map::new();
        any.insert("anyOf".into(), Value::Array(options));
        Value::Object(any)
    };
    media.insert("schema".into(), schema);
}
