//! `/v1/admin/...` through the in-process router: admin keys only, key
//! creation, listing and revocation (applied at once), projects.

mod common;

use common::raw::*;
use common::*;
use serde_json::json;

#[tokio::test]
async fn admin_routes_manage_keys_and_revokes_apply_at_once() {
    let state = bare_state();
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    // Extra keys and ordinary stored keys are not admins.
    shape_a(&get(&state, "/v1/admin/keys", Some(KEY)).await, 403);

    let created = request(
        &state,
        "POST",
        "/v1/admin/keys",
        Some(&admin),
        Some("application/json"),
        br#"{"name": "ci"}"#.to_vec(),
    )
    .await;
    assert_eq!(
        created.status,
        200,
        "{}",
        String::from_utf8_lossy(&created.bytes)
    );
    let created = created.json();
    let secret = created["key"].as_str().unwrap().to_string();
    assert!(
        secret.starts_with("hearth-") && secret.starts_with(created["prefix"].as_str().unwrap())
    );
    assert_eq!(created["default_project_id"], &*state.default_project);
    let key_id = created["id"].as_str().unwrap().to_string();
    shape_a(&get(&state, "/v1/admin/keys", Some(&secret)).await, 403);
    assert_eq!(get(&state, "/v1/files", Some(&secret)).await.status, 200);

    let listed = get(&state, "/v1/admin/keys", Some(&admin)).await.json();
    let names: Vec<_> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["admin", "ci"]);
    assert!(
        !listed.to_string().contains(&secret),
        "a list never shows keys"
    );

    let revoked = request(
        &state,
        "DELETE",
        &format!("/v1/admin/keys/{key_id}"),
        Some(&admin),
        None,
        vec![],
    )
    .await
    .json();
    assert!(revoked["revoked_at"].is_i64(), "{revoked}");
    shape_a(&get(&state, "/v1/files", Some(&secret)).await, 401);
    shape_a(
        &request(
            &state,
            "DELETE",
            "/v1/admin/keys/key-nope",
            Some(&admin),
            None,
            vec![],
        )
        .await,
        403,
    );

    // Projects: an admin makes one, reaches it, and can key it.
    let project = request(
        &state,
        "POST",
        "/v1/admin/projects",
        Some(&admin),
        Some("application/json"),
        br#"{"name": "Team"}"#.to_vec(),
    )
    .await
    .json();
    let pid = project["id"].as_str().unwrap();
    assert_eq!(
        get(
            &state,
            &format!("/v1/files?ai_project_id={pid}"),
            Some(&admin)
        )
        .await
        .status,
        200
    );
    let body = json!({"name": "team-key", "project_id": pid})
        .to_string()
        .into_bytes();
    let team = request(
        &state,
        "POST",
        "/v1/admin/keys",
        Some(&admin),
        Some("application/json"),
        body,
    )
    .await
    .json();
    assert_eq!(team["default_project_id"], pid);
    let projects = get(&state, "/v1/admin/projects", Some(&admin)).await.json();
    assert_eq!(projects["data"].as_array().unwrap().len(), 2);
    let body = br#"{"name": "x", "project_id": "project-01J00000000000000000000000"}"#.to_vec();
    shape_a(
        &request(
            &state,
            "POST",
            "/v1/admin/keys",
            Some(&admin),
            Some("application/json"),
            body,
        )
        .await,
        400,
    );
}

/// Two nodes on one store: each registers itself with its models, both are
/// listed (to admins only) as alive with their capacity, a silent one is
/// gone, and a clean stop removes the row.
#[tokio::test]
async fn nodes_register_heartbeat_and_leave() {
    let mut state = bare_state();
    state.node = hearth_server::nodes::NodeIdentity {
        id: "node-one".into(),
        timeout_secs: 30,
    };
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let args = hearth_server::nodes::NodeArgs {
        advertise_url: Some("http://10.1.2.3:8000".into()),
        node_heartbeat_secs: 1,
        ..Default::default()
    };
    let addr: std::net::SocketAddr = "0.0.0.0:8000".parse().unwrap();
    let one = hearth_server::nodes::register(&state, &args, addr).await;
    // A second node of the same store, whose heartbeat stopped long ago.
    state
        .store
        .register_node("node-two", None, &["m/x".into()], &json!({}))
        .await
        .unwrap();
    shape_a(&get(&state, "/v1/admin/nodes", Some(KEY)).await, 403);
    let listed = get(&state, "/v1/admin/nodes", Some(&admin)).await.json();
    let data = listed["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "{listed}");
    assert_eq!(data[0]["id"], "node-one");
    assert_eq!(data[0]["advertise_url"], "http://10.1.2.3:8000");
    assert_eq!(data[0]["this_node"], true);
    assert_eq!(data[0]["alive"], true);
    assert_eq!(data[0]["capacity"]["kv_blocks_total"], 0);
    assert_eq!(data[1]["this_node"], false);
    assert_eq!(data[1]["models"], json!(["m/x"]));
    // The heartbeat renews the row (1 s period).
    let before = state.store.nodes().await.unwrap()[0].heartbeat_at;
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    assert!(state.store.nodes().await.unwrap()[0].heartbeat_at > before);
    // A node whose heartbeat is older than the timeout is shown as gone.
    state.node.timeout_secs = 0;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let listed = get(&state, "/v1/admin/nodes", Some(&admin)).await.json();
    assert_eq!(listed["data"][1]["alive"], false, "{listed}");
    one.stop().await;
    let ids: Vec<String> = state
        .store
        .nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id)
        .collect();
    assert_eq!(ids, ["node-two"]);
}

