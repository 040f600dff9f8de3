//! Token sampling from logits.
//!
//! A [`Sampler`] is built per sequence from its [`SamplingParams`]. For each step
//! it applies, in order: `logit_bias`; the CTRL repetition penalty over prompt and
//! generated tokens; OpenAI presence/frequency penalties over generated tokens;
//! then greedy argmax when `temperature < 1e-5` (ties go to the lowest id), or
//! temperature scaling, `top_k`, `top_p` (nucleus, at least one token kept),
//! `min_p` (relative to the best token) and a draw from the renormalised
//! distribution with a seeded `StdRng`.
//!
//! The reported `logprob` and `top` candidates are the log-softmax of the RAW
//! logits (before penalties, bias and temperature), like vLLM's default.
//! Everything is O(vocab) except `top_p`, which sorts the surviving candidates.

use std::cmp::Ordering;

use hearth_core::SamplingParams;
use hearth_models::Pick;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Temperatures below this mean greedy decoding.
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// One sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub id: u32,
    /// log_softmax of the raw logits at `id`; computed only when the
    /// parameters ask for `logprobs` (it costs an exponential per
    /// vocabulary entry).
    pub logprob: Option<f32>,
    /// The `logprobs` most likely tokens by raw logits, best first (empty unless asked).
    pub top: Vec<(u32, f32)>,
}

/// Picks tokens for one sequence.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Working copy of the logits.
    work: Vec<f32>,
    /// Index scratch for top-k / top-p / top logprobs.
    idx: Vec<u32>,
    /// Per-token counts (kept all-zero between calls).
    counts: Vec<u32>,
}

/// NaN sorts as -inf.
fn key(v: f32) -> f32 {
    if v.is_nan() {
        f32::NEG_INFINITY
    } else {
        v
    }
}

/// Descending by value, ties by ascending id.
fn desc(values: &[f32]) -> impl Fn(&u32, &u32) -> Ordering + '_ {
    move |&a, &b| {
        key(values[b as usize])
            .total_cmp(&key(values[a as usize]))
            .then(a.cmp(&b))
    }
}

/// Index of the largest value (lowest index on ties; NaN ignored).
fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in values.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// log(sum(exp(values))) in f64, NaN treated as -inf.
fn log_sum_exp(values: &[f32]) -> f64 {
    let max = values
        .iter()
        .copied()
        .map(key)
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max as f64;
    }
    let sum: f64 = values.iter().map(|&v| ((key(v) - max) as f64).exp()).sum();
    max as f64 + sum.ln()
}

impl Sampler {
    pub fn new(params: &SamplingParams) -> Self {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Self {
            params: params.clone(),
            rng,
            work: Vec::new(),
            idx: Vec::new(),
            counts: Vec::new(),
        }
    }

    /// Whether this sampler decodes greedily.
    pub fn is_greedy(&self) -> bool {
        let t = self.params.temperature;
        t.is_nan() || t < GREEDY_TEMPERATURE
    }

    /// True when the token is the logits' argmax and nothing else is asked
    /// of them (greedy, no bias, no penalties, no log-probabilities): the
    /// engine can then pick it where the logits are (on a GPU) instead of
    /// reading them back.
    pub fn argmax_only(&self) -> bool {
        self.picks_raw_argmax() && self.params.logprobs.is_none()
    }

    /// How the next token can be picked where the logits are (a GPU), so
    /// that they need not be read back: the argmax when that is all this
    /// sampler wants ([`Sampler::argmax_only`]), or a draw at the
    /// temperature for plain sampling (no top-k, top-p, min-p, bias,
    /// penalties or log-probabilities) without a seed. A seeded request
    /// always samples here, from its own generator, so its text does not
    /// depend on which other requests share its steps. `None`: the logits
    /// must come back.
    pub fn device_pick(&mut self) -> Option<Pick> {
        if self.argmax_only() {
            return Some(Pick::Argmax);
        }
        let p = &self.params;
        let plain = p.top_k == 0
            && p.top_p >= 1.0
            && p.min_p <= 0.0
            && p.logit_bias.is_empty()
            && p.logprobs.is_none()
            && p.seed.is_none()
            && p.temperature.is_finite()
            && !self.is_greedy()
            && !self.penalized();
        plain.then(|| Pick::Draw {
            temperature: p.temperature,
            seed: self.rng.random(),
        })
    }

    fn penalized(&self) -> bool {
        let p = &self.params;
        p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0
    }

