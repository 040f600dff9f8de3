//! `/v1/images/generations` through the in-process router, with a tiny
//! random-weight Stable Diffusion pipeline (written in a temporary folder in
//! the diffusers layout) registered as a local catalogue model beside the
//! default chat model: both response formats, the PNGs decoded, seeds,
//! every error case, a full queue, and image requests beside a chat request.

mod common;

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::Request;
use base64::Engine as _;
use common::images::{image_state, occupy, IMAGE};
use common::*;
use hearth_server::AppState;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

fn state() -> &'static AppState {
    static STATE: OnceLock<AppState> = OnceLock::new();
    STATE.get_or_init(|| image_state(&[MODEL], 8))
}

async fn generate(state: &AppState, body: Value) -> Reply {
    post(state, "/v1/images/generations", &body.to_string()).await
}

/// `(width, height, rgb or rgba pixels)` of a PNG.
fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("a readable PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a sane size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

fn b64_images(reply: &Reply) -> Vec<Vec<u8>> {
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            base64::engine::general_purpose::STANDARD
                .decode(d["b64_json"].as_str().expect("b64_json"))
                .unwrap()
        })
        .collect()
}

#[tokio::test]
async fn b64_json_gives_pngs_of_the_requested_size_reproducible_by_seed() {
    let body = json!({"model": IMAGE, "prompt": "a red fox in the snow", "n": 2,
                      "size": "64x64", "response_format": "b64_json", "seed": 42,
                      "num_inference_steps": 2});
    let first = generate(state(), body.clone()).await;
    let images = b64_images(&first);
    assert_eq!(images.len(), 2);
    let body_json = first.json();
    assert_eq!(body_json["size"], "64x64");
    assert_eq!(body_json["seed"], 42);
    assert!(body_json["created"].as_i64().unwrap() > 0);
    assert_eq!(
        body_json["data"][0]["revised_prompt"],
        "a red fox in the snow"
    );
    assert!(body_json["data"][0].get("url").is_none());
    let (w, h, pixels) = decode_png(&images[0]);
    assert_eq!((w, h), (64, 64));
    assert!(
        pixels.iter().any(|&p| p != pixels[0]),
        "a flat image: {:?}",
        &pixels[..8]
    );
    assert_ne!(
        images[0], images[1],
        "the two images of a request are equal"
    );
    // The same seed again: the same images; another seed: others.
    assert_eq!(b64_images(&generate(state(), body.clone()).await), images);
    let mut other = body.clone();
    other["seed"] = json!(43);
    assert_ne!(b64_images(&generate(state(), other).await)[0], images[0]);
}

