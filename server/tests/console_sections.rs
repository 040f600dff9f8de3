//! The web console's sections in-process: files, datasets, batches, usage
//! and the playground, each through the API's own handlers (fine-tuning:
//! console_fine_tuning.rs; dedicated endpoints: console_endpoints.rs;
//! images: console_images.rs).

mod common;
mod console_common;

use axum::http::StatusCode;
use common::{bare_state, send, KEY};
use console_common::{signed_in, stored_key, Client};
use hearth_server::AppState;
use serde_json::json;

#[tokio::test]
async fn an_uploaded_file_is_listed_downloaded_and_deleted() {
    let state = bare_state();
    let (mut browser, csrf) = signed_in(&state, "alice").await;
    let line =
        br#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]}"#;
    let page = browser
        .post_multipart(
            "/console/files",
            &[("csrf", &csrf), ("purpose", "fine-tune")],
            ("train.jsonl", line),
        )
        .await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.text);
    let list = browser.get("/console/files?notice=uploaded").await;
    assert!(
        list.text.contains("train.jsonl") && list.text.contains("File uploaded."),
        "{}",
        list.text
    );
    let project = state.store.default_project().await.unwrap().id;
    let (files, _) = state
        .store
        .list_files(&project, None, None, 10, hearth_store::ListOrder::Desc)
        .await
        .unwrap();
    assert_eq!(files.len(), 1);
    let id = &files[0].id;
    let content = browser.get(&format!("/console/files/{id}/content")).await;
    assert_eq!(content.status, StatusCode::OK);
    assert_eq!(content.text.as_bytes(), line);

    assert_eq!(
        page.location.as_deref(),
        Some("/console/files?notice=uploaded")
    );
    // A file whose lines fail its purpose's check is stored, and said so.
    let failing = browser
        .post_multipart(
            "/console/files",
            &[("csrf", &csrf), ("purpose", "fine-tune")],
            ("bad.jsonl", b"not json\n"),
        )
        .await;
    assert_eq!(failing.status, StatusCode::SEE_OTHER, "{}", failing.text);
    let to = failing.location.expect("a redirect");
    assert_eq!(to, "/console/files?notice=uploaded-error");
    let list = browser.get(&to).await;
    assert!(
        list.text.contains("did not pass the check"),
        "{}",
        list.text
    );

    // A bad purpose: the page again with the API's words, nothing stored.
    let bad = browser
        .post_multipart(
            "/console/files",
            &[("csrf", &csrf), ("purpose", "nonsense")],
            ("x.txt", b"x"),
        )
        .await;
    assert_eq!(bad.status.as_u16() / 100, 4, "{}", bad.text);
    assert!(
        bad.text.contains("Input should be") && bad.text.contains("role=\"alert\""),
        "{}",
        bad.text
    );

    let deleted = browser
        .post(&format!("/console/files/{id}/delete"), &[("csrf", &csrf)])
        .await;
    assert_eq!(deleted.status, StatusCode::SEE_OTHER);
    let list = browser.get("/console/files").await;
    assert!(!list.text.contains("train.jsonl"));
    let gone = browser.get(&format!("/console/files/{id}/content")).await;
    assert_eq!(gone.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn usage_shows_tokens_by_day_and_model_and_refuses_bad_dates() {
    let state = bare_state();
    let (secret, key_id) = stored_key(&state, "alice", false).await;
    let project = state.store.default_project().await.unwrap().id;
    let day = hearth_store::usage::parse_day("2026-03-02").unwrap();
    let row = |day: i64, model: &str, input: i64, output: i64| {
        (
            hearth_store::usage::UsageKey {
                day,
                project_id: project.clone(),
                model: model.into(),
                key_id: key_id.clone(),
                class: "interactive".into(),
            },
            hearth_store::usage::UsageCounts {
                requests: 2,
                input_tokens: input,
                output_tokens: output,
                cached_tokens: 0,
                cost_nanos: 1_500_000,
            },
        )
    };
    state
        .store
        .add_usage(&[row(day, "model-a", 100, 20), row(day + 1, "model-b", 7, 3)])
        .await
        .unwrap();
    let mut browser = Client::new(&state);
    browser.sign_in(&secret).await;
    let page = browser
        .get("/console/usage?start_date=2026-03-01&end_date=2026-03-31")
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(page.text.contains("model-a") && page.text.contains("model-b"));
    // Rows are split by key, so the table names the key of each.
    assert!(
        page.text.contains("<th scope=\"col\">Key</th>"),
        "{}",
        page.text
    );
    assert_eq!(
        page.text.matches(&format!("<code>{key_id}</code>")).count(),
        2,
        "{}",
        page.text
    );
    assert!(
        page.text
            .contains("<strong>130</strong> tokens in 4 requests"),
        "{}",
        page.text
    );
    assert_eq!(
        page.text.matches("<rect class=\"bar\"").count(),
        2,
        "a bar per day"
    );
    let empty = browser
        .get("/console/usage?start_date=2026-04-01&end_date=2026-04-02")
        .await;
    assert!(empty.text.contains("No requests in this range."));
    let bad = browser.get("/console/usage?start_date=yesterday").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.text.contains("id=\"usage-error\""), "{}", bad.text);
    assert!(bad.text.contains("start_date"), "{}", bad.text);
}

