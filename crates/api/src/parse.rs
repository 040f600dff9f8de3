//! Request parsing into typed values, failing with FastAPI-style 422 bodies.
//!
//! [`parse_json_body`] and [`parse_query`] turn serde's errors into pydantic
//! error items (`type`, `loc`, `msg`, `input`, `ctx`): the path comes from
//! `serde_path_to_error` (array indices as integers), the type from serde's
//! message (a heuristic that covers missing fields, wrong JSON types, bad
//! booleans and numbers in query strings, and unknown enum values).

use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use serde_path_to_error::{Path, Segment};

use crate::error::{ApiError, Loc, ValidationItem};

/// Parses a JSON request body into `T`, a struct (every body of the API is a
/// JSON object; a body that is valid JSON but not an object is rejected before
/// `T` sees it, since serde would otherwise read an array as a struct's fields).
///
/// - not an object: `model_attributes_type` at `["body"]`;
/// - empty body: `missing` at `["body"]`;
/// - not JSON: `json_invalid` at `["body", <byte offset>]`, `ctx.error` = serde's message;
/// - missing field: `missing` at `["body", ..path, field]`, `input` = the enclosing object;
/// - wrong type: `string_type`, `int_type`, `float_type`, `bool_type`, `list_type`,
///   `dict_type`, `model_type`, `enum` or `value_error` at the field's path, `input` = the value.
///
/// The body is deserialized straight into `T` (no intermediate
/// [`Value`] that would hold a second, larger copy of it); only a body that
/// fails is parsed again as a [`Value`] to build the error item.
pub fn parse_json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() {
        return Err(Classified::new("missing", "Field required")
            .into_error(vec!["body".into()], Value::Null));
    }
    if let Some(offset) = too_deep(bytes) {
        return Err(ApiError::validation(vec![ValidationItem {
            kind: "json_invalid".into(),
            loc: vec!["body".into(), Loc::Index(offset)],
            msg: "JSON decode error".into(),
            input: json!({}),
            ctx: Some(json!({ "error": format!(
                "arrays and objects nested {MAX_DEPTH} deep or more"
            ) })),
        }]));
    }
    let starts_as_object = bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{');
    let mut direct = None;
    if starts_as_object {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        match serde_path_to_error::deserialize::<_, T>(&mut de) {
            Ok(parsed) => match de.end() {
                Ok(()) => return Ok(parsed),
                Err(e) => direct = Some(e.to_string()),
            },
            Err(e) => direct = Some(e.inner().to_string()),
        }
    }
    Err(match classify_body::<T>(bytes) {
        Err(e) => e,
        // Only the direct parse refuses it (e.g. a key given twice).
        Ok(_) => Classified::new(
            "value_error",
            format!("Invalid request body: {}", direct.unwrap_or_default()),
        )
        .into_error(vec!["body".into()], Value::Null),
    })
}

/// Nesting of arrays and objects at which a body is refused: serde_json's
/// own limit for the values it builds (127 levels parse, 128 do not), held
/// here for every field, also those a route skips unread.
const MAX_DEPTH: usize = 128;

/// Where a body first nests [`MAX_DEPTH`] levels deep (the byte offset of
/// the bracket), if it does; strings' contents do not count. One pass over
/// the bytes, no allocation.
fn too_deep(bytes: &[u8]) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth >= MAX_DEPTH {
                    return Some(i);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// The former value-first parse, kept for its error items.
fn classify_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| json_invalid(bytes, &e))?;
    if !value.is_object() {
        return Err(Classified::new(
            "model_attributes_type",
            "Input should be a valid dictionary or object to extract fields from",
        )
        .into_error(vec!["body".into()], value));
    }
    serde_path_to_error::deserialize::<_, T>(&value).map_err(|err| {
        let path = path_locs(err.path());
        let message = err.inner().to_string();
        let item = classify(&message, path.is_empty());
        let (loc_tail, input) = match &item.missing_field {
            Some(field) => {
                let mut loc = path.clone();
                loc.push(Loc::Key(field.clone()));
                (loc, lookup(&value, &path))
            }
            None => (path.clone(), lookup(&value, &path)),
        };
        let mut loc = vec![Loc::from("body")];
        loc.extend(loc_tail);
        item.into_error(loc, input)
    })
}

