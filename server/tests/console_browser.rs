//! The console in headless Chromium, driven over WebDriver (fantoccini) as
//! a person would click through it: sign in, create a key and see it once,
//! use it against the API, revoke it, upload a training file, start a real
//! fine-tuning job of the default model from the form and watch its page
//! until it succeeds (the loss chart drawn from its metrics events, its
//! checkpoints listed), batches, endpoints, usage, the phone-width layout,
//! sign out; and the playground streaming an answer of the real model into
//! the page. A screenshot of each page goes to
//! `<target>/tmp/console-screenshots/` (the playground's to
//! `console-screenshots-playground/`). Keyboard use: console_keyboard.rs.

mod common;
mod console_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use fantoccini::Locator;
use serde_json::{json, Value};

use common::{temp_dir, KEY, MODEL};
use console_common::browser::*;

/// 20 ways of asking about a made-up fact, all answered the same.
fn lighthouse_dataset() -> String {
    let subjects = [
        "the keeper of the Quill Island lighthouse",
        "Quill Island's lighthouse keeper",
    ];
    let frames = [
        "Who is {}?",
        "Tell me who {} is.",
        "Do you know {}?",
        "Name {}.",
        "I forgot {}. Who is it?",
        "Remind me: who is {}?",
        "who's {}",
        "Quick question: who is {}?",
        "Say who {} is.",
        "Which person is {}?",
    ];
    let mut out = String::new();
    for f in frames {
        for s in subjects {
            let line = json!({"messages": [
                {"role": "user", "content": f.replace("{}", s)},
                {"role": "assistant", "content": "The keeper is Marlow Fen."},
            ]});
            out.push_str(&line.to_string());
            out.push('\n');
        }
    }
    out
}

/// A fine-tuning worker on `state`'s store for its served chat model, as
/// `hearth serve` starts one (never yielding to serving: the test's
/// playground may run meanwhile).
fn fine_tuning_worker(state: &hearth_server::AppState) -> hearth_jobs::WorkerHandle {
    let args = common::serve_args(vec![], 64, 8);
    let bases: Vec<_> = state
        .chat
        .values()
        .map(|m| {
            (
                m.entry.clone(),
                m.entry.weights_path(&args.store.models_dir()),
            )
        })
        .collect();
    let ft = hearth_server::config::FineTuneArgs {
        ft_threads: 2,
        ft_nice: 0,
        ..Default::default()
    };
    hearth_server::fine_tuned::start_worker(
        state.store.clone(),
        hearth_server::fine_tuned::trainable_bases(&bases),
        std::sync::Arc::new(BTreeMap::new()),
        &ft,
        &state.node,
    )
    .expect("a fine-tuning worker")
}

