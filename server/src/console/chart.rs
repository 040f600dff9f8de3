//! The loss chart of a fine-tuning job: an inline SVG drawn on the server
//! from the job's `metrics` events (training loss, and validation loss
//! where the step logged one), so it shows without JavaScript.

use maud::{html, Markup};
use serde_json::Value;

/// One step's losses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub step: i64,
    pub train: f64,
    pub valid: Option<f64>,
}

/// The points of `metrics` events' data (`step`, `train_loss`,
/// `valid_loss`), by step; a step logged twice keeps the first given
/// (events come newest first), non-finite losses are left out.
pub fn points<'a>(metrics: impl IntoIterator<Item = &'a Value>) -> Vec<Point> {
    let mut by_step = std::collections::BTreeMap::new();
    for d in metrics {
        let (Some(step), Some(train)) = (d["step"].as_i64(), d["train_loss"].as_f64()) else {
            continue;
        };
        if !train.is_finite() {
            continue;
        }
        let valid = d["valid_loss"].as_f64().filter(|v| v.is_finite());
        by_step.entry(step).or_insert(Point { step, train, valid });
    }
    by_step.into_values().collect()
}

const W: f64 = 640.0;
const H: f64 = 260.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 40.0;

/// The chart of `points` (none: nothing to draw, `None`).
pub fn loss_chart(points: &[Point]) -> Option<Markup> {
    let first = points.first()?;
    let last = points.last()?;
    let losses = points
        .iter()
        .flat_map(|p| std::iter::once(p.train).chain(p.valid));
    let (mut lo, mut hi) = losses.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi - lo < 1e-9 {
        lo -= 0.5;
        hi += 0.5;
    }
    let (s0, s1) = (first.step as f64, (last.step.max(first.step + 1)) as f64);
    let x = |step: i64| LEFT + (step as f64 - s0) / (s1 - s0) * (W - LEFT - RIGHT);
    let y = |v: f64| TOP + (hi - v) / (hi - lo) * (H - TOP - BOTTOM);
    let line = |values: &mut dyn Iterator<Item = (i64, f64)>| {
        values
            .map(|(s, v)| format!("{:.1},{:.1}", x(s), y(v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let train = line(&mut points.iter().map(|p| (p.step, p.train)));
    let valid_points: Vec<(i64, f64)> = points
        .iter()
        .filter_map(|p| p.valid.map(|v| (p.step, v)))
        .collect();
    let valid = line(&mut valid_points.iter().copied());
    let has_valid = !valid_points.is_empty();
    // A line of one point draws nothing: that point is a dot.
    let lone_valid = match valid_points.as_slice() {
        [only] => Some(*only),
        _ => None,
    };
    let mut summary = format!(
        "Training loss from {:.4} at step {} to {:.4} at step {}",
        first.train, first.step, last.train, last.step
    );
    if let Some((step, v)) = valid_points.last() {
        summary += &format!("; validation loss {v:.4} at step {step}");
    }
    Some(html! {
        figure.chart {
            svg viewBox={ "0 0 " (W) " " (H) } role="img" aria-labelledby="chart-title chart-desc"
                xmlns="http://www.w3.org/2000/svg" {
                title #chart-title { "Loss by step" }
                desc #chart-desc { (summary) }
                line.axis x1=(LEFT) y1=(H - BOTTOM) x2=(W - RIGHT) y2=(H - BOTTOM) {}
                line.axis x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(H - BOTTOM) {}
                text.tick x=(LEFT - 6.0) y=(TOP + 4.0) text-anchor="end" { (format!("{hi:.3}")) }
                text.tick x=(LEFT - 6.0) y=(H - BOTTOM) text-anchor="end" { (format!("{lo:.3}")) }
                text.tick x=(LEFT) y=(H - BOTTOM + 16.0) text-anchor="start" { (first.step) }
                text.tick x=(W - RIGHT) y=(H - BOTTOM + 16.0) text-anchor="end" { (s1) }
                text.tick x=((LEFT + W - RIGHT) / 2.0) y=(H - 6.0) text-anchor="middle" { "step" }
                polyline.train-loss points=(train) {}
                @if points.len() == 1 { circle.train-loss cx=(x(first.step)) cy=(y(first.train)) r="3" {} }
                @if has_valid { polyline.valid-loss points=(valid) {} }
                @if let Some((step, v)) = lone_valid { circle.valid-loss cx=(x(step)) cy=(y(v)) r="3" {} }
            }
            figcaption {
                span.key.train { "training loss" }
                @if has_valid { " " span.key.valid { "validation loss" } }
                " — " (summary)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn points_follow_steps_and_skip_bad_values() {
        let data = [
            json!({"step": 2, "train_loss": 1.5, "valid_loss": 1.7}),
            json!({"step": 1, "train_loss": 2.0, "valid_loss": null}),
            json!({"step": 2, "train_loss": 9.0}),
            json!({"step": 3}),
        ];
        let p = points(data.iter());
        assert_eq!(
            p,
            vec![
                Point {
                    step: 1,
                    train: 2.0,
                    valid: None
                },
                Point {
                    step: 2,
                    train: 1.5,
                    valid: Some(1.7)
                },
            ]
        );
    }

    #[test]
    fn the_chart_spans_its_points() {
        assert!(loss_chart(&[]).is_none());
        let p = [
            Point {
                step: 1,
                train: 2.0,
                valid: None,
            },
            Point {
                step: 3,
                train: 1.0,
                valid: Some(1.5),
            },
        ];
        let svg = loss_chart(&p).unwrap().into_string();
        // First point top-left, last bottom-right of the plot area.
        assert!(svg.contains(r#"points="56.0,16.0 624.0,220.0""#), "{svg}");
        assert!(
            svg.contains(r#"class="valid-loss" points="624.0,118.0""#),
            "{svg}"
        );
        assert!(svg.contains("from 2.0000 at step 1 to 1.0000 at step 3"));
        assert!(svg.contains("; validation loss 1.5000 at step 3"), "{svg}");
        // One validation point is drawn as a dot (a line of one point is
        // invisible).
        assert!(
            svg.contains(r#"<circle class="valid-loss" cx="624" cy="118""#),
            "{svg}"
        );
        let mut two = p.to_vec();
        two[0].valid = Some(1.8);
        let svg = loss_chart(&two).unwrap().into_string();
        assert!(!svg.contains("circle"), "{svg}");
    }
}