/// Parses a URL query string (without the `?`); `None` is an empty query.
///
/// Errors are 422 items at `["query", <name>]` with the raw string as `input`,
/// e.g. `bool_parsing` for `verbose=notabool` (with [`crate::de`]'s helpers)
/// or `int_parsing` for `limit=abc`.
pub fn parse_query<T: DeserializeOwned>(query: Option<&str>) -> Result<T, ApiError> {
    let query = query.unwrap_or("");
    let deserializer =
        serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    serde_path_to_error::deserialize::<_, T>(deserializer).map_err(|err| {
        let path = path_locs(err.path());
        let message = err.inner().to_string();
        let item = classify(&message, false);
        let mut loc = vec![Loc::from("query")];
        let input = match &item.missing_field {
            Some(field) => {
                loc.push(Loc::Key(field.clone()));
                Value::Null
            }
            None => {
                loc.extend(path.iter().cloned());
                match path.first() {
                    Some(Loc::Key(name)) => form_urlencoded::parse(query.as_bytes())
                        .find(|(key, _)| key == name)
                        .map(|(_, v)| Value::String(v.into_owned()))
                        .unwrap_or(Value::Null),
                    _ => Value::Null,
                }
            }
        };
        item.into_error(loc, input)
    })
}

/// The 422 item of a body that is not valid JSON.
fn json_invalid(bytes: &[u8], err: &serde_json::Error) -> ApiError {
    let offset = byte_offset(bytes, err.line(), err.column());
    let full = err.to_string();
    let message = match full.rfind(" at line ") {
        Some(at) => full[..at].to_string(),
        None => full,
    };
    ApiError::validation(vec![ValidationItem {
        kind: "json_invalid".into(),
        loc: vec!["body".into(), Loc::Index(offset)],
        msg: "JSON decode error".into(),
        input: json!({}),
        ctx: Some(json!({ "error": message })),
    }])
}

/// Byte offset of serde_json's 1-based line and column.
fn byte_offset(bytes: &[u8], line: usize, column: usize) -> usize {
    let mut line_start = 0;
    let mut seen = 1;
    for (i, b) in bytes.iter().enumerate() {
        if seen >= line {
            break;
        }
        if *b == b'\n' {
            seen += 1;
            line_start = i + 1;
        }
    }
    (line_start + column.saturating_sub(1)).min(bytes.len())
}

/// `serde_path_to_error`'s path as `loc` items.
fn path_locs(path: &Path) -> Vec<Loc> {
    path.iter()
        .filter_map(|segment| match segment {
            Segment::Seq { index } => Some(Loc::Index(*index)),
            Segment::Map { key } => Some(Loc::Key(key.clone())),
            Segment::Enum { variant } => Some(Loc::Key(variant.clone())),
            Segment::Unknown => None,
        })
        .collect()
}

/// The value at `path` inside `value`, or null.
fn lookup(value: &Value, path: &[Loc]) -> Value {
    let mut current = value;
    for part in path {
        let next = match part {
            Loc::Index(i) => current.get(*i),
            Loc::Key(k) => current.get(k.as_str()),
        };
        match next {
            Some(v) => current = v,
            None => return Value::Null,
        }
    }
    current.clone()
}

/// A serde message translated to pydantic's vocabulary.
struct Classified {
    kind: String,
    msg: String,
    /// For `missing`: the field's name (appended to `loc`).
    missing_field: Option<String>,
    ctx: Option<Value>,
}

