//! Two nodes on one store: node A serves the default models on a real TCP
//! port and registers itself; node B serves none. B forwards requests for
//! A's models to A (plain and streamed), answers 404 for a model no node
//! lists, and 503 once A's heartbeat is older than the timeout.

mod common;

use common::*;
use hearth_server::nodes::{NodeArgs, NodeIdentity};
use hearth_server::AppState;
use serde_json::json;

async fn two_nodes() -> (AppState, AppState, hearth_server::nodes::Heartbeat) {
    let mut a = with_model();
    a.node = NodeIdentity {
        id: "node-a".into(),
        timeout_secs: 30,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = hearth_server::app(a.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let beat = hearth_server::nodes::register(&a, &NodeArgs::default(), addr).await;
    let mut b = bare_state();
    b.store = a.store.clone();
    b.default_project = a.default_project.clone();
    b.node = NodeIdentity {
        id: "node-b".into(),
        timeout_secs: 30,
    };
    (a, b, beat)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_forwards_what_another_node_serves() {
    let (_a, mut b, beat) = two_nodes().await;
    assert!(b.chat.is_empty() && b.embed.is_empty());
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}],
                      "max_tokens": 8, "temperature": 0});
    let reply = post(&b, "/v1/chat/completions", &chat.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.json()["model"], MODEL);
    assert!(reply.json()["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    // Streamed: the events come through as A sends them.
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let reply = post(&b, "/v1/chat/completions", &streamed.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert!(
        reply.content_type.starts_with("text/event-stream"),
        "{}",
        reply.content_type
    );
    let events = sse_events(&reply.text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));

    let embed = json!({"model": "sentence-transformers/all-MiniLM-L6-v2", "input": "hello"});
    let reply = post(&b, "/v1/embeddings", &embed.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(
        reply.json()["data"][0]["embedding"]
            .as_array()
            .unwrap()
            .len(),
        384
    );

    // A model no node lists: the local answer.
    let unknown =
        json!({"model": "nobody/serves-this", "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(
        post(&b, "/v1/chat/completions", &unknown.to_string())
            .await
            .status,
        404
    );
    // A key B does not know is refused by B before anything is forwarded.
    let refused = send(
        &b,
        "POST",
        "/v1/chat/completions",
        Some("wrong"),
        Some(&chat.to_string()),
    )
    .await;
    assert_eq!(refused.status, 401, "{}", refused.text);

    // A gone silent (B's timeout of 0 s, one second later): 503.
    beat.stop().await;
    b.store
        .register_node(
            "node-a",
            Some("http://127.0.0.1:9"),
            &[MODEL.to_string()],
            &json!({}),
        )
        .await
        .unwrap();
    b.node.timeout_secs = 0;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let reply = post(&b, "/v1/chat/completions", &chat.to_string()).await;
    assert_eq!(reply.status, 503, "{}", reply.text);
    b.store.deregister_node("node-a").await.unwrap();
}

/// Keys live in the shared store and are checked on every request: a key
/// revoked through one node is refused by the other at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_revoked_on_one_node_is_refused_by_the_other_at_once() {
    let a = bare_state();
    let mut b = bare_state();
    b.store = a.store.clone();
    b.default_project = a.default_project.clone();
    let admin = a.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let created = post_with(&a, "/v1/admin/keys", &admin, &json!({"name": "k"})).await;
    assert_eq!(created.status, 200, "{}", created.text);
    let created = created.json();
    let (id, secret) = (
        created["id"].as_str().unwrap().to_string(),
        created["key"].as_str().unwrap().to_string(),
    );
    assert_eq!(
        send(&b, "GET", "/v1/files", Some(&secret), None)
            .await
            .status,
        200
    );
    let revoked = send(
        &a,
        "DELETE",
        &format!("/v1/admin/keys/{id}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    assert_eq!(
        send(&b, "GET", "/v1/files", Some(&secret), None)
            .await
            .status,
        401
    );
}

async fn post_with(state: &AppState, uri: &str, key: &str, body: &serde_json::Value) -> Reply {
    send(state, "POST", uri, Some(key), Some(&body.to_string())).await
}
