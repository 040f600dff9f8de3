//! Enough of JSON Schema to check the server's answers against the
//! document: `$ref`, `allOf`/`anyOf`/`oneOf`, `type`, `enum`, `required`,
//! `properties`, `additionalProperties` and `items`.

use serde_json::Value;

/// Whether a response of `status` and `content_type` with `body` is one
/// `op` documents.
pub fn response_conforms(
    doc: &Value,
    op: &Value,
    status: &str,
    content_type: &str,
    body: &[u8],
) -> Result<(), String> {
    let response = op["responses"]
        .get(status)
        .or_else(|| op["responses"].get("default"))
        .ok_or_else(|| format!("status {status} is not documented"))?;
    let Some(content) = response["content"].as_object() else {
        return Ok(());
    };
    let base = |media: &str| {
        media
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    };
    let (media, spec) = content
        .iter()
        .find(|(media, _)| base(media) == base(content_type))
        .ok_or_else(|| format!("content type `{content_type}` is not documented for {status}"))?;
    if !media.contains("json") {
        return Ok(());
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    validate(doc, &spec["schema"], &value, "$")
}

fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> Result<&'a Value, String> {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .ok_or_else(|| format!("unresolved {r}")),
        None => Ok(schema),
    }
}

fn type_matches(kind: &str, value: &Value) -> bool {
    match kind {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    }
}

/// Checks `value` against `schema`; the error names the JSON path.
pub fn validate(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(doc, schema)?;
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            validate(doc, s, value, at)?;
        }
    }
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
        let errors: Vec<String> = any
            .iter()
            .filter_map(|s| validate(doc, s, value, at).err())
            .collect();
        if errors.len() == any.len() {
            return Err(format!("{at}: matches no anyOf branch: {errors:?}"));
        }
    }
    if let Some(one) = schema.get("oneOf").and_then(Value::as_array) {
        let matching = one
            .iter()
            .filter(|s| validate(doc, s, value, at).is_ok())
            .count();
        if matching != 1 {
            return Err(format!("{at}: matches {matching} oneOf branches: {value}"));
        }
    }
    match schema.get("type") {
        Some(Value::String(kind)) if !type_matches(kind, value) => {
            return Err(format!("{at}: expected {kind}, got {value}"));
        }
        Some(Value::Array(kinds))
            if !kinds
                .iter()
                .any(|k| type_matches(k.as_str().unwrap_or(""), value)) =>
        {
            return Err(format!("{at}: expected one of {kinds:?}, got {value}"));
        }
        _ => {}
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            return Err(format!("{at}: {value} is not one of {allowed:?}"));
        }
    }
    if let Value::Object(map) = value {
        for name in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !map.contains_key(name) {
                return Err(format!("{at}: `{name}` is required: {value}"));
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (key, item) in map {
            let inner = format!("{at}.{key}");
            match properties.and_then(|p| p.get(key)) {
                Some(s) => validate(doc, s, item, &inner)?,
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => return Err(format!("{inner}: not allowed")),
                    Some(s @ Value::Object(_)) => validate(doc, s, item, &inner)?,
                    _ => {}
                },
            }
        }
    }
    if let (Value::Array(items), Some(s)) = (value, schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            validate(doc, s, item, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}