/// A key that is not an admin key gets 403 on every admin route that takes
/// a body, whatever the body (none, empty, not JSON, invalid): the admin
/// check runs before the body is read.
#[tokio::test]
async fn non_admin_keys_get_403_before_body_validation() {
    let state = bare_state();
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let ordinary = state
        .store
        .create_key("plain", None, false)
        .await
        .unwrap()
        .secret;
    let project = state.default_project.to_string();
    let routes = [
        ("POST", "/v1/admin/keys".to_string()),
        ("POST", "/v1/admin/projects".to_string()),
        ("POST", "/v1/admin/adapters".to_string()),
        ("PUT", format!("/v1/admin/projects/{project}/budget")),
        ("PUT", format!("/v1/admin/projects/{project}/quotas")),
    ];
    let bodies: [(Option<&str>, &[u8]); 4] = [
        (None, b""),
        (Some("application/json"), b"{}"),
        (Some("application/json"), b"not json"),
        (Some("application/json"), br#"{"name": 5, "model": []}"#),
    ];
    for (method, uri) in &routes {
        for key in [KEY, ordinary.as_str()] {
            for (content_type, body) in &bodies {
                let reply =
                    request(&state, method, uri, Some(key), *content_type, body.to_vec()).await;
                let msg = shape_a(&reply, 403);
                assert!(msg.contains("admin"), "{method} {uri}: {msg}");
            }
        }
        // The admin key still gets the body checked.
        let reply = request(
            &state,
            method,
            uri,
            Some(&admin),
            Some("application/json"),
            b"not json".to_vec(),
        )
        .await;
        assert!(
            matches!(reply.status, 400 | 422),
            "{method} {uri}: {}",
            reply.status
        );
    }
}

/// Blank or over-long names of projects and keys, and a blank quota model,
/// are 400 naming the field; `*` and a model not served (yet) are quotas.
#[tokio::test]
async fn names_and_quota_models_are_checked() {
    let state = bare_state();
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    let send = |method: &'static str, uri: String, body: serde_json::Value| {
        let (state, admin) = (state.clone(), admin.clone());
        async move {
            let body = body.to_string().into_bytes();
            request(
                &state,
                method,
                &uri,
                Some(&admin),
                Some("application/json"),
                body,
            )
            .await
        }
    };
    let long = "n".repeat(257);
    for uri in ["/v1/admin/projects", "/v1/admin/keys"] {
        for name in ["", "   ", long.as_str()] {
            let reply = send("POST", uri.into(), json!({ "name": name })).await;
            assert_eq!(reply.status, 400, "{uri} {name:?}");
            assert_eq!(reply.json()["error"]["param"], "name", "{}", reply.json());
        }
        let fine = send("POST", uri.into(), json!({"name": "n".repeat(256)})).await;
        assert_eq!(fine.status, 200, "{uri}");
    }
    let project = state.default_project.to_string();
    let quotas = format!("/v1/admin/projects/{project}/quotas");
    for model in ["", " "] {
        let body = json!({"model": model, "tokens_per_minute": 100});
        let reply = send("PUT", quotas.clone(), body).await;
        assert_eq!(reply.status, 400, "{model:?}");
        assert_eq!(reply.json()["error"]["param"], "model", "{}", reply.json());
    }
    for model in ["*", "ft:not-served-yet"] {
        let body = json!({"model": model, "tokens_per_minute": 100});
        assert_eq!(send("PUT", quotas.clone(), body).await.status, 200);
    }
    let listed = get(&state, &quotas, Some(&admin)).await.json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 2, "{listed}");
}
