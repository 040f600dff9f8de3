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
