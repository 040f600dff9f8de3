//! The cloud platform API through the in-process router: the token
//! exchange with RS256 JWTs signed by freshly generated RSA-4096 keys (and
//! every forgery the exchange must refuse), `/iam/v1/profiles`, access
//! tokens on the inference API (roles: editor uses it, viewer reads, none
//! is refused), admin management of service accounts, keys and groups,
//! and the cloud error model `{code, message}` on every refusal.

mod common;

use std::sync::OnceLock;

use base64::Engine;
use common::raw::*;
use common::*;
use hearth_api::cloud::{GRANT_TYPE_TOKEN_EXCHANGE, TOKEN_TYPE_ACCESS_TOKEN, TOKEN_TYPE_JWT};
use hearth_server::state::AppState;
use hearth_store::iam::{NewAuthorizedKey, NewServiceAccount, Role};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use serde_json::{json, Value};

/// A key pair: private PKCS#8 PEM (to sign) and public SPKI PEM (to upload).
struct Pair {
    private: String,
    public: String,
}

fn generate(bits: usize) -> Pair {
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, bits).unwrap();
    Pair {
        private: key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
        public: key
            .to_public_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap(),
    }
}

/// Two RSA-4096 pairs, made once per test binary (in parallel: slow).
fn pairs() -> &'static [Pair; 2] {
    static PAIRS: OnceLock<[Pair; 2]> = OnceLock::new();
    PAIRS.get_or_init(|| {
        let a = std::thread::spawn(|| generate(4096));
        let b = generate(4096);
        [a.join().unwrap(), b]
    })
}

fn now() -> i64 {
    hearth_store::ids::now()
}

