//! Unit tests of the trainer on tiny random bases built in memory.

use candle_core::{Device, Tensor};

use super::base::{rope_tables, BaseWeights, Dims, LayerWeights};
use super::model::{build_batch, Forward, TokenizedExample};
use super::ops::{nll_sum, RopeLayout};
use super::optim::Rng;
use super::trainer::Trainer;
use crate::{TrainConfig, TrainError};

pub(crate) fn tiny_dims() -> Dims {
    Dims {
        hidden: 32,
        intermediate: 48,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        vocab: 50,
        context: 64,
    }
}

pub(crate) fn random_base(d: Dims, layout: RopeLayout, seed: u64) -> BaseWeights {
    let dev = Device::Cpu;
    let mut rng = Rng::new(seed);
    let mut randn = |shape: (usize, usize), mean: f32, std: f32| {
        let v: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| {
                // Box-Muller
                let (u1, u2) = (rng.next_f64().max(1e-12), rng.next_f64());
                mean + std * ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
            })
            .collect();
        Tensor::from_vec(v, shape, &dev).unwrap()
    };
    let (q, kv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let lin = |r: &mut dyn FnMut((usize, usize), f32, f32) -> Tensor, o: usize, i: usize| {
        r((o, i), 0.0, 1.0 / (i as f32).sqrt())
    };
    let mut layers = Vec::new();
    for _ in 0..d.layers {
        let linears = [
            lin(&mut randn, q, d.hidden),
            lin(&mut randn, kv, d.hidden),
            lin(&mut randn, kv, d.hidden),
            lin(&mut randn, d.hidden, q),
            lin(&mut randn, d.intermediate, d.hidden),
            lin(&mut randn, d.intermediate, d.hidden),
            lin(&mut randn, d.hidden, d.intermediate),
        ];
        layers.push(LayerWeights {
            attn_norm: randn((1, d.hidden), 1.0, 0.2).squeeze(0).unwrap(),
            ffn_norm: randn((1, d.hidden), 1.0, 0.2).squeeze(0).unwrap(),
            linears,
        });
    }
    let embed = randn((d.vocab, d.hidden), 0.0, 1.0);
    let lm_head = randn((d.vocab, d.hidden), 0.0, 0.3);
    let norm = randn((1, d.hidden), 1.0, 0.2).squeeze(0).unwrap();
    let freqs: Vec<f64> = (0..d.head_dim / 2)
        .map(|i| 1.0 / 10000f64.powf(2.0 * i as f64 / d.head_dim as f64))
        .collect();
    let (cos, sin) = rope_tables(&freqs, d.context, &dev).unwrap();
    BaseWeights {
        dims: d,
        eps: 1e-5,
        embed,
        layers,
        norm,
        lm_head,
        cos,
        sin,
        layout,
    }
}

/// `n` random examples of 5..20 tokens, loss on the second half.
pub(crate) fn random_examples(n: usize, vocab: usize, seed: u64) -> Vec<TokenizedExample> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let len = 5 + (rng.next_u64() % 16) as usize;
            let tokens: Vec<u32> = (0..len)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect();
            let loss = (0..len).map(|i| i >= len / 2).collect();
            TokenizedExample { tokens, loss }
        })
        .collect()
}

/// Random non-zero `B`s (a fresh adapter's are zero), so that the `A`s
/// have gradients too.
pub(crate) fn random_b(t: &Trainer) -> Result<(), TrainError> {
    let mut rng = Rng::new(3);
    for (_, b) in t.vars.iter().flatten() {
        let v: Vec<f32> = (0..b.elem_count())
            .map(|_| (rng.next_f64() as f32 - 0.5) * 0.6)
            .collect();
        b.set(&Tensor::from_vec(v, b.shape(), &Device::Cpu)?)?;
    }
    Ok(())
}

pub(crate) fn cfg() -> TrainConfig {
    TrainConfig {
        n_epochs: 2,
        batch_size: 3,
        learning_rate: 1e-2,
        warmup_ratio: 0.2,
        weight_decay: 0.01,
        max_grad_norm: 1.0,
        packing: true,
        context_length: 40,
        lora_r: 4,
        lora_alpha: 8.0,
        lora_dropout: 0.1,
        seed: 11,
        ..TrainConfig::default()
    }
}

pub(crate) fn trainer(layout: RopeLayout, c: TrainConfig) -> Result<Trainer, TrainError> {
    let d = tiny_dims();
    Trainer::from_base(
        random_base(d, layout, 5),
        "tiny",
        random_examples(10, d.vocab, 1),
        random_examples(4, d.vocab, 2),
        c,
    )
}