impl Classified {
    fn new(kind: &str, msg: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            msg: msg.into(),
            missing_field: None,
            ctx: None,
        }
    }

    /// The 422 error of this item at `loc`.
    fn into_error(self, loc: Vec<Loc>, input: Value) -> ApiError {
        ApiError::validation(vec![ValidationItem {
            kind: self.kind,
            loc,
            msg: self.msg,
            input,
            ctx: self.ctx,
        }])
    }
}

/// Maps serde's error message to a pydantic error type and message.
fn classify(message: &str, at_root: bool) -> Classified {
    if let Some(rest) = message.strip_prefix("missing field `") {
        let field = rest.split('`').next().unwrap_or_default().to_string();
        let mut item = Classified::new("missing", "Field required");
        item.missing_field = Some(field);
        return item;
    }
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        let expected = rest
            .rfind(", expected ")
            .map(|at| &rest[at + 11..])
            .unwrap_or("");
        return type_for_expected(expected, at_root);
    }
    if let Some(rest) = message.strip_prefix("invalid value: ") {
        let expected = rest
            .rfind(", expected ")
            .map(|at| &rest[at + 11..])
            .unwrap_or("");
        if expected == "a boolean" {
            return bool_parsing();
        }
        return Classified::new("value_error", format!("Value error, {message}"));
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let expected = rest
            .split_once(", expected ")
            .map(|(_, e)| e.trim_start_matches("one of "))
            .unwrap_or("")
            .replace('`', "'");
        let expected = match expected.rsplit_once(", ") {
            Some((head, last)) => format!("{head} or {last}"),
            None => expected,
        };
        let mut item = Classified::new("enum", format!("Input should be {expected}"));
        item.ctx = Some(json!({ "expected": expected }));
        return item;
    }
    if message.starts_with("unknown field ") {
        return Classified::new("extra_forbidden", "Extra inputs are not permitted");
    }
    // Query strings: `FromStr` errors of booleans and numbers.
    if message == "provided string was not `true` or `false`" {
        return bool_parsing();
    }
    if message == "invalid digit found in string"
        || message == "cannot parse integer from empty string"
        || message.starts_with("number too large")
        || message.starts_with("number too small")
    {
        return Classified::new(
            "int_parsing",
            "Input should be a valid integer, unable to parse string as an integer",
        );
    }
    if message == "invalid float literal" {
        return Classified::new(
            "float_parsing",
            "Input should be a valid number, unable to parse string as a number",
        );
    }
    Classified::new("value_error", format!("Value error, {message}"))
}

fn bool_parsing() -> Classified {
    Classified::new(
        "bool_parsing",
        "Input should be a valid boolean, unable to interpret input",
    )
}

/// Maps serde's "expected ..." phrase of a type error to pydantic's type.
fn type_for_expected(expected: &str, at_root: bool) -> Classified {
    match expected {
        "a string" | "a borrowed string" | "a character" | "char" => {
            Classified::new("string_type", "Input should be a valid string")
        }
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" | "u8" | "u16" | "u32" | "u64" | "u128"
        | "usize" => Classified::new("int_type", "Input should be a valid integer"),
        "f32" | "f64" => Classified::new("float_type", "Input should be a valid number"),
        "a boolean" => Classified::new("bool_type", "Input should be a valid boolean"),
        "a sequence" => Classified::new("list_type", "Input should be a valid list"),
        "a map" => Classified::new("dict_type", "Input should be a valid dictionary"),
        _ if expected.starts_with("struct ") => {
            if at_root {
                Classified::new(
                    "model_attributes_type",
                    "Input should be a valid dictionary or object to extract fields from",
                )
            } else {
                let name = &expected["struct ".len()..];
                Classified::new(
                    "model_type",
                    format!("Input should be a valid dictionary or instance of {name}"),
                )
            }
        }
        _ if expected.starts_with("a tuple") || expected.starts_with("tuple") => {
            Classified::new("tuple_type", "Input should be a valid tuple")
        }
        "" => Classified::new("value_error", "Input has the wrong type"),
        _ => Classified::new("value_error", format!("Input should be {expected}")),
    }
}
