//! `GET /openapi.json`: an OpenAPI 3.1 document with a dated version, that
//! describes every route `app.rs` serves (and nothing else), whose
//! references resolve, and whose responses match what the server answers.

mod common;

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use common::{bare_state, KEY};
use hearth_server::AppState;

#[path = "openapi/schema_check.rs"]
mod schema_check;

const METHODS: [&str; 8] = [
    "get", "post", "put", "patch", "delete", "head", "options", "trace",
];

struct Answer {
    status: u16,
    content_type: String,
    body: Vec<u8>,
}

async fn call(
    state: &AppState,
    key: Option<&str>,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Answer {
    let mut builder = Request::builder()
        .method(method.to_uppercase().as_str())
        .uri(uri);
    if let Some(key) = key {
        builder = builder.header("authorization", format!("Bearer {key}"));
    }
    if let Some(content_type) = content_type {
        builder = builder.header("content-type", content_type);
    }
    let response = hearth_server::app(state.clone())
        .oneshot(builder.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        content_type,
        body: body.to_vec(),
    }
}

/// The document as the server serves it.
async fn served_document(state: &AppState) -> Value {
    let answer = call(state, None, "get", "/openapi.json", None, Vec::new()).await;
    assert_eq!(answer.status, 200);
    assert!(answer.content_type.starts_with("application/json"));
    serde_json::from_slice(&answer.body).expect("the document is JSON")
}

/// `(METHOD, path)` of every operation of the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            if METHODS.contains(&method.as_str()) {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

/// `(METHOD, path)` of every `.route("PATH", get(..).post(..))` in app.rs.
fn app_routes() -> BTreeSet<(String, String)> {
    let source = include_str!("../src/app.rs");
    let code: String = source
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    for other in [
        ".nest(",
        ".nest_service(",
        ".route_service(",
        ".fallback_service(",
    ] {
        assert!(
            !code.contains(other),
            "app.rs uses `{other}`: teach tests/openapi.rs to read the routes it adds"
        );
    }
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find(".route(") {
        let after = &rest[at + ".route(".len()..];
        let mut depth = 1;
        let end = after
            .char_indices()
            .find_map(|(i, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                (depth == 0).then_some(i)
            })
            .expect("a closed .route(...)");
        let args = &after[..end];
        let (path, handlers) = args
            .trim_start()
            .strip_prefix('"')
            .and_then(|s| s.split_once('"'))
            .expect("a route's path is a string literal");
        let mut methods = 0;
        for method in METHODS {
            let call = format!("{method}(");
            let mut from = 0;
            while let Some(i) = handlers[from..].find(&call) {
                let start = from + i;
                let before = handlers[..start].chars().next_back();
                if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    // A catch-all segment (`{*model}`) is one path
                    // parameter to OpenAPI.
                    out.insert((method.to_uppercase(), path.replace("{*", "{")));
                    methods += 1;
                }
                from = start + call.len();
            }
        }
        assert!(methods > 0, "no method router found for {path}: {handlers}");
        rest = &after[end..];
    }
    assert!(out.len() > 20, "too few routes read from app.rs: {out:?}");
    out
}

#[tokio::test]
async fn the_document_is_openapi_3_1_with_a_dated_version() {
    let doc = served_document(&bare_state()).await;
    let openapi = doc["openapi"].as_str().expect("openapi");
    assert!(openapi.starts_with("3.1."), "{openapi}");
    let version = doc["info"]["version"].as_str().expect("info.version");
    // ^\d{4}-\d{2}-\d{2}-.+$
    let bytes = version.as_bytes();
    let dated = bytes.len() > 11
        && [0, 1, 2, 3, 5, 6, 8, 9]
            .iter()
            .all(|&i| bytes[i].is_ascii_digit())
        && bytes[4] == b'-'
        && bytes[7] == b'-'
        && bytes[10] == b'-';
    assert!(dated, "info.version is not <date>-<build>: {version}");
    assert_eq!(version, hearth_server::openapi::version());
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert_eq!(doc["security"], json!([{"bearer": []}]));
    // The fine-tuning list's `metadata[key]=value` filter is documented.
    let params = doc["paths"]["/v1/fine_tuning/jobs"]["get"]["parameters"]
        .as_array()
        .expect("parameters");
    let metadata = params
        .iter()
        .find(|p| p["name"] == "metadata")
        .expect("a metadata parameter");
    assert_eq!(
        (metadata["in"].as_str(), metadata["style"].as_str()),
        (Some("query"), Some("deepObject")),
        "{metadata}"
    );
}

