use serde::{Deserialize, Serialize};

/// Most stop sequences a request may carry (OpenAI's limit).
pub const MAX_STOP_SEQUENCES: usize = 4;
/// Most top candidates a request may ask log-probabilities for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How to pick tokens for one sequence. Defaults are OpenAI's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Most tokens to generate; `None` means up to the context length.
    pub max_tokens: Option<usize>,
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling; 1.0 disables it.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Drop tokens whose probability is below `min_p` times the best one's; 0 disables it.
    pub min_p: f32,
    /// Same seed, same prompt, same parameters: same text.
    pub seed: Option<u64>,
    /// Stop strings; the matched text is not returned.
    pub stop: Vec<String>,
    /// Subtracted once from the logit of every token already generated.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated.
    pub frequency_penalty: f32,
    /// CTRL-style multiplicative penalty over prompt and generated tokens; 1.0 disables it.
    pub repetition_penalty: f32,
    /// Added to the logits of the given token ids.
    pub logit_bias: Vec<(u32, f32)>,
    /// `None`: no log-probabilities; `Some(k)`: the chosen token's plus the top `k`.
    pub logprobs: Option<usize>,
    /// Keep generating past end-of-sequence tokens (for benchmarks).
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            max_tokens: None,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            stop: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            logprobs: None,
            ignore_eos: false,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding with everything else off.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }
}
