//! The node registry on SQLite and PostgreSQL: registration, heartbeats,
//! re-registration under the same id, liveness by heartbeat age, and
//! forgetting dead nodes.

#[macro_use]
mod common;

use common::{postgres, sqlite, Env};
use serde_json::json;

on_both!(nodes_register_beat_and_are_forgotten,);

async fn nodes_register_beat_and_are_forgotten(env: Env) {
    let s = &env.store;
    let models = vec!["m/chat".to_string(), "m/embed".to_string()];
    s.register_node(
        "node-a",
        Some("http://10.0.0.1:8000"),
        &models,
        &json!({"free_sequences": 60}),
    )
    .await
    .unwrap();
    s.register_node("node-b", None, &[], &json!({}))
        .await
        .unwrap();
    let nodes = s.nodes().await.unwrap();
    assert_eq!(nodes.len(), 2);
    let a = &nodes[0];
    assert_eq!(a.id, "node-a");
    assert_eq!(a.advertise_url.as_deref(), Some("http://10.0.0.1:8000"));
    assert_eq!(a.models, models);
    assert_eq!(a.capacity["free_sequences"], 60);
    let now = hearth_store::ids::now();
    assert!(a.alive_at(now, 30));
    assert!(!a.alive_at(now + 31, 30));

    // A heartbeat updates the models and capacity; an unknown node learns
    // it is gone.
    let serving = vec!["m1".to_string(), "m1:0a1b2c3d".to_string()];
    assert!(s
        .node_heartbeat("node-a", &serving, &json!({"free_sequences": 3}))
        .await
        .unwrap());
    assert_eq!(s.nodes().await.unwrap()[0].capacity["free_sequences"], 3);
    assert_eq!(s.nodes().await.unwrap()[0].models, serving);
    assert!(!s.node_heartbeat("node-z", &[], &json!({})).await.unwrap());

    // Registering again under the same id replaces the row.
    s.register_node("node-a", Some("http://10.0.0.9:8000"), &[], &json!({}))
        .await
        .unwrap();
    let nodes = s.nodes().await.unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(
        nodes[0].advertise_url.as_deref(),
        Some("http://10.0.0.9:8000")
    );
    assert!(nodes[0].models.is_empty());

    // Nothing is older than an hour; everything is older than -1 s.
    assert_eq!(s.forget_dead_nodes(3600).await.unwrap(), 0);
    s.deregister_node("node-b").await.unwrap();
    assert_eq!(s.nodes().await.unwrap().len(), 1);
    assert_eq!(s.forget_dead_nodes(-1).await.unwrap(), 1);
    assert!(s.nodes().await.unwrap().is_empty());
    assert!(!s.node_heartbeat("node-a", &[], &json!({})).await.unwrap());
}
