//! The console in headless Chromium, driven over WebDriver (fantoccini) as
//! a person would click through it: sign in, create a key and see it once,
//! use it against the API, revoke it, upload a file and see it listed, a
//! job's loss chart, batches, endpoints, usage, the phone-width layout,
//! sign out; and the playground streaming an answer of the real model into
//! the page. A screenshot of each page goes to
//! `<target>/tmp/console-screenshots/` (the playground's to
//! `console-screenshots-playground/`).
//!
//! The WebDriver server is `HEARTH_TEST_WEBDRIVER_URL` (`scripts/test`
//! starts chromedriver and sets it), else a `chromedriver` on the PATH
//! started here; without either the test says so and does nothing.

mod common;

use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::FutureExt;
use serde_json::json;

use common::{bare_state, temp_dir};

/// A chromedriver started by this test; killed when dropped.
struct Driver {
    child: Option<Child>,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn webdriver() -> Option<Driver> {
    if let Ok(url) = std::env::var("HEARTH_TEST_WEBDRIVER_URL") {
        return Some(Driver { child: None, url });
    }
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let driver = Driver {
        child: Some(child),
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(driver)
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--window-size=1280,800", "--no-first-run", "--disable-extensions"]}),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a WebDriver session of headless Chromium")
}

struct Shots {
    dir: PathBuf,
    n: usize,
}

impl Shots {
    async fn take(&mut self, c: &Client, name: &str) {
        self.n += 1;
        let png = c.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(self.dir.join(format!("{:02}-{name}.png", self.n)), png).unwrap();
    }
}

async fn path_of(c: &Client) -> String {
    let url = c.current_url().await.unwrap();
    match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    }
}

/// Waits (up to 10 s) until the page's path is `path`.
async fn wait_path(c: &Client, path: &str) {
    wait_until(c, path, |now| now == path).await
}

/// Waits (up to 10 s) until the page's path starts with `prefix`.
async fn wait_prefix(c: &Client, prefix: &str) {
    wait_until(c, prefix, |now| now.starts_with(prefix)).await
}

async fn wait_until(c: &Client, what: &str, done: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = path_of(c).await;
        if done(&now) {
            return;
        }
        assert!(Instant::now() < deadline, "still at {now}, expected {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The element at `css`, waiting (up to 10 s) for a page still loading.
async fn find(c: &Client, css: &str) -> fantoccini::elements::Element {
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
}

async fn click(c: &Client, css: &str) {
    find(c, css).await.click().await.unwrap();
}

async fn fill(c: &Client, css: &str, text: &str) {
    let field = find(c, css).await;
    field.clear().await.unwrap();
    field.send_keys(text).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_clicks_through_the_console() {
    let Some(driver) = webdriver() else {
        eprintln!("console_browser: no HEARTH_TEST_WEBDRIVER_URL and no chromedriver on the PATH; skipped");
        return;
    };
    let started = Instant::now();
    let state = bare_state();
    let admin = state
        .store
        .create_key("root", None, true)
        .await
        .unwrap()
        .secret;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, hearth_server::app(state.clone())).into_future());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut shots = Shots {
        dir: dir.clone(),
        n: 0,
    };
    let c = browser(&driver).await;

    // Whatever happens, the browser's session is closed (no Chromium left behind).
    let outcome = std::panic::AssertUnwindSafe(async {
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

        // Upload a file (with the progress script) and see it listed.
        c.goto(&format!("{base}/console/files")).await.unwrap();
        let upload = temp_dir().join("browser-train.jsonl");
        std::fs::write(&upload, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"hello\"}]}\n").unwrap();
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

        // A job with logged steps: the chart is drawn.
        let project = state.store.default_project().await.unwrap().id;
        let job = state
            .store
            .create_ft_job(hearth_store::NewFtJob {
                project_id: project,
                model: "tiny".into(),
                training_file: "file-x".into(),
                validation_file: None,
                suffix: None,
                seed: 1,
                hyperparameters: json!({}),
                method: "supervised".into(),
            })
            .await
            .unwrap();
        for step in 1..=20 {
            let loss = 3.0 / (1.0 + step as f64 / 4.0);
            let data = json!({"step": step, "train_loss": loss, "valid_loss": (step % 5 == 0).then_some(loss + 0.2)});
            state
                .store
                .add_ft_event(
                    &job.id,
                    "info",
                    "metrics",
                    &format!("Step {step}/20: training loss={loss:.4}"),
                    Some(data),
                )
                .await
                .unwrap();
        }
        c.goto(&format!("{base}/console/fine-tuning"))
            .await
            .unwrap();
        shots.take(&c, "fine-tuning").await;
        click(&c, &format!("a[href='/console/fine-tuning/{}']", job.id)).await;
        let line = find(&c, "svg polyline.train-loss").await;
        assert_eq!(
            line.attr("points")
                .await
                .unwrap()
                .unwrap()
                .split(' ')
                .count(),
            20
        );
        shots.take(&c, "job-chart").await;

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
    .catch_unwind()
    .await;
    let _ = c.clone().close().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    eprintln!(
        "console_browser: {} screenshots in {} ({:.1} s)",
        shots.n,
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    assert!(Path::new(&dir).join("01-sign-in-refused.png").exists());
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, hearth_server::app(state.clone())).into_future());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots-playground");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut shots = Shots { dir, n: 0 };
    let c = browser(&driver).await;
    let outcome = std::panic::AssertUnwindSafe(async {
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
    .catch_unwind()
    .await;
    let _ = c.clone().close().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
