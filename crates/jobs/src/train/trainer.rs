//! [`Trainer`]: the training loop, evaluation, generation and the adapter.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use candle_core::{Tensor, Var};
use hearth_api::training_data::TrainingExample;
use hearth_engine::chat_template::ChatTemplate;
use hearth_models::{LoraAdapter, LoraConfig, LoraTarget, LoraWeights, ModelInfo};
use tokenizers::Tokenizer;

use super::base::{BaseWeights, Dims};
use super::buffers::Buffers;
use super::data::{fit_to_context, tokenize_all, DataStats};
use super::model::{Batch, Dropout, Forward, LoraTensors, TokenizedExample};
use super::ops::RopeLayout;
use super::optim::{clip_grad_norm, learning_rate, AdamW, Rng};
use super::step::{Adapter, Step, Tokens};
use crate::{BaseModel, StepReport, TrainConfig, TrainError};

/// A LoRA fine-tuning run over a frozen Llama base. See the crate docs.
pub struct Trainer {
    pub(crate) base: BaseWeights,
    /// Per layer, per target (`LoraTarget::ALL` order): `(A, B)`, in the
    /// base's layout.
    pub(crate) vars: Vec<[(Var, Var); 7]>,
    pub(crate) opt: AdamW,
    pub(crate) cfg: TrainConfig,
    pub(crate) base_model_name: String,
    pub(crate) train: Vec<TokenizedExample>,
    pub(crate) valid: Vec<TokenizedExample>,
    pub(crate) stats: DataStats,
    pub(crate) step: usize,
    pub(crate) steps_per_epoch: usize,
    pub(crate) fingerprint: String,
    /// Large buffers the steps reuse.
    pub(crate) bufs: Mutex<Buffers>,
}

fn cfg_err(m: impl Into<String>) -> TrainError {
    TrainError::Config(m.into())
}