    /// Greedy with nothing that changes the logits (bias, penalties): the
    /// token is the raw logits' argmax.
    fn picks_raw_argmax(&self) -> bool {
        self.is_greedy() && self.params.logit_bias.is_empty() && !self.penalized()
    }

    /// Picks the next token. `prompt` and `generated` feed the penalties.
    pub fn sample(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> Sampled {
        assert!(!logits.is_empty(), "sample: empty logits");
        let id = self.choose(logits, prompt, generated);
        let Some(k) = self.params.logprobs else {
            return Sampled {
                id,
                logprob: None,
                top: Vec::new(),
            };
        };
        let lse = log_sum_exp(logits);
        let logprob = (key(logits[id as usize]) as f64 - lse) as f32;
        let top = match k {
            0 => Vec::new(),
            k => self.top_logprobs(logits, k, lse),
        };
        Sampled {
            id,
            logprob: Some(logprob),
            top,
        }
    }

    fn top_logprobs(&mut self, logits: &[f32], k: usize, lse: f64) -> Vec<(u32, f32)> {
        let k = k.min(logits.len());
        self.idx.clear();
        self.idx.extend(0..logits.len() as u32);
        let cmp = desc(logits);
        if k < self.idx.len() {
            self.idx.select_nth_unstable_by(k - 1, &cmp);
            self.idx.truncate(k);
        }
        self.idx.sort_unstable_by(&cmp);
        self.idx
            .iter()
            .map(|&i| (i, (key(logits[i as usize]) as f64 - lse) as f32))
            .collect()
    }

    fn choose(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> u32 {
        if self.picks_raw_argmax() {
            return argmax(logits) as u32; // nothing changes the logits
        }
        let n = logits.len();
        let p = &self.params;
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        work.extend(logits.iter().map(|&v| key(v)));

        for &(id, bias) in &p.logit_bias {
            if let Some(v) = work.get_mut(id as usize) {
                *v += bias;
            }
        }

        let penalize_repeats = p.repetition_penalty != 1.0 && p.repetition_penalty > 0.0;
        let penalize_generated = p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if penalize_repeats || penalize_generated {
            self.counts.resize(n, 0);
            // counts[id] = times generated (+ a flag bit for "seen in prompt").
            const IN_PROMPT: u32 = 1 << 31;
            for &id in generated {
                if let Some(c) = self.counts.get_mut(id as usize) {
                    *c += 1;
                }
            }
            if penalize_repeats {
                for &id in prompt {
                    if let Some(c) = self.counts.get_mut(id as usize) {
                        *c |= IN_PROMPT;
                    }
                }
            }
            for &id in prompt.iter().chain(generated) {
                let Some(c) = self.counts.get_mut(id as usize) else {
                    continue;
                };
                if *c == 0 {
                    continue; // already applied
                }
                let times = *c & !IN_PROMPT;
                *c = 0;
                let v = &mut work[id as usize];
                if penalize_repeats {
                    if *v > 0.0 {
                        *v /= p.repetition_penalty;
                    } else {
                        *v *= p.repetition_penalty;
                    }
                }
                if times > 0 {
                    *v -= p.frequency_penalty * times as f32 + p.presence_penalty;
                }
            }
        }

        let id = if self.is_greedy() {
            argmax(&work) as u32
        } else {
            self.draw(&mut work)
        };
        self.work = work;
        id
    }

    /// Temperature, top-k, top-p, min-p, then a draw. Excluded tokens become -inf.
    fn draw(&mut self, work: &mut [f32]) -> u32 {
        let n = work.len();
        let p = &self.params;
        if p.temperature != 1.0 {
            let inv = 1.0 / p.temperature;
            work.iter_mut().for_each(|v| *v *= inv);
        }
        let top_k_active = p.top_k > 0 && p.top_k < n;
        let top_p_active = p.top_p < 1.0;
        if top_k_active || top_p_active {
            self.idx.clear();
            self.idx.extend(0..n as u32);
            let cmp = desc(&*work);
            if top_k_active {
                self.idx.select_nth_unstable_by(p.top_k - 1, &cmp);
                self.idx.truncate(p.top_k);
            }
            if top_p_active {
                self.idx.sort_unstable_by(&cmp);
                let max = work[self.idx[0] as usize];
                let probs: Vec<f64> = self
                    .idx
                    .iter()
                    .map(|&i| ((work[i as usize] - max) as f64).exp())
                    .collect();
                let total: f64 = probs.iter().sum();
                let target = p.top_p.max(0.0) as f64 * total;
                let mut cum = 0.0;
                let mut keep = probs.len();
                for (j, q) in probs.iter().enumerate() {
                    cum += q;
                    if cum >= target {
                        keep = j + 1;
                        break;
                    }
                }
                self.idx.truncate(keep.max(1));
            }
            drop(cmp);
            // Mask everything outside the kept set.
            let mut masked = vec![f32::NEG_INFINITY; n];
            for &i in &self.idx {
                masked[i as usize] = work[i as usize];
            }
            work.copy_from_slice(&masked);
        }
        let best = argmax(work);
        let max = work[best];
        if !max.is_finite() {
            return best as u32; // everything banned or infinite: fall back to the argmax
        }
        if p.min_p > 0.0 {
            let threshold = max + p.min_p.min(1.0).ln();
            work.iter_mut()
                .filter(|v| **v < threshold)
                .for_each(|v| *v = f32::NEG_INFINITY);
        }
        // Unnormalised probabilities, each exponential computed once (f32:
        // a token more than ~87 nats below the best gets no mass).
        let mut total = 0f64;
        for v in work.iter_mut() {
            *v = (*v - max).exp();
            total += *v as f64;
        }
        let mut u = self.rng.random::<f64>() * total;
        let mut last = best;
        for (i, &q) in work.iter().enumerate() {
            if q == 0.0 {
                continue;
            }
            if u < q as f64 {
                return i as u32;
            }
            u -= q as f64;
            last = i;
        }
        last as u32 // rounding: the last token with any mass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    /// A peaked distribution: id 3 best, then 1, then 0, 2, 4...
    fn logits() -> Vec<f32> {
        let mut l = vec![0.0f32; 64];
        l[0] = 1.0;
        l[1] = 2.0;
        l[2] = 0.5;
        l[3] = 3.0;
        l
    }

    fn draw_many(p: &SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(p);
        (0..n).map(|_| s.sample(logits, &[], &[]).id).collect()
    }

    fn freq(ids: &[u32], id: u32) -> f64 {
        ids.iter().filter(|&&i| i == id).count() as f64 / ids.len() as f64
    }

    /// Exactly the parameters under which the token is the raw argmax
    /// and nothing else is read from the logits.
    #[test]
    fn argmax_only_means_greedy_with_nothing_else_asked() {
        let greedy = |f: fn(&mut SamplingParams)| {
            params(|p| {
                *p = SamplingParams::greedy();
                f(p)
            })
        };
        let only = |p: &SamplingParams| Sampler::new(p).argmax_only();
        assert!(only(&greedy(|_| {})));
        assert!(only(&greedy(|p| p.top_k = 5)), "top-k changes no argmax");
        for (what, p) in [
            ("temperature", params(|p| p.temperature = 0.7)),
            ("logprobs", greedy(|p| p.logprobs = Some(0))),
            ("logit_bias", greedy(|p| p.logit_bias = vec![(1, 5.0)])),
            ("repetition", greedy(|p| p.repetition_penalty = 1.2)),
            ("presence", greedy(|p| p.presence_penalty = 0.5)),
            ("frequency", greedy(|p| p.frequency_penalty = 0.5)),
        ] {
            assert!(!only(&p), "{what}");
        }
        // Where it holds, sampling is the argmax.
        let p = greedy(|_| {});
        assert_eq!(Sampler::new(&p).sample(&logits(), &[], &[]).id, 3);
    }

    /// Plain unseeded temperature sampling is drawn on the device; every
    /// other parameter that shapes the distribution, a seed, or
    /// log-probabilities keep the logits coming back.
    #[test]
    fn device_picks_are_the_argmax_or_a_plain_unseeded_draw() {
        let pick = |p: &SamplingParams| Sampler::new(p).device_pick();
        assert_eq!(pick(&SamplingParams::greedy()), Some(Pick::Argmax));
        let warm = params(|p| p.temperature = 0.8);
        match pick(&warm) {
            Some(Pick::Draw { temperature, .. }) => assert_eq!(temperature, 0.8),
            other => panic!("plain sampling picked {other:?}"),
        }
        // Each draw takes a fresh seed from the sequence's generator.
        let mut s = Sampler::new(&warm);
        assert_ne!(s.device_pick(), s.device_pick());
        for (what, p) in [
            ("top-k", params(|p| p.top_k = 5)),
            ("top-p", params(|p| p.top_p = 0.9)),
            ("min-p", params(|p| p.min_p = 0.1)),
            ("seed", params(|p| p.seed = Some(7))),
            ("logprobs", params(|p| p.logprobs = Some(0))),
            ("bias", params(|p| p.logit_bias = vec![(1, 2.0)])),
            ("presence", params(|p| p.presence_penalty = 0.5)),
            ("repetition", params(|p| p.repetition_penalty = 1.2)),
        ] {
            assert_eq!(pick(&p), None, "{what}");
        }
    }

    #[test]
    fn greedy_picks_argmax_lowest_id_on_ties() {
        let mut s = Sampler::new(&SamplingParams::greedy());
        assert_eq!(s.sample(&logits(), &[], &[]).id, 3);
        let tied = [1.0, 5.0, 5.0, f32::NAN, 2.0];
        assert_eq!(s.sample(&tied, &[], &[]).id, 1);
    }

    #[test]
    fn same_seed_same_sequence_different_seed_differs() {
        let flat = vec![0.0f32; 1000];
        let a = draw_many(&params(|p| p.seed = Some(7)), &flat, 50);
        let b = draw_many(&params(|p| p.seed = Some(7)), &flat, 50);
        let c = draw_many(&params(|p| p.seed = Some(8)), &flat, 50);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn top_k_one_equals_greedy() {
        let p = params(|p| {
            p.top_k = 1;
            p.seed = Some(1);
        });
        assert!(draw_many(&p, &logits(), 200).iter().all(|&id| id == 3));
        // top_k = 2 keeps only ids 3 and 1.
        let p = params(|p| {
            p.top_k = 2;
            p.seed = Some(1);
        });
        let ids = draw_many(&p, &logits(), 500);
        assert!(ids.iter().all(|&id| id == 3 || id == 1));
        assert!(ids.contains(&1));
    }

    #[test]
    fn tiny_top_p_is_argmax() {
        let p = params(|p| {
            p.top_p = 1e-6;
            p.seed = Some(2);
        });
        assert!(draw_many(&p, &logits(), 200).iter().all(|&id| id == 3));
        // top_p = 0.8 over probs of {3, 1, 0, ...}: 3 and 1 cover it, others never appear.
        let l = [0.0f32, 2.0, -10.0, 3.0];
        let p = params(|p| {
            p.top_p = 0.8;
            p.seed = Some(2);
        });
        let ids = draw_many(&p, &l, 500);
        assert!(ids.iter().all(|&id| id == 3 || id == 1));
        assert!(ids.contains(&1));
    }

    #[test]
    fn min_p_one_is_argmax() {
        let p = params(|p| {
            p.min_p = 1.0;
            p.seed = Some(3);
        });
        assert!(draw_many(&p, &logits(), 200).iter().all(|&id| id == 3));
        // min_p = 0.3: id 1 (e^-1 = 0.37 of the best) stays, id 0 (0.14) goes.
        let p = params(|p| {
            p.min_p = 0.3;
            p.seed = Some(3);
        });
        let ids = draw_many(&p, &logits(), 500);
        assert!(ids.iter().all(|&id| id == 3 || id == 1));
        assert!(ids.contains(&1));
    }

    #[test]
    fn high_temperature_flattens() {
        let cold = draw_many(&params(|p| p.seed = Some(4)), &logits(), 4000);
        let hot = draw_many(
            &params(|p| {
                p.seed = Some(4);
                p.temperature = 5.0;
            }),
            &logits(),
            4000,
        );
        // At T=1 id 3 has p ≈ 0.24; at T=5 the 64 tokens are nearly uniform (≈ 0.025).
        assert!(freq(&cold, 3) > 0.18, "{}", freq(&cold, 3));
        assert!(freq(&hot, 3) < 0.06, "{}", freq(&hot, 3));
        let distinct = |ids: &[u32]| {
            let mut v = ids.to_vec();
            v.sort();
            v.dedup();
            v.len()
        };
        assert!(distinct(&hot) > distinct(&cold) || distinct(&hot) == 64);
    }

    #[test]
    fn logit_bias_forces_and_bans() {
        let mut s = Sampler::new(&params(|p| {
            p.temperature = 0.0;
            p.logit_bias = vec![(10, 100.0)];
        }));
        assert_eq!(s.sample(&logits(), &[], &[]).id, 10);
        let mut s = Sampler::new(&params(|p| {
            p.temperature = 0.0;
            p.logit_bias = vec![(3, -100.0), (99_999, 5.0)];
            p.logprobs = Some(0);
        }));
        let out = s.sample(&logits(), &[], &[]);
        assert_eq!(out.id, 1);
        // Reported logprob is of the raw logits, unaffected by the bias.
        let logprob = out.logprob.expect("asked for");
        assert!((logprob - (2.0 - log_sum_exp(&logits()) as f32)).abs() < 1e-5);
        let p = params(|p| {
            p.logit_bias = vec![(3, -100.0)];
            p.seed = Some(5);
        });
        assert!(!draw_many(&p, &logits(), 500).contains(&3));
    }

    #[test]
    fn presence_penalty_makes_repeated_token_lose() {
        let greedy = |f: fn(&mut SamplingParams)| {
            let mut p = SamplingParams::greedy();
            f(&mut p);
            Sampler::new(&p).sample(&logits(), &[], &[3]).id
        };
        assert_eq!(greedy(|_| {}), 3);
        assert_eq!(greedy(|p| p.presence_penalty = 1.5), 1);
        assert_eq!(greedy(|p| p.presence_penalty = 0.5), 3);
    }

    #[test]
    fn frequency_penalty_scales_with_count() {
        let mut p = SamplingParams::greedy();
        p.frequency_penalty = 0.6;
        let mut s = Sampler::new(&p);
        assert_eq!(s.sample(&logits(), &[], &[3]).id, 3); // 3 - 0.6 > 2
        assert_eq!(s.sample(&logits(), &[], &[3, 3]).id, 1); // 3 - 1.2 < 2
        assert_eq!(s.sample(&logits(), &[3, 3, 3], &[]).id, 3); // prompt is not counted
    }

    #[test]
    fn repetition_penalty_covers_prompt_and_generated() {
        let mut p = SamplingParams::greedy();
        p.repetition_penalty = 2.0;
        let mut s = Sampler::new(&p);
        assert_eq!(s.sample(&logits(), &[], &[]).id, 3);
        assert_eq!(s.sample(&logits(), &[3], &[]).id, 1); // 3/2 < 2
        assert_eq!(s.sample(&logits(), &[], &[3, 3]).id, 1); // applied once
        assert_eq!(s.sample(&logits(), &[3, 1], &[3]).id, 3); // 1.5 > 1.0 (ids 0 and 1)
        p.repetition_penalty = 4.0;
        let mut s = Sampler::new(&p);
        assert_eq!(s.sample(&logits(), &[3, 1], &[3]).id, 0); // 0.75, 0.5 < 1.0
                                                              // Negative logits are multiplied (pushed further down).
        let neg = [-1.0f32, -1.5];
        assert_eq!(s.sample(&neg, &[0], &[]).id, 1);
    }

    #[test]
    fn logprobs_are_raw_log_softmax_sorted() {
        let l = logits();
        let mut s = Sampler::new(&params(|p| {
            p.logprobs = Some(5);
            p.temperature = 0.7;
            p.presence_penalty = 2.0;
            p.seed = Some(9);
        }));
        let out = s.sample(&l, &[], &[3]);
        let lse = log_sum_exp(&l);
        let logprob = out.logprob.expect("asked for");
        assert!((logprob - (l[out.id as usize] as f64 - lse) as f32).abs() < 1e-6);
        assert_eq!(out.top.len(), 5);
        let ids: Vec<u32> = out.top.iter().map(|t| t.0).collect();
        assert_eq!(&ids[..4], &[3, 1, 0, 2]);
        assert_eq!(ids[4], 4); // the zero logits tie; the lowest id comes first
        assert!(out.top.windows(2).all(|w| w[0].1 >= w[1].1));
        let mass: f64 = out.top.iter().map(|t| (t.1 as f64).exp()).sum();
        assert!(mass <= 1.0 + 1e-6);
        assert!((out.top[0].1 - (3.0 - lse) as f32).abs() < 1e-6);
        // Not asked: no candidates, no logprob.
        let mut s = Sampler::new(&SamplingParams::greedy());
        let out = s.sample(&l, &[], &[]);
        assert!(out.top.is_empty() && out.logprob.is_none());
        // Asked for more than the vocabulary: all of it.
        let mut s = Sampler::new(&params(|p| p.logprobs = Some(10)));
        assert_eq!(s.sample(&[0.0, 1.0], &[], &[]).top.len(), 2);
    }

    #[test]
    fn everything_banned_falls_back_to_argmax() {
        let mut s = Sampler::new(&params(|p| {
            p.seed = Some(1);
            p.logit_bias = vec![(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)];
        }));
        let out = s.sample(&[1.0, 2.0], &[], &[]);
        assert!(out.id < 2);
    }
}
