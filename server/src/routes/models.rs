//! `GET /v1/models`: the served chat and embedding models, then the adapter
//! models (catalogue adapters and the project's, through the adapter source)
//! with `parent`/`root` naming their base, then the routing keys of the
//! project's dedicated endpoints (`parent`/`root`: the model they serve).
//! `GET /v1/models/{model}`: one of those (ids with `/` in them taken
//! whole, written plainly or as `%2F`), or any other adapter model chat
//! serves for the project though the list leaves it out (a fine-tuning
//! job's checkpoint, `...:ckpt-step-N`); 404 for any other name.
//! `DELETE /v1/models/{model}`: a fine-tuned model of the project.

use axum::extract::State;
use axum::{Extension, Json};
use hearth_api::{ApiError, ModelDeleted, ModelList, ModelObject, ModelPricing, ModelsQuery};
use hearth_engine::ChatModel;

use crate::auth::RequestContext;
use crate::error::{ApiPath, ApiQuery, HttpError};
use crate::models_resolve::{find_adapter, list_adapters, AdapterModel};
use crate::state::AppState;

pub async fn list(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiQuery(query): ApiQuery<ModelsQuery>,
) -> Result<Json<ModelList>, HttpError> {
    Ok(Json(ModelList::new(models(&state, &ctx, &query).await?)))
}

pub async fn retrieve(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(model): ApiPath<String>,
    ApiQuery(query): ApiQuery<ModelsQuery>,
) -> Result<Json<ModelObject>, HttpError> {
    if let Some(found) = models(&state, &ctx, &query)
        .await?
        .into_iter()
        .find(|m| m.id == model)
    {
        return Ok(Json(found));
    }
    // Adapter models chat serves without listing them (a fine-tuning
    // job's checkpoints, `...:ckpt-step-N`).
    if let Some(a) = find_adapter(&state, &ctx.project_id, &model).await? {
        if let Some(base) = state.chat.get(&a.base) {
            return Ok(Json(adapter_object(a, base, query.verbose)));
        }
    }
    Err(HttpError(ApiError::model_not_found(&model)))
}

/// `DELETE /v1/models/{model}`: deletes a fine-tuned model of the
/// caller's project (a succeeded job's `fine_tuned_model`): from then on
/// it is neither listed, retrieved nor served, with its checkpoints; the
/// job keeps its `fine_tuned_model`. Any other model the project can use
/// is 403 (it cannot be deleted); a name it does not know, 404.
pub async fn delete(
    State(state): State<AppState>,
    Extension(ctx): Extension<RequestContext>,
    ApiPath(model): ApiPath<String>,
    ApiQuery(query): ApiQuery<ModelsQuery>,
) -> Result<Json<ModelDeleted>, HttpError> {
    if state.store.delete_ft_model(&ctx.project_id, &model).await? {
        tracing::info!(%model, project = %ctx.project_id, "fine-tuned model deleted");
        return Ok(Json(ModelDeleted::new(model)));
    }
    let known = models(&state, &ctx, &query)
        .await?
        .iter()
        .any(|m| m.id == model)
        || find_adapter(&state, &ctx.project_id, &model)
            .await?
            .is_some();
    if known {
        return Err(HttpError(ApiError::forbidden(format!(
            "The model `{model}` cannot be deleted: only the project's fine-tuned models can."
        ))));
    }
    Err(HttpError(ApiError::model_not_found(&model)))
}

/// An adapter model over its served base, as /v1/models shows it.
fn adapter_object(a: AdapterModel, base: &ChatModel, verbose: bool) -> ModelObject {
    let mut object = ModelObject::new(a.id, a.created, a.owned_by);
    object.parent = Some(a.base.clone());
    object.root = Some(a.base);
    if verbose {
        object.kind = Some("adapter".to_string());
        object.context_length = Some(base.engine.context_length() as u64);
        object.pricing = Some(ModelPricing {
            input_per_million: base.entry.price_input_per_million,
            output_per_million: base.entry.price_output_per_million,
        });
        object.description = a.description;
    }
    object
}

/// What the caller's project may use, in [`list`]'s order.
async fn models(
    state: &AppState,
    ctx: &RequestContext,
    query: &ModelsQuery,
) -> Result<Vec<ModelObject>, HttpError> {
    let chat = state
        .chat
        .values()
        .map(|m| (&m.entry, m.engine.context_length()));
    let embed = state.embed.values().map(|m| (&m.entry, m.max_tokens));
    // An image model's prompt limit is its text encoder's (77 tokens for
    // CLIP); the catalogue's context_length says it where set.
    let images = state
        .images
        .values()
        .map(|m| (&m.entry, m.entry.context_length));
    let mut data: Vec<ModelObject> = chat
        .chain(embed)
        .chain(images)
        .map(|(e, context_length)| {
            let mut object = ModelObject::new(e.id.clone(), state.started_at, e.owner());
            if query.verbose {
                object.kind = Some(e.kind.as_str().to_string());
                object.context_length = Some(context_length as u64);
                object.pricing = Some(ModelPricing {
                    input_per_million: e.price_input_per_million,
                    output_per_million: e.price_output_per_million,
                });
                object.description = e.description.clone();
            }
            object
        })
        .collect();
    for a in list_adapters(state, &ctx.project_id).await? {
        let Some(base) = state.chat.get(&a.base) else {
            continue;
        };
        data.push(adapter_object(a, base, query.verbose));
    }
    // The project's dedicated endpoints, by routing key.
    for e in state.store.list_endpoints(&ctx.project_id).await? {
        if e.status == "deleting" {
            continue;
        }
        let mut object = ModelObject::new(e.routing_key, e.created_at.max(0) as u64, e.project_id);
        object.parent = Some(e.model_name.clone());
        object.root = Some(e.model_name);
        if query.verbose {
            object.kind = Some("dedicated_endpoint".to_string());
            object.description = Some(format!("{} ({}, {})", e.name, e.flavor_name, e.status));
        }
        data.push(object);
    }
    Ok(data)
}
