//! Images: text to image with a served image model, through the images
//! API's own handler (`response_format: b64_json`); the PNGs come back in
//! the page (`data:` images, the prompt as their alt text) with the seed
//! used, so a person can make the same images again. Errors of the API
//! show next to the control they concern.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use hearth_api::images::{ImagesResponse, MAX_PROMPT_CHARS, MAX_STEPS};
use hearth_api::{ErrorBody, Loc, ProjectQuery};
use maud::{html, Markup};
use serde_json::{json, Value};

use super::form::Form;
use super::layout::{self, csrf_field, render, Section};
use super::session::Session;
use crate::error::{ApiJson, ApiQuery, HttpError};
use crate::state::AppState;

/// Most images one generation of the console asks for (they are shown
/// inline, in one page).
const MAX_IMAGES: u32 = 4;

/// Sizes offered besides the model's own, where the model can make them.
const SIZES: &[(usize, usize)] = &[
    (64, 64),
    (128, 128),
    (256, 256),
    (512, 512),
    (768, 768),
    (1024, 1024),
    (768, 512),
    (512, 768),
    (1024, 768),
    (768, 1024),
];

/// A refusal, with the form field it concerns (`None`: the whole form).
struct Refusal {
    status: StatusCode,
    field: Option<&'static str>,
    message: String,
}

impl Refusal {
    fn bad(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            field: Some(field),
            message: message.into(),
        }
    }
}

/// `GET /console/images`.
pub async fn page(State(state): State<AppState>, session: Session) -> Response {
    show(
        &state,
        &session,
        StatusCode::OK,
        &Form::default(),
        None,
        None,
    )
    .await
}

/// The sizes of the select: the served image models' own sizes first,
/// then those of [`SIZES`] some served model can make.
fn sizes(state: &AppState) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let own = state.images.values().map(|m| m.default_size());
    let offered = SIZES
        .iter()
        .copied()
        .filter(|&(w, h)| state.images.values().any(|m| m.supports_size(w, h)));
    for (w, h) in own.chain(offered) {
        let size = format!("{w}x{h}");
        if !out.contains(&size) {
            out.push(size);
        }
    }
    out
}

async fn show(
    state: &AppState,
    session: &Session,
    status: StatusCode,
    entered: &Form,
    made: Option<&ImagesResponse>,
    refusal: Option<&Refusal>,
) -> Response {
    let error_at = |field: Option<&str>| -> Markup {
        match refusal {
            Some(r) if r.field == field => {
                html! { p.error #img-error role="alert" { (r.message) } }
            }
            _ => html! {},
        }
    };
    let described = |field: &str| {
        refusal
            .filter(|r| r.field == Some(field))
            .map(|_| "img-error")
    };
    let value = |name: &str| entered.get(name).unwrap_or("").to_string();
    let picked = |name: &str, v: &str| entered.get(name) == Some(v);
    let models: Vec<&String> = state.images.keys().collect();
    let body = html! {
        h1 { "Images" }
        @if models.is_empty() {
            p { "This server serves no image model (start it with one, e.g. `hearth serve --models stabilityai/sd-turbo`)." }
            (error_at(None))
        } @else {
            form #images method="post" action="/console/images" {
                (csrf_field(session))
                label for="img-model" { "Model" }
                select #img-model name="model" aria-describedby=[described("model")] {
                    @for m in &models { option value=(m) selected[picked("model", m)] { (m) } } }
                (error_at(Some("model")))
                label for="img-prompt" { "Prompt (what the image shows)" }
                textarea #img-prompt name="prompt" rows="3" required maxlength=(MAX_PROMPT_CHARS)
                    aria-describedby=[described("prompt")] { (value("prompt")) }
                (error_at(Some("prompt")))
                label for="img-negative" { "Negative prompt (what it should not show, optional)" }
                textarea #img-negative name="negative_prompt" rows="2" { (value("negative_prompt")) }
                label for="img-size" { "Size (width x height, in pixels)" }
                select #img-size name="size" aria-describedby=[described("size")] {
                    option value="auto" { "the model's own size" }
                    @for s in sizes(state) { option value=(s) selected[picked("size", &s)] { (s) } }
                }
                label for="img-custom-size" { "Another size (optional, e.g. 512x768: replaces the one above)" }
                input #img-custom-size name="custom_size" type="text"
                    pattern="[0-9]+[xX][0-9]+" placeholder="WIDTHxHEIGHT" value=(value("custom_size"))
                    aria-describedby=[described("size")];
                (error_at(Some("size")))
                label for="img-n" { "Number of images" }
                select #img-n name="n" aria-describedby=[described("n")] {
                    @for n in 1..=MAX_IMAGES { option value=(n) selected[picked("n", &n.to_string())] { (n) } } }
                (error_at(Some("n")))
                label for="img-steps" { "Denoising steps (optional: the model's default)" }
                input #img-steps name="steps" type="number" min="1" max=(MAX_STEPS) value=(value("steps"))
                    aria-describedby=[described("steps")];
                (error_at(Some("steps")))
                label for="img-seed" { "Seed (optional: a random one; the same seed and settings make the same images)" }
                input #img-seed name="seed" type="number" min="0" value=(value("seed"))
                    aria-describedby=[described("seed")];
                (error_at(Some("seed")))
                (error_at(None))
                button type="submit" { "Generate" }
                p.hint { "Generating takes a while on a CPU: the page comes back with the images." }
            }
        }
        @if let Some(made) = made {
            section aria-labelledby="img-result" {
                h2 #img-result { "Generated" }
                p #img-seed-used { "Seed used: " strong { (made.seed) } " (size " (made.size)
                    @if made.data.len() > 1 { "; each next image used the next seed" } ")." }
                div.images {
                    @for (i, image) in made.data.iter().enumerate() {
                        @if let Some(b64) = &image.b64_json {
                            figure {
                                img src={ "data:image/png;base64," (b64) }
                                    alt=(image.revised_prompt.as_deref().or(entered.get("prompt")).unwrap_or("generated image"));
                                figcaption { "Image " (i + 1) ", seed " (made.seed.wrapping_add(i as u64)) }
                            }
                        }
                    }
                }
            }
        }
    };
    render(state, session, Section::Images, status, "Images", body).await
}

