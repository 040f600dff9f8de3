//! `GET /v1/models`.

use axum::extract::State;
use axum::Json;
use hearth_api::{ModelList, ModelObject, ModelPricing, ModelsQuery};

use crate::error::{ApiQuery, HttpError};
use crate::state::AppState;

pub async fn list(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ModelsQuery>,
) -> Result<Json<ModelList>, HttpError> {
    let chat = state
        .chat
        .values()
        .map(|m| (&m.entry, m.engine.context_length()));
    let embed = state.embed.values().map(|m| (&m.entry, m.max_tokens));
    let data = chat
        .chain(embed)
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
    Ok(Json(ModelList::new(data)))
}