#[test]
fn every_route_of_app_rs_is_documented_and_nothing_else() {
    let doc = hearth_server::openapi::document();
    let documented = operations(doc);
    let served = app_routes();
    let missing: Vec<_> = served.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "routes without documentation: {missing:?}"
    );
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(extra.is_empty(), "documented but not in app.rs: {extra:?}");
}

/// The routes that name a model (app.rs's inference router, which may
/// send a request on to another node) document `x-hearth-node` on every
/// answer; no other operation does.
#[test]
fn forwarded_routes_document_the_node_header() {
    let doc = hearth_server::openapi::document();
    let forwarded = [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/rerank",
        "/v1/images/generations",
    ];
    let paths = doc["paths"].as_object().expect("paths");
    for (path, item) in paths {
        for (method, op) in item.as_object().expect("a path item") {
            let responses = op["responses"].as_object().expect("responses");
            assert!(!responses.is_empty(), "{method} {path}: no responses");
            for (status, response) in responses {
                let header = &response["headers"]["x-hearth-node"];
                if method == "post" && forwarded.contains(&path.as_str()) {
                    assert_eq!(header["schema"]["type"], "string", "{path} {status}");
                } else {
                    assert!(
                        header.is_null(),
                        "{method} {path} {status} has x-hearth-node"
                    );
                }
            }
        }
    }
}

#[test]
fn every_reference_resolves_and_schema_names_are_final() {
    fn walk(value: &Value, refs: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    refs.push(r.clone());
                }
                map.values().for_each(|v| walk(v, refs));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, refs)),
            _ => {}
        }
    }
    let doc = hearth_server::openapi::document();
    let mut refs = Vec::new();
    walk(doc, &mut refs);
    assert!(refs.len() > 50);
    for r in &refs {
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("external $ref {r}"));
        assert!(doc.pointer(pointer).is_some(), "unresolved $ref {r}");
    }
    for name in doc["components"]["schemas"].as_object().unwrap().keys() {
        assert!(
            !name.contains('_'),
            "a generic schema without a name: {name}"
        );
    }
    // The checker the answers go through refuses what it should.
    let shape = |name: &str| json!({ "$ref": format!("#/components/schemas/{name}") });
    assert!(
        schema_check::validate(doc, &shape("ErrorDetail"), &json!({"detail": 5}), "$").is_err()
    );
    assert!(
        schema_check::validate(doc, &shape("UpstreamError"), &json!({"detail": "x"}), "$").is_err()
    );
    assert!(schema_check::validate(
        doc,
        &shape("ValidationError"),
        &json!({"detail": [{}]}),
        "$"
    )
    .is_err());
    assert!(
        schema_check::validate(doc, &shape("ErrorDetail"), &json!({"detail": "x"}), "$").is_ok()
    );
    let mut ids = BTreeSet::new();
    for (_, item) in doc["paths"].as_object().unwrap() {
        for op in item.as_object().unwrap().values() {
            let id = op["operationId"].as_str().expect("operationId");
            assert!(ids.insert(id.to_string()), "operationId {id} twice");
        }
    }
}

/// A value for a path parameter, from its pattern (`^file-[...]{26}$`).
fn path_value(param: &Value) -> String {
    let pattern = param["schema"]["pattern"].as_str().unwrap_or("");
    let prefix = pattern
        .trim_start_matches('^')
        .split('-')
        .next()
        .filter(|p| p.chars().all(|c| c.is_ascii_lowercase()) && !p.is_empty())
        .unwrap_or("x");
    format!("{prefix}-01ARZ3NDEKTSV4RRFFQ69G5FAV")
}