fn sign(pair: &Pair, kid: &str, claims: Value) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_string());
    jsonwebtoken::encode(
        &header,
        &claims,
        &EncodingKey::from_rsa_pem(pair.private.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn claims(sub: &str, lifetime: i64) -> Value {
    let t = now();
    json!({"iss": sub, "sub": sub, "iat": t, "exp": t + lifetime})
}

fn exchange_form(jwt: &str) -> Vec<(&'static str, String)> {
    vec![
        ("grant_type", GRANT_TYPE_TOKEN_EXCHANGE.to_string()),
        ("requested_token_type", TOKEN_TYPE_ACCESS_TOKEN.to_string()),
        ("subject_token", jwt.to_string()),
        ("subject_token_type", TOKEN_TYPE_JWT.to_string()),
    ]
}

async fn exchange_raw(state: &AppState, fields: &[(&str, String)]) -> Raw {
    let mut form = form_urlencoded::Serializer::new(String::new());
    for (k, v) in fields {
        form.append_pair(k, v);
    }
    request(
        state,
        "POST",
        "/oauth2/token/exchange",
        None,
        Some("application/x-www-form-urlencoded"),
        form.finish().into_bytes(),
    )
    .await
}

/// The body of a cloud error: `{code, message}` and nothing else.
fn cloud_error(reply: &Raw, status: u16, code: u64) -> String {
    let body = reply.json();
    assert_eq!(reply.status, status, "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body.as_object().unwrap().len(), 2, "{body}");
    body["message"].as_str().unwrap().to_string()
}

async fn exchange(state: &AppState, jwt: &str) -> String {
    let reply = exchange_raw(state, &exchange_form(jwt)).await;
    let body = reply.json();
    assert_eq!(reply.status, 200, "{body}");
    assert_eq!(reply.headers["cache-control"], "no-store");
    assert_eq!(body["expires_in"], 43200);
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["issued_token_type"], TOKEN_TYPE_ACCESS_TOKEN);
    body["access_token"].as_str().unwrap().to_string()
}

/// A service account of a new account in the default project, with `role`
/// and an authorized key (the public half of `pair`); returns (sa, kid).
async fn service_account(
    state: &AppState,
    name: &str,
    role: Option<Role>,
    pair: &Pair,
) -> (String, String) {
    let sa = state
        .store
        .create_service_account(NewServiceAccount {
            name: name.to_string(),
            role,
            ..Default::default()
        })
        .await
        .unwrap();
    let checked = hearth_server::iam::pem::check_public_key(&pair.public).unwrap();
    let key = state
        .store
        .add_authorized_key(NewAuthorizedKey {
            service_account_id: sa.id.clone(),
            public_key: checked.pem,
            algorithm: "RSA_4096".into(),
            fingerprint: checked.fingerprint,
            expires_at: None,
        })
        .await
        .unwrap();
    (sa.id, key.id)
}

async fn cloud_get(state: &AppState, uri: &str, token: Option<&str>) -> Raw {
    get(state, uri, token).await
}

#[tokio::test]
async fn a_signed_jwt_gets_a_token_that_reads_the_profile_and_the_inference_api() {
    let state = bare_state();
    let [a, _] = pairs();
    let (sa, kid) = service_account(&state, "ci-bot", Some(Role::Editor), a).await;
    let token = exchange(&state, &sign(a, &kid, claims(&sa, 300))).await;

    let profile = cloud_get(&state, "/iam/v1/profiles", Some(&token)).await;
    assert_eq!(profile.status, 200);
    let info = &profile.json()["service_account_profile"];
    assert_eq!(info["info"]["id"], sa.as_str());
    assert_eq!(info["info"]["name"], "ci-bot");
    assert_eq!(info["info"]["role"], "editor");
    assert_eq!(info["info"]["groups"][0]["name"], "editors");
    assert_eq!(info["projects"][0], &*state.default_project);
    assert!(info["token_expires_at"].as_i64().unwrap() >= now() + 43_000);

    // The token works on the inference API, in the account's project.
    let files = get(&state, "/v1/files", Some(&token)).await;
    files.expect_status(200);
    let uploaded = upload_as(&state, &token, "/v1/files", "batch", "a.jsonl", b"{}\n").await;
    assert_eq!(uploaded.status, 200);
    // ...but not in a project the account does not reach.
    let (other, _) = other_project(&state).await;
    shape_a(
        &get(
            &state,
            &format!("/v1/files?ai_project_id={other}"),
            Some(&token),
        )
        .await,
        403,
    );

    // The cloud API takes access tokens only.
    let msg = cloud_error(
        &cloud_get(&state, "/iam/v1/profiles", Some(KEY)).await,
        401,
        16,
    );
    assert!(msg.contains("API keys are not accepted"), "{msg}");
    let admin = state.store.bootstrap_admin().await.unwrap().unwrap().secret;
    cloud_error(
        &cloud_get(&state, "/iam/v1/profiles", Some(&admin)).await,
        401,
        16,
    );
    cloud_error(&cloud_get(&state, "/iam/v1/profiles", None).await, 401, 16);
    // Two Authorization headers, even with the valid token first.
    let twice = axum::http::Request::get("/iam/v1/profiles")
        .header("host", "files.test")
        .header("authorization", format!("Bearer {token}"))
        .header("authorization", "Bearer junk")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = tower::ServiceExt::oneshot(hearth_server::app(state.clone()), twice)
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["code"], 16, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("more than one Authorization"),
        "{body}"
    );
    cloud_error(
        &cloud_get(&state, "/iam/v1/profiles", Some("garbage")).await,
        401,
        16,
    );
    cloud_error(
        &cloud_get(&state, "/iam/v1/profiles", Some("hearthtok_00")).await,
        401,
        16,
    );
    cloud_error(
        &cloud_get(&state, "/iam/v1/nothing", Some(&token)).await,
        404,
        5,
    );
    cloud_error(
        &cloud_get(&state, "/iam/v2/profiles", Some(&token)).await,
        404,
        5,
    );
    // A garbage access token on the inference API is its own 401.
    shape_a(&get(&state, "/v1/files", Some("hearthtok_00")).await, 401);
}

#[tokio::test]
async fn forged_and_malformed_jwts_are_refused() {
    let state = bare_state();
    let [a, b] = pairs();
    let (sa, kid) = service_account(&state, "svc", Some(Role::Editor), a).await;
    let (other_sa, _) = service_account(&state, "other", Some(Role::Editor), b).await;

    let refused = |reply: Raw, want: &str| {
        let msg = cloud_error(&reply, 401, 16);
        assert!(msg.contains(want), "{msg} should say {want}");
    };
    // A stranger's key: a kid nobody uploaded.
    let stranger = "publickey-01JAAAAAAAAAAAAAAAAAAAAAAA";
    refused(
        exchange_raw(&state, &exchange_form(&sign(b, stranger, claims(&sa, 300)))).await,
        "Unknown authorized key",
    );
    // A real kid, signed by another key.
    refused(
        exchange_raw(&state, &exchange_form(&sign(b, &kid, claims(&sa, 300)))).await,
        "signature does not verify",
    );
    // A real key claiming another service account.
    refused(
        exchange_raw(
            &state,
            &exchange_form(&sign(a, &kid, claims(&other_sa, 300))),
        )
        .await,
        "`sub` is not the service account",
    );
    // iss and sub must agree.
    let mut c = claims(&sa, 300);
    c["iss"] = json!(other_sa);
    refused(
        exchange_raw(&state, &exchange_form(&sign(a, &kid, c))).await,
        "`iss` must equal",
    );
    // Expired (beyond the clock skew), and a one-hour JWT.
    let t = now();
    refused(
        exchange_raw(
            &state,
            &exchange_form(&sign(
                a,
                &kid,
                json!({"iss": sa, "sub": sa, "iat": t - 600, "exp": t - 300}),
            )),
        )
        .await,
        "expired",
    );
    refused(
        exchange_raw(&state, &exchange_form(&sign(a, &kid, claims(&sa, 3600)))).await,
        "more than 5 minutes",
    );
    // An iat so far back that exp - iat would overflow.
    let overflow = json!({"iss": sa, "sub": sa, "iat": i64::MIN, "exp": t + 300});
    refused(
        exchange_raw(&state, &exchange_form(&sign(a, &kid, overflow))).await,
        "more than 5 minutes",
    );
    // No exp at all.
    refused(
        exchange_raw(
            &state,
            &exchange_form(&sign(a, &kid, json!({"iss": sa, "sub": sa, "iat": t}))),
        )
        .await,
        "no `exp`",
    );
    // alg none, and HS256 keyed with the public key.
    let b64 = |v: Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&v).unwrap())
    };
    let none = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "typ": "JWT", "kid": kid})),
        b64(claims(&sa, 300))
    );
    refused(
        exchange_raw(&state, &exchange_form(&none)).await,
        "only RS256",
    );
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some(kid.clone());
    let hs256 = jsonwebtoken::encode(
        &hs,
        &claims(&sa, 300),
        &EncodingKey::from_secret(a.public.as_bytes()),
    )
    .unwrap();
    refused(
        exchange_raw(&state, &exchange_form(&hs256)).await,
        "only RS256",
    );
    // Not a JWT at all.
    refused(
        exchange_raw(&state, &exchange_form("not-a-jwt")).await,
        "not a JWT",
    );
    // Headers read before any key: each fault named, whatever the claims.
    let signed = sign(a, &kid, claims(&sa, 300));
    let rest = signed.split_once('.').unwrap().1;
    let raw_head = |head: &str| {
        let head = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(head);
        exchange_form(&format!("{head}.{rest}"))
    };
    for (head, want) in [
        (
            format!(r#"{{"alg":"RS256","kid":"{kid}","crit":["exp"]}}"#),
            "`crit`",
        ),
        (
            r#"{"alg":"RS256","kid":7}"#.to_string(),
            "`kid` must be a string",
        ),
        (
            format!(r#"{{"alg":"RS256","alg":"RS256","kid":"{kid}"}}"#),
            "duplicate field `alg`",
        ),
        (r#"{"alg":5}"#.to_string(), "`alg` must be a string"),
    ] {
        refused(exchange_raw(&state, &raw_head(&head)).await, want);
    }
    // Padding is not base64url as JWTs write it.
    refused(
        exchange_raw(&state, &exchange_form(&format!("{signed}=="))).await,
        "without padding",
    );
    // An exp no NumericDate holds is named as such.
    refused(
        exchange_raw(
            &state,
            &exchange_form(&sign(a, &kid, json!({"iss": sa, "sub": sa, "exp": 1e22}))),
        )
        .await,
        "NumericDate",
    );

    // Form errors are 400 code 3.
    let mut wrong = exchange_form("x.y.z");
    wrong[0].1 = "client_credentials".into();
    let msg = cloud_error(&exchange_raw(&state, &wrong).await, 400, 3);
    assert!(msg.contains("grant_type"), "{msg}");
    let mut wrong = exchange_form("x.y.z");
    wrong[3].1 = "urn:ietf:params:oauth:token-type:id_token".into();
    cloud_error(&exchange_raw(&state, &wrong).await, 400, 3);
    let missing: Vec<_> = exchange_form("x")
        .into_iter()
        .filter(|(k, _)| *k != "subject_token")
        .collect();
    let msg = cloud_error(&exchange_raw(&state, &missing).await, 400, 3);
    assert!(msg.contains("subject_token"), "{msg}");
    let json_body = request(
        &state,
        "POST",
        "/oauth2/token/exchange",
        None,
        Some("application/json"),
        b"{}".to_vec(),
    )
    .await;
    cloud_error(&json_body, 400, 3);

    // A jti is exchanged once.
    let mut c = claims(&sa, 300);
    c["jti"] = json!("once-only");
    let jwt = sign(a, &kid, c);
    let token = exchange(&state, &jwt).await;
    refused(
        exchange_raw(&state, &exchange_form(&jwt)).await,
        "already exchanged",
    );

    // Revoking the key refuses its JWTs and the tokens issued for them.
    assert_eq!(get(&state, "/v1/files", Some(&token)).await.status, 200);
    state.store.revoke_authorized_key(&kid).await.unwrap();
    refused(
        exchange_raw(&state, &exchange_form(&sign(a, &kid, claims(&sa, 300)))).await,
        "revoked",
    );
    // Who cannot sign with the key does not learn that it is revoked.
    refused(
        exchange_raw(&state, &exchange_form(&sign(b, &kid, claims(&sa, 300)))).await,
        "signature does not verify",
    );
    cloud_error(
        &cloud_get(&state, "/iam/v1/profiles", Some(&token)).await,
        401,
        16,
    );
    shape_a(&get(&state, "/v1/files", Some(&token)).await, 401);
}

#[tokio::test]
async fn roles_decide_what_a_token_may_do_and_admins_manage_the_account() {
    let state = bare_state();
    let [a, b] = pairs();
    let (admin_sa, admin_kid) = service_account(&state, "root", Some(Role::Admin), a).await;
    let admin = exchange(&state, &sign(a, &admin_kid, claims(&admin_sa, 300))).await;
    let account = state
        .store
        .service_account(&admin_sa)
        .await
        .unwrap()
        .unwrap()
        .account_id;

    // An admin makes a viewer in its account and uploads its key.
    let post_json = |uri: &'static str, token: String, body: Value| {
        let state = state.clone();
        async move {
            request(
                &state,
                "POST",
                uri,
                Some(&token),
                Some("application/json"),
                body.to_string().into_bytes(),
            )
            .await
        }
    };
    let created = post_json(
        "/iam/v1/serviceAccounts",
        admin.clone(),
        json!({"name": "reader", "role": "viewer"}),
    )
    .await;
    created.expect_status(200);
    let viewer_sa = created.json()["id"].as_str().unwrap().to_string();
    assert_eq!(created.json()["account_id"], account.as_str());
    assert_eq!(created.json()["role"], "viewer");
    let small = generate(2048);
    let msg = cloud_error(
        &post_json(
            "/iam/v1/authorizedKeys",
            admin.clone(),
            json!({"service_account_id": viewer_sa, "public_key": small.public}),
        )
        .await,
        400,
        3,
    );
    assert!(msg.contains("2048 bits"), "{msg}");
    let uploaded = post_json(
        "/iam/v1/authorizedKeys",
        admin.clone(),
        json!({"service_account_id": viewer_sa, "public_key": b.public}),
    )
    .await;
    uploaded.expect_status(200);
    let viewer_kid = uploaded.json()["id"].as_str().unwrap().to_string();
    let twice = post_json(
        "/iam/v1/authorizedKeys",
        admin.clone(),
        json!({"service_account_id": viewer_sa, "public_key": b.public}),
    )
    .await;
    assert!(cloud_error(&twice, 409, 6).contains(&viewer_kid));
    assert!(viewer_kid.starts_with("publickey-"));
    assert_eq!(uploaded.json()["status"], "active");

    // The viewer reads but does not write, on both APIs.
    let viewer = exchange(&state, &sign(b, &viewer_kid, claims(&viewer_sa, 300))).await;
    assert_eq!(get(&state, "/v1/files", Some(&viewer)).await.status, 200);
    let msg = shape_a(
        &upload_as(&state, &viewer, "/v1/files", "batch", "a.jsonl", b"{}\n").await,
        403,
    );
    assert!(msg.contains("viewer"), "{msg}");
    let listed = cloud_get(&state, "/iam/v1/serviceAccounts", Some(&viewer)).await;
    assert_eq!(listed.json()["items"].as_array().unwrap().len(), 2);
    cloud_error(
        &post_json(
            "/iam/v1/serviceAccounts",
            viewer.clone(),
            json!({"name": "sneaky"}),
        )
        .await,
        403,
        7,
    );
    // Roles as the CLI's: editor unless said, `none` joins no group.
    for (body, role) in [
        (json!({"name": "plain"}), json!("editor")),
        (json!({"name": "loner", "role": "none"}), Value::Null),
    ] {
        let made = post_json("/iam/v1/serviceAccounts", admin.clone(), body).await;
        made.expect_status(200);
        assert_eq!(made.json()["role"], role);
    }
    let msg = cloud_error(
        &post_json(
            "/iam/v1/serviceAccounts",
            admin.clone(),
            json!({"name": "odd", "role": "owner"}),
        )
        .await,
        400,
        3,
    );
    assert!(msg.contains("admin or none"), "{msg}");
    // A filter given twice is refused, whichever id comes first.
    let twice = format!(
        "/iam/v1/authorizedKeys?service_account_id={viewer_sa}&service_account_id={admin_sa}"
    );
    cloud_error(&cloud_get(&state, &twice, Some(&admin)).await, 400, 3);

    // Memberships: the admin promotes the viewer to editor; it may then write.
    let groups = cloud_get(&state, "/iam/v1/groups", Some(&admin))
        .await
        .json();
    let editors = groups["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["role"] == "editor")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let added = request(
        &state,
        "POST",
        &format!("/iam/v1/groups/{editors}/members"),
        Some(&admin),
        Some("application/json"),
        json!({"service_account_id": viewer_sa})
            .to_string()
            .into_bytes(),
    )
    .await;
    added.expect_status(200);
    let up = upload_as(&state, &viewer, "/v1/files", "batch", "a.jsonl", b"{}\n").await;
    assert_eq!(up.status, 200);
    // Out of every group: refused on the inference API, profile still readable.
    for role in ["viewer", "editor"] {
        let group = groups["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["role"] == role)
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let removed = request(
            &state,
            "DELETE",
            &format!("/iam/v1/groups/{group}/members/{viewer_sa}"),
            Some(&admin),
            None,
            Vec::new(),
        )
        .await;
        assert_eq!(removed.status, 200);
    }
    let msg = shape_a(&get(&state, "/v1/files", Some(&viewer)).await, 403);
    assert!(msg.contains("no group"), "{msg}");
    assert_eq!(
        cloud_get(&state, "/iam/v1/profiles", Some(&viewer))
            .await
            .status,
        200
    );

    // Another account's service account and keys look missing (403 code 7).
    let (stranger, stranger_kid) = service_account(&state, "elsewhere", Some(Role::Admin), b).await;
    cloud_error(
        &cloud_get(
            &state,
            &format!("/iam/v1/serviceAccounts/{stranger}"),
            Some(&admin),
        )
        .await,
        403,
        7,
    );
    cloud_error(
        &cloud_get(
            &state,
            &format!("/iam/v1/authorizedKeys/{stranger_kid}"),
            Some(&admin),
        )
        .await,
        403,
        7,
    );
    cloud_error(
        &cloud_get(&state, "/iam/v1/serviceAccounts/nope", Some(&admin)).await,
        403,
        7,
    );
    // Revoke over the cloud API.
    let revoked = request(
        &state,
        "DELETE",
        &format!("/iam/v1/authorizedKeys/{viewer_kid}"),
        Some(&admin),
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(revoked.json()["status"], "revoked");
    cloud_error(
        &cloud_get(&state, "/iam/v1/profiles", Some(&viewer)).await,
        401,
        16,
    );
    let keys = cloud_get(
        &state,
        &format!("/iam/v1/authorizedKeys?service_account_id={admin_sa}"),
        Some(&admin),
    )
    .await
    .json();
    assert_eq!(keys["items"][0]["id"], admin_kid.as_str());
}

/// Two admins removing each other from `admins` at the same time: one is
/// refused (400 code 9), so the account keeps an admin; the last admin
/// cannot remove itself either.
#[tokio::test]
async fn admins_removing_each_other_at_once_keep_one() {
    let state = bare_state();
    let [a, b] = pairs();
    let (first, first_kid) = service_account(&state, "first", Some(Role::Admin), a).await;
    let account = state
        .store
        .service_account(&first)
        .await
        .unwrap()
        .unwrap()
        .account_id;
    let second = state
        .store
        .create_service_account(NewServiceAccount {
            name: "second".into(),
            account_id: Some(account.clone()),
            role: Some(Role::Admin),
            ..Default::default()
        })
        .await
        .unwrap()
        .id;
    let checked = hearth_server::iam::pem::check_public_key(&b.public).unwrap();
    let second_kid = state
        .store
        .add_authorized_key(NewAuthorizedKey {
            service_account_id: second.clone(),
            public_key: checked.pem,
            algorithm: "RSA_4096".into(),
            fingerprint: checked.fingerprint,
            expires_at: None,
        })
        .await
        .unwrap()
        .id;
    let first_token = exchange(&state, &sign(a, &first_kid, claims(&first, 300))).await;
    let second_token = exchange(&state, &sign(b, &second_kid, claims(&second, 300))).await;
    let admins = state
        .store
        .groups(&account)
        .await
        .unwrap()
        .into_iter()
        .find(|g| g.role == Role::Admin)
        .unwrap()
        .id;
    let remove = |token: String, member: String| {
        let (state, admins) = (state.clone(), admins.clone());
        async move {
            let uri = format!("/iam/v1/groups/{admins}/members/{member}");
            request(&state, "DELETE", &uri, Some(&token), None, Vec::new()).await
        }
    };
    let (one, two) = tokio::join!(
        remove(first_token.clone(), second.clone()),
        remove(second_token.clone(), first.clone()),
    );
    // The refused one is 400 code 9, or 403 code 7 when the other removal
    // had already taken its admin role when it was authorized.
    let mut statuses = [one.status, two.status];
    statuses.sort();
    assert!(
        statuses == [200, 400] || statuses == [200, 403],
        "{} {}",
        one.json(),
        two.json()
    );
    let refused = if one.status == 200 { &two } else { &one };
    if refused.status == 400 {
        assert!(cloud_error(refused, 400, 9).contains("last admin"));
    } else {
        cloud_error(refused, 403, 7);
    }
    let left = state.store.group_members(&admins).await.unwrap();
    assert_eq!(left.len(), 1);
    // The one left cannot leave.
    let token = if left[0] == first {
        first_token
    } else {
        second_token
    };
    let alone = remove(token, left[0].clone()).await;
    cloud_error(&alone, 400, 9);
    assert_eq!(state.store.group_members(&admins).await.unwrap(), left);
}
