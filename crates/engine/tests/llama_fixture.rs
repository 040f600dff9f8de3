//! The native Llama on the real default model against llama.cpp's reference
//! outputs (`shared/fixtures/smollm2_greedy.json`), with the fixture's own
//! tolerance rules: teacher-forced argmax where the reference margin is at
//! least 0.5, log-probabilities within 0.75, top-5 agreement on the first
//! steps, and free-running greedy equal up to `strict_prefix_len`.

mod common;

use hearth_engine::load::load_gguf;
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    let lse = max + sum.ln();
    logits.iter().map(|l| l - lse).collect()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0 as u32
}

#[test]
fn teacher_forced_logprobs_match_llama_cpp() {
    let lm = load_gguf(&common::smollm_gguf(), &common::test_device()).unwrap();
    let fixture = common::fixture("smollm2_greedy.json");
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_token_ids"]);
        let generated = ids(&case["generated_token_ids"]);
        let chosen: Vec<f64> = case["chosen_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let margins: Vec<f64> = case["top2_margin_per_step"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let tops = case["top_candidates_first_steps"].as_array().unwrap();

        let mut cache = lm.model.new_cache();
        let mut logits = lm
            .model
            .forward(&prompt, &mut cache)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let mut worst = 0f64;
        for (i, &reference) in generated.iter().enumerate() {
            let lp = log_softmax(&logits);
            let top1 = argmax(&lp);
            if margins[i] >= 0.5 {
                assert_eq!(
                    top1, reference,
                    "{name} step {i}: argmax differs where the reference margin is {}",
                    margins[i]
                );
            }
            let delta = (lp[reference as usize] as f64 - chosen[i]).abs();
            worst = worst.max(delta);
            assert!(delta <= 0.75, "{name} step {i}: |Δlogprob| = {delta}");
            if let Some(step) = tops.get(i).filter(|_| i < 4) {
                let candidates = step["top5"].as_array().unwrap();
                for c in candidates {
                    let id = c["id"].as_u64().unwrap() as usize;
                    let d = (lp[id] as f64 - c["logprob"].as_f64().unwrap()).abs();
                    assert!(
                        d <= 0.75,
                        "{name} step {i}: top-5 candidate {id} off by {d}"
                    );
                }
                let top3: Vec<u64> = candidates
                    .iter()
                    .take(3)
                    .map(|c| c["id"].as_u64().unwrap())
                    .collect();
                assert!(
                    top3.contains(&(top1 as u64)),
                    "{name} step {i}: our top-1 {top1} not in reference top-3 {top3:?}"
                );
            }
            logits = lm
                .model
                .forward(&[reference], &mut cache)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
        }
        eprintln!(
            "{name}: worst |Δlogprob| {worst:.3} over {} steps",
            generated.len()
        );
    }
}