/// Every operation, called with a minimal request: never the router's own
/// 404 or 405, always a documented status with a body of its schema.
#[tokio::test]
async fn every_operation_is_served_as_documented() {
    let state = bare_state();
    let doc = served_document(&state).await;
    for (method, path) in operations(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let mut uri = path.clone();
        for param in op["parameters"].as_array().into_iter().flatten() {
            if param["in"] == "path" {
                let name = param["name"].as_str().unwrap();
                uri = uri.replace(&format!("{{{name}}}"), &path_value(param));
            }
        }
        let (content_type, body) = match op["requestBody"]["content"].as_object() {
            Some(c) if c.contains_key("multipart/form-data") => (
                Some("multipart/form-data; boundary=X"),
                b"--X--\r\n".to_vec(),
            ),
            Some(_) => (Some("application/json"), b"{}".to_vec()),
            None => (None, Vec::new()),
        };
        let answer = call(&state, Some(KEY), &method, &uri, content_type, body).await;
        let text = String::from_utf8_lossy(&answer.body).to_string();
        let label = format!("{method} {uri} -> {} {text}", answer.status);
        assert_ne!(answer.status, 405, "{label}");
        assert!(
            !(answer.status == 404 && text.contains("\"Not Found\"")),
            "the router does not know {label}"
        );
        conforms(&doc, &method, &path, &answer, &label);
    }
}

fn conforms(doc: &Value, method: &str, path: &str, answer: &Answer, label: &str) {
    let op = &doc["paths"][path][method.to_lowercase()];
    assert!(op.is_object(), "{method} {path} is not documented");
    schema_check::response_conforms(
        doc,
        op,
        &answer.status.to_string(),
        &answer.content_type,
        &answer.body,
    )
    .unwrap_or_else(|e| panic!("{label}: {e}"));
}