#[tokio::test]
async fn url_downloads_without_a_key_and_the_file_is_listed() {
    let reply = generate(
        state(),
        json!({"model": IMAGE, "prompt": "a lighthouse", "num_inference_steps": 1}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["size"], "64x64", "auto is the model's own size");
    let url = body["data"][0]["url"].as_str().expect("a url");
    assert!(body["data"][0].get("b64_json").is_none());
    let path = url.split_once("://").unwrap().1;
    let path = &path[path.find('/').unwrap()..];
    let response = hearth_server::app(state().clone())
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // Shown by a browser, as OpenAI's image links are.
    let headers = response.headers();
    assert_eq!(headers["content-type"], "image/png");
    assert!(headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("inline"));
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(decode_png(&bytes).0, 64);
    // A tampered link is refused.
    let bad = path.replace("signature=", "signature=0");
    let response = hearth_server::app(state().clone())
        .oneshot(Request::get(bad).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let files = send(state(), "GET", "/v1/files?purpose=image", Some(KEY), None).await;
    assert_eq!(files.status, 200, "{}", files.text);
    assert!(files.text.contains(".png"), "{}", files.text);
    // Metered: the image model's requests are in the project's usage.
    let usage = send(state(), "GET", "/v1/usage", Some(KEY), None).await;
    assert_eq!(usage.status, 200, "{}", usage.text);
    let rows = usage.json()["data"].as_array().unwrap().clone();
    let image_rows: Vec<_> = rows.iter().filter(|r| r["model"] == IMAGE).collect();
    assert!(
        image_rows
            .iter()
            .map(|r| r["requests"].as_i64().unwrap())
            .sum::<i64>()
            >= 1,
        "{}",
        usage.text
    );
}

#[tokio::test]
async fn bad_requests_get_the_api_error_shapes() {
    let cases = [
        (json!({"model": IMAGE}), 422, None),
        (json!({"model": IMAGE, "prompt": ""}), 422, None),
        (json!({"model": "no/such-model", "prompt": "x"}), 404, None),
        (json!({"model": MODEL, "prompt": "x"}), 400, Some("model")),
        (
            json!({"model": IMAGE, "prompt": "x", "n": 9}),
            400,
            Some("n"),
        ),
        (
            json!({"model": IMAGE, "prompt": "x", "size": "72x64"}),
            400,
            Some("size"),
        ),
        (
            json!({"model": IMAGE, "prompt": "x", "size": "4096x4096"}),
            400,
            Some("size"),
        ),
        (
            json!({"model": IMAGE, "prompt": "x", "size": "huge"}),
            400,
            Some("size"),
        ),
        // Sides the model can make, but its attention would hold 9 GB (over
        // the default --image-max-attention-mb, 8 GiB).
        (
            json!({"model": IMAGE, "prompt": "x", "size": "1232x1232"}),
            400,
            Some("size"),
        ),
        (
            json!({"model": IMAGE, "prompt": "x", "response_format": "gif"}),
            422,
            None,
        ),
    ];
    for (body, status, param) in cases {
        let reply = generate(state(), body.clone()).await;
        assert_eq!(reply.status, status, "{body}: {}", reply.text);
        if let Some(param) = param {
            assert_eq!(
                reply.json()["error"]["param"],
                param,
                "{body}: {}",
                reply.text
            );
        }
    }
    // The image model on the other routes: the wrong kind, 400 naming
    // `model` (not 404: it exists).
    for (uri, body) in [
        (
            "/v1/chat/completions",
            json!({"model": IMAGE, "messages": [{"role": "user", "content": "x"}]}),
        ),
        ("/v1/completions", json!({"model": IMAGE, "prompt": "x"})),
        ("/v1/embeddings", json!({"model": IMAGE, "input": "x"})),
        (
            "/v1/rerank",
            json!({"model": IMAGE, "query": "x", "documents": ["y"]}),
        ),
    ] {
        let reply = post(state(), uri, &body.to_string()).await;
        assert_eq!(reply.status, 400, "{uri}: {}", reply.text);
        let error = &reply.json()["error"];
        assert_eq!(error["param"], "model", "{uri}: {}", reply.text);
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("/v1/images/generations"),
            "{uri}: {}",
            reply.text
        );
    }
    let big = generate(
        state(),
        json!({"model": IMAGE, "prompt": "x", "size": "1232x1232"}),
    )
    .await;
    assert!(
        big.text.contains("--image-max-attention-mb"),
        "{}",
        big.text
    );
    // The model is still there and works.
    let ok = generate(
        state(),
        json!({"prompt": "x", "num_inference_steps": 1, "response_format": "b64_json"}),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text);
}

#[tokio::test]
async fn images_and_chat_at_the_same_time_all_finish() {
    let image = |seed: u64| {
        tokio::spawn(generate(
            state(),
            json!({"model": IMAGE, "prompt": "a boat", "seed": seed, "num_inference_steps": 3,
                   "response_format": "b64_json"}),
        ))
    };
    let (a, b) = (image(1), image(2));
    let chat = post(
        state(),
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 8})
        .to_string(),
    )
    .await;
    assert_eq!(chat.status, 200, "{}", chat.text);
    for reply in [a.await.unwrap(), b.await.unwrap()] {
        assert_eq!(b64_images(&reply).len(), 1);
    }
    let metrics = send(state(), "GET", "/metrics", Some(KEY), None).await;
    assert!(
        metrics.text.contains(&format!(
            "hearth_images_generated_total{{model=\"{IMAGE}\"}}"
        )),
        "{}",
        metrics.text
    );
}

#[tokio::test]
async fn a_full_queue_answers_529() {
    // No waiting room: a second request while one runs is refused.
    let state = image_state(&[MODEL], 0);
    let long = occupy(&state).await;
    let refused = generate(&state, json!({"model": IMAGE, "prompt": "again"})).await;
    assert_eq!(refused.status, 529, "{}", refused.text);
    assert_eq!(long.await.unwrap().status, 200);
}

#[tokio::test]
async fn a_request_quota_holds_image_requests_too() {
    let state = image_state(&[MODEL], 8);
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let project = state.default_project.to_string();
    let set = send(
        &state,
        "PUT",
        &format!("/v1/admin/projects/{project}/quotas"),
        Some(&admin),
        Some(&json!({"model": IMAGE, "requests_per_minute": 1}).to_string()),
    )
    .await;
    assert_eq!(set.status, 200, "{}", set.text);
    let body = json!({"model": IMAGE, "prompt": "x", "num_inference_steps": 1,
                      "response_format": "b64_json"});
    assert_eq!(generate(&state, body.clone()).await.status, 200);
    let refused = generate(&state, body).await;
    assert_eq!(refused.status, 429, "{}", refused.text);
}
