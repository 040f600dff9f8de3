//! The console's Images section in-process, on the tiny random-weight
//! Stable Diffusion pipeline: in the navigation only when an image model
//! is served, a generation shows the requested number of PNGs inline (the
//! prompt as their alt text, the seed used), the API's refusals (a size the
//! model cannot make, a full queue) and the form's own (no prompt, not a
//! number) show by the control they concern, and a form without the
//! session's CSRF token generates nothing.

mod common;
mod console_common;

use std::sync::OnceLock;

use axum::http::StatusCode;
use base64::Engine as _;
use common::images::{image_state, occupy, IMAGE};
use common::{bare_state, send, KEY};
use console_common::{signed_in, Page};
use hearth_server::AppState;

fn state() -> AppState {
    static STATE: OnceLock<AppState> = OnceLock::new();
    STATE.get_or_init(|| image_state(&[], 8)).clone()
}

/// The page's inline images: `(alt, PNG bytes)`.
fn images(page: &Page) -> Vec<(String, Vec<u8>)> {
    let marker = r#"<img src="data:image/png;base64,"#;
    page.text
        .split(marker)
        .skip(1)
        .map(|rest| {
            let b64 = &rest[..rest.find('"').unwrap()];
            let alt = rest.split(r#"alt=""#).nth(1).unwrap();
            let alt = alt[..alt.find('"').unwrap()].to_string();
            let png = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            (alt, png)
        })
        .collect()
}

/// `(width, height)` of a PNG.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let reader = decoder.read_info().expect("a readable PNG");
    (reader.info().width, reader.info().height)
}

