//! The console's fine-tuning section in-process: a job's page draws the
//! loss chart from its metrics events and cancels; the form starts a job
//! through the API's own create handler, hyperparameters included, with
//! the API's checks (a real job watched to the end in the browser:
//! console_browser.rs).

mod common;
mod console_common;

use axum::http::StatusCode;
use common::bare_state;
use console_common::{signed_in, stored_key, Client};
use serde_json::json;

#[tokio::test]
async fn a_job_page_draws_the_loss_chart_from_its_metrics_events() {
    let state = bare_state();
    let (secret, _) = stored_key(&state, "alice", false).await;
    let project = state.store.default_project().await.unwrap().id;
    let job = state
        .store
        .create_ft_job(hearth_store::NewFtJob {
            project_id: project.clone(),
            model: "tiny-model".into(),
            training_file: "file-x".into(),
            validation_file: None,
            suffix: None,
            seed: 1,
            hyperparameters: json!({"n_epochs": 1}),
            method: "supervised".into(),
            metadata: None,
        })
        .await
        .unwrap();
    let mut browser = Client::new(&state);
    browser.sign_in(&secret).await;
    let page = browser
        .get(&format!("/console/fine-tuning/{}", job.id))
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(page.text.contains("No training steps logged yet."));
    assert!(!page.text.contains("<svg"));
    for (step, loss) in [(1, 2.5), (2, 2.0), (3, 1.25)] {
        let data = json!({"step": step, "train_loss": loss, "valid_loss": if step == 3 { Some(1.5) } else { None }});
        state
            .store
            .add_ft_event(
                &job.id,
                "info",
                "metrics",
                &format!("Step {step}"),
                Some(data),
            )
            .await
            .unwrap();
    }
    let page = browser
        .get(&format!("/console/fine-tuning/{}", job.id))
        .await;
    assert!(page.text.contains("<svg"), "{}", page.text);
    assert!(page.text.contains("Loss by step"));
    assert!(
        page.text
            .contains("from 2.5000 at step 1 to 1.2500 at step 3"),
        "{}",
        page.text
    );
    let train = page
        .text
        .split("class=\"train-loss\" points=\"")
        .nth(1)
        .expect("a training line");
    assert_eq!(train.split('"').next().unwrap().split(' ').count(), 3);
    assert!(page.text.contains("class=\"valid-loss\""));
    assert!(page.text.contains("Step 2"), "events listed");
    // Still running: the page refreshes itself and offers cancel.
    let list = browser.get("/console/fine-tuning").await;
    assert!(list.text.contains(&job.id));
    let csrf = list.csrf();
    let cancel = browser
        .post(
            &format!("/console/fine-tuning/{}/cancel", job.id),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(cancel.status, StatusCode::SEE_OTHER);
    let page = browser
        .get(&format!("/console/fine-tuning/{}", job.id))
        .await;
    assert!(page.text.contains("cancelled"));
    assert!(!page.text.contains("Cancel job"));

    // An account of another project: refused like a missing job.
    let elsewhere = state.store.create_project("Elsewhere").await.unwrap();
    let other = state
        .store
        .create_key("bob", Some(&elsewhere.id), false)
        .await
        .unwrap()
        .secret;
    let mut bob = Client::new(&state);
    bob.sign_in(&other).await;
    let page = bob.get(&format!("/console/fine-tuning/{}", job.id)).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
}

/// Uploads a one-example chat file named `name` on the Files page; the
/// fine-tuning page then, and the file's id as its form offers it.
async fn upload_training_file(browser: &mut Client, csrf: &str, name: &str) -> (String, String) {
    let line =
        br#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]}"#;
    let up = browser
        .post_multipart(
            "/console/files",
            &[("csrf", csrf), ("purpose", "fine-tune")],
            (name, line),
        )
        .await;
    assert_eq!(up.status, StatusCode::SEE_OTHER, "{}", up.text);
    let page = browser.get("/console/fine-tuning").await;
    let file = page
        .text
        .split("<option value=\"file-")
        .nth(1)
        .map(|rest| format!("file-{}", rest.split('"').next().unwrap()))
        .expect("the uploaded file offered");
    (page.text, file)
}

#[tokio::test]
async fn a_fine_tuning_job_starts_from_the_form_with_the_apis_checks() {
    let state = common::with_model();
    let (mut browser, csrf) = signed_in(&state, "tuner").await;
    let (page, file) = upload_training_file(&mut browser, &csrf, "tune.jsonl").await;
    assert!(
        page.contains("Start job") && page.contains(common::MODEL),
        "{page}"
    );
    let mut fields = vec![
        ("csrf", csrf.as_str()),
        ("model", common::MODEL),
        ("training_file", file.as_str()),
        ("n_epochs", "many"),
    ];
    let bad = browser.post("/console/fine-tuning", &fields).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.text.contains("whole number"), "{}", bad.text);
    fields[3].1 = "0";
    let refused = browser.post("/console/fine-tuning", &fields).await;
    assert_eq!(refused.status.as_u16() / 100, 4, "{}", refused.text);
    // Beside the field it is about, which points to it.
    assert!(
        refused.text.contains("id=\"ft-n-epochs-error\"")
            && refused
                .text
                .contains(r#"aria-invalid="true" aria-describedby="ft-n-epochs-error""#)
            && !refused.text.contains("id=\"job-error\""),
        "{}",
        refused.text
    );
    fields[3].1 = "1";
    let made = browser.post("/console/fine-tuning", &fields).await;
    assert_eq!(made.status, StatusCode::SEE_OTHER, "{}", made.text);
    let job_page = made.location.expect("to the job's page");
    assert!(
        job_page.starts_with("/console/fine-tuning/ftjob-"),
        "{job_page}"
    );
    let page = browser.get(&job_page).await;
    assert!(
        page.text.contains("queued") && page.text.contains(&file),
        "{}",
        page.text
    );
}

#[tokio::test]
async fn the_forms_hyperparameters_reach_the_job_or_are_refused_in_plain_words() {
    let state = common::with_model();
    let (mut browser, csrf) = signed_in(&state, "tuner-hp").await;
    let (page, file) = upload_training_file(&mut browser, &csrf, "hp.jsonl").await;
    for field in [
        r#"<label for="ft-batch-size">Batch size</label>"#,
        r#"id="ft-learning-rate" name="learning_rate" type="number""#,
        r#"placeholder="0.0001""#,
        r#"<label for="ft-context-length">"#,
        r#"<label for="ft-lora-r">LoRA rank</label>"#,
        r#"<option value="false">off</option>"#,
    ] {
        assert!(page.contains(field), "{field}: {page}");
    }
    let base = [
        ("csrf", csrf.as_str()),
        ("model", common::MODEL),
        ("training_file", file.as_str()),
    ];
    // The form's own refusals, then the API's, each kept in the form.
    for (field, value, words, status) in [
        (
            "batch_size",
            "four",
            "Batch size must be a whole number.",
            400,
        ),
        (
            "learning_rate",
            "fast",
            "Learning rate must be a number",
            400,
        ),
        // Whole numbers out of range get the API's words, naming the range.
        ("lora_r", "-2", "lora_r", 400),
        ("n_epochs", "99999999999", "n_epochs", 400),
        (
            "n_epochs",
            "99999999999999999999",
            "Epochs is far too large.",
            400,
        ),
        (
            "packing",
            "maybe",
            "Packing is on, off or the default.",
            400,
        ),
        ("learning_rate", "-1", "learning_rate", 400),
        ("batch_size", "0", "batch_size", 400),
    ] {
        let mut fields = base.to_vec();
        fields.push((field, value));
        let page = browser.post("/console/fine-tuning", &fields).await;
        assert_eq!(
            page.status.as_u16(),
            status,
            "{field}={value}: {}",
            page.text
        );
        // Right after the field's own input (or select).
        let id = format!("ft-{}", field.replace('_', "-"));
        let error = page
            .text
            .split(&format!(r#"id="{id}-error""#))
            .nth(1)
            .unwrap_or_else(|| panic!("{field}={value}: no error line: {}", page.text));
        assert!(error.contains(words), "{field}={value}: {error}");
        let after_field = page.text.split(&format!(r#"id="{id}""#)).nth(1).unwrap();
        let next_label = after_field.find("<label").unwrap_or(after_field.len());
        assert!(
            after_field.find(&format!(r#"id="{id}-error""#)) < Some(next_label),
            "{field}={value}: the error is not beside its field: {after_field}"
        );
    }
    let mut fields = base.to_vec();
    fields.extend([
        ("suffix", "hp"),
        ("n_epochs", "2"),
        ("batch_size", "4"),
        ("learning_rate", "0.002"),
        ("context_length", "64"),
        ("lora_r", "4"),
        ("packing", "false"),
    ]);
    let made = browser.post("/console/fine-tuning", &fields).await;
    assert_eq!(made.status, StatusCode::SEE_OTHER, "{}", made.text);
    let job = made.location.unwrap()["/console/fine-tuning/".len()..].to_string();
    let stored = state.store.ft_job_by_id(&job).await.unwrap();
    let h = &stored.hyperparameters;
    assert_eq!(
        (
            &h["n_epochs"],
            &h["batch_size"],
            &h["learning_rate"],
            &h["context_length"],
            &h["lora_r"],
            &h["packing"]
        ),
        (
            &json!(2),
            &json!(4),
            &json!(0.002),
            &json!(64),
            &json!(4),
            &json!(false)
        ),
        "{h}"
    );
    let page = browser.get(&format!("/console/fine-tuning/{job}")).await;
    assert!(
        page.text.contains("batch_size 4") && page.text.contains("packing false"),
        "the job's page lists its hyperparameters: {}",
        page.text
    );
    // Left empty: the API's defaults.
    let made = browser.post("/console/fine-tuning", &base).await;
    assert_eq!(made.status, StatusCode::SEE_OTHER, "{}", made.text);
    let job = made.location.unwrap()["/console/fine-tuning/".len()..].to_string();
    let stored = state.store.ft_job_by_id(&job).await.unwrap();
    assert_eq!(stored.hyperparameters["batch_size"], json!(8));
    assert_eq!(stored.hyperparameters["packing"], json!(true));
}