impl Trainer {
    /// Tokenises the datasets with `tokenizer` and `template` (see
    /// [`crate::train::data`]; `eos_ids`: end-of-turn / end-of-sequence ids,
    /// the first one ends completions), loads the base and initialises the
    /// adapter. Fails before loading the base on a bad config or a dataset
    /// left empty.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        base: &BaseModel,
        base_model_name: &str,
        tokenizer: &Tokenizer,
        template: &ChatTemplate,
        eos_ids: &[u32],
        train: &[TrainingExample],
        valid: Option<&[TrainingExample]>,
        cfg: TrainConfig,
    ) -> Result<Trainer, TrainError> {
        check_config(&cfg)?;
        let mut stats = DataStats::default();
        let ctx = cfg.context_length;
        let train = tokenize_all(tokenizer, template, eos_ids, train, ctx, &mut stats)?;
        let valid = match valid {
            Some(v) => tokenize_all(tokenizer, template, eos_ids, v, ctx, &mut stats)?,
            None => Vec::new(),
        };
        Self::build(base, base_model_name, train, valid, cfg, stats)
    }

    /// Like [`Trainer::new`] with examples already tokenised (truncated to
    /// the context length and dropped when left without loss tokens, as
    /// `new` does).
    pub fn from_tokenized(
        base: &BaseModel,
        base_model_name: &str,
        train: Vec<TokenizedExample>,
        valid: Vec<TokenizedExample>,
        cfg: TrainConfig,
    ) -> Result<Trainer, TrainError> {
        check_config(&cfg)?;
        let mut stats = DataStats::default();
        let train = fit_to_context(train, cfg.context_length, &mut stats);
        let valid = fit_to_context(valid, cfg.context_length, &mut stats);
        Self::build(base, base_model_name, train, valid, cfg, stats)
    }

    fn build(
        base: &BaseModel,
        base_model_name: &str,
        train: Vec<TokenizedExample>,
        valid: Vec<TokenizedExample>,
        cfg: TrainConfig,
        stats: DataStats,
    ) -> Result<Trainer, TrainError> {
        if train.is_empty() {
            return Err(TrainError::Data(format!(
                "no training example left to train on ({} dropped without loss tokens)",
                stats.dropped
            )));
        }
        let base = match base {
            BaseModel::Gguf(p) => BaseWeights::from_gguf(p)?,
            BaseModel::Safetensors(p) => BaseWeights::from_safetensors(p)?,
        };
        Self::assemble(base, base_model_name, train, valid, cfg, stats)
    }

    /// A trainer over weights already in memory (tests).
    #[cfg(test)]
    pub(crate) fn from_base(
        base: BaseWeights,
        base_model_name: &str,
        train: Vec<TokenizedExample>,
        valid: Vec<TokenizedExample>,
        cfg: TrainConfig,
    ) -> Result<Trainer, TrainError> {
        check_config(&cfg)?;
        let mut stats = DataStats::default();
        let train = fit_to_context(train, cfg.context_length, &mut stats);
        let valid = fit_to_context(valid, cfg.context_length, &mut stats);
        Self::assemble(base, base_model_name, train, valid, cfg, stats)
    }

    fn assemble(
        base: BaseWeights,
        base_model_name: &str,
        train: Vec<TokenizedExample>,
        valid: Vec<TokenizedExample>,
        cfg: TrainConfig,
        mut stats: DataStats,
    ) -> Result<Trainer, TrainError> {
        if train.is_empty() {
            return Err(TrainError::Data("no training example".into()));
        }
        if train
            .iter()
            .chain(&valid)
            .any(|e| e.tokens.len() != e.loss.len())
        {
            return Err(TrainError::Data(
                "an example's loss mask and tokens differ in length".into(),
            ));
        }
        stats.train_examples = train.len();
        stats.valid_examples = valid.len();
        stats.train_tokens = train.iter().map(|e| e.tokens.len()).sum();
        stats.train_loss_tokens = train.iter().map(|e| e.loss_tokens()).sum();
        let d = base.dims;
        if cfg.context_length > d.context {
            return Err(cfg_err(format!(
                "context_length {} exceeds the model's {}",
                cfg.context_length, d.context
            )));
        }
        if let Some(t) = train
            .iter()
            .chain(&valid)
            .flat_map(|e| &e.tokens)
            .find(|&&t| t as usize >= d.vocab)
        {
            return Err(TrainError::Data(format!(
                "token id {t} outside the vocabulary"
            )));
        }
        let vars = init_lora(&d, cfg.lora_r, cfg.seed)?;
        let sizes: Vec<usize> = vars
            .iter()
            .flatten()
            .flat_map(|(a, b)| [a.elem_count(), b.elem_count()])
            .collect();
        let steps_per_epoch = train.len().div_ceil(cfg.batch_size);
        let fingerprint = super::state::fingerprint(&cfg, &train, &valid);
        Ok(Trainer {
            base,
            vars,
            opt: AdamW::new(&sizes),
            cfg,
            base_model_name: base_model_name.to_string(),
            train,
            valid,
            stats,
            step: 0,
            steps_per_epoch,
            fingerprint,
            bufs: Mutex::default(),
        })
    }

    /// Optimizer steps of the whole run: `n_epochs * ceil(examples / batch_size)`.
    pub fn total_steps(&self) -> usize {
        self.cfg.n_epochs * self.steps_per_epoch
    }

    /// Optimizer steps done.
    pub fn step(&self) -> usize {
        self.step
    }

    /// Steps per epoch.
    pub fn steps_per_epoch(&self) -> usize {
        self.steps_per_epoch
    }

    /// What tokenisation kept, truncated and dropped.
    pub fn data_stats(&self) -> &DataStats {
        &self.stats
    }

    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// Sizes of the base model.
    pub fn dims(&self) -> Dims {
        self.base.dims
    }

    /// The example order of `epoch`: a shuffle seeded by `seed + epoch`.
    fn epoch_order(&self, epoch: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.train.len()).collect();
        Rng::new(self.cfg.seed.wrapping_add(epoch as u64)).shuffle(&mut order);
        order
    }

    pub(crate) fn lora(&self, detach: bool) -> LoraTensors {
        let t = |v: &Var| {
            if detach {
                v.as_tensor().detach()
            } else {
                v.as_tensor().clone()
            }
        };
        LoraTensors {
            ab: self
                .vars
                .iter()
                .map(|l| l.each_ref().map(|(a, b)| Some((t(a), t(b)))))
                .collect(),
            scale: self.cfg.lora_alpha / self.cfg.lora_r as f64,
        }
    }

    /// Runs one optimizer step on the next batch (with dropout), and at the
    /// end of an epoch the validation loss. Errors once all steps are done.
    pub fn train_step(&mut self) -> Result<StepReport, TrainError> {
        self.train_step_with(Self::loss_and_grads)
    }

    /// The summed loss of `tokens` and the gradients of its mean for every
    /// LoRA matrix, in `vars` order (A then B per target).
    pub(crate) fn loss_and_grads(
        &self,
        tokens: &Tokens,
        dropout: Dropout,
    ) -> Result<(f64, Vec<Vec<f32>>), TrainError> {
        let ab = self.lora_tensors();
        let step = Step {
            base: &self.base,
            adapter: Some(self.adapter_of(&ab)),
            dropout: Some(dropout),
            bufs: &self.bufs,
        };
        let n = tokens.targets.len().max(1);
        let (loss_sum, grads) = step.run(tokens, Some(1.0 / n as f32))?;
        let grads = grads.expect("the step computed gradients");
        Ok((
            loss_sum,
            grads
                .into_iter()
                .flatten()
                .flat_map(|(a, b)| [a, b])
                .collect(),
        ))
    }

    /// [`Trainer::train_step`] with the loss and gradients from `grads`.
    pub(crate) fn train_step_with(
        &mut self,
        grads: impl Fn(&Self, &Tokens, Dropout) -> Result<(f64, Vec<Vec<f32>>), TrainError>,
    ) -> Result<StepReport, TrainError> {
        let total = self.total_steps();
        if self.step >= total {
            return Err(TrainError::Finished);
        }
        let start = Instant::now();
        let (epoch, bi) = (
            self.step / self.steps_per_epoch,
            self.step % self.steps_per_epoch,
        );
        let order = self.epoch_order(epoch);
        let bs = self.cfg.batch_size;
        let picked: Vec<&TokenizedExample> = order[bi * bs..((bi + 1) * bs).min(order.len())]
            .iter()
            .map(|&i| &self.train[i])
            .collect();
        let tokens = Tokens::new(&picked);
        let lr = learning_rate(
            self.cfg.learning_rate,
            self.step + 1,
            total,
            self.cfg.warmup_ratio,
            self.cfg.schedule,
        );
        let n = tokens.targets.len();
        let dropout = Dropout {
            p: self.cfg.lora_dropout,
            seed: self.cfg.seed,
            step: self.step as u64,
        };
        let (loss_sum, mut gs) = grads(self, &tokens, dropout)?;
        let mut params = Vec::new();
        for (a, b) in self.vars.iter().flatten() {
            for v in [a, b] {
                params.push(v.as_tensor().flatten_all()?.to_vec1::<f32>()?);
            }
        }
        let grad_norm = clip_grad_norm(&mut gs, self.cfg.max_grad_norm);
        self.opt.step(&mut params, &gs, lr, self.cfg.weight_decay);
        let mut it = params.into_iter();
        for (a, b) in self.vars.iter().flatten() {
            for v in [a, b] {
                let p = it.next().expect("one vector per var");
                v.set(&Tensor::from_vec(p, v.shape(), v.device())?)?;
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        self.step += 1;
        let epoch_end = bi + 1 == self.steps_per_epoch;
        let valid_loss = if epoch_end && !self.valid.is_empty() {
            Some(self.validation_loss()?)
        } else {
            None
        };
        Ok(StepReport {
            step: self.step,
            epoch,
            train_loss: (loss_sum / n.max(1) as f64) as f32,
            learning_rate: lr,
            grad_norm: grad_norm as f32,
            tokens: n,
            real_tokens: tokens.len(),
            tokens_per_second: tokens.len() as f64 / seconds.max(1e-9),
            valid_loss,
            epoch_end,
        })
    }

    /// Mean loss per loss token over `examples` with the current adapter
    /// (no dropout), in batches of `batch_size`.
    pub fn evaluate(&self, examples: &[TokenizedExample]) -> Result<f32, TrainError> {
        let ab = self.lora_tensors();
        let step = Step {
            base: &self.base,
            adapter: Some(self.adapter_of(&ab)),
            dropout: None,
            bufs: &self.bufs,
        };
        let (mut sum, mut n) = (0f64, 0usize);
        for chunk in examples.chunks(self.cfg.batch_size) {
            let refs: Vec<&TokenizedExample> = chunk.iter().collect();
            let tokens = Tokens::new(&refs);
            if tokens.targets.is_empty() {
                continue;
            }
            sum += step.run(&tokens, None)?.0;
            n += tokens.targets.len();
        }
        Ok((sum / n.max(1) as f64) as f32)
    }

    /// The adapter's `(A, B)` tensors (shared storage with the `Var`s).
    pub(crate) fn lora_tensors(&self) -> Vec<[(Tensor, Tensor); 7]> {
        self.vars
            .iter()
            .map(|l| {
                l.each_ref()
                    .map(|(a, b)| (a.as_tensor().clone(), b.as_tensor().clone()))
            })
            .collect()
    }

    fn adapter_of<'a>(&self, ab: &'a [[(Tensor, Tensor); 7]]) -> Adapter<'a> {
        Adapter {
            ab,
            scale: (self.cfg.lora_alpha / self.cfg.lora_r as f64) as f32,
            rank: self.cfg.lora_r,
        }
    }

    /// Mean validation loss (0 when there is no validation set).
    pub fn validation_loss(&self) -> Result<f32, TrainError> {
        self.evaluate(&self.valid)
    }

    /// The trained adapter in Hugging Face / PEFT layout (for a GGUF base the
    /// q/k `B` rows are permuted back), `config.base_model` set to the name
    /// given to [`Trainer::new`], all seven targets.
    pub fn adapter(&self) -> Result<LoraAdapter, TrainError> {
        let mut layers = Vec::with_capacity(self.vars.len());
        for l in &self.vars {
            let mut m = BTreeMap::new();
            for (t, (a, b)) in LoraTarget::ALL.iter().zip(l) {
                m.insert(
                    *t,
                    LoraWeights::new(
                        a.as_tensor().detach().copy()?,
                        b.as_tensor().detach().copy()?,
                    ),
                );
            }
            layers.push(m);
        }
        let ad = LoraAdapter {
            config: LoraConfig {
                r: self.cfg.lora_r,
                alpha: self.cfg.lora_alpha,
                dropout: self.cfg.lora_dropout,
                use_rslora: false,
                targets: LoraTarget::ALL.to_vec(),
                base_model: self.base_model_name.clone(),
            },
            layers,
        };
        let d = self.base.dims;
        Ok(match self.base.layout {
            RopeLayout::Interleaved => {
                ad.permuted_for_gguf(d.heads, d.kv_heads, d.head_dim, false)?
            }
            RopeLayout::Halves => ad,
        })
    }

    /// Greedy decoding with the trained adapter (no dropout): appends up to
    /// `max_new` tokens to `prompt_ids`, stopping after a token in `stop`;
    /// returns the new tokens. Recomputes the whole sequence per token.
    pub fn generate_greedy(
        &self,
        prompt_ids: &[u32],
        max_new: usize,
        stop: &[u32],
    ) -> Result<Vec<u32>, TrainError> {
        let lora = self.lora(true);
        self.generate(Some(&lora), prompt_ids, max_new, stop)
    }

    /// [`Trainer::generate_greedy`] with another adapter in Hugging Face
    /// layout (e.g. one read back with `LoraAdapter::from_peft`; for a GGUF
    /// base its q/k `B` rows are permuted to GGUF's layout first), or with
    /// the bare base (`None`).
    pub fn generate_greedy_with(
        &self,
        adapter: Option<&LoraAdapter>,
        prompt_ids: &[u32],
        max_new: usize,
        stop: &[u32],
    ) -> Result<Vec<u32>, TrainError> {
        let lora = adapter.map(|a| self.external_lora(a)).transpose()?;
        self.generate(lora.as_ref(), prompt_ids, max_new, stop)
    }

    /// Logits `[vocab]` of the last token of `tokens` (no dropout) with an
    /// adapter in Hugging Face layout, or the bare base (`None`).
    pub fn last_logits_with(
        &self,
        adapter: Option<&LoraAdapter>,
        tokens: &[u32],
    ) -> Result<Vec<f32>, TrainError> {
        let lora = adapter.map(|a| self.external_lora(a)).transpose()?;
        self.logits_of(lora.as_ref(), tokens)
    }

    fn external_lora(&self, ad: &LoraAdapter) -> Result<LoraTensors, TrainError> {
        let d = self.base.dims;
        let info = ModelInfo {
            architecture: "llama".into(),
            vocab_size: d.vocab,
            context_length: d.context,
            num_layers: d.layers,
            hidden_size: d.hidden,
            num_heads: d.heads,
            num_kv_heads: d.kv_heads,
            head_dim: d.head_dim,
        };
        ad.check_shapes(&info, d.intermediate)?;
        let ad = match self.base.layout {
            RopeLayout::Interleaved => {
                ad.permuted_for_gguf(d.heads, d.kv_heads, d.head_dim, true)?
            }
            RopeLayout::Halves => ad.clone(),
        };
        Ok(LoraTensors {
            ab: ad
                .layers
                .iter()
                .map(|l| LoraTarget::ALL.map(|t| l.get(&t).map(|w| (w.a.clone(), w.b.clone()))))
                .collect(),
            scale: ad.config.scale(),
        })
    }

    fn logits_of(
        &self,
        lora: Option<&LoraTensors>,
        tokens: &[u32],
    ) -> Result<Vec<f32>, TrainError> {
        let d = self.base.dims;
        if tokens.is_empty()
            || tokens.len() > d.context
            || tokens.iter().any(|&t| t as usize >= d.vocab)
        {
            return Err(TrainError::Data(
                "empty sequence, too long, or a token outside the vocabulary".into(),
            ));
        }
        let fwd = Forward {
            base: &self.base,
            lora,
            dropout: None,
        };
        Ok(fwd
            .logits(&last_token_batch(tokens))?
            .squeeze(0)?
            .to_vec1::<f32>()?)
    }

    fn generate(
        &self,
        lora: Option<&LoraTensors>,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
    ) -> Result<Vec<u32>, TrainError> {
        let mut seq = prompt.to_vec();
        let mut out = Vec::new();
        while out.len() < max_new && seq.len() < self.base.dims.context {
            let logits = self.logits_of(lora, &seq)?;
            let next = argmax(&logits);
            seq.push(next);
            out.push(next);
            if stop.contains(&next) {
                break;
            }
        }
        Ok(out)
    }

    /// Logits `[vocab]` of the last token of `tokens` (no dropout), with the
    /// trained adapter or the bare base.
    pub fn last_logits(&self, tokens: &[u32], with_adapter: bool) -> Result<Vec<f32>, TrainError> {
        let lora = self.lora(true);
        self.logits_of(with_adapter.then_some(&lora), tokens)
    }
}

