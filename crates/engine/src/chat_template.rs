//! Chat templates: Hugging Face-style Jinja templates rendered with minijinja.
//!
//! A [`ChatTemplate`] is compiled once per model and rendered per request. The
//! environment mimics what `transformers` gives templates: `trim_blocks` and
//! `lstrip_blocks`, Python string methods (`.strip()`, `.startswith()`... via
//! minijinja-contrib's pycompat), `raise_exception(msg)`, a `tojson` filter that
//! writes JSON like Python's `json.dumps` (no HTML escaping), and
//! `strftime_now(fmt)`. Template errors and `raise_exception` become a
//! [`ChatTemplateError`] carrying the message (the server answers 400).

use std::cell::RefCell;
use std::fmt::Write as _;

use hearth_core::ChatMessage;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::Serialize;

/// The ChatML template, used for models that ship none.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat_template";

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template does not compile.
    #[error("invalid chat template: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`.
    #[error("{0}")]
    Raised(String),
    /// Rendering failed (bad variable use, unknown filter...).
    #[error("chat template failed: {0}")]
    Render(String),
}

thread_local! {
    /// The message of the last `raise_exception` call on this thread (rendering is synchronous).
    static RAISED: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A compiled chat template.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The model calls tools in `<tool_call>` tags (Hermes / Qwen style).
    tagged_tool_calls: bool,
}

impl ChatTemplate {
    /// Compiles `template`; `bos_token`/`eos_token` are exposed to it as variables.
    pub fn new(
        template: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, template.to_owned())
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
            tagged_tool_calls: template.contains("tools") && template.contains("<tool_call>"),
        })
    }

    /// `template` in place of this one, with the same special tokens.
    pub fn replaced(&self, template: &str) -> Result<Self, ChatTemplateError> {
        Self::new(template, self.bos_token.clone(), self.eos_token.clone())
    }

    /// Whether the template knows tools and has the model call them as
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (the Hermes
    /// format of Qwen 2.5 and others): then requests with tools render
    /// through it, with `tools`, assistant `tool_calls` and `tool` messages.
    pub fn tagged_tool_calls(&self) -> bool {
        self.tagged_tool_calls
    }

    /// The ChatML fallback for models without a template.
    pub fn chatml() -> ChatTemplate {
        Self::new(
            CHATML_TEMPLATE,
            Some("<|im_start|>".into()),
            Some("<|im_end|>".into()),
        )
        .expect("the ChatML template compiles")
    }

    /// Renders a conversation; `add_generation_prompt` opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with(messages, add_generation_prompt, None)
    }

    /// Like [`render`](Self::render) for any serializable message list (for
    /// messages richer than [`ChatMessage`]), with optional `tools`.
    pub fn render_with<M: Serialize + ?Sized>(
        &self,
        messages: &M,
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        let ctx = context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
            tools => tools.map(Value::from_serialize),
        };
        RAISED.with(|r| r.borrow_mut().take());
        template
            .render(ctx)
            .map_err(|e| match RAISED.with(|r| r.borrow_mut().take()) {
                Some(message) => ChatTemplateError::Raised(message),
                None => ChatTemplateError::Render(e.to_string()),
            })
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    RAISED.with(|r| *r.borrow_mut() = Some(message.clone()));
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson` like transformers' override: `json.dumps(x, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(v.as_usize().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                "tojson: indent must be an integer",
            )
        })?),
        None => None,
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let (mut item_sep, mut key_sep) = match indent {
        Some(_) => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        if let [a, b] = seps.as_slice() {
            item_sep = a.clone();
            key_sep = b.clone();
        }
    }
    // ensure_ascii is accepted; output is always UTF-8 (ensure_ascii=False).
    let _ = kwargs.get::<Option<bool>>("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    write_json(value, &style, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct JsonStyle {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

fn write_json(v: &Value, style: &JsonStyle, level: usize, out: &mut String) -> Result<(), Error> {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = style.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => {
            let _ = write!(out, "{v}");
        }
        ValueKind::Number => {
            let f = f64::try_from(v.clone())?;
            out.push_str(&serde_json::to_string(&f).unwrap_or_else(|_| "NaN".into()));
        }
        ValueKind::String => out.push_str(&json_string(v.as_str().unwrap_or_default())),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, level + 1);
                let key_text = match key.as_str() {
                    Some(s) => s.to_owned(),
                    None => key.to_string(),
                };
                out.push_str(&json_string(&key_text));
                out.push_str(&style.key_sep);
                write_json(&v.get_item(key)?, style, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, level + 1);
                write_json(item, style, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        _ => out.push_str(&json_string(&v.to_string())),
    }
    Ok(())
}

/// `strftime_now(format)`: the current UTC time formatted with the common
/// strftime directives (`%Y %y %m %d %-d %e %H %I %M %S %p %b %B %a %A %j %%`).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime_utc(&format, secs)
}