/// Successes and errors of the admin and files routes, and the key check,
/// against their documented schemas.
#[tokio::test]
async fn answers_match_their_schemas() {
    let state = bare_state();
    let doc = served_document(&state).await;
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let form = common::raw::form(&[
        ("purpose", None, b"fine-tune"),
        (
            "file",
            Some("train.jsonl"),
            b"{\"prompt\": \"a\", \"completion\": \"b\"}\n",
        ),
    ]);
    let multipart = format!("multipart/form-data; boundary={}", common::raw::BOUNDARY);
    let mut ids: std::collections::HashMap<String, String> = Default::default();
    // (key, method, documented path, uri with `{id}` for the last id made, body)
    type Step<'a> = (Option<&'a str>, &'a str, &'a str, String, Option<Vec<u8>>);
    let steps: Vec<Step> = vec![
        (
            Some(&admin),
            "get",
            "/v1/admin/keys",
            "/v1/admin/keys".into(),
            None,
        ),
        (
            Some(&admin),
            "post",
            "/v1/admin/keys",
            "/v1/admin/keys".into(),
            Some(br#"{"name": "ci"}"#.to_vec()),
        ),
        (
            Some(&admin),
            "delete",
            "/v1/admin/keys/{key_id}",
            "/v1/admin/keys/{key}".into(),
            None,
        ),
        (
            Some(&admin),
            "get",
            "/v1/admin/projects",
            "/v1/admin/projects".into(),
            None,
        ),
        (
            Some(&admin),
            "post",
            "/v1/admin/projects",
            "/v1/admin/projects".into(),
            Some(br#"{"name": "p"}"#.to_vec()),
        ),
        (
            Some(KEY),
            "post",
            "/v1/files",
            "/v1/files".into(),
            Some(form),
        ),
        (
            Some(KEY),
            "get",
            "/v1/files",
            "/v1/files?limit=5&order=asc&purpose=fine-tune".into(),
            None,
        ),
        (
            Some(KEY),
            "get",
            "/v1/files",
            "/v1/files?limit=0".into(),
            None,
        ),
        (
            Some(KEY),
            "get",
            "/v1/files/{file_id}",
            "/v1/files/{file}".into(),
            None,
        ),
        (
            Some(KEY),
            "get",
            "/v1/files/{file_id}/link",
            "/v1/files/{file}/link?expires_in=60".into(),
            None,
        ),
        (
            Some(KEY),
            "get",
            "/v1/files/{file_id}/content",
            "/v1/files/{file}/content".into(),
            None,
        ),
        (
            Some(KEY),
            "delete",
            "/v1/files/{file_id}",
            "/v1/files/{file}".into(),
            None,
        ),
        (
            Some(KEY),
            "get",
            "/v1/fine_tuning/jobs",
            "/v1/fine_tuning/jobs?limit=abc".into(),
            None,
        ),
        (
            Some(KEY),
            "get",
            "/v1/models",
            "/v1/models?verbose=yes".into(),
            None,
        ),
        (
            Some(KEY),
            "get",
            "/v1/models",
            "/v1/models?ai_project_id=nope".into(),
            None,
        ),
        (
            Some(KEY),
            "get",
            "/v1/models",
            "/v1/models?verbose=maybe".into(),
            None,
        ),
        (None, "get", "/v1/models", "/v1/models".into(), None),
        (
            Some("wrong"),
            "post",
            "/v1/chat/completions",
            "/v1/chat/completions".into(),
            Some(b"{}".to_vec()),
        ),
        (
            Some(KEY),
            "post",
            "/v1/completions",
            "/v1/completions".into(),
            Some(br#"{"model": "none", "prompt": "x", "max_tokens": 1}"#.to_vec()),
        ),
        (
            Some(KEY),
            "post",
            "/v1/completions",
            "/v1/completions".into(),
            Some(br#"{"model": "none", "prompt": "x", "logprobs": 99}"#.to_vec()),
        ),
    ];
    let mut statuses = Vec::new();
    for (key, method, path, uri, body) in steps {
        let mut uri = uri;
        for (name, id) in &ids {
            uri = uri.replace(&format!("{{{name}}}"), id.as_str());
        }
        let content_type = match &body {
            Some(b) if b.starts_with(b"--") => Some(multipart.as_str()),
            Some(_) => Some("application/json"),
            None => None,
        };
        let answer = call(
            &state,
            key,
            method,
            &uri,
            content_type,
            body.unwrap_or_default(),
        )
        .await;
        let text = String::from_utf8_lossy(&answer.body).to_string();
        let label = format!("{method} {uri} -> {} {text}", answer.status);
        conforms(&doc, method, path, &answer, &label);
        statuses.push(answer.status);
        if answer.status == 200 && method == "post" {
            let value: Value = serde_json::from_str(&text).unwrap();
            let id = value["id"].as_str().unwrap().to_string();
            let name = id.split('-').next().unwrap().to_string();
            ids.insert(name, id);
        }
    }
    assert_eq!(
        statuses,
        [
            200, 200, 200, 200, 200, 200, 200, 422, 200, 200, 200, 200, 422, 200, 400, 422, 401,
            401, 404, 400
        ]
    );
}

/// A request of a schema check: method, documented path, URI, body and the
/// status expected.
type Step<'a> = (&'a str, &'a str, &'a str, Option<&'a [u8]>, u16);

/// The admin adapter routes' answers (a list, refusals) against their
/// documented schemas (a model-less server: every import is refused).
#[tokio::test]
async fn adapter_answers_match_their_schemas() {
    let state = bare_state();
    let doc = served_document(&state).await;
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let import =
        br#"{"base_model": "none/none", "name": "n", "weights_file": "f", "config_file": "c"}"#;
    let steps: [Step<'_>; 4] = [
        ("get", "/v1/admin/adapters", "/v1/admin/adapters", None, 200),
        (
            "post",
            "/v1/admin/adapters",
            "/v1/admin/adapters",
            Some(import),
            400,
        ),
        (
            "post",
            "/v1/admin/adapters",
            "/v1/admin/adapters",
            Some(b"{}"),
            422,
        ),
        (
            "delete",
            "/v1/admin/adapters/{adapter_id}",
            "/v1/admin/adapters/adapter-01ARZ3NDEKTSV4RRFFQ69G5FAV",
            None,
            403,
        ),
    ];
    for (method, path, uri, body, status) in steps {
        let content_type = body.map(|_| "application/json");
        let body = body.map(<[u8]>::to_vec).unwrap_or_default();
        let answer = call(&state, Some(&admin), method, uri, content_type, body).await;
        let text = String::from_utf8_lossy(&answer.body).to_string();
        let label = format!("{method} {uri} -> {} {text}", answer.status);
        assert_eq!(answer.status, status, "{label}");
        conforms(&doc, method, path, &answer, &label);
    }
}