/// First index of the largest value.
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// One row holding `tokens`, with loss row = the last token.
fn last_token_batch(tokens: &[u32]) -> Batch {
    let n = tokens.len();
    Batch {
        rows: 1,
        len: n,
        tokens: tokens.to_vec(),
        positions: (0..n as u32).collect(),
        segments: vec![1; n],
        loss_rows: vec![n as u32 - 1],
    }
}

fn check_config(c: &TrainConfig) -> Result<(), TrainError> {
    if c.n_epochs == 0 || c.batch_size == 0 || c.lora_r == 0 {
        return Err(cfg_err("n_epochs, batch_size and lora_r must be positive"));
    }
    if c.context_length < 2 {
        return Err(cfg_err("context_length must be at least 2"));
    }
    if !(c.learning_rate > 0.0 && c.learning_rate.is_finite()) {
        return Err(cfg_err("learning_rate must be positive"));
    }
    if !(0.0..1.0).contains(&c.lora_dropout) || !(0.0..=1.0).contains(&c.warmup_ratio) {
        return Err(cfg_err(
            "lora_dropout must be in [0, 1) and warmup_ratio in [0, 1]",
        ));
    }
    if c.weight_decay < 0.0 || c.max_grad_norm < 0.0 {
        return Err(cfg_err(
            "weight_decay and max_grad_norm must not be negative",
        ));
    }
    Ok(())
}

