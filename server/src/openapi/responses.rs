//! Operations of `/v1/responses`.

#![allow(dead_code)]

use super::EventStream;
use hearth_api::responses::{
    InputItemList, InputItemsQuery, InputTokens, ResponseDeleted, ResponseObject, ResponseRequest,
    RetrieveQuery,
};
use hearth_api::schemas::{ErrorDetail, UpstreamError};
use hearth_api::ProjectQuery;

#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "Responses",
    operation_id = "createResponse",
    summary = "Answer an input (the Responses API)",
    description = "Runs like a chat completion with one choice. With `stream` the answer is a \
        stream of typed events (`response.created` ... `response.output_text.delta` ... \
        `response.completed`, each with a `sequence_number`), then `data: [DONE]`; a failure \
        after the start is an `error` event. With `store` (default) the response is kept \
        for retrieval and `previous_response_id`. With function `tools` the model may answer \
        with `function_call` output items (streamed as `response.output_item.added`, \
        `response.function_call_arguments.delta` / `.done`, `response.output_item.done`), \
        whose results come back as `function_call_output` input items; `text.format` \
        constrains the answer to JSON (of a schema). `include` \
        `[\"message.output_text.logprobs\"]` adds each output token's log-probability \
        (with `top_logprobs` alternatives) to the text part and its deltas.",
    params(ProjectQuery),
    request_body = ResponseRequest,
    responses(
        (status = 200, description = "The response; with `\"stream\": true` a stream of events.",
            content(
                (ResponseObject = "application/json"),
                (EventStream = "text/event-stream"),
            )),
        (status = 400, description = "A parameter out of range or not supported (hosted \
            tools, reasoning, background, conversation, prompt, an `include` value other \
            than `message.output_text.logprobs`, `text.verbosity` other than `medium`, \
            images), a schema that cannot be compiled or a `json_schema` without `schema`, \
            a `function_call_output` without its call or a `function_call` without its \
            output, an unknown `previous_response_id`, or a prompt longer than \
            the context.", body = UpstreamError),
        (status = 404, description = "No model of this name.", body = ErrorDetail),
        (status = 413, description = "The body is over the server's limit.", body = ErrorDetail),
        (status = 500, description = "The model failed to process the request.", body = UpstreamError),
        (status = 503, description = "The model's engine has stopped.", body = UpstreamError),
        (status = 529, description = "The model's waiting queue is full.", body = UpstreamError),
    )
)]
pub fn create_response() {}

#[utoipa::path(
    post,
    path = "/v1/responses/input_tokens",
    tag = "Responses",
    operation_id = "countInputTokens",
    summary = "Count a response's input tokens",
    description = "The number of tokens the input of a `POST /v1/responses` with this body \
        would give the model: `instructions`, the function `tools` as the model is told of \
        them, the conversation of `previous_response_id` and this turn's `input`, after \
        `truncation`. Nothing is generated, stored or charged. The body is checked as \
        create checks it; fields that only shape the output (`stream`, `store`, \
        `temperature`, ...) are otherwise ignored.",
    params(ProjectQuery),
    request_body = ResponseRequest,
    responses(
        (status = 200, description = "The count.", body = InputTokens),
        (status = 400, description = "A field create refuses, or an unknown \
            `previous_response_id`.", body = UpstreamError),
        (status = 404, description = "No model of this name.", body = ErrorDetail),
    )
)]
pub fn count_input_tokens() {}

#[utoipa::path(
    get,
    path = "/v1/responses/{response_id}",
    tag = "Responses",
    operation_id = "retrieveResponse",
    summary = "A stored response",
    params(
        ("response_id" = String, Path, description = "The response's id (`resp_...`)."),
        RetrieveQuery,
    ),
    responses(
        (status = 200, description = "The response.", body = ResponseObject),
        (status = 400, description = "`stream=true` (no response runs in the background).",
            body = UpstreamError),
    )
)]
pub fn retrieve_response() {}

#[utoipa::path(
    delete,
    path = "/v1/responses/{response_id}",
    tag = "Responses",
    operation_id = "deleteResponse",
    summary = "Delete a stored response",
    params(
        ("response_id" = String, Path, description = "The response's id (`resp_...`)."),
        ProjectQuery,
    ),
    responses(
        (status = 200, description = "Deleted.", body = ResponseDeleted),
    )
)]
pub fn delete_response() {}

#[utoipa::path(
    get,
    path = "/v1/responses/{response_id}/input_items",
    tag = "Responses",
    operation_id = "listInputItems",
    summary = "The input items of a stored response",
    params(
        ("response_id" = String, Path, description = "The response's id (`resp_...`)."),
        InputItemsQuery,
    ),
    responses(
        (status = 200, description = "A page of the items, newest first unless `order=asc`.",
            body = InputItemList),
        (status = 400, description = "`limit`, `order` or `after` out of range.", body = UpstreamError),
    )
)]
pub fn list_input_items() {}