fn strftime_utc(format: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (hour, minute, second) = (sod / 3600, (sod % 3600) / 60, sod % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let month_name = MONTHS[(month - 1) as usize];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let no_pad = spec == Some('-');
        if no_pad {
            spec = chars.next();
        }
        let num = |out: &mut String, n: i64, width: usize| {
            if no_pad {
                let _ = write!(out, "{n}");
            } else {
                let _ = write!(out, "{n:0width$}");
            }
        };
        match spec {
            Some('Y') => num(&mut out, year, 4),
            Some('y') => num(&mut out, year.rem_euclid(100), 2),
            Some('m') => num(&mut out, month, 2),
            Some('d') => num(&mut out, day, 2),
            Some('e') => {
                let _ = write!(out, "{day:>2}");
            }
            Some('H') => num(&mut out, hour, 2),
            Some('I') => num(&mut out, hour12, 2),
            Some('M') => num(&mut out, minute, 2),
            Some('S') => num(&mut out, second, 2),
            Some('j') => num(&mut out, yday, 3),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    const SMOLLM_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn templates_in_the_hermes_style_get_tools_calls_and_results() {
        assert!(!ChatTemplate::chatml().tagged_tool_calls());
        let template = "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>\n{% endif %}\
            {% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.arguments | tojson }}</tool_call>{% endfor %}\
            {% elif m.role == 'tool' %}<tool_response id={{ m.tool_call_id }}>{{ m.content }}</tool_response>\
            {% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}";
        let t = ChatTemplate::chatml().replaced(template).unwrap();
        assert!(t.tagged_tool_calls());
        let messages = serde_json::json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "cold"}
        ]);
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let out = t.render_with(&messages, true, Some(&tools)).unwrap();
        assert_eq!(
            out,
            "<tools>get_weather;</tools>\nuser: Weather?\n<tool_call>{\"city\": \"Oslo\"}</tool_call><tool_response id=c1>cold</tool_response>"
        );
    }

    #[test]
    fn chatml_renders_system_user_assistant() {
        let t = ChatTemplate::chatml();
        let out = t
            .render(
                &[
                    msg("system", "Be brief."),
                    msg("user", "Hi"),
                    msg("assistant", "Hello!"),
                ],
                false,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        );
    }

    #[test]
    fn generation_prompt_is_appended() {
        let t = ChatTemplate::chatml();
        let with = t.render(&[msg("user", "Hi")], true).unwrap();
        let without = t.render(&[msg("user", "Hi")], false).unwrap();
        assert_eq!(with, format!("{without}<|im_start|>assistant\n"));
    }

    #[test]
    fn smollm_template_inserts_default_system_prompt() {
        let t = ChatTemplate::new(SMOLLM_TEMPLATE, None, None).unwrap();
        let out = t.render(&[msg("user", "What is 2+2?")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
        let own = t
            .render(&[msg("system", "S"), msg("user", "U")], false)
            .unwrap();
        assert_eq!(
            own,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        );
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let t = ChatTemplate::new(
            "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('Conversation must start with a user message') }}{% endif %}ok",
            None,
            None,
        )
        .unwrap();
        let err = t.render(&[msg("assistant", "x")], false).unwrap_err();
        assert_eq!(
            err,
            ChatTemplateError::Raised("Conversation must start with a user message".into())
        );
        assert_eq!(t.render(&[msg("user", "x")], false).unwrap(), "ok");
    }

    #[test]
    fn syntax_and_render_errors_are_errors() {
        assert!(matches!(
            ChatTemplate::new("{% for x in %}", None, None),
            Err(ChatTemplateError::Syntax(_))
        ));
        let t = ChatTemplate::new("{{ messages | no_such_filter }}", None, None);
        let failed = match t {
            Err(_) => true,
            Ok(t) => t.render(&[msg("user", "x")], false).is_err(),
        };
        assert!(failed);
    }

    #[test]
    fn pycompat_string_methods_work() {
        let t = ChatTemplate::new(
            "{% for m in messages %}[{{ m['content'].strip() }}]{% if m.content.startswith('  he') %}!{% endif %}{% endfor %}",
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            t.render(&[msg("user", "  hello \n")], false).unwrap(),
            "[hello]!"
        );
    }

    #[test]
    fn bos_eos_tokens_are_variables() {
        let t = ChatTemplate::new(
            "{{ bos_token }}x{{ eos_token }}",
            Some("<s>".into()),
            Some("</s>".into()),
        )
        .unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "<s>x</s>");
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ messages[0] | tojson }}|{{ [1, 2.5, none, true] | tojson }}",
            None,
            None,
        )
        .unwrap();
        let out = t.render(&[msg("user", "a <b> & \"é\"")], false).unwrap();
        assert_eq!(
            out,
            r#"{"role": "user", "content": "a <b> & \"é\""}|[1, 2.5, null, true]"#
        );
        let t = ChatTemplate::new("{{ {'a': [1]} | tojson(indent=2) }}", None, None).unwrap();
        assert_eq!(
            t.render(&[], false).unwrap(),
            "{\n  \"a\": [\n    1\n  ]\n}"
        );
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime_utc("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(
            strftime_utc("%A %B %-d %H:%M:%S %j %I%p %%", t),
            "Thursday February 29 13:05:09 060 01PM %"
        );
        assert_eq!(strftime_utc("%Y-%m-%d", 0), "1970-01-01");
    }
}
