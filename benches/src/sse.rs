//! Server-sent events as OpenAI-compatible servers stream them: lines
//! `data: {json}`, blank lines between events, and `data: [DONE]` at the end.
//!
//! [`SseParser`] takes the body in whatever pieces the network delivers and
//! yields complete `data:` payloads; [`read_chunk`] reads what one JSON chunk
//! carries for the load generator.

use serde_json::Value;

use crate::run::Endpoint;

/// One `data:` payload of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// The payload text (normally a JSON object).
    Data(String),
    /// The `[DONE]` sentinel.
    Done,
}

/// Incremental splitter of an event-stream body into `data:` payloads.
/// Other fields (`event:`, `id:`, comments) are skipped.
#[derive(Debug, Default)]
pub struct SseParser {
    pending: Vec<u8>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next piece of the body; returns the payloads of the lines it
    /// completed. A line split across pieces is kept until its end arrives.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
            if let Some(ev) = parse_line(&self.pending[start..end]) {
                events.push(ev);
            }
            start = end + 1;
        }
        self.pending.drain(..start);
        events
    }

    /// The payload of a last line that had no line break (the body ended).
    pub fn finish(&mut self) -> Option<SseEvent> {
        let line = std::mem::take(&mut self.pending);
        parse_line(&line)
    }
}

/// A `data:` line's payload; `None` for any other line.
fn parse_line(line: &[u8]) -> Option<SseEvent> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(b"data:")?;
    let text = String::from_utf8_lossy(rest);
    let text = text.trim();
    Some(if text == "[DONE]" {
        SseEvent::Done
    } else {
        SseEvent::Data(text.to_string())
    })
}

/// Token accounting a server reports (`usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkUsage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

/// What one streamed JSON chunk carries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkInfo {
    /// Choices with non-empty content (`text` for completions,
    /// `delta.content` for chat); each counts as one token.
    pub content_pieces: usize,
    /// The content itself, concatenated.
    pub text: String,
    pub finish_reason: Option<String>,
    pub usage: Option<ChunkUsage>,
    /// An in-stream error event (`{"error": ...}`), shortened.
    pub error: Option<String>,
    /// llama.cpp's per-request `timings` object, when sent.
    pub timings: Option<Value>,
}

/// Reads one `data:` payload; `None` when it is not a JSON object.
pub fn read_chunk(data: &str, endpoint: Endpoint) -> Option<ChunkInfo> {
    let obj: Value = serde_json::from_str(data).ok()?;
    let obj = obj.as_object()?;
    let mut info = ChunkInfo::default();
    if let Some(err) = obj.get("error") {
        let mut msg = err.to_string();
        msg.truncate(300);
        info.error = Some(msg);
        return Some(info);
    }
    for choice in obj
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let content = match endpoint {
            Endpoint::Completions => choice.get("text"),
            Endpoint::Chat => choice.get("delta").and_then(|d| d.get("content")),
        };
        if let Some(text) = content.and_then(Value::as_str).filter(|t| !t.is_empty()) {
            info.content_pieces += 1;
            info.text.push_str(text);
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            info.finish_reason = Some(reason.to_string());
        }
    }
    if let Some(usage) = obj.get("usage").filter(|u| u.is_object()) {
        info.usage = Some(ChunkUsage {
            prompt_tokens: usage.get("prompt_tokens").and_then(Value::as_u64),
            completion_tokens: usage.get("completion_tokens").and_then(Value::as_u64),
        });
    }
    info.timings = obj.get("timings").filter(|t| t.is_object()).cloned();
    Some(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(s: &str) -> SseEvent {
        SseEvent::Data(s.to_string())
    }

    #[test]
    fn splits_lines_across_pieces() {
        let mut p = SseParser::new();
        assert_eq!(p.push(b"data: {\"a\""), vec![]);
        assert_eq!(p.push(b":1}\n\nda"), vec![data("{\"a\":1}")]);
        assert_eq!(
            p.push(b"ta:{\"b\":2}\r\n\r\ndata: [DONE]\n\n"),
            vec![data("{\"b\":2}"), SseEvent::Done]
        );
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn skips_other_fields_and_keeps_an_unterminated_last_line() {
        let mut p = SseParser::new();
        let events = p.push(b": keep-alive\nevent: message\nid: 3\ndata: x\n\ndata: [DONE]");
        assert_eq!(events, vec![data("x")]);
        assert_eq!(p.finish(), Some(SseEvent::Done));
    }

    #[test]
    fn completion_chunk_text_and_finish() {
        let c = read_chunk(
            r#"{"choices":[{"index":0,"text":" Paris","finish_reason":null}]}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!((c.content_pieces, c.text.as_str()), (1, " Paris"));
        assert_eq!(c.finish_reason, None);
        let end = read_chunk(
            r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}]}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!(end.content_pieces, 0);
        assert_eq!(end.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn chat_chunk_counts_delta_content_only() {
        let role = read_chunk(
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!(role.content_pieces, 0);
        let tok = read_chunk(
            r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!(tok.content_pieces, 1);
        // The completions field is not content on the chat endpoint.
        let wrong = read_chunk(r#"{"choices":[{"text":"Hi"}]}"#, Endpoint::Chat).unwrap();
        assert_eq!(wrong.content_pieces, 0);
    }

    #[test]
    fn usage_error_and_timings() {
        let u = read_chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":128,"total_tokens":140}}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!(
            u.usage,
            Some(ChunkUsage {
                prompt_tokens: Some(12),
                completion_tokens: Some(128)
            })
        );
        let none = read_chunk(r#"{"choices":[],"usage":null}"#, Endpoint::Chat).unwrap();
        assert_eq!(none.usage, None);
        let e = read_chunk(
            r#"{"error":{"code":500,"message":"boom"}}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert!(e.error.unwrap().contains("boom"));
        let t = read_chunk(
            r#"{"choices":[],"timings":{"prompt_n":100}}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!(t.timings.unwrap()["prompt_n"], 100);
        assert_eq!(read_chunk("not json", Endpoint::Chat), None);
        assert_eq!(read_chunk("[1,2]", Endpoint::Chat), None);
    }
}
