//! `/v1/embeddings` and `/v1/rerank` through the in-process router with the
//! real default models: shapes, base64, `dimensions`, token-id input, every
//! error case, paraphrase/unrelated behaviour, an obvious rerank case, and 16
//! concurrent clients getting the same vectors as single requests.

mod common;

use common::*;
use hearth_api::decode_base64;
use serde_json::{json, Value};

const EMBED: &str = "sentence-transformers/all-MiniLM-L6-v2";

fn fixture() -> Value {
    let dir = std::env::var_os("HEARTH_FIXTURES_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures")
        });
    let text = std::fs::read_to_string(dir.join("minilm_embeddings.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn cos(a: &[f32], b: &[f32]) -> f32 {
    hearth_engine::embed::cosine(a, b)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

async fn embed(body: Value) -> Reply {
    post(&with_model(), "/v1/embeddings", &body.to_string()).await
}

async fn vectors(input: Value) -> Vec<Vec<f32>> {
    let reply = embed(json!({"model": EMBED, "input": input})).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let body = reply.json();
    body["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            floats(&d["embedding"])
        })
        .collect()
}

fn shape_b(reply: &Reply, status: u16) -> String {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["error"]["code"], status, "{body}");
    assert!(body["detail"].is_string(), "{body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

fn shape_c(reply: &Reply) -> Value {
    assert_eq!(reply.status.as_u16(), 422, "{}", reply.text);
    let body = reply.json();
    body["detail"][0].clone()
}

#[tokio::test]
async fn float_base64_dimensions_and_token_ids() {
    let fx = fixture();
    let s0 = &fx["sentences"][0];
    let reply = embed(json!({"model": EMBED, "input": s0["text"], "user": "u1"})).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], EMBED);
    assert_eq!(body["data"][0]["object"], "embedding");
    let n = s0["n_tokens"].as_u64().unwrap();
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": n, "total_tokens": n})
    );
    let v = floats(&body["data"][0]["embedding"]);
    assert_eq!(v.len(), 384);
    // The served arithmetic is bf16 on CPUs with AVX-512 BF16 and int16 on
    // those with AVX2 but no AVX-512 (see engine/tests/minilm_fixture.rs
    // for each precision's bounds).
    let want = floats(&s0["embedding"]);
    assert!(cos(&v, &want) >= 0.9999, "cosine {}", cos(&v, &want));
    assert!(max_diff(&v, &want) <= 3e-3);

    let reply =
        embed(json!({"model": EMBED, "input": [s0["text"]], "encoding_format": "base64"})).await;
    let b64 = reply.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(decode_base64(&b64).unwrap(), v);

    let reply = embed(json!({"model": EMBED, "input": s0["text"], "dimensions": 64})).await;
    let short = floats(&reply.json()["data"][0]["embedding"]);
    assert_eq!(short.len(), 64);
    assert!(max_diff(&short, &hearth_api::apply_dimensions(&v, 64)) < 1e-6);
    let full = embed(json!({"model": EMBED, "input": s0["text"], "dimensions": 384})).await;
    assert_eq!(floats(&full.json()["data"][0]["embedding"]), v);

    let ids = vectors(s0["token_ids"].clone()).await;
    assert!(max_diff(&ids[0], &v) < 1e-6);
    let batch = vectors(json!([s0["token_ids"], [101, 7592, 1012, 102]])).await;
    assert_eq!(batch.len(), 2);
}

#[tokio::test]
async fn error_cases() {
    let state = with_model();
    let c = shape_c(&embed(json!({"model": EMBED, "input": ""})).await);
    assert_eq!(c["type"], "string_too_short");
    let c = shape_c(&embed(json!({"model": EMBED, "input": []})).await);
    assert_eq!(c["type"], "too_short");
    let many: Vec<&str> = vec!["x"; 2049];
    let c = shape_c(&embed(json!({"model": EMBED, "input": many})).await);
    assert_eq!(c["type"], "too_long");
    let c = shape_c(&embed(json!({"model": EMBED, "input": "x", "dimensions": 385})).await);
    assert_eq!(c["loc"], json!(["body", "dimensions"]));
    let long = "word ".repeat(300);
    let reply = embed(json!({"model": EMBED, "input": ["ok", long]})).await;
    let message = shape_b(&reply, 400);
    assert!(message.contains("Input 1"), "{message}");
    assert_eq!(reply.json()["error"]["param"], "input");
    let reply = embed(json!({"model": EMBED, "input": ["ok", long], "truncate": true})).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json()["usage"]["prompt_tokens"], 3 + 256);
    // Truncation keeps [CLS], the first 254 word pieces and the closing [SEP].
    let cut = floats(&reply.json()["data"][1]["embedding"]);
    let mut ids = vec![101u32];
    ids.extend(std::iter::repeat_n(2773u32, 254));
    ids.push(102);
    let by_ids = vectors(json!([ids])).await;
    assert!(max_diff(&cut, &by_ids[0]) < 1e-6);
    let reply = embed(json!({"model": EMBED, "input": [[101, 99999, 102]]})).await;
    assert!(shape_b(&reply, 400).contains("vocabulary"));
    let reply = embed(json!({"model": MODEL, "input": "hi"})).await;
    assert!(shape_b(&reply, 400).contains("not an embedding model"));
    let chat = json!({"model": EMBED, "messages": [{"role": "user", "content": "hi"}]});
    let reply = post(&state, "/v1/chat/completions", &chat.to_string()).await;
    assert!(shape_b(&reply, 400).contains("not a chat model"));
    let completion = json!({"model": EMBED, "prompt": "hi"});
    let reply = post(&state, "/v1/completions", &completion.to_string()).await;
    assert!(shape_b(&reply, 400).contains("not a chat model"));
    let reply = embed(json!({"model": "no/such", "input": "hi"})).await;
    assert_eq!(reply.status, 404);
    let reply = send(&state, "POST", "/v1/embeddings", None, Some("{}")).await;
    assert_eq!(reply.status, 401);

    let rerank = |body: Value| {
        let state = state.clone();
        async move { post(&state, "/v1/rerank", &body.to_string()).await }
    };
    let c = shape_c(&rerank(json!({"model": EMBED, "query": "q", "documents": []})).await);
    assert_eq!(c["type"], "too_short");
    let docs = vec!["d"; 1001];
    let c = shape_c(&rerank(json!({"model": EMBED, "query": "q", "documents": docs})).await);
    assert_eq!(c["type"], "too_long");
    let reply = rerank(json!({"model": MODEL, "query": "q", "documents": ["d"]})).await;
    assert!(shape_b(&reply, 400).contains("not an embedding model"));
}