/// Packing puts several examples in one row; with the block-diagonal mask
/// and per-example positions the loss equals one-example-per-row padding.
#[test]
fn packing_matches_padding() -> Result<(), TrainError> {
    for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
        let mut t = trainer(layout, cfg())?;
        // A non-zero adapter, so LoRA paths count too.
        t.train_step()?;
        t.train_step()?;
        let ex = random_examples(6, tiny_dims().vocab, 9);
        let refs: Vec<&TokenizedExample> = ex.iter().collect();
        let (packed, packed_targets) = build_batch(&refs, true, 40);
        let (padded, padded_targets) = build_batch(&refs, false, 40);
        assert!(packed.rows < padded.rows, "examples share rows");
        assert_eq!(padded.rows, 6);
        let lora = t.lora(true);
        let f = Forward {
            base: &t.base,
            lora: Some(&lora),
            dropout: None,
        };
        let a = f.logits(&packed)?;
        let b = f.logits(&padded)?;
        let diff = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-4, "{layout:?}: logits differ by {diff}");
        assert_eq!(packed_targets, padded_targets);
    }
    Ok(())
}

/// The autograd gradient of LoRA A and B entries against central finite
/// differences of the loss (f32, so a loose relative tolerance).
#[test]
fn lora_gradients_match_finite_differences() -> Result<(), TrainError> {
    let mut c = cfg();
    c.lora_dropout = 0.0;
    let t = trainer(RopeLayout::Interleaved, c)?;
    random_b(&t)?;
    let ex = random_examples(3, tiny_dims().vocab, 4);
    let refs: Vec<&TokenizedExample> = ex.iter().collect();
    let (batch, batch_targets) = build_batch(&refs, true, 40);
    let targets = Tensor::new(batch_targets.as_slice(), &Device::Cpu)?;
    let loss = |t: &Trainer| -> Result<Tensor, TrainError> {
        let lora = t.lora(false);
        let f = Forward {
            base: &t.base,
            lora: Some(&lora),
            dropout: None,
        };
        Ok((nll_sum(&f.logits(&batch)?, &targets)? / batch_targets.len() as f64)?)
    };
    let grads = loss(&t)?.backward()?;
    let mut biggest = 0f32;
    let mut checked = 0;
    for (layer, target) in [(0usize, 0usize), (1, 1), (0, 3), (1, 6), (1, 4)] {
        let (a, b) = &t.vars[layer][target];
        for var in [a, b] {
            let g = grads
                .get(var.as_tensor())
                .expect("a gradient")
                .flatten_all()?;
            let g = g.to_vec1::<f32>()?;
            let orig = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            for k in 0..4 {
                let i = (k * 7919 + layer * 31 + target) % orig.len();
                let h = 1e-2f32;
                let mut p = orig.clone();
                p[i] += h;
                var.set(&Tensor::from_vec(p.clone(), var.shape(), &Device::Cpu)?)?;
                let up = loss(&t)?.to_scalar::<f32>()?;
                p[i] -= 2.0 * h;
                var.set(&Tensor::from_vec(p, var.shape(), &Device::Cpu)?)?;
                let dn = loss(&t)?.to_scalar::<f32>()?;
                var.set(&Tensor::from_vec(orig.clone(), var.shape(), &Device::Cpu)?)?;
                let fd = (up - dn) / (2.0 * h);
                assert!(
                    (fd - g[i]).abs() <= 0.05 * g[i].abs() + 2e-3,
                    "layer {layer} target {target} entry {i}: fd {fd} vs autograd {}",
                    g[i]
                );
                biggest = biggest.max(g[i].abs());
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 40);
    assert!(
        biggest > 2e-2,
        "gradients too small to be a check: {biggest}"
    );
    Ok(())
}

/// Same seed and data: bitwise the same losses; a run saved at step k and
/// restored into a fresh trainer continues with the same losses, learning
/// rates and final adapter as the uninterrupted run.
#[test]
fn deterministic_and_resumable() -> Result<(), TrainError> {
    let run = |t: &mut Trainer, n: usize| -> Result<Vec<(f32, f64, Option<f32>)>, TrainError> {
        (0..n)
            .map(|_| {
                let r = t.train_step()?;
                Ok((r.train_loss, r.learning_rate, r.valid_loss))
            })
            .collect()
    };
    let mut a = trainer(RopeLayout::Halves, cfg())?;
    let total = a.total_steps();
    assert_eq!(total, 2 * 4, "2 epochs of ceil(10 / 3) steps");
    let full = run(&mut a, total)?;
    assert!(matches!(a.train_step(), Err(TrainError::Finished)));
    // Validation at each epoch end only.
    let valid: Vec<bool> = full.iter().map(|s| s.2.is_some()).collect();
    assert_eq!(
        valid,
        [false, false, false, true, false, false, false, true]
    );
    assert!(full.last().unwrap().0 < full[0].0, "the loss goes down");

    let mut b = trainer(RopeLayout::Halves, cfg())?;
    assert_eq!(run(&mut b, total)?, full, "same seed, same losses");

    let mut c = trainer(RopeLayout::Halves, cfg())?;
    let k = 3;
    assert_eq!(run(&mut c, k)?, full[..k]);
    let state = c.save_state()?;
    drop(c);
    let mut d = trainer(RopeLayout::Halves, cfg())?;
    d.restore_state(&state)?;
    assert_eq!(d.step(), k);
    assert_eq!(run(&mut d, total - k)?, full[k..], "resumed run diverged");
    let (x, y) = (a.adapter()?, d.adapter()?);
    for (la, lb) in x.layers.iter().zip(&y.layers) {
        for (t, w) in la {
            let same = |p: &Tensor, q: &Tensor| -> Result<bool, TrainError> {
                Ok(p.flatten_all()?.to_vec1::<f32>()? == q.flatten_all()?.to_vec1::<f32>()?)
            };
            assert!(same(&w.a, &lb[t].a)? && same(&w.b, &lb[t].b)?);
        }
    }
    // Another seed gives another run; a state from another config is refused.
    let mut other = cfg();
    other.seed = 12;
    let mut e = trainer(RopeLayout::Halves, other)?;
    assert_ne!(run(&mut e, 2)?, full[..2]);
    assert!(matches!(e.restore_state(&state), Err(TrainError::State(_))));
    Ok(())
}

/// Clipping bounds the update: with max_grad_norm tiny, the first AdamW
/// step still moves by about lr (Adam normalises), but reported norms are
/// pre-clip; with clipping off the norm is the same.
#[test]
fn reports_grad_norm_and_schedule() -> Result<(), TrainError> {
    let mut c = cfg();
    c.lora_dropout = 0.0;
    let mut t = trainer(RopeLayout::Halves, c.clone())?;
    let r1 = t.train_step()?;
    assert_eq!(r1.step, 1);
    assert!(r1.grad_norm > 0.0 && r1.tokens > 0 && r1.tokens_per_second > 0.0);
    // warmup: ceil(0.2 * 8) = 2 steps
    assert!((r1.learning_rate - 0.5e-2).abs() < 1e-12);
    c.max_grad_norm = 0.0;
    let mut u = trainer(RopeLayout::Halves, c)?;
    assert_eq!(u.train_step()?.grad_norm, r1.grad_norm);
    Ok(())
}

/// The worker moves trainers across threads.
#[test]
fn trainer_is_send_and_checks_inputs() {
    fn send<T: Send>() {}
    send::<Trainer>();
    let d = tiny_dims();
    let mut bad = random_examples(2, d.vocab, 1);
    bad[0].loss.pop();
    let r = Trainer::from_base(
        random_base(d, RopeLayout::Halves, 1),
        "x",
        bad,
        vec![],
        cfg(),
    );
    assert!(matches!(r, Err(TrainError::Data(_))));
    let mut c = cfg();
    c.batch_size = 0;
    let r = Trainer::from_base(
        random_base(d, RopeLayout::Halves, 1),
        "x",
        random_examples(2, d.vocab, 1),
        vec![],
        c,
    );
    assert!(matches!(r, Err(TrainError::Config(_))));
    // Examples left without loss tokens after truncation are dropped and counted.
    let mut c = cfg();
    c.context_length = 4;
    let t = Trainer::from_base(
        random_base(d, RopeLayout::Halves, 1),
        "x",
        random_examples(5, d.vocab, 1),
        vec![],
        c,
    );
    match t {
        Ok(t) => {
            let s = t.data_stats();
            assert_eq!(s.truncated, 5);
            assert_eq!(s.dropped + s.train_examples, 5);
        }
        Err(e) => assert!(matches!(e, TrainError::Data(_)), "{e}"),
    }
}
