//! Lines of a fine-tuning dataset (JSONL, one example per line), read the
//! same way by the job-creation check and by the trainer.
//!
//! Two shapes, as OpenAI's and Nebius's fine-tuning accept:
//! - chat: `{"messages": [{"role": "system"|"user"|"assistant", "content":
//!   "...", "weight": 0|1}, ...]}`; the loss covers assistant messages
//!   (those with `weight` 1, the default);
//! - completion: `{"prompt": "...", "completion": "..."}`; the loss covers
//!   the completion only.

use serde::Deserialize;
use serde_json::Value;

/// One message of a chat example.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TrainingMessage {
    pub role: String,
    pub content: String,
    /// Whether an assistant message is trained on (OpenAI's `weight`: 0 or 1).
    #[serde(default = "default_weight")]
    pub weight: u8,
}

fn default_weight() -> u8 {
    1
}

impl TrainingMessage {
    /// Whether the loss covers this message's tokens.
    pub fn trained(&self) -> bool {
        self.role == "assistant" && self.weight == 1
    }
}

/// One training example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrainingExample {
    Chat(Vec<TrainingMessage>),
    Completion { prompt: String, completion: String },
}

const ROLES: &[&str] = &["system", "user", "assistant"];

/// Parses and checks one non-blank line; the error says what is wrong
/// (without the line number, which the caller adds).
pub fn parse_training_line(line: &str) -> Result<TrainingExample, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not valid JSON ({e})"))?;
    let Value::Object(obj) = &value else {
        return Err("not a JSON object".into());
    };
    if let Some(messages) = obj.get("messages") {
        let messages: Vec<TrainingMessage> = serde_json::from_value(messages.clone())
            .map_err(|e| format!("`messages` must be a list of {{role, content}} objects ({e})"))?;
        if messages.is_empty() {
            return Err("`messages` is empty".into());
        }
        for (i, m) in messages.iter().enumerate() {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(format!(
                    "messages[{i}].role `{}` is not one of {}",
                    m.role,
                    ROLES.join(", ")
                ));
            }
            if m.weight > 1 {
                return Err(format!("messages[{i}].weight must be 0 or 1"));
            }
        }
        if !messages
            .iter()
            .any(|m| m.trained() && !m.content.is_empty())
        {
            return Err("no assistant message to train on".into());
        }
        return Ok(TrainingExample::Chat(messages));
    }
    match (obj.get("prompt"), obj.get("completion")) {
        (Some(Value::String(prompt)), Some(Value::String(completion))) => {
            if completion.is_empty() {
                return Err("`completion` is empty".into());
            }
            Ok(TrainingExample::Completion {
                prompt: prompt.clone(),
                completion: completion.clone(),
            })
        }
        (None, None) => Err("needs `messages`, or `prompt` and `completion`".into()),
        _ => Err("`prompt` and `completion` must both be strings".into()),
    }
}

/// Parses a whole JSONL dataset, skipping blank lines; the error names the
/// 1-based line.
pub fn parse_training_file(text: &str) -> Result<Vec<TrainingExample>, String> {
    let mut out = Vec::new();
    // A byte order mark opening the file is not content.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(parse_training_line(line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    if out.is_empty() {
        return Err("the file holds no examples".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_and_completion_lines() {
        let chat = parse_training_line(
            r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]}"#,
        )
        .unwrap();
        match chat {
            TrainingExample::Chat(m) => {
                assert_eq!(m.len(), 2);
                assert!(!m[0].trained() && m[1].trained());
            }
            _ => panic!("chat expected"),
        }
        assert_eq!(
            parse_training_line(r#"{"prompt":"2+2=","completion":"4"}"#).unwrap(),
            TrainingExample::Completion {
                prompt: "2+2=".into(),
                completion: "4".into()
            }
        );
    }

    #[test]
    fn bad_lines_say_why() {
        let cases = [
            ("[1]", "not a JSON object"),
            ("{", "not valid JSON"),
            (r#"{"messages":[]}"#, "empty"),
            (
                r#"{"messages":[{"role":"bot","content":"x"}]}"#,
                "role `bot`",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}]}"#,
                "no assistant",
            ),
            (
                r#"{"messages":[{"role":"assistant","content":"x","weight":0}]}"#,
                "no assistant",
            ),
            (r#"{"prompt":"x"}"#, "both be strings"),
            (r#"{"text":"x"}"#, "needs `messages`"),
            (r#"{"prompt":"x","completion":""}"#, "empty"),
        ];
        for (line, want) in cases {
            let err = parse_training_line(line).unwrap_err();
            assert!(err.contains(want), "{line}: {err}");
        }
    }

    #[test]
    fn file_errors_name_the_line() {
        let text = "{\"prompt\":\"a\",\"completion\":\"b\"}\n\n{\"prompt\":1}\n";
        assert!(parse_training_file(text)
            .unwrap_err()
            .starts_with("line 3:"));
        assert!(parse_training_file("\n \n").is_err());
        assert_eq!(
            parse_training_file("{\"prompt\":\"a\",\"completion\":\"b\"}\n")
                .unwrap()
                .len(),
            1
        );
        // A byte order mark opening the file is skipped; elsewhere it is
        // an error.
        let line = "{\"prompt\":\"a\",\"completion\":\"b\"}";
        assert_eq!(
            parse_training_file(&format!("\u{feff}{line}\n{line}\n"))
                .unwrap()
                .len(),
            2
        );
        assert!(parse_training_file(&format!("{line}\n\u{feff}{line}\n"))
            .unwrap_err()
            .starts_with("line 2:"));
    }
}
