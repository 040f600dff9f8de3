//! Checks the GGUF Llama against llama.cpp reference outputs.
//!
//! Usage: `check_fixture MODEL.gguf smollm2_greedy.json`
//!
//! For every case of the fixture (see `fixtures/README.md` for the rules):
//! - teacher-forced: feed `prompt_token_ids`, then the reference generated
//!   tokens one at a time; at each step the argmax must equal the reference
//!   wherever `top2_margin >= 0.5`, `|log_softmax(ref) - chosen_logprob|` must
//!   be <= 0.75, and for steps 0..4 every listed top-5 logprob is within 0.75
//!   and our top-1 is among the reference top-3;
//! - free-running greedy: the common prefix with the reference must be at
//!   least `strict_prefix_len`.
//!
//! Exits with status 1 if any rule fails. Also prints prefill and decode speed.
//! `CHECK_VERBOSE=1` prints every teacher-forced step.

use std::time::Instant;

use anyhow::{Context, Result};
use hearth_models::{gguf_file, CausalLM, Device, Llama, Tensor};
use serde_json::Value;

const MAX_DLOGPROB: f64 = 0.75;
const STRICT_MARGIN: f64 = 0.5;

fn ids(v: &Value) -> Result<Vec<u32>> {
    v.as_array()
        .context("expected an array of ids")?
        .iter()
        .map(|x| x.as_u64().map(|x| x as u32).context("expected an id"))
        .collect()
}

fn floats(v: &Value) -> Result<Vec<f64>> {
    v.as_array()
        .context("expected an array of numbers")?
        .iter()
        .map(|x| x.as_f64().context("expected a number"))
        .collect()
}

/// Natural-log softmax of a logits vector, in f64.
fn log_softmax(logits: &Tensor) -> Result<Vec<f64>> {
    let l: Vec<f64> = logits
        .to_vec1::<f32>()?
        .into_iter()
        .map(f64::from)
        .collect();
    let max = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + l.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
    Ok(l.into_iter().map(|x| x - lse).collect())
}

fn argmax(v: &[f64]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, model_path, fixture_path] = args.as_slice() else {
        anyhow::bail!("usage: check_fixture MODEL.gguf FIXTURE.json")
    };
    let device = Device::Cpu;
    let verbose = std::env::var("CHECK_VERBOSE").is_ok_and(|v| v == "1");
    let t0 = Instant::now();
    let mut file = std::fs::File::open(model_path).with_context(|| format!("open {model_path}"))?;
    let content = gguf_file::Content::read(&mut file)?;
    let model = Llama::from_gguf(&content, &mut file, &device)?;
    println!(
        "loaded in {:.2}s: {:?}",
        t0.elapsed().as_secs_f64(),
        model.info()
    );

    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(fixture_path)?)?;
    let cases = fixture["cases"].as_array().context("no cases")?;
    let mut failures = 0usize;
    let (mut decode_tokens, mut decode_secs) = (0usize, 0f64);
    let (mut prefill_tokens, mut prefill_secs) = (0usize, 0f64);

    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let prompt = ids(&case["prompt_token_ids"])?;
        let generated = ids(&case["generated_token_ids"])?;
        let chosen = floats(&case["chosen_logprobs"])?;
        let margins = floats(&case["top2_margin_per_step"])?;
        let strict = case["strict_prefix_len"]
            .as_u64()
            .context("strict_prefix_len")? as usize;
        let tops = case["top_candidates_first_steps"]
            .as_array()
            .cloned()
            .unwrap_or_default();

        // Teacher-forced pass.
        let mut cache = model.new_cache();
        let t = Instant::now();
        let mut logits = model.forward(&prompt, &mut cache)?;
        prefill_secs += t.elapsed().as_secs_f64();
        prefill_tokens += prompt.len();
        let (mut max_d, mut mismatches, mut flips_low_margin) = (0f64, Vec::new(), 0usize);
        let mut top5_bad = Vec::new();
        for (i, &want) in generated.iter().enumerate() {
            let lp = log_softmax(&logits)?;
            let got = argmax(&lp);
            max_d = max_d.max((lp[want as usize] - chosen[i]).abs());
            if verbose {
                println!(
                    "  step {i:2} ref {want:6} lp {:8.4} ours {:8.4} d {:+.3} margin {:.3} our top {got} {:.4}",
                    chosen[i], lp[want as usize], lp[want as usize] - chosen[i], margins[i], lp[got as usize]
                );
            }
            if got != want {
                if margins[i] >= STRICT_MARGIN {
                    mismatches.push(i);
                } else {
                    flips_low_margin += 1;
                }
            }
            if let Some(step) = tops.iter().find(|s| s["step"].as_u64() == Some(i as u64)) {
                let top5 = step["top5"].as_array().context("top5")?;
                for cand in top5 {
                    let id = cand["id"].as_u64().context("id")? as usize;
                    let d = (lp[id] - cand["logprob"].as_f64().context("logprob")?).abs();
                    if d > MAX_DLOGPROB {
                        top5_bad.push(format!("step {i} id {id} |d|={d:.3}"));
                    }
                }
                let top3: Vec<u32> = top5
                    .iter()
                    .take(3)
                    .filter_map(|c| c["id"].as_u64())
                    .map(|x| x as u32)
                    .collect();
                if !top3.contains(&got) {
                    top5_bad.push(format!("step {i} top-1 {got} not in reference top-3"));
                }
            }
            if i + 1 < generated.len() {
                let t = Instant::now();
                logits = model.forward(&[want], &mut cache)?;
                decode_secs += t.elapsed().as_secs_f64();
                decode_tokens += 1;
            }
        }

        // Free-running greedy pass.
        let mut cache = model.new_cache();
        let mut logits = model.forward(&prompt, &mut cache)?;
        let mut common = 0;
        let mut ours = Vec::new();
        for i in 0..generated.len() {
            let next = argmax(&log_softmax(&logits)?);
            ours.push(next);
            if common == i && next == generated[i] {
                common += 1;
            }
            if i + 1 < generated.len() {
                logits = model.forward(&[next], &mut cache)?;
            }
        }

        let ok = max_d <= MAX_DLOGPROB
            && mismatches.is_empty()
            && top5_bad.is_empty()
            && common >= strict;
        if !ok {
            failures += 1;
        }
        println!(
            "{name:7} {}: max|dlogprob| {max_d:.3}, argmax mismatches at margin>=0.5: {} {:?} \
             (low-margin flips {flips_low_margin}), greedy common prefix {common}/{} (strict {strict}), top5 issues {:?}",
            if ok { "PASS" } else { "FAIL" },
            mismatches.len(),
            mismatches,
            generated.len(),
            top5_bad,
        );
        println!(
            "        first greedy tokens {:?}",
            &ours[..ours.len().min(8)]
        );
    }
    println!(
        "prefill {:.1} tok/s ({prefill_tokens} tokens), decode {:.1} tok/s ({decode_tokens} tokens)",
        prefill_tokens as f64 / prefill_secs,
        decode_tokens as f64 / decode_secs
    );
    if failures > 0 {
        println!("{failures} case(s) FAILED");
        std::process::exit(1);
    }
    println!("all {} cases pass", cases.len());
    Ok(())
}
