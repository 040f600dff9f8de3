//! `POST /v1/images/generations`: text to image on an image model's own
//! worker (`hearth_engine::image`). The PNGs come back inline
//! (`b64_json`) or, by default, as files of purpose `image` in the caller's
//! project with a signed link that downloads them without a key.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::{Extension, Json};
use hearth_api::images::{
    ImageData, ImageGenerationRequest, ImageResponseFormat, ImageSize, ImagesResponse,
    PURPOSE_IMAGE,
};
use hearth_api::{ApiError, ProjectQuery};
use hearth_engine::image::{ImageError, ImageModel, ImageParams};

use crate::auth::RequestContext;
use crate::error::{ApiJson, ApiQuery, HttpError};
use crate::routes::files::signed_download_url;
use crate::state::AppState;

/// How long the link of a generated image works.
const LINK_SECS: i64 = 3600;

pub async fn create(
    State(state): State<AppState>,
    ApiQuery(_project): ApiQuery<ProjectQuery>,
    Extension(ctx): Extension<RequestContext>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ImageGenerationRequest>,
) -> Result<Json<ImagesResponse>, HttpError> {
    let valid = request.validate()?;
    let model = image_model(&state, valid.model.as_deref())?;
    let (width, height) = match valid.size {
        ImageSize::Auto => model.default_size(),
        ImageSize::Exact { width, height } => (width, height),
    };
    if !model.supports_size(width, height) {
        return Err(HttpError(ApiError::bad_request(
            Some("size"),
            format!(
                "`{}` cannot make {width}x{height} images: {}.",
                model.id(),
                model.size_refusal(width, height)
            ),
        )));
    }
    let seed = valid
        .seed
        .unwrap_or_else(|| u64::from(rand::random::<u32>()));
    let params = ImageParams {
        prompt: valid.prompt.clone(),
        negative_prompt: valid.negative_prompt,
        n: valid.n,
        width,
        height,
        steps: valid.steps.unwrap_or_else(|| model.default_steps()),
        guidance_scale: valid
            .guidance_scale
            .unwrap_or_else(|| model.default_guidance_scale()),
        seed,
    };
    // Metered as requests (no tokens, no price): request quotas and
    // budgets apply.
    let ticket = state.usage.admit(&ctx, model.id(), &model.entry, 0, 0)?;
    let generated = model.generate(params).await;
    match &generated {
        Ok(_) => ticket.started(),
        Err(_) => ticket.cancel(),
    }
    let images = generated.map_err(|e| {
        HttpError(match e {
            ImageError::QueueFull(_) => ApiError::overloaded(format!(
                "The image model `{}` has too many requests waiting; try again later.",
                model.id()
            )),
            ImageError::Stopped => ApiError::unavailable("The image model is not running."),
            ImageError::Cancelled | ImageError::Failed(_) => {
                ApiError::model_failed(format!("The image could not be generated: {e}"))
            }
        })
    })?;
    let created = hearth_store::ids::now();
    let mut data = Vec::with_capacity(images.len());
    for (i, image) in images.iter().enumerate() {
        let png = image.to_png();
        let item = match valid.response_format {
            ImageResponseFormat::B64Json => ImageData {
                b64_json: Some(base64::Engine::encode(
                    &base64::engine::general_purpose::STANDARD,
                    &png,
                )),
                url: None,
                revised_prompt: Some(valid.prompt.clone()),
            },
            ImageResponseFormat::Url => {
                let name = format!("image-{created}-{seed}-{i}.png");
                let file = state
                    .store
                    .create_file_from_bytes(&ctx.project_id, &name, PURPOSE_IMAGE, &png)
                    .await?;
                ImageData {
                    b64_json: None,
                    url: Some(signed_download_url(
                        &state,
                        &headers,
                        &file.id,
                        created + LINK_SECS,
                    )),
                    revised_prompt: Some(valid.prompt.clone()),
                }
            }
        };
        data.push(item);
    }
    Ok(Json(ImagesResponse {
        created,
        data,
        size: format!("{width}x{height}"),
        seed,
    }))
}

/// The image model a request names, or the only one served when it names
/// none: 404 for an unknown model, 400 (shape B) for a chat or embedding
/// model.
fn image_model(state: &AppState, id: Option<&str>) -> Result<ImageModel, HttpError> {
    let Some(id) = id else {
        let mut all = state.images.values();
        return match (all.next(), all.next()) {
            (Some(only), None) => Ok(only.clone()),
            (None, _) => Err(HttpError(ApiError::bad_request(
                Some("model"),
                "This server serves no image model.",
            ))),
            (Some(_), Some(_)) => Err(HttpError(ApiError::bad_request(
                Some("model"),
                format!(
                    "Name the image model: one of {}.",
                    state
                        .images
                        .keys()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ))),
        };
    };
    if let Some(model) = state.images.get(id) {
        return Ok(model.clone());
    }
    Err(super::not_this_kind(state, id, "an image model"))
}