#[tokio::test]
async fn paraphrases_score_higher_and_rerank_finds_the_relevant_document() {
    let fx = fixture();
    let texts: Vec<Value> = fx["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["text"].clone())
        .collect();
    let v = vectors(Value::Array(texts)).await;
    let pair = |p: &Value| {
        cos(
            &v[p[0].as_u64().unwrap() as usize],
            &v[p[1].as_u64().unwrap() as usize],
        )
    };
    let worst_paraphrase = fx["paraphrase_pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(pair)
        .fold(1.0, f32::min);
    let best_unrelated = fx["unrelated_pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(pair)
        .fold(-1.0, f32::max);
    assert!(worst_paraphrase > 0.6 && best_unrelated < 0.2 && worst_paraphrase > best_unrelated);

    let body = json!({
        "model": EMBED,
        "query": "How do I reset my password?",
        "documents": [
            "The central bank raised interest rates.",
            {"text": "To change your password, open settings and choose 'reset password'."},
            "Cats sleep most of the day.",
        ],
    });
    let reply = post(&with_model(), "/v1/rerank", &body.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let r = reply.json();
    assert!(r["id"].is_string());
    assert_eq!(r["model"], EMBED);
    assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() > 10);
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["index"], 1);
    assert!(results[0]["document"]["text"]
        .as_str()
        .unwrap()
        .starts_with("To change"));
    let scores: Vec<f64> = results
        .iter()
        .map(|x| x["relevance_score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let mut body = body;
    body["top_n"] = json!(1);
    body["return_documents"] = json!(false);
    let r = post(&with_model(), "/v1/rerank", &body.to_string())
        .await
        .json();
    assert_eq!(r["results"].as_array().unwrap().len(), 1);
    assert_eq!(r["results"][0]["index"], 1);
    assert!(r["results"][0].get("document").is_none());

    // A document of another type is 422 saying what a document is; an
    // empty one is scored like any other.
    let bad = json!({"model": EMBED, "query": "q", "documents": ["fine", 5]});
    let item = shape_c(&post(&with_model(), "/v1/rerank", &bad.to_string()).await);
    let msg = item["msg"].as_str().unwrap();
    assert!(
        msg.contains("a string or an object with a `text` string"),
        "{item}"
    );
    let empty = json!({"model": EMBED, "query": "q", "documents": ["", "q"]});
    let reply = post(&with_model(), "/v1/rerank", &empty.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json()["results"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_clients_get_single_request_results() {
    let fx = fixture();
    let texts: Vec<String> = fx["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["text"].as_str().unwrap().to_string())
        .collect();
    // Client c asks for a rotation of the sentences, 1 to 4 of them.
    let request = |c: usize| -> Vec<String> {
        (0..c % 4 + 1)
            .map(|k| texts[(c + k * 5) % texts.len()].clone())
            .collect()
    };
    let mut single = Vec::new();
    for c in 0..16 {
        single.push(vectors(json!(request(c))).await);
    }
    let tasks: Vec<_> = (0..16)
        .map(|c| {
            let input = request(c);
            tokio::spawn(async move { vectors(json!(input)).await })
        })
        .collect();
    for (c, task) in tasks.into_iter().enumerate() {
        let got = task.await.unwrap();
        assert_eq!(got.len(), single[c].len());
        for (a, b) in got.iter().zip(&single[c]) {
            assert!(max_diff(a, b) <= 1e-5, "client {c}");
        }
    }
}

#[tokio::test]
async fn models_list_names_the_embedding_model() {
    let reply = send(
        &with_model(),
        "GET",
        "/v1/models?verbose=true",
        Some(KEY),
        None,
    )
    .await;
    let body = reply.json();
    let model = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == EMBED)
        .expect("embedding model listed")
        .clone();
    assert_eq!(model["kind"], "embed");
    assert_eq!(model["context_length"], 256);
    assert!(model["description"]
        .as_str()
        .unwrap()
        .contains("bi-encoder"));
}
