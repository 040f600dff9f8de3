//! `GET /v1/models`: the served chat and embedding models, then the adapter
//! models (catalogue adapters and the project's, through the adapter source)
//! with `parent`/`root` naming their base, then the routing keys of the
//! project's dedicated endpoints (`parent`/`root`: the model they serve).
//! `GET /v1/models/{model}`: one of those (ids with `/` in them taken
//! whole, written plainly or as `%2F`), 404 for any other name.

use axum::extract::State;
use axum::{Extension, Json};
use hearth_api::{ApiError, ModelList, ModelObject, ModelPricing, ModelsQuery};

use crate::auth::RequestContext;
use crate::error::{ApiPath, ApiQuery, HttpError};
use crate::models_resolve::list_adapters;
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
    models(&state, &ctx, &query)
        .await?
        .into_iter()
        .find(|m| m.id == model)
        .map(Json)
        .ok_or_else(|| HttpError(ApiError::model_not_found(&model)))
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
        let mut object = ModelObject::new(a.id, a.created, a.owned_by);
        object.parent = Some(a.base.clone());
        object.root = Some(a.base.clone());
        if query.verbose {
            object.kind = Some("adapter".to_string());
            object.context_length = Some(base.engine.context_length() as u64);
            object.pricing = Some(ModelPricing {
                input_per_million: base.entry.price_input_per_million,
                output_per_million: base.entry.price_output_per_million,
            });
            object.description = a.description;
        }
        data.push(object);
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
