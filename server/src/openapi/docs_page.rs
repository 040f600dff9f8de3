//! `GET /docs`: the document's operations as one plain HTML page (no
//! scripts, no external assets): per tag, each operation's method, path,
//! summary, parameters, body and responses, with links to the schemas,
//! which are listed at the end as JSON.

use std::fmt::Write;

use serde_json::Value;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `#/components/schemas/X` as a link to X's section, else a short type.
fn schema_label(schema: &Value) -> String {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let name = reference.rsplit('/').next().unwrap_or(reference);
        return format!("<a href=\"#schema-{0}\">{0}</a>", escape(name));
    }
    if let Some(options) = schema.get("anyOf").or_else(|| schema.get("oneOf")) {
        let labels: Vec<String> = options
            .as_array()
            .into_iter()
            .flatten()
            .map(schema_label)
            .collect();
        return labels.join(" | ");
    }
    match schema.get("type") {
        Some(Value::String(t)) => escape(t),
        Some(other) => escape(&other.to_string()),
        None => "any".to_string(),
    }
}

fn content_list(content: Option<&Value>) -> String {
    let Some(content) = content.and_then(Value::as_object) else {
        return String::new();
    };
    content
        .iter()
        .map(|(media, m)| {
            let schema = m.get("schema").map(schema_label).unwrap_or_default();
            format!("<code>{}</code> {schema}", escape(media))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn operation(out: &mut String, method: &str, path: &str, op: &Value) {
    let text = |key: &str| op.get(key).and_then(Value::as_str).unwrap_or("");
    let _ = write!(
        out,
        "<section><h3><code>{} {}</code></h3><p>{}</p>",
        method.to_uppercase(),
        escape(path),
        escape(text("summary"))
    );
    if !text("description").is_empty() {
        let _ = write!(out, "<p>{}</p>", escape(text("description")));
    }
    if let Some(params) = op.get("parameters").and_then(Value::as_array) {
        out.push_str("<p>Parameters:</p><ul>");
        for p in params {
            let field = |key: &str| p.get(key).and_then(Value::as_str).unwrap_or("");
            let _ = write!(
                out,
                "<li><code>{}</code> ({}, {}) {}</li>",
                escape(field("name")),
                escape(field("in")),
                p.get("schema").map(schema_label).unwrap_or_default(),
                escape(field("description"))
            );
        }
        out.push_str("</ul>");
    }
    if let Some(body) = op.get("requestBody") {
        let _ = write!(out, "<p>Body: {}</p>", content_list(body.get("content")));
    }
    if let Some(responses) = op.get("responses").and_then(Value::as_object) {
        out.push_str("<table>");
        for (status, r) in responses {
            let description = r.get("description").and_then(Value::as_str).unwrap_or("");
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(status),
                content_list(r.get("content")),
                escape(description)
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</section>");
}

/// The page for `doc`.
pub fn render(doc: &Value) -> String {
    let info = |key: &str| doc["info"][key].as_str().unwrap_or("").to_string();
    let mut out = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{0} API</title>\
         <style>body{{font-family:sans-serif;max-width:60em;margin:auto;padding:1em}}\
         td{{vertical-align:top;padding:.2em .6em;border-top:1px solid #ddd}}\
         pre{{background:#f6f6f6;padding:.5em;overflow:auto}}</style></head><body>\
         <h1>{0} API <small>{1}</small></h1><p>{2}</p>\
         <p>The document: <a href=\"/openapi.json\">/openapi.json</a>.</p>",
        escape(&info("title")),
        escape(&info("version")),
        escape(&info("description"))
    );
    let tags: Vec<String> = doc["tags"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect();
    let paths = doc["paths"].as_object().cloned().unwrap_or_default();
    for tag in &tags {
        let _ = write!(out, "<h2>{}</h2>", escape(tag));
        for (path, item) in &paths {
            for (method, op) in item.as_object().into_iter().flatten() {
                let tagged = op["tags"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|x| x.as_str() == Some(tag)));
                if tagged {
                    operation(&mut out, method, path, op);
                }
            }
        }
    }
    out.push_str("<h2>Schemas</h2>");
    for (name, schema) in doc["components"]["schemas"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let pretty = serde_json::to_string_pretty(schema).unwrap_or_default();
        let _ = write!(
            out,
            "<h3 id=\"schema-{0}\">{0}</h3><pre>{1}</pre>",
            escape(name),
            escape(&pretty)
        );
    }
    out.push_str("</body></html>");
    out
}
