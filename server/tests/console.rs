//! The web console in-process, signing in and access: sessions, CSRF,
//! keys (shown once, working against the API, revoked), accounts kept
//! apart, projects and the static assets. The sections' pages are in
//! `console_sections.rs`.

mod common;
mod console_common;

use axum::http::StatusCode;
use common::{bare_state, send, KEY};
use console_common::{stored_key, Client};

/// The first whole key value (`hearth-` and 64 hex digits) in a page.
fn key_in(text: &str) -> Option<String> {
    text.match_indices("hearth-").find_map(|(start, _)| {
        let value: String = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        (value.len() == 7 + 64).then_some(value)
    })
}

#[tokio::test]
async fn sign_in_takes_a_good_key_and_refuses_a_bad_one() {
    let state = bare_state();
    let (secret, _) = stored_key(&state, "alice", false).await;
    let mut browser = Client::new(&state);

    // Not signed in: every page leads to the sign-in form.
    let page = browser.get("/console/keys").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(page.location.as_deref(), Some("/console/sign-in"));

    let form = browser.get("/console/sign-in").await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(form.content_type.starts_with("text/html"));
    assert!(form.text.contains(r#"<label for="key">"#), "{}", form.text);
    let csrf = form.csrf();

    // A bad key, an extra --api-key key, an empty one: the form again, with the reason.
    let bad = browser
        .post(
            "/console/sign-in",
            &[("csrf", &csrf), ("key", "hearth-0000")],
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNAUTHORIZED);
    assert!(
        bad.text.contains("not valid for this server"),
        "{}",
        bad.text
    );
    assert!(!bad.text.contains("hearth-0000"), "the key is never echoed");
    assert!(!browser.cookies.contains_key("hearth_console"));
    let csrf = bad.csrf();
    let extra = browser
        .post("/console/sign-in", &[("csrf", &csrf), ("key", KEY)])
        .await;
    assert_eq!(extra.status, StatusCode::UNAUTHORIZED);
    assert!(extra.text.contains("--api-key"), "{}", extra.text);
    let empty = browser
        .post("/console/sign-in", &[("csrf", &extra.csrf()), ("key", " ")])
        .await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);

    // Without the form's token: refused, no session.
    let forged = browser
        .post("/console/sign-in", &[("csrf", "nope"), ("key", &secret)])
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(!browser.cookies.contains_key("hearth_console"));

    // The good key: a session cookie, scoped and hidden from scripts.
    let ok = browser.sign_in(&secret).await;
    let cookie = ok
        .set_cookies
        .iter()
        .find(|c| c.starts_with("hearth_console="))
        .expect("a session cookie");
    for part in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/console",
        "Max-Age=43200",
    ] {
        assert!(cookie.contains(part), "{cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    assert!(!cookie.contains(&secret));
    let keys = browser.get("/console/keys").await;
    assert_eq!(keys.status, StatusCode::OK);
    assert!(keys.text.contains("alice"));
    assert!(!keys.text.contains(&secret), "the key is never shown again");
    assert_eq!(keys.set_cookies.len(), 0);
}

#[tokio::test]
async fn a_key_used_through_the_console_has_a_last_use() {
    let state = bare_state();
    let (secret, key_id) = stored_key(&state, "alice", false).await;
    let last_used = || async {
        state
            .store
            .key(&key_id)
            .await
            .unwrap()
            .unwrap()
            .last_used_at
    };
    assert_eq!(last_used().await, None);
    let mut browser = Client::new(&state);
    browser.sign_in(&secret).await;
    assert_eq!(browser.get("/console/keys").await.status, StatusCode::OK);
    // Recorded in the background: wait for it a little.
    let mut seen = None;
    for _ in 0..200 {
        seen = last_used().await;
        if seen.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(seen.is_some(), "a console page view is a use of its key");
    let keys = browser.get("/console/keys").await;
    assert!(!keys.text.contains("never"), "{}", keys.text);
}

#[tokio::test]
async fn the_session_cookie_is_secure_behind_tls() {
    let mut state = bare_state();
    state.http.public_url = Some("https://hearth.example".into());
    let (secret, _) = stored_key(&state, "alice", false).await;
    let mut browser = Client::new(&state);
    let ok = browser.sign_in(&secret).await;
    assert!(
        ok.set_cookies.iter().all(|c| c.contains("; Secure")),
        "{:?}",
        ok.set_cookies
    );
}

#[tokio::test]
async fn forms_without_the_csrf_token_change_nothing() {
    let state = bare_state();
    let (admin, _) = stored_key(&state, "root", true).await;
    let (_, victim) = stored_key(&state, "victim", false).await;
    let mut browser = Client::new(&state);
    browser.sign_in(&admin).await;
    let csrf = browser.csrf().await;
    // The keys as the forms could change them: the signed-in key's last use
    // is written in the background (at most once a minute) and may land at
    // any point here, so it is left out of the comparison.
    let keys_now = || async {
        let mut keys = state.store.keys().await.unwrap();
        for k in &mut keys {
            k.last_used_at = None;
        }
        keys
    };
    let keys_before = keys_now().await;

    for token in [
        None,
        Some("0".repeat(64)),
        Some(format!("{}x", &csrf[..63])),
    ] {
        let mut fields = vec![("name", "sneaky")];
        if let Some(t) = &token {
            fields.push(("csrf", t));
        }
        let page = browser.post("/console/keys", &fields).await;
        assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.text);
        assert!(key_in(&page.text).is_none());
        let mut fields = vec![];
        if let Some(t) = &token {
            fields.push(("csrf", t.as_str()));
        }
        let page = browser
            .post(&format!("/console/keys/{victim}/revoke"), &fields)
            .await;
        assert_eq!(page.status, StatusCode::FORBIDDEN);
        let page = browser
            .post(
                "/console/projects",
                &[("csrf", token.as_deref().unwrap_or("")), ("name", "X")],
            )
            .await;
        assert_eq!(page.status, StatusCode::FORBIDDEN);
        let page = browser.post("/console/sign-out", &fields).await;
        assert_eq!(page.status, StatusCode::FORBIDDEN);
        let mut parts = vec![("purpose", "fine-tune")];
        if let Some(t) = &token {
            parts.insert(0, ("csrf", t.as_str()));
        }
        let page = browser
            .post_multipart("/console/files", &parts, ("evil.jsonl", b"{}\n"))
            .await;
        assert_eq!(page.status, StatusCode::FORBIDDEN);
    }
    assert_eq!(keys_now().await, keys_before, "nothing changed");
    assert_eq!(state.store.projects().await.unwrap().len(), 1);
    let project = state.store.default_project().await.unwrap().id;
    let (files, _) = state
        .store
        .list_files(&project, None, None, 10, hearth_store::ListOrder::Desc)
        .await
        .unwrap();
    assert!(files.is_empty());
    // Still signed in.
    assert_eq!(browser.get("/console/keys").await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_created_key_is_shown_once_works_and_is_refused_once_revoked() {
    let state = bare_state();
    let (admin, _) = stored_key(&state, "root", true).await;
    let mut browser = Client::new(&state);
    browser.sign_in(&admin).await;
    let csrf = browser.csrf().await;

    // Name, then confirm.
    let empty = browser.get("/console/keys/new?name=+").await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    assert!(empty.text.contains("Enter a name"), "{}", empty.text);
    let confirm = browser.get("/console/keys/new?name=ci-runner").await;
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(confirm.text.contains("Create this key?") && confirm.text.contains("ci-runner"));
    assert_eq!(
        state.store.keys().await.unwrap().len(),
        1,
        "nothing made before confirming"
    );

    let created = browser
        .post("/console/keys", &[("csrf", &csrf), ("name", "ci-runner")])
        .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.text);
    assert!(created.text.contains("cannot be viewed later"));
    assert!(created.text.contains("data-copy=\"new-key\""));
    let secret = key_in(&created.text).expect("the key's value, once");

    // It works against the API.
    let models = send(&state, "GET", "/v1/models", Some(&secret), None).await;
    assert_eq!(models.status, StatusCode::OK, "{}", models.text);

    // The list names it and shows its prefix, never the value.
    let list = browser.get("/console/keys").await;
    assert!(list.text.contains("ci-runner"));
    assert!(list.text.contains(&secret[..15]));
    assert!(!list.text.contains(&secret));
    assert!(key_in(&list.text).is_none());

    // Revoke: confirm page, then the post; the API refuses the key at once.
    let made = state.store.keys().await.unwrap();
    let id = &made.iter().find(|k| k.name == "ci-runner").unwrap().id;
    let confirm = browser.get(&format!("/console/keys/{id}/revoke")).await;
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(confirm.text.contains("Revoke this key?"));
    assert_eq!(
        send(&state, "GET", "/v1/models", Some(&secret), None)
            .await
            .status,
        StatusCode::OK
    );
    let revoked = browser
        .post(&format!("/console/keys/{id}/revoke"), &[("csrf", &csrf)])
        .await;
    assert_eq!(revoked.status, StatusCode::SEE_OTHER);
    assert_eq!(
        revoked.location.as_deref(),
        Some("/console/keys?notice=revoked")
    );
    let refused = send(&state, "GET", "/v1/models", Some(&secret), None).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let list = browser.get("/console/keys?notice=revoked").await;
    assert!(list.text.contains("refused from now on") && list.text.contains("revoked 20"));
}

#[tokio::test]
async fn revoking_ones_own_key_signs_out_with_a_notice() {
    let state = bare_state();
    let (secret, key_id) = stored_key(&state, "alice", false).await;
    let mut browser = Client::new(&state);
    browser.sign_in(&secret).await;
    let csrf = browser.csrf().await;
    let confirm = browser.get(&format!("/console/keys/{key_id}/revoke")).await;
    assert!(
        confirm.text.contains("the key you are signed in with"),
        "{}",
        confirm.text
    );
    let revoked = browser
        .post(
            &format!("/console/keys/{key_id}/revoke"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(revoked.status, StatusCode::SEE_OTHER);
    assert_eq!(
        revoked.location.as_deref(),
        Some("/console/sign-in?revoked")
    );
    let page = browser.get("/console/sign-in?revoked").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text.contains("is revoked"), "{}", page.text);
    // The session went with the key.
    assert_eq!(
        browser.get("/console/keys").await.location.as_deref(),
        Some("/console/sign-in")
    );
}

#[tokio::test]
async fn one_account_never_sees_anothers_keys() {
    let state = bare_state();
    let (alice, alice_id) = stored_key(&state, "alice-key", false).await;
    let (bob, bob_id) = stored_key(&state, "bob-key", false).await;
    let mut a = Client::new(&state);
    a.sign_in(&alice).await;
    let csrf = a.csrf().await;
    let page = a.get("/console/keys").await;
    assert!(page.text.contains("alice-key"));
    assert!(!page.text.contains("bob-key"));
    assert!(!page.text.contains(&bob_id));

    // Bob's key cannot be revoked from Alice's session, nor its page seen.
    let confirm = a.get(&format!("/console/keys/{bob_id}/revoke")).await;
    assert_eq!(confirm.status, StatusCode::FORBIDDEN);
    assert!(!confirm.text.contains("bob-key"));
    let revoke = a
        .post(
            &format!("/console/keys/{bob_id}/revoke"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(revoke.status, StatusCode::FORBIDDEN);
    assert_eq!(
        send(&state, "GET", "/v1/models", Some(&bob), None)
            .await
            .status,
        StatusCode::OK
    );

    // Alice's new key joins her account, not Bob's, and Bob's session
    // (with Alice's form token) cannot act for her.
    let made = a
        .post(
            "/console/keys",
            &[("csrf", &csrf), ("name", "alice-second")],
        )
        .await;
    assert_eq!(made.status, StatusCode::OK);
    let mine = state
        .store
        .key(&alice_id)
        .await
        .unwrap()
        .unwrap()
        .account_id;
    assert_eq!(state.store.account_keys(&mine).await.unwrap().len(), 2);
    let mut b = Client::new(&state);
    b.sign_in(&bob).await;
    let page = b.get("/console/keys").await;
    assert!(!page.text.contains("alice"));
    let forged = b
        .post(
            &format!("/console/keys/{alice_id}/revoke"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(state
        .store
        .key(&alice_id)
        .await
        .unwrap()
        .unwrap()
        .revoked_at
        .is_none());
}

#[tokio::test]
async fn sign_out_and_revoking_the_key_end_the_session() {
    let state = bare_state();
    let (secret, key_id) = stored_key(&state, "alice", false).await;
    let mut browser = Client::new(&state);
    browser.sign_in(&secret).await;
    let csrf = browser.csrf().await;
    let stolen = browser.clone();
    let out = browser.post("/console/sign-out", &[("csrf", &csrf)]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(
        out.location.as_deref(),
        Some("/console/sign-in?signed_out=1")
    );
    assert!(!browser.cookies.contains_key("hearth_console"));
    // The old cookie no longer opens anything.
    let mut stolen = stolen;
    let page = stolen.get("/console/keys").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(page.location.as_deref(), Some("/console/sign-in"));

    browser.sign_in(&secret).await;
    assert_eq!(browser.get("/console/files").await.status, StatusCode::OK);
    state.store.revoke_key(&key_id).await.unwrap();
    assert_eq!(
        browser.get("/console/files").await.status,
        StatusCode::SEE_OTHER
    );
}

#[tokio::test]
async fn projects_switch_only_to_reachable_ones_and_admins_create() {
    let state = bare_state();
    let (admin, _) = stored_key(&state, "root", true).await;
    let (user, _) = stored_key(&state, "alice", false).await;
    let mut root = Client::new(&state);
    root.sign_in(&admin).await;
    let csrf = root.csrf().await;
    let bad = root
        .post("/console/projects", &[("csrf", &csrf), ("name", "")])
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.text.contains("Enter a name"));
    let made = root
        .post(
            "/console/projects",
            &[("csrf", &csrf), ("name", "Research")],
        )
        .await;
    assert_eq!(made.status, StatusCode::SEE_OTHER);
    let research = state
        .store
        .projects()
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.name == "Research")
        .unwrap();
    let page = root.get("/console/files").await;
    assert!(
        page.text.contains(&format!(
            r#"<option value="{}" selected>Research"#,
            research.id
        )),
        "{}",
        page.text
    );

    let mut alice = Client::new(&state);
    alice.sign_in(&user).await;
    let csrf = alice.csrf().await;
    let page = alice.get("/console/projects").await;
    assert!(!page.text.contains("Research") && !page.text.contains("Create a project"));
    let refused = alice
        .post(
            "/console/projects/switch",
            &[("csrf", &csrf), ("project", &research.id)],
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let refused = alice
        .post("/console/projects", &[("csrf", &csrf), ("name", "Mine")])
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let back = alice
        .post(
            "/console/projects/switch",
            &[
                ("csrf", &csrf),
                ("project", &state.default_project),
                ("back", "https://evil.example/"),
            ],
        )
        .await;
    assert_eq!(back.location.as_deref(), Some("/console/files"));
}

#[tokio::test]
async fn assets_are_served_and_unknown_pages_are_404() {
    let state = bare_state();
    let mut browser = Client::new(&state);
    let css = browser.get("/console/assets/console.css").await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(css.content_type.starts_with("text/css") && css.text.contains("@media"));
    let js = browser.get("/console/assets/console.js").await;
    assert!(js.content_type.starts_with("text/javascript") && js.text.contains("data-copy"));
    assert_eq!(
        browser.get("/console/nope").await.status,
        StatusCode::NOT_FOUND
    );
}
