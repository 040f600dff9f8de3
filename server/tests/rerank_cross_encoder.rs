//! A cross-encoder rerank model served end to end: a tiny random-weight
//! `BertForSequenceClassification` folder (MiniLM's real tokenizer) is a
//! `rerank` entry of a catalogue file with a local source, loaded by
//! `build_state` and asked through the in-process router. /v1/rerank must
//! answer with the scores the model itself gives each (query, document) pair
//! (sigmoid of its one logit), sorted, with `top_n`, `return_documents` and
//! `{text}` documents honoured; /v1/embeddings and chat refuse it; /v1/models
//! lists it as a `rerank` model.

mod common;
#[path = "../../crates/engine/tests/common/tiny_cross_encoder.rs"]
mod tiny_cross_encoder;

use std::path::{Path, PathBuf};

use candle_core::Device;
use common::*;
use hearth_engine::catalog::Catalog;
use hearth_engine::cross_encoder::{load_cross_encoder, pair_items};
use hearth_engine::pull::{self, Progress};
use hearth_models::EncoderInput;
use hearth_server::serve::build_state;
use hearth_server::AppState;
use serde_json::{json, Value};

const RERANK: &str = "test/tiny-cross-encoder";
const MAX_TOKENS: usize = 24;

const QUERY: &str = "how do plants make food";
const DOCS: [&str; 4] = [
    "Photosynthesis turns light, water and carbon dioxide into sugar.",
    "The stock market closed higher today.",
    "A very long document about gardening that goes on and on about soil, compost, watering schedules, pests and the many kinds of vegetables one might grow.",
    "Leaves hold chlorophyll.",
];

/// MiniLM's folder (pulled once into the shared data folder if missing).
fn minilm_dir() -> PathBuf {
    let catalog = Catalog::built_in();
    let entry = catalog
        .get("sentence-transformers/all-MiniLM-L6-v2")
        .expect("MiniLM is in the catalogue");
    pull::ensure(entry, &data_dir().join("models"), Progress::Quiet).expect("fetching MiniLM")
}

/// Writes the tiny random BERT cross-encoder with MiniLM's tokenizer.
fn write_model(dir: &Path) {
    tiny_cross_encoder::write_model(
        dir,
        &tiny_cross_encoder::config("bert"),
        &minilm_dir().join("tokenizer.json"),
    );
}

/// A catalogue file with the cross-encoder as a local `rerank` entry.
fn write_catalog(dir: &Path, model_dir: &Path) -> PathBuf {
    let path = dir.join("catalog.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[[model]]
id = "{RERANK}"
kind = "rerank"
format = "safetensors"
context_length = {MAX_TOKENS}
description = "a tiny random cross-encoder"
source = {{ type = "local", path = "{}" }}
files = [{{ path = "config.json" }}, {{ path = "model.safetensors" }}, {{ path = "tokenizer.json" }}]
"#,
            model_dir.display()
        ),
    )
    .unwrap();
    path
}

/// A state serving only the cross-encoder (loaded as `hearth serve` would),
/// and the model's folder.
async fn setup() -> (AppState, PathBuf) {
    tokio::task::spawn_blocking(|| {
        let dir = temp_dir();
        let model_dir = dir.join("model");
        write_model(&model_dir);
        let mut args = serve_args(vec![RERANK.to_string()], 64, 8);
        args.store.catalog = Some(write_catalog(&dir, &model_dir));
        let (store, project) = new_store();
        let state = build_state(&args, vec![KEY.to_string()], store, &project)
            .expect("the cross-encoder loads");
        assert!(state.embed[RERANK].cross_encoder);
        assert!(state.chat.is_empty());
        (state, model_dir)
    })
    .await
    .unwrap()
}

