//! Error bodies: exact keys and JSON types of shapes A, B and C, the SSE error
//! event, and the `EngineError -> ApiError` mapping.

use hearth_api::{parse_json_body, ApiError, CompletionRequest, INVALID_REQUEST_PREFIX};
use hearth_core::EngineError;
use serde_json::{json, Value};

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort();
    k
}

#[test]
fn shape_a_bodies() {
    let cases = [
        (ApiError::unauthorized("API key is missing."), 401),
        (ApiError::project("Invalid project ID."), 400),
        (ApiError::payment_required("Budget exhausted."), 402),
        (ApiError::forbidden("No access."), 403),
        (ApiError::model_not_found("x"), 404),
        (ApiError::payload_too_large(1024), 413),
        (ApiError::rate_limited("m", 30), 429),
        (ApiError::internal(), 500),
        (
            ApiError::upstream_unavailable("Upstream connection failed."),
            503,
        ),
    ];
    for (err, status) in cases {
        assert_eq!(err.status(), status);
        let body = err.body_json();
        assert_eq!(keys(&body), ["detail"], "{body}");
        assert!(body["detail"].is_string());
    }
    assert_eq!(
        ApiError::model_not_found("x").body_json(),
        json!({"detail": "The model `x` does not exist."})
    );
    assert_eq!(
        ApiError::internal().body_json(),
        json!({"detail": "Internal server error, please try again later."})
    );
}

#[test]
fn shape_b_bad_request() {
    let err = ApiError::bad_request(
        Some("logprobs"),
        "`logprobs` must be between 0 and 20, got 25.",
    );
    assert_eq!(err.status(), 400);
    let body = err.body_json();
    assert_eq!(keys(&body), ["detail", "error"]);
    assert_eq!(keys(&body["error"]), ["code", "message", "param", "type"]);
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert_eq!(body["error"]["code"], 400);
    assert!(body["error"]["code"].is_u64());
    assert_eq!(body["error"]["param"], "logprobs");
    assert_eq!(
        body["detail"],
        format!("{INVALID_REQUEST_PREFIX}`logprobs` must be between 0 and 20, got 25.")
    );
    assert!(body["detail"]
        .as_str()
        .unwrap()
        .starts_with("Invalid request. Please check the parameters and try again. Details: "));
    let no_param = ApiError::bad_request(None, "x").body_json();
    assert!(no_param["error"]["param"].is_null());
}

#[test]
fn shape_b_server_errors() {
    for (err, status) in [
        (ApiError::overloaded("busy"), 529),
        (ApiError::model_failed("boom"), 500),
        (ApiError::unavailable("none"), 503),
    ] {
        assert_eq!(err.status(), status);
        let body = err.body_json();
        assert_eq!(keys(&body), ["detail", "error"]);
        assert_eq!(body["error"]["type"], "InternalServerError");
        assert_eq!(body["error"]["code"], status);
        assert!(body["error"]["param"].is_null());
        assert!(body["detail"].is_string());
    }
}

#[test]
fn shape_c_body() {
    let err = parse_json_body::<CompletionRequest>(b"{\"prompt\": \"hi\"}").unwrap_err();
    assert_eq!(err.status(), 422);
    let body = err.body_json();
    assert_eq!(keys(&body), ["detail"]);
    let item = &body["detail"][0];
    assert_eq!(keys(item), ["input", "loc", "msg", "type"]);
    assert!(item["type"].is_string() && item["msg"].is_string() && item["loc"].is_array());
}

#[test]
fn stream_event_shape() {
    let event = ApiError::bad_request(Some("top_p"), "bad").stream_event();
    assert_eq!(keys(&event), ["error"]);
    assert_eq!(keys(&event["error"]), ["code", "message", "param", "type"]);
    assert_eq!(event["error"]["code"], "400");
    assert_eq!(event["error"]["type"], "BadRequestError");
    assert_eq!(event["error"]["param"], "top_p");
    assert_eq!(event["error"]["message"], "bad");

    let event = ApiError::overloaded("busy").stream_event();
    assert_eq!(event["error"]["code"], "529");
    assert!(event["error"]["param"].is_null());

    let event = ApiError::internal().stream_event();
    assert_eq!(event["error"]["code"], "500");
    assert_eq!(event["error"]["type"], "InternalServerError");
    assert_eq!(
        event["error"]["message"],
        "Internal server error, please try again later."
    );
}

#[test]
fn engine_error_mapping() {
    let err = ApiError::from(EngineError::Overloaded(64));
    assert_eq!(
        (err.status(), err.body_json()["error"]["code"].clone()),
        (529, json!(529))
    );

    let err = ApiError::from(EngineError::PromptTooLong {
        prompt_tokens: 9000,
        context_length: 8192,
    });
    assert_eq!(err.status(), 400);
    assert_eq!(err.body_json()["error"]["type"], "BadRequestError");
    assert!(err.message().contains("9000"));

    let err = ApiError::from(EngineError::InvalidParameter {
        param: "logit_bias".into(),
        message: "token 99999 is outside the vocabulary".into(),
    });
    assert_eq!(err.status(), 400);
    assert_eq!(err.param(), Some("logit_bias"));

    let err = ApiError::from(EngineError::Model("NaN logits".into()));
    assert_eq!(err.status(), 500);
    assert_eq!(err.body_json()["error"]["type"], "InternalServerError");
    assert_eq!(err.body_json()["error"]["code"], 500);

    let err = ApiError::from(EngineError::Stopped);
    assert_eq!(err.status(), 503);
    assert_eq!(err.body_json()["error"]["code"], 503);
}
