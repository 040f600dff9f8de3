//! The web console's dedicated endpoints section in-process: the list
//! with status and replicas, create, scale and delete, each through the
//! endpoints API's own handlers and checks.

mod common;
mod console_common;

use axum::http::StatusCode;
use common::bare_state;
use console_common::{signed_in, stored_key, Client};

#[tokio::test]
async fn endpoints_are_listed_with_their_status_and_deleted() {
    let state = bare_state();
    let (secret, _) = stored_key(&state, "alice", false).await;
    let project = state.store.default_project().await.unwrap().id;
    let elsewhere = state.store.create_project("Elsewhere").await.unwrap().id;
    let endpoint = |project: &str, name: &str| hearth_store::NewEndpoint {
        id: uuid::Uuid::new_v4().to_string(),
        project_id: project.to_string(),
        name: name.into(),
        description: None,
        model_name: "some-model".into(),
        routing_key: format!("some-model:{name}"),
        flavor_name: "cpu-small".into(),
        gpu_type: None,
        gpu_count: 0,
        region: "local".into(),
        min_replicas: 1,
        max_replicas: 2,
        enabled: true,
    };
    let mine = state
        .store
        .create_endpoint(endpoint(&project, "mine"))
        .await
        .unwrap();
    let theirs = state
        .store
        .create_endpoint(endpoint(&elsewhere, "theirs"))
        .await
        .unwrap();
    let mut browser = Client::new(&state);
    browser.sign_in(&secret).await;
    let csrf = browser.csrf().await;
    let page = browser.get("/console/endpoints").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(
        page.text.contains("some-model:mine") && page.text.contains("0 ready of 1–2"),
        "{}",
        page.text
    );
    assert!(!page.text.contains("theirs"));
    let refused = browser
        .post(
            &format!("/console/endpoints/{}/delete", theirs.id),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let forged = browser
        .post(&format!("/console/endpoints/{}/delete", mine.id), &[])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    // Another project's endpoint cannot be scaled either.
    let scale = |id: &str| format!("/console/endpoints/{id}/scale");
    let refused = browser
        .post(
            &scale(&theirs.id),
            &[
                ("csrf", &csrf),
                ("min_replicas", "1"),
                ("max_replicas", "1"),
            ],
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let deleted = browser
        .post(
            &format!("/console/endpoints/{}/delete", mine.id),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(deleted.status, StatusCode::SEE_OTHER, "{}", deleted.text);
    let page = browser.get("/console/endpoints?notice=deleted").await;
    assert!(page.text.contains("deleting"), "{}", page.text);
}

#[tokio::test]
async fn an_endpoint_is_created_from_the_form_with_the_apis_checks() {
    let state = common::with_model();
    let (mut browser, csrf) = signed_in(&state, "deployer").await;
    let page = browser.get("/console/endpoints").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(page.text.contains("Create an endpoint"), "{}", page.text);
    let list = &page.text[page
        .text
        .find("name=\"flavor_name\"")
        .expect("a flavor list")..];
    let start = list.find("value=\"").unwrap() + 7;
    let flavor = list[start..start + list[start..].find('"').unwrap()].to_string();
    let fields = |flavor: &str, csrf: Option<&str>| -> Vec<(String, String)> {
        let mut out = vec![
            ("name".to_string(), "support-bot".to_string()),
            ("model_name".to_string(), common::MODEL.to_string()),
            ("flavor_name".to_string(), flavor.to_string()),
        ];
        if let Some(c) = csrf {
            out.push(("csrf".into(), c.into()));
        }
        out
    };

    // Without the session's token: refused, nothing created.
    let f = fields(&flavor, None);
    let forged = browser.post("/console/endpoints", &as_refs(&f)).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    // A flavor the model does not have: the API's 400, named on the page.
    let f = fields("no-such-flavor", Some(&csrf));
    let bad = browser.post("/console/endpoints", &as_refs(&f)).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text);
    assert!(bad.text.contains("flavor_name"), "{}", bad.text);
    assert!(!bad.text.contains("support-bot:"), "{}", bad.text);

    let f = fields(&flavor, Some(&csrf));
    let made = browser.post("/console/endpoints", &as_refs(&f)).await;
    assert_eq!(made.status, StatusCode::SEE_OTHER, "{}", made.text);
    let page = browser.get("/console/endpoints?notice=created").await;
    assert!(
        page.text.contains("support-bot") && page.text.contains(&format!("{}:", common::MODEL)),
        "{}",
        page.text
    );

    // Scaling it: through the API's update, with its checks.
    let project = state.store.default_project().await.unwrap().id;
    let made = state.store.list_endpoints(&project).await.unwrap();
    let made = made.iter().find(|e| e.name == "support-bot").unwrap();
    let scale = format!("/console/endpoints/{}/scale", made.id);
    let forged = browser
        .post(&scale, &[("min_replicas", "1"), ("max_replicas", "2")])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let scaled = browser
        .post(
            &scale,
            &[
                ("csrf", &csrf),
                ("min_replicas", "1"),
                ("max_replicas", "2"),
            ],
        )
        .await;
    assert_eq!(scaled.status, StatusCode::SEE_OTHER, "{}", scaled.text);
    let page = browser.get("/console/endpoints?notice=scaled").await;
    assert!(page.text.contains("scaling was changed"), "{}", page.text);
    let stored = state.store.endpoint_by_id(&made.id).await.unwrap();
    assert_eq!((stored.min_replicas, stored.max_replicas), (1, 2));
    for (min, max) in [("3", "1"), ("two", "3"), ("-1", "2"), ("0", "2")] {
        let bad = browser
            .post(
                &scale,
                &[
                    ("csrf", &csrf),
                    ("min_replicas", min),
                    ("max_replicas", max),
                ],
            )
            .await;
        assert!(bad.status.is_client_error(), "{min}-{max}: {}", bad.status);
        assert!(bad.text.contains("replicas"), "{min}-{max}: {}", bad.text);
        // In plain words, never the parser's.
        assert!(
            !bad.text.contains("expected u32"),
            "{min}-{max}: {}",
            bad.text
        );
    }
    let stored = state.store.endpoint_by_id(&made.id).await.unwrap();
    assert_eq!((stored.min_replicas, stored.max_replicas), (1, 2));
    let deleted = browser
        .post(
            &format!("/console/endpoints/{}/delete", made.id),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(deleted.status, StatusCode::SEE_OTHER, "{}", deleted.text);
}

fn as_refs(fields: &[(String, String)]) -> Vec<(&str, &str)> {
    fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}