/// Scores of the pairs straight through the model, without the server or its
/// batcher: sigmoid of the one logit; and the pairs' token count.
fn direct_scores(model_dir: &Path, query: &str, docs: &[&str]) -> (Vec<f32>, usize) {
    let mut direct = load_cross_encoder(model_dir, &Device::Cpu, MAX_TOKENS).unwrap();
    // As the server runs it (`serve_args`: `--encoder-precision auto`).
    (direct.encoder.model)
        .set_precision(hearth_engine::EncoderPrecision::Auto)
        .unwrap();
    let docs: Vec<String> = docs.iter().map(|d| d.to_string()).collect();
    let items = pair_items(&direct.tokenizer, query, &docs).unwrap();
    assert!(items.iter().all(|i| i.ids.len() <= MAX_TOKENS));
    let inputs: Vec<EncoderInput> = items
        .iter()
        .map(|i| EncoderInput {
            ids: &i.ids,
            type_ids: i.type_ids.as_deref(),
        })
        .collect();
    let logits = direct
        .encoder
        .model
        .forward(&inputs)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let scores = logits
        .iter()
        .map(|l| {
            assert_eq!(l.len(), 1, "one label");
            1.0 / (1.0 + (-l[0]).exp())
        })
        .collect();
    (scores, items.iter().map(|i| i.ids.len()).sum())
}

async fn rerank(state: &AppState, body: Value) -> Reply {
    post(state, "/v1/rerank", &body.to_string()).await
}

/// Checks a 200 rerank answer against the direct scores: sorted descending,
/// each index a distinct input position scored as the model scores it, the
/// document echoed or absent, the best `n` documents kept, usage counted.
fn check_results(
    reply: &Reply,
    docs: &[&str],
    direct: &[f32],
    tokens: usize,
    n: usize,
    return_documents: bool,
) -> Vec<(usize, f32)> {
    assert_eq!(reply.status, 200, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["model"], RERANK, "{body}");
    assert!(
        body["id"].as_str().is_some_and(|id| !id.is_empty()),
        "{body}"
    );
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": tokens, "total_tokens": tokens}),
        "{body}"
    );
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), n, "{body}");
    let mut got = Vec::new();
    for r in results {
        let index = r["index"].as_u64().unwrap() as usize;
        assert!(index < direct.len(), "{body}");
        assert!(
            got.iter().all(|&(i, _)| i != index),
            "repeated index: {body}"
        );
        let score = r["relevance_score"].as_f64().unwrap() as f32;
        assert!(
            (score - direct[index]).abs() < 1e-5,
            "document {index}: served {score}, the model gives {}",
            direct[index]
        );
        if return_documents {
            assert_eq!(r["document"], json!({"text": docs[index]}), "{body}");
        } else {
            assert!(r.get("document").is_none(), "{body}");
        }
        got.push((index, score));
    }
    assert!(
        got.windows(2).all(|w| w[0].1 >= w[1].1),
        "not sorted by descending relevance_score: {body}"
    );
    // The kept documents are the best ones.
    let worst_kept = got.iter().map(|&(i, _)| direct[i]).fold(1.0, f32::min);
    for (i, s) in direct.iter().enumerate() {
        if got.iter().all(|&(j, _)| j != i) {
            assert!(*s <= worst_kept + 1e-5, "document {i} left out: {body}");
        }
    }
    got
}

#[tokio::test]
async fn rerank_serves_the_cross_encoder_scores() {
    let (state, model_dir) = setup().await;
    let (direct, tokens) = direct_scores(&model_dir, QUERY, &DOCS);
    assert!(
        direct.iter().any(|s| (s - direct[0]).abs() > 1e-4),
        "distinct pairs get distinct scores: {direct:?}"
    );

    let reply = rerank(
        &state,
        json!({"model": RERANK, "query": QUERY, "documents": DOCS}),
    )
    .await;
    let all = check_results(&reply, &DOCS, &direct, tokens, DOCS.len(), true);

    let reply = rerank(
        &state,
        json!({"model": RERANK, "query": QUERY, "documents": DOCS, "top_n": 2}),
    )
    .await;
    check_results(&reply, &DOCS, &direct, tokens, 2, true);

    let reply = rerank(
        &state,
        json!({"model": RERANK, "query": QUERY, "documents": DOCS, "return_documents": false}),
    )
    .await;
    check_results(&reply, &DOCS, &direct, tokens, DOCS.len(), false);

    // `{text}` objects (mixed with strings) are the same documents.
    let objects: Vec<Value> = DOCS
        .iter()
        .enumerate()
        .map(|(i, d)| {
            if i % 2 == 0 {
                json!({"text": d})
            } else {
                json!(d)
            }
        })
        .collect();
    let reply = rerank(
        &state,
        json!({"model": RERANK, "query": QUERY, "documents": objects}),
    )
    .await;
    let from_objects = check_results(&reply, &DOCS, &direct, tokens, DOCS.len(), true);
    for ((i, a), (j, b)) in all.iter().zip(&from_objects) {
        assert_eq!(i, j);
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }

    // Another query scores differently, again as the model does.
    let other = "stock prices";
    let (direct2, tokens2) = direct_scores(&model_dir, other, &DOCS);
    assert!(direct2
        .iter()
        .zip(&direct)
        .any(|(a, b)| (a - b).abs() > 1e-4));
    let reply = rerank(
        &state,
        json!({"model": RERANK, "query": other, "documents": DOCS, "top_n": 3}),
    )
    .await;
    check_results(&reply, &DOCS, &direct2, tokens2, 3, true);

    // An empty document is a pair like any other.
    let docs = ["", DOCS[0]];
    let (direct3, tokens3) = direct_scores(&model_dir, QUERY, &docs);
    let reply = rerank(
        &state,
        json!({"model": RERANK, "query": QUERY, "documents": docs}),
    )
    .await;
    check_results(&reply, &docs, &direct3, tokens3, 2, true);
}

