//! The console by keyboard alone, in headless Chromium over WebDriver: a
//! person signs in, creates an API key (seen once) and generates images
//! with Tab, typing and Enter only; and every page of the console starts
//! with a "Skip to content" link, shows a focus ring on everything Tab
//! reaches, and labels every form control. Screenshots go to
//! `<target>/tmp/console-screenshots-keyboard/`.
//!
//! The server serves the default chat model and the tiny image model, and
//! its project has a training file and a cancelled job, so that every
//! section shows its forms.

mod common;
mod console_common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fantoccini::key::Key;
use fantoccini::{Client, Locator};
use hearth_server::AppState;
use serde_json::{json, Value};

use common::images::{image_state, IMAGE};
use common::{raw, MODEL};
use console_common::browser::*;

fn state() -> AppState {
    static STATE: OnceLock<AppState> = OnceLock::new();
    STATE.get_or_init(|| image_state(&[MODEL], 8)).clone()
}

async fn admin_key(state: &AppState, name: &str) -> String {
    state
        .store
        .create_key(name, None, true)
        .await
        .unwrap()
        .secret
}

/// Types `text` into the focused element, then presses Tab.
async fn type_then_tab(c: &Client, text: &str) {
    type_here(c, &format!("{text}{}", Key::Tab)).await;
}

