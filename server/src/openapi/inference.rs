//! Operations of `/v1/models`, `/v1/completions`, `/v1/chat/completions`,
//! `/v1/embeddings` and `/v1/rerank`. The errors every operation shares
//! (authentication, project, 422, limits) are added by `finish.rs`.

#![allow(dead_code)]

use super::EventStream;
use hearth_api::schemas::{ErrorDetail, UpstreamError};
use hearth_api::{
    ChatChoice, ChatCompletionRequest, Completion, CompletionChoice, CompletionRequest,
    EmbeddingList, EmbeddingRequest, ModelDeleted, ModelList, ModelObject, ModelsQuery,
    ProjectQuery, RerankRequest, RerankResponse, UsageInfo,
};

#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "Models",
    operation_id = "listModels",
    summary = "The models this server serves",
    description = "Chat and embedding models, then the adapter (LoRA) models of the project \
        with `parent` and `root` naming their base. `verbose` adds kind, context length, \
        pricing and description.",
    params(ModelsQuery),
    responses(
        (status = 200, description = "The model list.", body = ModelList),
    )
)]
pub fn list_models() {}

#[utoipa::path(
    get,
    path = "/v1/models/{model}",
    tag = "Models",
    operation_id = "retrieveModel",
    summary = "One model this server serves",
    description = "One entry of `GET /v1/models` for the same project, by its id (an id \
        with `/` in it as it is, or with `%2F`).",
    params(
        ("model" = String, Path, description = "The model's id, as `GET /v1/models` lists it."),
        ModelsQuery,
    ),
    responses(
        (status = 200, description = "The model.", body = ModelObject),
        (status = 404, description = "No model of this id for the project.", body = ErrorDetail),
    )
)]
pub fn retrieve_model() {}

#[utoipa::path(
    delete,
    path = "/v1/models/{model}",
    tag = "Models",
    operation_id = "deleteModel",
    summary = "Delete a fine-tuned model",
    description = "A fine-tuned model of the project (a succeeded job's `fine_tuned_model`): \
        afterwards it is neither listed, retrieved nor served, nor are its checkpoints; the \
        job keeps its `fine_tuned_model`. Other models cannot be deleted (403).",
    params(
        ("model" = String, Path, description = "The fine-tuned model's id."),
        ModelsQuery,
    ),
    responses(
        (status = 200, description = "The model is gone.", body = ModelDeleted),
        (status = 403, description = "A model of the project that cannot be deleted.", body = ErrorDetail),
        (status = 404, description = "No model of this id for the project.", body = ErrorDetail),
    )
)]
pub fn delete_model() {}

#[utoipa::path(
    post,
    path = "/v1/completions",
    tag = "Completions",
    operation_id = "createCompletion",
    summary = "Complete a prompt",
    params(ProjectQuery),
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion; with `\"stream\": true` a stream of chunks.",
            content(
                (Completion<CompletionChoice, UsageInfo> = "application/json"),
                (EventStream = "text/event-stream"),
            )),
        (status = 400, description = "A parameter out of range, a chat model's name given to \
            another route, or a prompt longer than the context.", body = UpstreamError),
        (status = 404, description = "No model of this name.", body = ErrorDetail),
        (status = 413, description = "The body is over the server's limit.", body = ErrorDetail),
        (status = 500, description = "The model failed to process the request.", body = UpstreamError),
        (status = 503, description = "The model's engine has stopped.", body = UpstreamError),
        (status = 529, description = "The model's waiting queue is full.", body = UpstreamError),
    )
)]
pub fn create_completion() {}

#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "Chat",
    operation_id = "createChatCompletion",
    summary = "Answer a conversation",
    params(ProjectQuery),
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "The chat completion; with `\"stream\": true` a stream of chunks.",
            content(
                (Completion<ChatChoice, UsageInfo> = "application/json"),
                (EventStream = "text/event-stream"),
            )),
        (status = 400, description = "A parameter out of range, messages the chat template \
            refuses, or a prompt longer than the context.", body = UpstreamError),
        (status = 404, description = "No model of this name.", body = ErrorDetail),
        (status = 413, description = "The body is over the server's limit.", body = ErrorDetail),
        (status = 500, description = "The model failed to process the request.", body = UpstreamError),
        (status = 503, description = "The model's engine has stopped.", body = UpstreamError),
        (status = 529, description = "The model's waiting queue is full.", body = UpstreamError),
    )
)]
pub fn create_chat_completion() {}

#[utoipa::path(
    post,
    path = "/v1/embeddings",
    tag = "Embeddings",
    operation_id = "createEmbedding",
    summary = "Embed texts or token ids",
    params(ProjectQuery),
    request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "One vector per input, in input order.", body = EmbeddingList),
        (status = 400, description = "A chat or rerank model named, an input over the \
            model's length (without `truncate`), or a bad token id.", body = UpstreamError),
        (status = 404, description = "No model of this name.", body = ErrorDetail),
        (status = 413, description = "The body is over the server's limit.", body = ErrorDetail),
        (status = 500, description = "The model failed to process the request.", body = UpstreamError),
        (status = 503, description = "The model's batcher has stopped.", body = UpstreamError),
        (status = 529, description = "The model's queue is full.", body = UpstreamError),
    )
)]
pub fn create_embedding() {}

#[utoipa::path(
    post,
    path = "/v1/rerank",
    tag = "Rerank",
    operation_id = "createRerank",
    summary = "Order documents by relevance to a query",
    params(ProjectQuery),
    request_body = RerankRequest,
    responses(
        (status = 200, description = "Results in descending `relevance_score`.", body = RerankResponse),
        (status = 400, description = "A chat model named.", body = UpstreamError),
        (status = 404, description = "No model of this name.", body = ErrorDetail),
        (status = 413, description = "The body is over the server's limit.", body = ErrorDetail),
        (status = 500, description = "The model failed to process the request.", body = UpstreamError),
        (status = 503, description = "The model's batcher has stopped.", body = UpstreamError),
        (status = 529, description = "The model's queue is full.", body = UpstreamError),
    )
)]
pub fn create_rerank() {}

#[utoipa::path(
    post,
    path = "/v1/images/generations",
    tag = "Images",
    operation_id = "createImage",
    summary = "Generate images from a prompt",
    description = "Runs on the image model's own worker; `b64_json` returns the PNGs inline, \
        `url` (the default) stores each as a file of purpose `image` and returns a signed \
        download link that works without a key for an hour.",
    params(ProjectQuery),
    request_body = hearth_api::images::ImageGenerationRequest,
    responses(
        (status = 200, description = "The images, in order (image `i` from `seed + i`).", body = hearth_api::images::ImagesResponse),
        (status = 400, description = "A chat or embedding model named, no image model served, \
            `n` or `num_inference_steps` out of range, or a `size` the model cannot make.", body = UpstreamError),
        (status = 404, description = "No model of this name.", body = ErrorDetail),
        (status = 422, description = "No prompt, or a malformed body."),
        (status = 500, description = "The model failed to generate the images.", body = UpstreamError),
        (status = 503, description = "The image model's worker has stopped.", body = UpstreamError),
        (status = 529, description = "The image model's queue is full.", body = UpstreamError),
    )
)]
pub fn create_image() {}
