//! A batch's input checked whole before any request runs: every line
//! parsed (`custom_id` present and unique, `method`, `url` the batch's
//! endpoint), then each parsed body through its endpoint's own checks, one
//! model for the batch. The problems of both kinds are reported together,
//! in line order: the first [`MAX_REPORTED_ERRORS`], then how many more
//! lines have problems.

use futures_util::stream::TryStreamExt;
use hearth_api::batches::{parse_input_line, BatchError, CustomIds, OverrideSettings};
use hearth_store::Batch;
use tokio::sync::watch;

use super::{batch_error, BatchRun, Control, Request, Stop};

/// Most problems a failed batch lists (the count says how many more).
const MAX_REPORTED_ERRORS: usize = 100;

/// A problem of one line.
#[derive(Debug)]
pub(super) struct LineProblem {
    line: i64,
    code: &'static str,
    message: String,
}

/// An input file read line by line: the requests that parsed, and the
/// lines that did not.
#[derive(Debug)]
pub(super) struct Parsed {
    pub requests: Vec<Request>,
    pub problems: Vec<LineProblem>,
}

/// The errors a failed batch shows: the problems in line order, at most
/// [`MAX_REPORTED_ERRORS`], then a count of the lines left out.
pub(super) fn report(mut problems: Vec<LineProblem>) -> Vec<BatchError> {
    problems.sort_by_key(|p| p.line);
    let more = problems.len().saturating_sub(MAX_REPORTED_ERRORS);
    let mut errors: Vec<BatchError> = problems
        .into_iter()
        .take(MAX_REPORTED_ERRORS)
        .map(|p| {
            batch_error(
                p.code,
                format!("Line {}: {}", p.line, p.message),
                Some(p.line),
            )
        })
        .collect();
    if more > 0 {
        errors.push(batch_error(
            "invalid_request",
            format!("{more} more lines have problems."),
            None,
        ));
    }
    errors
}

impl BatchRun {
    /// Reads and parses the input file: every non-blank line, with the
    /// batch's overrides applied. A file that cannot be read, or one with
    /// too many lines, is [`Stop::Failed`]; the lines that are not
    /// requests come back as problems.
    pub(super) async fn read_requests(&self, batch: &Batch) -> Result<Parsed, Stop> {
        let file = match self.store.file_by_id(&batch.input_file_id).await {
            Ok(file) => file,
            Err(hearth_store::StoreError::NotFound(_)) => {
                return Err(Stop::Failed(vec![batch_error(
                    "invalid_input_file",
                    format!("The input file `{}` no longer exists.", batch.input_file_id),
                    None,
                )]))
            }
            Err(e) => return Err(e.into()),
        };
        let mut content = Vec::with_capacity(file.bytes.max(0) as usize);
        let mut chunks = self.store.file_content(&file).await?;
        while let Some(chunk) = chunks.try_next().await? {
            content.extend_from_slice(&chunk);
        }
        let endpoint = batch.endpoint.clone();
        let overrides: Option<OverrideSettings> = batch
            .override_settings
            .clone()
            .and_then(|v| serde_json::from_value(v).ok());
        let max_lines = self.config.max_lines;
        tokio::task::spawn_blocking(move || {
            parse_file(&content, &endpoint, overrides.as_ref(), max_lines)
        })
        .await
        .map_err(|_| {
            Stop::Failed(vec![batch_error(
                "invalid_input_file",
                "The input file could not be read.".into(),
                None,
            )])
        })?
        .map_err(Stop::Failed)
    }

    /// Each parsed body through its endpoint's checks; one model for the
    /// batch. `problems` (the lines that did not parse) and the bodies'
    /// problems fail the batch together, in line order.
    pub(super) async fn check_requests(
        &self,
        batch: &Batch,
        requests: &[Request],
        mut problems: Vec<LineProblem>,
        control: &watch::Receiver<Control>,
    ) -> Result<String, Stop> {
        let mut model: Option<(String, i64)> = None;
        for (i, request) in requests.iter().enumerate() {
            if i % 256 == 0 {
                // (An expiry waits for the checks: the window is long.)
                match *control.borrow() {
                    Control::Run | Control::Expire => {}
                    other => return Err(Stop::Control(other)),
                }
            }
            let checked = self
                .endpoints
                .check(
                    batch.project_id.clone(),
                    batch.endpoint.clone(),
                    request.input.body.clone(),
                )
                .await;
            let problem = match checked {
                Err(message) => Some(("invalid_request", message)),
                Ok(name) => match &model {
                    None => {
                        model = Some((name, request.line));
                        None
                    }
                    Some((first, line)) if *first != name => Some((
                        "mismatched_model",
                        format!(
                            "the model `{name}` differs from `{first}` of line {line}; a batch \
                             uses one model"
                        ),
                    )),
                    Some(_) => None,
                },
            };
            if let Some((code, message)) = problem {
                problems.push(LineProblem {
                    line: request.line,
                    code,
                    message,
                });
            }
        }
        match model {
            _ if !problems.is_empty() => Err(Stop::Failed(report(problems))),
            Some((model, _)) => Ok(model),
            None => Err(Stop::Failed(vec![batch_error(
                "empty_file",
                "The input file holds no requests.".into(),
                None,
            )])),
        }
    }
}