/// Presses Tab once from a freshly loaded page: the focus must be on a
/// visible "Skip to content" link to `#main`.
async fn tab_to_skip_link(c: &Client, page: &str) {
    press(c, Key::Tab).await;
    assert!(
        focus_is(c, "a.skip[href='#main']").await,
        "{page}: the first Tab does not reach the skip link"
    );
    let shown = c
        .execute(
            "const r = document.activeElement.getBoundingClientRect(); \
             return r.left >= 0 && r.top >= 0 && r.width > 0 && r.height > 0 \
                 && document.activeElement.textContent === 'Skip to content'",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(shown, json!(true), "{page}: the skip link is not shown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_signs_in_creates_a_key_and_makes_images_by_keyboard() {
    let Some(driver) = webdriver() else {
        eprintln!("console_keyboard: no WebDriver; skipped");
        return;
    };
    let state = state();
    let admin = admin_key(&state, "keyboard-root").await;
    let base = serve(&state).await;
    let mut shots = Shots::new("console-screenshots-keyboard");
    let c = browser(&driver).await;
    closing(&c, async {
        // Sign in: Tab to the skip link, on to the key field, type the
        // key, Tab to the button, Enter.
        c.goto(&format!("{base}/console/sign-in")).await.unwrap();
        tab_to_skip_link(&c, "sign-in").await;
        type_here(&c, &Key::Tab.to_string()).await;
        assert!(focus_is(&c, "#key").await, "the key field follows");
        type_then_tab(&c, &admin).await;
        assert!(focus_is(&c, "button[type=submit]").await);
        type_here(&c, &Key::Enter.to_string()).await;
        wait_path(&c, "/console/keys").await;

        // The skip link moves the focus to the page's content.
        tab_to_skip_link(&c, "keys").await;
        type_here(&c, &Key::Enter.to_string()).await;
        assert!(
            focus_is(&c, "main#main").await,
            "the skip link focuses main"
        );
        tab_to(&c, "#key-name").await;
        type_here(&c, "keyboard-key").await;
        shots.take(&c, "keys-name-typed").await;
        tab_to(&c, "form[action='/console/keys/new'] button[type=submit]").await;
        type_here(&c, &Key::Enter.to_string()).await;
        wait_prefix(&c, "/console/keys/new?name=keyboard-key").await;
        tab_to_skip_link(&c, "confirm").await;
        type_here(&c, &Key::Enter.to_string()).await;
        tab_to(&c, "#main form button[type=submit]").await;
        shots.take(&c, "key-confirm-focused").await;
        type_here(&c, &Key::Enter.to_string()).await;
        let secret = find(&c, "#new-key")
            .await
            .prop("value")
            .await
            .unwrap()
            .unwrap();
        assert!(
            secret.starts_with("hearth-") && secret.len() == 71,
            "{secret}"
        );
        let page = c.source().await.unwrap();
        assert!(page.contains("shown this once"), "{page}");
        shots.take(&c, "key-created").await;
        let models = ureq::get(&format!("{base}/v1/models"))
            .set("Authorization", &format!("Bearer {secret}"))
            .call();
        assert_eq!(models.map(|r| r.status()).unwrap_or(0), 200);
        // "Done": back to the list, where the value is never shown again.
        tab_to(&c, "#main a[href='/console/keys']").await;
        type_here(&c, &Key::Enter.to_string()).await;
        wait_path(&c, "/console/keys").await;
        let page = c.source().await.unwrap();
        assert!(page.contains("keyboard-key") && page.contains(&secret[..15]));
        assert!(!page.contains(&secret), "the key is shown once");

        // Images: prompt, two images, two steps, a seed; Enter generates.
        c.goto(&format!("{base}/console/images")).await.unwrap();
        tab_to_skip_link(&c, "images").await;
        type_here(&c, &Key::Enter.to_string()).await;
        tab_to(&c, "#img-prompt").await;
        type_here(&c, "a red boat at dawn").await;
        tab_to(&c, "#img-n").await;
        type_here(&c, "2").await;
        tab_to(&c, "#img-steps").await;
        type_then_tab(&c, "2").await;
        assert!(focus_is(&c, "#img-seed").await);
        type_here(&c, "7").await;
        tab_to(&c, "#images button[type=submit]").await;
        type_here(&c, &Key::Enter.to_string()).await;
        find(&c, "#img-result").await;
        let images = c.find_all(Locator::Css(".images img")).await.unwrap();
        assert_eq!(images.len(), 2);
        for img in &images {
            assert_eq!(
                img.attr("alt").await.unwrap().as_deref(),
                Some("a red boat at dawn")
            );
            let src = img.attr("src").await.unwrap().unwrap();
            assert!(src.starts_with("data:image/png;base64,iVBOR"), "{src}");
            let loaded = c
                .execute(
                    "return arguments[0].complete && arguments[0].naturalWidth",
                    vec![serde_json::to_value(img).unwrap()],
                )
                .await
                .unwrap();
            assert_eq!(
                loaded,
                json!(64),
                "the PNG is drawn (CSP allows data: images)"
            );
        }
        let seed = find(&c, "#img-seed-used").await.text().await.unwrap();
        assert!(seed.contains("Seed used: 7"), "{seed}");
        c.execute(
            "document.getElementById('img-result').scrollIntoView()",
            vec![],
        )
        .await
        .unwrap();
        shots.take(&c, "images").await;
    })
    .await;
}

/// Everything Tab can reach on the page, counted by the page itself.
const TABBABLE: &str = "return Array.from(document.querySelectorAll(\
    'a[href], button, input:not([type=hidden]), select, textarea, summary, [tabindex]'))\
    .filter(e => e.tabIndex >= 0 && !e.disabled && e.getClientRects().length > 0).length";

/// The focused element's look: `null` when the focus left the page.
const FOCUSED: &str = "const e = document.activeElement; \
    if (!e || e === document.body || e === document.documentElement) return null; \
    const s = getComputedStyle(e); const r = e.getBoundingClientRect(); \
    return {html: e.outerHTML.slice(0, 160), style: s.outlineStyle, \
            width: parseFloat(s.outlineWidth) || 0, color: s.outlineColor, \
            shadow: s.boxShadow, shown: r.width > 0 && r.height > 0, skip: e.matches('a.skip')}";

/// Form controls without a label (`labels`, `aria-label` or
/// `aria-labelledby`).
const UNLABELLED: &str = "return Array.from(document.querySelectorAll(\
    'input:not([type=hidden]), select, textarea'))\
    .filter(e => !(e.labels && e.labels.length > 0) && !e.getAttribute('aria-label') \
                 && !e.getAttribute('aria-labelledby'))\
    .map(e => e.outerHTML)";

/// The checks of one page: labels, the skip link first, then a ring on
/// every element Tab reaches (the keyboard itself presses Tab), until the
/// focus leaves the page. Returns how many elements Tab reached.
async fn check_page(c: &Client, page: &str) -> usize {
    let unlabelled = c.execute(UNLABELLED, vec![]).await.unwrap();
    assert_eq!(unlabelled, json!([]), "{page}: controls without a label");
    let controls = c
        .execute(
            "return document.querySelectorAll('input:not([type=hidden]), select, textarea').length",
            vec![],
        )
        .await
        .unwrap();
    let tabbable = c.execute(TABBABLE, vec![]).await.unwrap().as_u64().unwrap() as usize;
    tab_to_skip_link(c, page).await;
    let mut reached = 0;
    loop {
        let focused: Value = c.execute(FOCUSED, vec![]).await.unwrap();
        if focused.is_null() || (reached > 0 && focused["skip"] == json!(true)) {
            break;
        }
        reached += 1;
        let ring = focused["style"] != "none"
            && focused["width"].as_f64().unwrap_or(0.0) >= 2.0
            && focused["color"] != "rgba(0, 0, 0, 0)";
        assert!(
            ring || focused["shadow"] != "none",
            "{page}: no visible focus style on {focused}"
        );
        assert_eq!(
            focused["shown"],
            json!(true),
            "{page}: focus on a hidden element: {focused}"
        );
        assert!(
            reached <= tabbable + 10,
            "{page}: Tab never leaves the page"
        );
        press(c, Key::Tab).await;
    }
    assert!(
        reached >= tabbable,
        "{page}: Tab reached {reached} of {tabbable} elements ({controls} controls)"
    );
    reached
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_has_a_skip_link_focus_rings_and_labelled_controls() {
    let Some(driver) = webdriver() else {
        eprintln!("console_keyboard: no WebDriver; skipped");
        return;
    };
    let started = Instant::now();
    let state = state();
    let admin = admin_key(&state, "a11y-root").await;
    // A batch file, a training file and a finished (cancelled) job: the
    // batch and fine-tuning forms show, and the job page does not reload
    // itself.
    let line =
        br#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]}"#;
    let batch = json!({"custom_id": "1", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}});
    raw::upload(&state, "batch", format!("{batch}\n").as_bytes()).await;
    let file = raw::upload(&state, "fine-tune", line).await;
    let file = file["id"].as_str().unwrap();
    let job = raw::post_json(
        &state,
        "/v1/fine_tuning/jobs",
        &json!({"model": MODEL, "training_file": file}),
    )
    .await;
    job.expect_status(200);
    let job = job.json()["id"].as_str().unwrap().to_string();
    raw::post_json(
        &state,
        &format!("/v1/fine_tuning/jobs/{job}/cancel"),
        &json!({}),
    )
    .await
    .expect_status(200);
    let base = serve(&state).await;
    let c = browser(&driver).await;
    closing(&c, async {
        c.goto(&format!("{base}/console/sign-in")).await.unwrap();
        let reached = check_page(&c, "/console/sign-in").await;
        assert!(reached >= 3, "skip link, key field, button: {reached}");
        fill(&c, "#key", &admin).await;
        click(&c, "form button[type=submit]").await;
        wait_path(&c, "/console/keys").await;
        let pages = [
            "/console/keys".to_string(),
            "/console/keys/new?name=x".to_string(),
            "/console/projects".to_string(),
            "/console/files".to_string(),
            "/console/datasets".to_string(),
            "/console/fine-tuning".to_string(),
            format!("/console/fine-tuning/{job}"),
            "/console/batches".to_string(),
            "/console/endpoints".to_string(),
            "/console/usage".to_string(),
            "/console/playground".to_string(),
            "/console/images".to_string(),
        ];
        for page in &pages {
            c.goto(&format!("{base}{page}")).await.unwrap();
            find(&c, "main#main h1").await;
            // Each section page links to every section, Images included.
            let nav = c.find_all(Locator::Css("nav a")).await.unwrap().len();
            assert_eq!(nav, 10, "{page}: the navigation");
            let reached = check_page(&c, page).await;
            eprintln!("console_keyboard: {page}: Tab reached {reached} elements");
        }
        // The forms really are there (not an empty page passing).
        for (page, control) in [
            ("/console/fine-tuning", "#ft-packing"),
            ("/console/batches", "#batch-file"),
            ("/console/playground", "#pg-message"),
            ("/console/images", "#img-size"),
        ] {
            c.goto(&format!("{base}{page}")).await.unwrap();
            find(&c, control).await;
        }
        let size = find(&c, "#img-size").await.text().await.unwrap();
        assert!(size.contains("64x64"), "{size}");
        assert!(find(&c, "#img-model")
            .await
            .text()
            .await
            .unwrap()
            .contains(IMAGE));
    })
    .await;
    eprintln!(
        "console_keyboard: every page checked in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(started.elapsed() < Duration::from_secs(120));
}