/// The API request a form asks for, or what is wrong with it.
fn request(form: &Form) -> Result<Value, Refusal> {
    let prompt = form
        .get("prompt")
        .ok_or_else(|| Refusal::bad("prompt", "Enter a prompt: what the image should show."))?;
    let whole = |name: &str, field: &'static str, what: &str| -> Result<Option<u64>, Refusal> {
        form.get(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| Refusal::bad(field, format!("{what} must be a whole number.")))
            })
            .transpose()
    };
    let n = whole("n", "n", "The number of images")?.unwrap_or(1);
    if !(1..=u64::from(MAX_IMAGES)).contains(&n) {
        return Err(Refusal::bad(
            "n",
            format!("The console makes 1 to {MAX_IMAGES} images at a time."),
        ));
    }
    let size = form
        .get("custom_size")
        .or(form.get("size"))
        .unwrap_or("auto");
    let mut request = json!({
        "prompt": prompt,
        "n": n,
        "size": size,
        "response_format": "b64_json",
    });
    if let Some(model) = form.get("model") {
        request["model"] = json!(model);
    }
    if let Some(negative) = form.get("negative_prompt") {
        request["negative_prompt"] = json!(negative);
    }
    if let Some(steps) = whole("steps", "steps", "The number of steps")? {
        request["num_inference_steps"] = json!(steps);
    }
    if let Some(seed) = whole("seed", "seed", "The seed")? {
        request["seed"] = json!(seed);
    }
    Ok(request)
}

/// The form field an API error concerns.
fn field_of(e: &HttpError) -> Option<&'static str> {
    let param = match e.0.body() {
        ErrorBody::Validation(items) => items.first().and_then(|item| match item.loc.get(1) {
            Some(Loc::Key(k)) => Some(k.as_str()),
            _ => None,
        }),
        _ => e.0.param(),
    };
    match param? {
        "model" => Some("model"),
        "prompt" => Some("prompt"),
        "size" => Some("size"),
        "n" => Some("n"),
        "num_inference_steps" => Some("steps"),
        "seed" => Some("seed"),
        _ => None,
    }
}

/// Runs a request through `/v1/images/generations`' handler as the session.
async fn generate(
    state: &AppState,
    session: &Session,
    headers: HeaderMap,
    request: Value,
) -> Result<ImagesResponse, HttpError> {
    let parsed = hearth_api::parse_json_body(request.to_string().as_bytes()).map_err(HttpError)?;
    crate::routes::images::create(
        State(state.clone()),
        ApiQuery(ProjectQuery::default()),
        Extension(session.ctx()),
        headers,
        ApiJson(parsed),
    )
    .await
    .map(|made| made.0)
}

/// `POST /console/images` `{csrf, model, prompt, negative_prompt?, size,
/// custom_size?, n, steps?, seed?}`.
pub async fn create(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    form: Form,
) -> Response {
    if let Some(refused) = session.refuse(&form) {
        return refused;
    }
    let made = match request(&form) {
        Ok(request) => generate(&state, &session, headers, request)
            .await
            .map_err(|e| {
                let (status, message) = layout::error_text(&e);
                Refusal {
                    status,
                    field: field_of(&e),
                    message,
                }
            }),
        Err(refusal) => Err(refusal),
    };
    match made {
        Ok(made) => show(&state, &session, StatusCode::OK, &form, Some(&made), None).await,
        Err(refusal) => {
            show(
                &state,
                &session,
                refusal.status,
                &form,
                None,
                Some(&refusal),
            )
            .await
        }
    }
}