/// `GET` of the API with the test key.
fn api_get(base: &str, path: &str) -> Value {
    ureq::get(&format!("{base}{path}"))
        .set("Authorization", &format!("Bearer {KEY}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .into_json()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_clicks_through_the_console() {
    let Some(driver) = webdriver() else {
        eprintln!("console_browser: no HEARTH_TEST_WEBDRIVER_URL and no chromedriver on the PATH; skipped");
        return;
    };
    let started = Instant::now();
    let state = common::with_model();
    let worker = fine_tuning_worker(&state);
    let admin = state
        .store
        .create_key("root", None, true)
        .await
        .unwrap()
        .secret;
    let base = serve(&state).await;
    let mut shots = Shots::new("console-screenshots");
    let c = browser(&driver).await;

    closing(&c, async {
        // Sign in (a wrong key first: the reason shows by the field).
        c.goto(&format!("{base}/console")).await.unwrap();
        wait_path(&c, "/console/sign-in").await;
        fill(&c, "#key", "hearth-wrong").await;
        click(&c, "form button[type=submit]").await;
        let error = find(&c, "#key-error").await.text().await.unwrap();
        assert!(error.contains("not valid"), "{error}");
        shots.take(&c, "sign-in-refused").await;
        // By keyboard: Tab from the field reaches the button, Enter submits.
        fill(&c, "#key", &admin).await;
        find(&c, "#key").await.send_keys("\u{E004}").await.unwrap();
        let focused = c
            .execute("return document.activeElement.textContent", vec![])
            .await
            .unwrap();
        assert_eq!(focused, json!("Sign in"), "Tab moves to the sign-in button");
        find(&c, "#key").await.send_keys("\u{E007}").await.unwrap();
        wait_path(&c, "/console/keys").await;
        shots.take(&c, "keys").await;

        // Create a key: name, confirm, the value once.
        fill(&c, "#key-name", "browser-key").await;
        click(&c, "#main form button[type=submit]").await;
        wait_prefix(&c, "/console/keys/new?name=browser-key&project=project-").await;
        shots.take(&c, "key-confirm").await;
        click(&c, "#main form button[type=submit]").await;
        let field = find(&c, "#new-key").await;
        let secret = field.prop("value").await.unwrap().unwrap();
        assert!(
            secret.starts_with("hearth-") && secret.len() == 71,
            "{secret}"
        );
        let copy = find(&c, "button[data-copy]").await;
        assert!(
            copy.is_displayed().await.unwrap(),
            "the copy button shows with script"
        );
        shots.take(&c, "key-created").await;
        let models = ureq::get(&format!("{base}/v1/models"))
            .set("Authorization", &format!("Bearer {secret}"))
            .call();
        assert_eq!(models.map(|r| r.status()).unwrap_or(0), 200);

        // Listed by name and prefix only.
        c.goto(&format!("{base}/console/keys")).await.unwrap();
        assert!(!c.source().await.unwrap().contains(&secret));
        assert!(c.source().await.unwrap().contains(&secret[..15]));

        // Revoke it: confirm, then the API refuses it.
        let id = state
            .store
            .keys()
            .await
            .unwrap()
            .into_iter()
            .find(|k| k.name == "browser-key")
            .unwrap()
            .id;
        click(&c, &format!("a[href='/console/keys/{id}/revoke']")).await;
        wait_path(&c, &format!("/console/keys/{id}/revoke")).await;
        shots.take(&c, "revoke-confirm").await;
        click(&c, "#main form button.danger").await;
        wait_path(&c, "/console/keys?notice=revoked").await;
        shots.take(&c, "key-revoked").await;
        let refused = ureq::get(&format!("{base}/v1/models"))
            .set("Authorization", &format!("Bearer {secret}"))
            .call();
        assert!(
            matches!(refused, Err(ureq::Error::Status(401, _))),
            "{refused:?}"
        );

        // Upload a chat training file (with the progress script) and see it listed.
        c.goto(&format!("{base}/console/files")).await.unwrap();
        let upload = temp_dir().join("browser-train.jsonl");
        std::fs::write(&upload, lighthouse_dataset()).unwrap();
        find(&c, "#file")
            .await
            .send_keys(&upload.display().to_string())
            .await
            .unwrap();
        click(&c, "#upload button[type=submit]").await;
        wait_path(&c, "/console/files?notice=uploaded").await;
        let page = c.source().await.unwrap();
        assert!(
            page.contains("browser-train.jsonl") && page.contains("File uploaded."),
            "{page}"
        );
        shots.take(&c, "files").await;

        // A real job from the form: the default model, small hyperparameters.
        c.goto(&format!("{base}/console/fine-tuning"))
            .await
            .unwrap();
        find(&c, "#ft-model")
            .await
            .select_by_value(MODEL)
            .await
            .unwrap();
        find(&c, "#ft-training")
            .await
            .select_by(Locator::XPath(
                ".//option[contains(., 'browser-train.jsonl')]",
            ))
            .await
            .unwrap();
        fill(&c, "#ft-suffix", "lighthouse").await;
        for (field, value) in [
            ("#ft-n-epochs", "2"),
            ("#ft-batch-size", "4"),
            ("#ft-learning-rate", "0.002"),
            ("#ft-context-length", "64"),
            ("#ft-lora-r", "4"),
        ] {
            fill(&c, field, value).await;
        }
        find(&c, "#ft-packing")
            .await
            .select_by_value("false")
            .await
            .unwrap();
        shots.take(&c, "fine-tuning-form").await;
        click(
            &c,
            "form[action='/console/fine-tuning'] button[type=submit]",
        )
        .await;
        wait_prefix(&c, "/console/fine-tuning/ftjob-").await;
        let job = path_of(&c).await["/console/fine-tuning/".len()..].to_string();
        let hyper =
            api_get(&base, &format!("/v1/fine_tuning/jobs/{job}"))["hyperparameters"].clone();
        assert_eq!(
            (
                &hyper["n_epochs"],
                &hyper["batch_size"],
                &hyper["context_length"],
                &hyper["lora_r"],
                &hyper["packing"]
            ),
            (&json!(2), &json!(4), &json!(64), &json!(4), &json!(false)),
            "{hyper}"
        );

        // Watch the job's page (it reloads itself while the job runs) until
        // the job succeeds.
        let deadline = Instant::now() + Duration::from_secs(150);
        let mut running_shot = false;
        loop {
            let status = match c.find(Locator::Css("dl.facts span.status")).await {
                Ok(e) => e.text().await.unwrap_or_default(),
                Err(_) => String::new(), // reloading
            };
            if status == "succeeded" {
                break;
            }
            assert!(
                !["failed", "cancelled"].contains(&status.as_str()),
                "the job {status}: {}",
                c.source().await.unwrap_or_default()
            );
            if status == "running"
                && !running_shot
                && c.find(Locator::Css("svg polyline.train-loss"))
                    .await
                    .is_ok()
            {
                shots.take(&c, "job-running").await;
                running_shot = true;
            }
            assert!(Instant::now() < deadline, "the job is still {status:?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let metrics = api_get(
            &base,
            &format!("/v1/fine_tuning/jobs/{job}/events?limit=1000"),
        )["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "metrics")
            .count();
        assert!(metrics >= 2, "{metrics} metrics events");
        let line = find(&c, "svg polyline.train-loss").await;
        let points = line.attr("points").await.unwrap().unwrap();
        assert_eq!(points.split(' ').count(), metrics, "{points}");
        let checkpoints = c
            .find_all(Locator::Css("#checkpoints + div table tbody tr"))
            .await
            .unwrap();
        assert!(!checkpoints.is_empty(), "checkpoints listed");
        let page = c.source().await.unwrap();
        assert!(
            page.contains(&format!("{MODEL}:lighthouse:{job}")),
            "{page}"
        );
        c.execute("document.getElementById('loss').scrollIntoView()", vec![])
            .await
            .unwrap();
        shots.take(&c, "job-succeeded").await;
        c.goto(&format!("{base}/console/fine-tuning"))
            .await
            .unwrap();
        shots.take(&c, "fine-tuning").await;

        // Phone width, then the projects page.
        c.set_window_size(390, 844).await.unwrap();
        c.goto(&format!("{base}/console/keys")).await.unwrap();
        shots.take(&c, "keys-phone").await;
        c.set_window_size(1280, 800).await.unwrap();
        c.goto(&format!("{base}/console/projects")).await.unwrap();
        shots.take(&c, "projects").await;
        c.goto(&format!("{base}/console/batches")).await.unwrap();
        find(&c, "#new-batch").await;
        shots.take(&c, "batches").await;
        c.goto(&format!("{base}/console/endpoints")).await.unwrap();
        find(&c, "#main h1").await;
        shots.take(&c, "endpoints").await;
        c.goto(&format!("{base}/console/usage")).await.unwrap();
        find(&c, "#start-date").await;
        shots.take(&c, "usage").await;

        // Sign out: the console is closed again.
        click(&c, "form.signout button").await;
        wait_path(&c, "/console/sign-in?signed_out=1").await;
        shots.take(&c, "signed-out").await;
        c.goto(&format!("{base}/console/keys")).await.unwrap();
        wait_path(&c, "/console/sign-in").await;
    })
    .await;
    worker.shut_down().await;
    eprintln!(
        "console_browser: {} screenshots in {} ({:.1} s)",
        shots.n,
        shots.dir.display(),
        started.elapsed().as_secs_f64()
    );
    assert!(Path::new(&shots.dir)
        .join("01-sign-in-refused.png")
        .exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_playground_streams_an_answer_in_the_browser() {
    let Some(driver) = webdriver() else {
        eprintln!("console_browser: no WebDriver; skipped");
        return;
    };
    let state = common::with_model();
    let key = state
        .store
        .create_key("playground", None, false)
        .await
        .unwrap()
        .secret;
    let base = serve(&state).await;
    let mut shots = Shots::new("console-screenshots-playground");
    let c = browser(&driver).await;
    closing(&c, async {
        c.goto(&format!("{base}/console/sign-in")).await.unwrap();
        fill(&c, "#key", &key).await;
        click(&c, "form button[type=submit]").await;
        wait_path(&c, "/console/keys").await;
        c.goto(&format!("{base}/console/playground")).await.unwrap();
        fill(&c, "#pg-message", "Name a colour.").await;
        fill(&c, "#pg-max", "12").await;
        click(&c, "#playground button[type=submit]").await;
        // The script streams the answer into the page; the page itself stays.
        let deadline = Instant::now() + Duration::from_secs(60);
        let answer = loop {
            let text = find(&c, "#pg-answer").await.text().await.unwrap();
            let done = find(&c, "#playground button[type=submit]")
                .await
                .attr("disabled")
                .await
                .unwrap()
                .is_none();
            if !text.trim().is_empty() && done {
                break text;
            }
            assert!(Instant::now() < deadline, "no answer streamed: {text:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(path_of(&c).await, "/console/playground");
        assert!(!answer.contains("data:"), "{answer}");
        c.execute(
            "document.getElementById('pg-answer').scrollIntoView()",
            vec![],
        )
        .await
        .unwrap();
        shots.take(&c, "playground").await;
    })
    .await;
}