fn shape_b(reply: &Reply, status: u16) -> Value {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["error"]["code"], status, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    assert!(body["detail"].is_string(), "{body}");
    body
}

#[tokio::test]
async fn other_endpoints_refuse_the_cross_encoder() {
    let (state, _) = setup().await;

    let c = rerank(
        &state,
        json!({"model": RERANK, "query": QUERY, "documents": []}),
    )
    .await;
    assert_eq!(c.status, 422, "{}", c.text);
    assert_eq!(c.json()["detail"][0]["type"], "too_short", "{}", c.text);
    assert_eq!(c.json()["detail"][0]["loc"], json!(["body", "documents"]));
    let c = rerank(
        &state,
        json!({"model": RERANK, "query": "", "documents": ["d"]}),
    )
    .await;
    assert_eq!(c.status, 422, "{}", c.text);
    let c = rerank(
        &state,
        json!({"model": RERANK, "query": QUERY, "documents": ["d"], "top_n": 0}),
    )
    .await;
    assert_eq!(c.status, 422, "{}", c.text);

    // Not an embedding model, whatever else the request asks.
    for body in [
        json!({"model": RERANK, "input": "hello"}),
        json!({"model": RERANK, "input": ["a", "b"], "dimensions": 8}),
        json!({"model": RERANK, "input": [[101, 7592, 102]]}),
    ] {
        let reply = post(&state, "/v1/embeddings", &body.to_string()).await;
        let error = shape_b(&reply, 400);
        assert_eq!(error["error"]["param"], "model", "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(RERANK)
                && message.contains("rerank model")
                && message.contains("no embeddings"),
            "{message}"
        );
    }

    let chat = json!({"model": RERANK, "messages": [{"role": "user", "content": "hi"}]});
    let reply = post(&state, "/v1/chat/completions", &chat.to_string()).await;
    let error = shape_b(&reply, 400);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a chat model"),
        "{error}"
    );

    let reply = rerank(
        &state,
        json!({"model": "no/such", "query": QUERY, "documents": ["d"]}),
    )
    .await;
    assert_eq!(reply.status, 404, "{}", reply.text);
}

#[tokio::test]
async fn models_lists_the_cross_encoder_as_rerank() {
    let (state, _) = setup().await;
    let find = |list: &Value| {
        let data = list["data"].as_array().unwrap();
        assert_eq!(data.len(), 1, "{list}");
        data.iter()
            .find(|m| m["id"] == RERANK)
            .cloned()
            .unwrap_or_else(|| panic!("{RERANK} not listed: {list}"))
    };

    let reply = send(&state, "GET", "/v1/models?verbose=true", Some(KEY), None).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let m = find(&reply.json());
    assert_eq!(m["object"], "model", "{m}");
    assert_eq!(m["kind"], "rerank", "{m}");
    assert_eq!(m["context_length"], MAX_TOKENS, "{m}");
    assert_eq!(m["description"], "a tiny random cross-encoder", "{m}");
    assert!(m["pricing"].is_object(), "{m}");
    assert!(m.get("parent").is_none(), "{m}");

    let reply = send(&state, "GET", "/v1/models", Some(KEY), None).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let m = find(&reply.json());
    assert!(m.get("kind").is_none(), "{m}");
    assert!(m.get("context_length").is_none(), "{m}");
}