#[tokio::test]
async fn a_batch_starts_from_an_uploaded_file_shows_progress_and_cancels() {
    let state = bare_state();
    let (mut browser, csrf) = signed_in(&state, "alice").await;
    let page = browser.get("/console/batches").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text.contains("Upload a JSONL file of requests"));
    let line = br#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi"}]}}"#;
    let up = browser
        .post_multipart(
            "/console/files",
            &[("csrf", &csrf), ("purpose", "batch")],
            ("requests.jsonl", line),
        )
        .await;
    assert_eq!(up.status, StatusCode::SEE_OTHER, "{}", up.text);
    let up = browser
        .post_multipart(
            "/console/files",
            &[("csrf", &csrf), ("purpose", "fine-tune")],
            ("train.jsonl", b"{}\n"),
        )
        .await;
    assert_eq!(up.status, StatusCode::SEE_OTHER, "{}", up.text);
    let project = state.store.default_project().await.unwrap().id;
    let (files, _) = state
        .store
        .list_files(&project, None, None, 10, hearth_store::ListOrder::Desc)
        .await
        .unwrap();
    let batch_file = files
        .iter()
        .find(|f| f.purpose == "batch")
        .unwrap()
        .id
        .clone();
    let tune_file = files
        .iter()
        .find(|f| f.purpose == "fine-tune")
        .unwrap()
        .id
        .clone();

    // A file of the wrong purpose: the API's reason by the form, nothing made.
    let wrong = [
        ("csrf", csrf.as_str()),
        ("input_file_id", tune_file.as_str()),
        ("endpoint", "/v1/chat/completions"),
        ("completion_window", "24h"),
    ];
    let refused = browser.post("/console/batches", &wrong).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.text);
    assert!(
        refused.text.contains("a batch needs purpose"),
        "{}",
        refused.text
    );
    assert!(state
        .store
        .list_batches(&project, 10, None, None)
        .await
        .unwrap()
        .0
        .is_empty());

    let mut good = wrong;
    good[1].1 = batch_file.as_str();
    let made = browser.post("/console/batches", &good).await;
    assert_eq!(made.status, StatusCode::SEE_OTHER, "{}", made.text);
    let (batches, _) = state
        .store
        .list_batches(&project, 10, None, None)
        .await
        .unwrap();
    assert_eq!(batches.len(), 1);
    let id = batches[0].id.clone();
    let page = browser.get("/console/batches?notice=created").await;
    assert!(
        page.text.contains(&id) && page.text.contains("Batch created"),
        "{}",
        page.text
    );
    assert!(page.text.contains("0 done, 0 failed of"));
    let cancelled = browser
        .post(&format!("/console/batches/{id}/cancel"), &[("csrf", &csrf)])
        .await;
    assert_eq!(
        cancelled.status,
        StatusCode::SEE_OTHER,
        "{}",
        cancelled.text
    );
    let status = state
        .store
        .list_batches(&project, 10, None, None)
        .await
        .unwrap()
        .0[0]
        .status;
    assert!(status.as_str().starts_with("cancel"), "{status:?}");

    // A failed batch shows why on its row, six problems as five and a count.
    let failed = browser.post("/console/batches", &good).await;
    assert_eq!(failed.status, StatusCode::SEE_OTHER, "{}", failed.text);
    // Claimed as a worker would (the cancelled one left out).
    let running = [id.clone()];
    let rules = hearth_store::batches::BatchClaimRules {
        running_here: &running,
        ..hearth_store::batches::BatchClaimRules::new("w", 60)
    };
    let claimed = state.store.claim_batch(&rules).await.unwrap().unwrap();
    assert_ne!(claimed.id, id);
    let errors: Vec<_> = (1..=6)
        .map(|i| json!({"code": "invalid_request", "message": format!("Line {i}: `method` must be `POST`, not \"GET\""), "param": null, "line": i}))
        .collect();
    assert!(state
        .store
        .fail_batch(&claimed.id, "w", json!(errors))
        .await
        .unwrap());
    let page = browser.get("/console/batches").await;
    let row = page.text.split(&claimed.id).nth(1).unwrap();
    assert!(
        row.contains("Line 5: <code>method</code>") || row.contains("Line 5: `method` must be"),
        "{row}"
    );
    assert!(
        !row.contains("Line 6:") && row.contains("and 1 more"),
        "{row}"
    );

    // A refused cancel is said at the top of the page, not in the form.
    let again = browser
        .post(
            &format!("/console/batches/{}/cancel", claimed.id),
            &[("csrf", &csrf)],
        )
        .await;
    assert!(again.status.is_client_error(), "{}", again.text);
    let top = again
        .text
        .split(r#"id="page-error""#)
        .nth(1)
        .expect("a page error");
    assert!(top.contains("failed"), "{top}");
    assert!(
        !again.text.contains(r#"id="batch-error""#),
        "{}",
        again.text
    );
}

#[tokio::test]
async fn console_addresses_that_are_no_page_answer_pages() {
    let state = bare_state();
    let (mut browser, _) = signed_in(&state, "alice").await;
    for uri in [
        "/console/nonexistent",
        "/console/keys/",
        "/console/files/x/y",
    ] {
        let page = browser.get(uri).await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{uri}");
        assert!(page.content_type.starts_with("text/html"), "{uri}");
        assert!(page.text.contains("Page not found"), "{uri}: {}", page.text);
    }
    let page = browser.get("/console/sign-out").await;
    assert_eq!(page.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(page.content_type.starts_with("text/html"), "{}", page.text);
    // The API keeps its JSON.
    let page = browser.get("/v1/nonexistent").await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert_eq!(page.text, r#"{"detail":"Not Found"}"#);
    let page = browser.get("/consoles").await;
    assert_eq!(page.text, r#"{"detail":"Not Found"}"#);
}

#[tokio::test]
async fn the_playground_refuses_what_the_chat_api_refuses() {
    let state = bare_state();
    let (mut browser, csrf) = signed_in(&state, "alice").await;
    let page = browser.get("/console/playground").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text.contains("serves no chat model"));
    let fields = [
        ("csrf", csrf.as_str()),
        ("model", "nope"),
        ("message", "hi"),
    ];
    let page = browser.post("/console/playground", &fields).await;
    assert_eq!(page.status.as_u16() / 100, 4, "{}", page.text);
    assert!(page.text.contains("nope"), "{}", page.text);
    let streamed = browser.post("/console/playground/stream", &fields).await;
    assert_eq!(streamed.status.as_u16() / 100, 4);
    assert!(streamed.content_type.starts_with("text/plain"));
    let empty = browser
        .post(
            "/console/playground",
            &[("csrf", csrf.as_str()), ("model", "nope")],
        )
        .await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    let forged = browser
        .post(
            "/console/playground/stream",
            &[("model", "nope"), ("message", "hi")],
        )
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_playground_answers_with_the_served_model_and_streams() {
    let state = common::with_model();
    let (mut browser, csrf) = signed_in(&state, "alice").await;
    let page = browser.get("/console/playground").await;
    assert!(page.text.contains(common::MODEL), "{}", page.text);
    let fields = [
        ("csrf", csrf.as_str()),
        ("model", common::MODEL),
        ("message", "What is the capital of France?"),
        ("max_tokens", "8"),
    ];
    let page = browser.post("/console/playground", &fields).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    let answer = page
        .text
        .split("<pre id=\"pg-answer\" aria-live=\"polite\">")
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .unwrap_or("");
    assert!(!answer.trim().is_empty(), "{}", page.text);
    let streamed = browser.post("/console/playground/stream", &fields).await;
    assert_eq!(streamed.status, StatusCode::OK, "{}", streamed.text);
    assert!(streamed.content_type.starts_with("text/event-stream"));
    let events = common::sse_json(&streamed.text);
    assert!(events
        .iter()
        .any(|e| e["choices"][0]["delta"]["content"].is_string()));
}

#[tokio::test]
async fn a_dataset_made_through_the_api_is_listed_and_its_rows_page() {
    let state = bare_state();
    let (secret, _) = stored_key(&state, "alice", false).await;
    let rows: Vec<serde_json::Value> = (0..60)
        .map(|i| json!({"n": i, "text": format!("row-{i:02}")}))
        .collect();
    let body = json!({"name": "evalset", "rows": rows}).to_string();
    let made = send(&state, "POST", "/v1/datasets", Some(&secret), Some(&body)).await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.text);
    let id = serde_json::from_str::<serde_json::Value>(&made.text).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    let mut browser = Client::new(&state);
    browser.sign_in(&secret).await;
    let list = browser.get("/console/datasets").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert!(
        list.text.contains("evalset") && list.text.contains(&id) && list.text.contains(">60<"),
        "{}",
        list.text
    );

    // The first page: rows 0 to 49, a next link and no previous one.
    let first = browser.get(&format!("/console/datasets/{id}")).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    assert!(first.text.contains("row-00") && first.text.contains("row-49"));
    assert!(!first.text.contains("row-50"));
    let next = format!("/console/datasets/{id}?offset=50");
    assert!(first.text.contains(&next), "{}", first.text);
    assert!(!first.text.contains("Previous rows"));
    let second = browser.get(&next).await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.text);
    assert!(second.text.contains("row-50") && second.text.contains("row-59"));
    assert!(!second.text.contains("row-49<"));
    assert!(second.text.contains("Previous rows") && !second.text.contains("Next rows"));

    // A bad offset is plain words, not a 5xx.
    let bad = browser
        .get(&format!("/console/datasets/{id}?offset=-3"))
        .await;
    assert_eq!(bad.status.as_u16() / 100, 4, "{}", bad.text);
    let bad = browser
        .get(&format!("/console/datasets/{id}?offset=x"))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    // Export through the session.
    let csv = browser
        .get(&format!("/console/datasets/{id}/export?format=csv"))
        .await;
    assert_eq!(csv.status, StatusCode::OK);
    assert!(
        csv.content_type.starts_with("text/csv"),
        "{}",
        csv.content_type
    );
    assert_eq!(csv.text.lines().count(), 61, "{}", csv.text);
    let xml = browser
        .get(&format!("/console/datasets/{id}/export?format=xml"))
        .await;
    assert_eq!(xml.status, StatusCode::BAD_REQUEST);
    assert!(xml.text.contains("CSV"), "{}", xml.text);
}

#[tokio::test]
async fn a_dataset_is_created_from_a_file_by_the_form_and_deleted() {
    let state = bare_state();
    let (mut browser, csrf) = signed_in(&state, "alice").await;
    let count = |state: AppState| async move {
        let list = send(&state, "GET", "/v1/datasets", Some(KEY), None).await;
        serde_json::from_str::<serde_json::Value>(&list.text).unwrap()["data"]
            .as_array()
            .unwrap()
            .len()
    };
    let file: &[u8] = b"{\"q\":\"two plus two\",\"a\":4}\n{\"q\":\"one plus one\",\"a\":2}\n";

    // Without the token (or with a wrong one): 403, and nothing is made.
    for token in [None, Some("wrong")] {
        let mut fields = vec![("name", "sneaky")];
        if let Some(t) = token {
            fields.insert(0, ("csrf", t));
        }
        let page = browser
            .post_multipart("/console/datasets", &fields, ("qa.jsonl", file))
            .await;
        assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.text);
    }
    assert_eq!(count(state.clone()).await, 0);

    let page = browser
        .post_multipart(
            "/console/datasets",
            &[("csrf", &csrf), ("name", "arithmetic")],
            ("qa.jsonl", file),
        )
        .await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.text);
    assert_eq!(
        page.location.as_deref(),
        Some("/console/datasets?notice=created")
    );
    let list = browser.get("/console/datasets?notice=created").await;
    assert!(
        list.text.contains("arithmetic") && list.text.contains("Dataset created."),
        "{}",
        list.text
    );
    assert_eq!(count(state.clone()).await, 1);
    let api = send(&state, "GET", "/v1/datasets", Some(KEY), None).await;
    let listed: serde_json::Value = serde_json::from_str(&api.text).unwrap();
    assert_eq!(listed["data"][0]["row_count"], 2, "{listed}");
    let id = listed["data"][0]["id"].as_str().unwrap().to_string();
    let rows = browser.get(&format!("/console/datasets/{id}")).await;
    assert!(
        rows.text.contains("two plus two") && rows.text.contains("one plus one"),
        "{}",
        rows.text
    );

    // A CSV file works too; a file that is not a table is the page again
    // with the reason, not a 5xx, and nothing more is made.
    let page = browser
        .post_multipart(
            "/console/datasets",
            &[("csrf", &csrf), ("name", "table")],
            ("t.csv", b"x,y\n1,a\n2,b\n3,c\n"),
        )
        .await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.text);
    assert_eq!(count(state.clone()).await, 2);
    let bad = browser
        .post_multipart(
            "/console/datasets",
            &[("csrf", &csrf), ("name", "broken")],
            ("b.jsonl", b"this is not json\n"),
        )
        .await;
    assert_eq!(bad.status.as_u16() / 100, 4, "{}", bad.text);
    assert!(bad.text.contains("role=\"alert\""), "{}", bad.text);
    assert_eq!(count(state.clone()).await, 2);
    // No file chosen: the browser sends an empty part without a name.
    let none = browser
        .post_multipart(
            "/console/datasets",
            &[("csrf", &csrf), ("name", "nothing")],
            ("", b""),
        )
        .await;
    assert_eq!(none.status, StatusCode::BAD_REQUEST, "{}", none.text);
    assert!(none.text.contains("Choose a file."), "{}", none.text);
    assert_eq!(count(state.clone()).await, 2);

    // Columns, folder and description given in the form: the API takes
    // them as they are (a float column where the file's first rows would
    // have said integer); a malformed or unknown type is the page again.
    let page = browser
        .post_multipart(
            "/console/datasets",
            &[
                ("csrf", &csrf),
                ("name", "typed"),
                ("schema", "x:float, y:string"),
                ("folder", "experiments"),
                ("description", "given columns"),
            ],
            ("t.csv", b"x,y\n1,a\n2,b\n"),
        )
        .await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.text);
    let api = send(&state, "GET", "/v1/datasets", Some(KEY), None).await;
    let listed: serde_json::Value = serde_json::from_str(&api.text).unwrap();
    let typed = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "typed")
        .unwrap_or_else(|| panic!("{listed}"))
        .clone();
    assert_eq!(typed["folder"], "experiments", "{typed}");
    assert_eq!(typed["description"], "given columns", "{typed}");
    assert_eq!(typed["schema"][0]["type"]["name"], "float", "{typed}");
    for schema in ["x float", "x:decimal, y:string"] {
        let bad = browser
            .post_multipart(
                "/console/datasets",
                &[("csrf", &csrf), ("name", "badly-typed"), ("schema", schema)],
                ("t.csv", b"x,y\n1,a\n"),
            )
            .await;
        assert_eq!(bad.status.as_u16() / 100, 4, "{schema}: {}", bad.text);
        assert!(bad.text.contains("role=\"alert\""), "{}", bad.text);
    }
    assert_eq!(count(state.clone()).await, 3);

    // A part over the 2 MB default body limit goes through (the route's
    // lifted limit reaches the API's part reader).
    let big: String = (0..40_000)
        .map(|i| format!("{{\"i\":{i},\"pad\":\"{}\"}}\n", "x".repeat(80)))
        .collect();
    let page = browser
        .post_multipart(
            "/console/datasets",
            &[("csrf", &csrf), ("name", "big")],
            ("big.jsonl", big.as_bytes()),
        )
        .await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.text);
    assert_eq!(count(state.clone()).await, 4);

    // Delete: refused without the token, done with it.
    let refused = browser
        .post(&format!("/console/datasets/{id}/delete"), &[])
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let deleted = browser
        .post(
            &format!("/console/datasets/{id}/delete"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(deleted.status, StatusCode::SEE_OTHER, "{}", deleted.text);
    assert_eq!(count(state.clone()).await, 3);
}