/// Every non-blank line of an input file as a request (line numbers from
/// 1), and the lines that are not one; [`Stop::Failed`]'s errors when the
/// file holds more than `max_lines` requests.
fn parse_file(
    content: &[u8],
    endpoint: &str,
    overrides: Option<&OverrideSettings>,
    max_lines: usize,
) -> Result<Parsed, Vec<BatchError>> {
    let mut requests = Vec::new();
    let mut problems = Vec::new();
    let mut ids = CustomIds::default();
    let content = hearth_store::jsonl::without_bom(content);
    for (i, raw) in content.split(|&b| b == b'\n').enumerate() {
        let line = i as i64 + 1;
        let parsed = std::str::from_utf8(raw)
            .map_err(|_| "not UTF-8".to_string())
            .and_then(|text| {
                if text.trim().is_empty() {
                    return Ok(None);
                }
                let input = parse_input_line(text, endpoint, overrides)?;
                ids.insert(&input.custom_id)?;
                Ok(Some(input))
            });
        match parsed {
            Ok(Some(input)) => requests.push(Request { line, input }),
            Ok(None) => {}
            Err(message) => problems.push(LineProblem {
                line,
                code: "invalid_request",
                message,
            }),
        }
        if requests.len() > max_lines {
            return Err(vec![batch_error(
                "too_many_requests",
                format!("The input file holds more than {max_lines} requests, the most a batch may hold."),
                None,
            )]);
        }
    }
    Ok(Parsed { requests, problems })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_parsed_with_line_numbers() {
        let ep = "/v1/embeddings";
        let good = |id: &str| {
            format!(
                r#"{{"custom_id":"{id}","method":"POST","url":"/v1/embeddings","body":{{"model":"m","input":"x"}}}}"#
            )
        };
        let text = format!("{}\n\n{}\n", good("a"), good("b"));
        let parsed = parse_file(text.as_bytes(), ep, None, 10).unwrap();
        assert_eq!(
            parsed.requests.iter().map(|r| r.line).collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert!(parsed.problems.is_empty());
        let text = format!("{}\nnot json\n{}\n", good("a"), good("a"));
        let parsed = parse_file(text.as_bytes(), ep, None, 10).unwrap();
        let errors = report(parsed.problems);
        assert_eq!(
            errors.iter().map(|e| e.line).collect::<Vec<_>>(),
            vec![Some(2), Some(3)]
        );
        assert!(
            errors[1].message.contains("unique"),
            "{}",
            errors[1].message
        );
        let many = (0..4)
            .map(|i| good(&i.to_string()))
            .collect::<Vec<_>>()
            .join("\n");
        let errors = parse_file(many.as_bytes(), ep, None, 3).unwrap_err();
        assert_eq!(errors[0].code, "too_many_requests");
        // A byte order mark opening the file is not part of line 1.
        let text = format!("\u{feff}{}\n{}\n", good("a"), good("b"));
        let parsed = parse_file(text.as_bytes(), ep, None, 10).unwrap();
        assert_eq!(parsed.requests.len(), 2);
        assert!(parsed.problems.is_empty());
        let text = format!("{}\n\u{feff}{}\n", good("a"), good("b"));
        let parsed = parse_file(text.as_bytes(), ep, None, 10).unwrap();
        assert_eq!(report(parsed.problems)[0].line, Some(2));
    }

    #[test]
    fn problems_are_reported_in_line_order_then_counted() {
        let problem = |line: i64, code: &'static str| LineProblem {
            line,
            code,
            message: format!("problem {line}"),
        };
        let errors = report(vec![
            problem(4, "invalid_request"),
            problem(9, "invalid_request"),
            problem(2, "mismatched_model"),
        ]);
        assert_eq!(
            errors.iter().map(|e| e.line).collect::<Vec<_>>(),
            vec![Some(2), Some(4), Some(9)]
        );
        assert_eq!(errors[0].message, "Line 2: problem 2");
        assert_eq!(errors[0].code, "mismatched_model");
        let errors = report((1..=103).rev().map(|l| problem(l, "x")).collect());
        assert_eq!(errors.len(), 101);
        assert_eq!(errors[99].line, Some(100));
        assert_eq!(errors[100].message, "3 more lines have problems.");
        assert_eq!(errors[100].line, None);
    }
}