/// LoRA `A` Kaiming-uniform with `a = sqrt(5)` (PEFT's init: uniform in
/// `±1/sqrt(in)`) from the seeded RNG, `B` zeros.
fn init_lora(d: &Dims, r: usize, seed: u64) -> Result<Vec<[(Var, Var); 7]>, TrainError> {
    let dev = candle_core::Device::Cpu;
    let (q, kv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let mut out = Vec::with_capacity(d.layers);
    for l in 0..d.layers {
        let make = |ti: usize, out_f: usize, in_f: usize| -> Result<(Var, Var), TrainError> {
            let mut rng = Rng::from_parts(&[seed, 0x10AA, l as u64, ti as u64]);
            let bound = 1.0 / (in_f as f64).sqrt();
            let a: Vec<f32> = (0..r * in_f)
                .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
                .collect();
            let a = Var::from_tensor(&Tensor::from_vec(a, (r, in_f), &dev)?)?;
            let b = Var::from_tensor(&Tensor::zeros((out_f, r), candle_core::DType::F32, &dev)?)?;
            Ok((a, b))
        };
        out.push([
            make(0, q, d.hidden)?,
            make(1, kv, d.hidden)?,
            make(2, kv, d.hidden)?,
            make(3, d.hidden, q)?,
            make(4, d.intermediate, d.hidden)?,
            make(5, d.intermediate, d.hidden)?,
            make(6, d.hidden, d.intermediate)?,
        ]);
    }
    Ok(out)
}
