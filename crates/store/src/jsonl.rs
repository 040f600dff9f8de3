//! A line-by-line JSONL check that runs as an upload streams by: every
//! non-blank line must be one JSON object. Only the current line is held.

/// The byte order mark some editors put first in a UTF-8 file.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// A file's first line (or whole content) without the UTF-8 byte order
/// mark it may open with: that mark is not content.
pub fn without_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(UTF8_BOM).unwrap_or(bytes)
}

/// Longest line checked; a longer one is an error (and is not buffered).
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Default)]
pub struct JsonlChecker {
    line: Vec<u8>,
    /// 1-based number of the line being read.
    number: u64,
    error: Option<String>,
}

impl JsonlChecker {
    pub fn new() -> Self {
        Self {
            number: 1,
            ..Self::default()
        }
    }

    /// Feeds the next chunk of the file.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while self.error.is_none() && !chunk.is_empty() {
            match chunk.iter().position(|&b| b == b'\n') {
                Some(end) => {
                    self.push(&chunk[..end]);
                    self.end_line();
                    chunk = &chunk[end + 1..];
                }
                None => {
                    self.push(chunk);
                    chunk = &[];
                }
            }
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.error.is_none() && self.line.len() + bytes.len() > MAX_LINE_BYTES {
            self.error = Some(format!(
                "line {} is longer than {MAX_LINE_BYTES} bytes",
                self.number
            ));
            self.line = Vec::new();
        } else {
            self.line.extend_from_slice(bytes);
        }
    }

    fn end_line(&mut self) {
        if self.error.is_none() {
            let line = match self.number {
                1 => without_bom(&self.line),
                _ => &self.line,
            };
            self.error = check_line(line).map(|e| format!("line {}: {e}", self.number));
        }
        self.line.clear();
        self.number += 1;
    }

    /// The verdict once the whole file went by: `None` when every line is a
    /// JSON object, else the first bad line's number and what is wrong.
    pub fn finish(mut self) -> Option<String> {
        if self.error.is_none() && !self.line.is_empty() {
            self.end_line();
        }
        if self.error.is_none() && self.number == 1 {
            return Some("the file is empty".to_string());
        }
        self.error
    }
}

fn check_line(line: &[u8]) -> Option<String> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    match serde_json::from_slice::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(_)) => None,
        Ok(_) => Some("expected a JSON object".to_string()),
        Err(e) => Some(format!("not valid JSON ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::JsonlChecker;

    fn check(chunks: &[&str]) -> Option<String> {
        let mut checker = JsonlChecker::new();
        for chunk in chunks {
            checker.feed(chunk.as_bytes());
        }
        checker.finish()
    }

    #[test]
    fn good_files_pass_whatever_the_chunking() {
        assert_eq!(check(&["{\"a\": 1}\n{\"b\"", ": [2]}\n"]), None);
        assert_eq!(check(&["{\"a\": 1}\n\n{\"b\": 2}"]), None);
        assert_eq!(check(&["{\"a\":", " 1}\r\n"]), None);
    }

    #[test]
    fn the_first_bad_line_is_named() {
        let e = check(&["{\"a\": 1}\n{\"b\": 2}\n{oops\n[1]\n"]).unwrap();
        assert!(e.starts_with("line 3: not valid JSON"), "{e}");
        let e = check(&["{}\n", "[1, 2]"]).unwrap();
        assert_eq!(e, "line 2: expected a JSON object");
        assert_eq!(check(&[""]).unwrap(), "the file is empty");
    }

    #[test]
    fn a_byte_order_mark_opens_the_file_only() {
        assert_eq!(check(&["\u{feff}{\"a\": 1}\n{}\n"]), None);
        // Split inside the mark.
        let mut checker = JsonlChecker::new();
        let bytes = "\u{feff}{}\n".as_bytes();
        checker.feed(&bytes[..2]);
        checker.feed(&bytes[2..]);
        assert_eq!(checker.finish(), None);
        let e = check(&["{}\n\u{feff}{}\n"]).unwrap();
        assert!(e.starts_with("line 2: not valid JSON"), "{e}");
    }
}