/// The error line's text (`#img-error`) and the control it follows.
fn error_of(page: &Page) -> (String, String) {
    let at = page
        .text
        .find(r#"id="img-error""#)
        .unwrap_or_else(|| panic!("no error line: {}", page.text));
    let text = &page.text[at..];
    let text = &text[text.find('>').unwrap() + 1..];
    let text = text[..text.find("</p>").unwrap()].to_string();
    let before = &page.text[..at];
    let control = before
        .rfind(" id=\"img-")
        .map(|i| {
            let id = &before[i + 5..];
            id[..id.find('"').unwrap()].to_string()
        })
        .unwrap_or_default();
    (text, control)
}

/// How many images the server has generated.
async fn generated(state: &AppState) -> u64 {
    let metrics = send(state, "GET", "/metrics", Some(KEY), None).await;
    let line = format!("hearth_images_generated_total{{model=\"{IMAGE}\"}} ");
    metrics
        .text
        .lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

#[tokio::test]
async fn the_section_is_in_the_navigation_only_with_an_image_model() {
    let bare = bare_state();
    let (mut browser, _) = signed_in(&bare, "no-images").await;
    let keys = browser.get("/console/keys").await;
    assert!(keys.text.contains("/console/playground"), "{}", keys.text);
    assert!(!keys.text.contains("/console/images"), "{}", keys.text);
    let page = browser.get("/console/images").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text.contains("serves no image model"), "{}", page.text);
    assert!(!page.text.contains("<form id=\"images\""));

    let state = state();
    let (mut browser, _) = signed_in(&state, "images").await;
    let keys = browser.get("/console/keys").await;
    assert!(
        keys.text
            .contains(r#"<a href="/console/images">Images</a>"#),
        "{}",
        keys.text
    );
    let page = browser.get("/console/images").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.text
            .contains(r#"<a href="/console/images" aria-current="page">Images</a>"#),
        "{}",
        page.text
    );
    for part in [
        r#"<form id="images" method="post" action="/console/images">"#,
        &format!(r#"<option value="{IMAGE}">{IMAGE}</option>"#),
        r#"<option value="64x64">64x64</option>"#,
        r#"name="prompt""#,
        r#"name="negative_prompt""#,
        r#"name="custom_size""#,
        r#"<option value="4">4</option>"#,
        r#"name="steps""#,
        r#"name="seed""#,
    ] {
        assert!(page.text.contains(part), "{part}: {}", page.text);
    }
    assert!(!page.text.contains(r#"<option value="5">"#));
    // 72 is no multiple of the model's step: not offered.
    assert!(!page.text.contains("72x"));
}

#[tokio::test]
async fn a_generation_shows_the_requested_pngs_and_the_seed() {
    let state = state();
    let (mut browser, csrf) = signed_in(&state, "painter").await;
    let page = browser
        .post(
            "/console/images",
            &[
                ("csrf", &csrf),
                ("model", IMAGE),
                ("prompt", "a red fox in the snow"),
                ("negative_prompt", "blurry"),
                ("size", "64x64"),
                ("n", "3"),
                ("steps", "2"),
                ("seed", "42"),
            ],
        )
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    let shown = images(&page);
    assert_eq!(shown.len(), 3, "{}", page.text);
    for (alt, png) in &shown {
        assert_eq!(alt, "a red fox in the snow");
        assert_eq!(png_size(png), (64, 64));
    }
    assert!(
        shown[0].1 != shown[1].1,
        "two images of a request are equal"
    );
    assert!(
        page.text.contains("Seed used: <strong>42</strong>"),
        "{}",
        page.text
    );
    assert!(page.text.contains("Image 3, seed 44"), "{}", page.text);
    // The form keeps what was asked, for another try.
    assert!(page
        .text
        .contains(r#"<option value="3" selected>3</option>"#));
    assert!(page.text.contains(">a red fox in the snow</textarea>"));

    // The same request again (the model picked as the only one, its own
    // size): the same images, as the API promises for a seed.
    let again = browser
        .post(
            "/console/images",
            &[
                ("csrf", &csrf),
                ("prompt", "a red fox in the snow"),
                ("negative_prompt", "blurry"),
                ("size", "auto"),
                ("n", "3"),
                ("steps", "2"),
                ("seed", "42"),
            ],
        )
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert!(images(&again) == shown, "the same seed made other images");
}

/// A form's fields, the status and words of its refusal, and the control
/// the words follow.
type Case = (
    Vec<(&'static str, String)>,
    StatusCode,
    &'static str,
    &'static str,
);

#[tokio::test]
async fn refusals_show_in_plain_words_by_their_control() {
    let state = state();
    let (mut browser, csrf) = signed_in(&state, "careless").await;
    let before = generated(&state).await;
    let base = |prompt: &'static str| {
        vec![
            ("csrf", csrf.clone()),
            ("model", IMAGE.to_string()),
            ("prompt", prompt.to_string()),
            ("size", "auto".to_string()),
            ("n", "1".to_string()),
            ("steps", "1".to_string()),
        ]
    };
    let cases: Vec<Case> = vec![
        // The API's own words about the size, by the size field.
        (
            [base("x"), vec![("custom_size", "72x64".into())]].concat(),
            StatusCode::BAD_REQUEST,
            "cannot make 72x64 images: width and height must be multiples of",
            "img-custom-size",
        ),
        (
            [base("x"), vec![("custom_size", "huge".into())]].concat(),
            StatusCode::BAD_REQUEST,
            "`size` must be `WIDTHxHEIGHT`",
            "img-custom-size",
        ),
        (
            base("   "),
            StatusCode::BAD_REQUEST,
            "Enter a prompt",
            "img-prompt",
        ),
        (
            [base("x"), vec![("seed", "lucky".into())]].concat(),
            StatusCode::BAD_REQUEST,
            "The seed must be a whole number.",
            "img-seed",
        ),
        (
            [base("x"), vec![("steps", "999".into())]].concat(),
            StatusCode::BAD_REQUEST,
            "`num_inference_steps` must be between 1 and 150",
            "img-steps",
        ),
        (
            [base("x"), vec![("n", "9".into())]].concat(),
            StatusCode::BAD_REQUEST,
            "1 to 4 images at a time",
            "img-n",
        ),
        (
            [base("x"), vec![("model", "no/such-model".into())]].concat(),
            StatusCode::NOT_FOUND,
            "no/such-model",
            "img-result-none",
        ),
    ];
    for (fields, status, words, control) in cases {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let page = browser.post("/console/images", &fields).await;
        assert_eq!(page.status, status, "{fields:?}: {}", page.text);
        let (text, after) = error_of(&page);
        assert!(text.contains(words), "{fields:?}: {text}");
        if control != "img-result-none" {
            assert_eq!(after, control, "{fields:?}: the error follows its control");
            assert!(
                page.text.contains(r#"aria-describedby="img-error""#),
                "{}",
                page.text
            );
        }
        assert!(images(&page).is_empty());
        assert!(page.text.contains(r#"<form id="images""#), "the form stays");
    }
    assert_eq!(generated(&state).await, before, "nothing was generated");
}

#[tokio::test]
async fn a_form_without_the_csrf_token_generates_nothing() {
    let state = state();
    let (mut browser, csrf) = signed_in(&state, "forged").await;
    let before = generated(&state).await;
    for token in [
        None,
        Some("0".repeat(64)),
        Some(format!("{}x", &csrf[..63])),
    ] {
        let mut fields = vec![("prompt", "a boat"), ("n", "1"), ("steps", "1")];
        if let Some(t) = &token {
            fields.push(("csrf", t));
        }
        let page = browser.post("/console/images", &fields).await;
        assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.text);
        assert!(page.text.contains("security token"), "{}", page.text);
        assert!(images(&page).is_empty());
    }
    assert_eq!(generated(&state).await, before);
}

#[tokio::test]
async fn a_full_queue_says_to_try_again_later() {
    // No waiting room: a generation while another runs is refused (529).
    let state = image_state(&[], 0);
    let long = occupy(&state).await;
    let (mut browser, csrf) = signed_in(&state, "impatient").await;
    let page = browser
        .post(
            "/console/images",
            &[("csrf", &csrf), ("prompt", "again"), ("n", "1")],
        )
        .await;
    assert_eq!(page.status.as_u16(), 529, "{}", page.text);
    let (text, _) = error_of(&page);
    assert!(
        text.contains("too many requests waiting; try again later"),
        "{text}"
    );
    assert_eq!(long.await.unwrap().status, 200);
}
