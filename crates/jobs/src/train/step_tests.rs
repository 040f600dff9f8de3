//! The hand-written step against candle's autograd through
//! [`super::model::Forward`] on tiny random bases: the loss and every LoRA
//! gradient, both RoPE layouts, with and without dropout; and the fused
//! kernels one by one against autograd of the same function.

use candle_core::{Device, Tensor, Var, D};

use super::kernels::{self, AttentionSaved, Heads, Rope};
use super::model::{build_batch, Batch, Dropout, Forward, TokenizedExample};
use super::ops::{self, nll_sum, RopeLayout};
use super::optim::Rng;
use super::step::{Adapter, Step, Tokens};
use super::tests::{cfg, random_b, random_examples, tiny_dims, trainer};
use super::trainer::Trainer;
use crate::TrainError;

/// Largest `|a - b|` over the largest `|b|` (a relative error over the
/// whole tensor).
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths");
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn vec(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Loss and gradients of the step against autograd, for `examples`.
fn check_step(
    layout: RopeLayout,
    dropout: f64,
    examples: &[TokenizedExample],
) -> Result<(), TrainError> {
    let mut c = cfg();
    c.lora_dropout = dropout;
    let t = trainer(layout, c)?;
    random_b(&t)?;
    let refs: Vec<&TokenizedExample> = examples.iter().collect();
    let dropout = Some(Dropout {
        p: dropout,
        seed: 5,
        step: 2,
    });
    // Reference: autograd over the padded batch.
    let (batch, batch_targets) = build_batch(&refs, false, 40);
    let n = batch_targets.len();
    let lora = t.lora(false);
    let f = Forward {
        base: &t.base,
        lora: Some(&lora),
        dropout,
    };
    let targets = Tensor::new(batch_targets.as_slice(), &Device::Cpu)?;
    let want_sum = nll_sum(&f.logits(&batch)?, &targets)?;
    let want = (want_sum.clone() / n as f64)?.backward()?;
    // The step.
    let ab = t.lora_tensors();
    let step = Step {
        base: &t.base,
        adapter: Some(Adapter {
            ab: &ab,
            scale: (t.cfg.lora_alpha / t.cfg.lora_r as f64) as f32,
            rank: t.cfg.lora_r,
        }),
        dropout,
        bufs: &t.bufs,
    };
    let tokens = Tokens::new(&refs);
    assert_eq!(tokens.targets, batch_targets);
    let (sum, grads) = step.run(&tokens, Some(1.0 / n as f32))?;
    let grads = grads.expect("gradients were asked for");
    let want_sum = want_sum.to_scalar::<f32>()? as f64;
    assert!(
        (sum - want_sum).abs() < 1e-4 * want_sum.abs(),
        "{layout:?}: loss {sum} vs autograd {want_sum}"
    );
    let (mut worst, mut biggest) = (0f32, 0f32);
    for (l, (vars, got)) in t.vars.iter().zip(&grads).enumerate() {
        for (target, ((a, b), (ga, gb))) in vars.iter().zip(got).enumerate() {
            for (var, g) in [(a, ga), (b, gb)] {
                let w = vec(want.get(var.as_tensor()).expect("an autograd gradient"));
                let e = rel_err(g, &w);
                assert!(
                    e < 2e-4,
                    "{layout:?} layer {l} target {target}: relative error {e}"
                );
                worst = worst.max(e);
                biggest = biggest.max(w.iter().fold(0f32, |m, x| m.max(x.abs())));
            }
        }
    }
    assert!(
        biggest > 1e-3,
        "gradients too small to be a check: {biggest}"
    );
    println!(
        "{layout:?} dropout {:?}: worst relative error {worst:e}",
        dropout.map(|d| d.p)
    );
    Ok(())
}

#[test]
fn step_matches_autograd() -> Result<(), TrainError> {
    let ex = random_examples(4, tiny_dims().vocab, 21);
    for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
        check_step(layout, 0.0, &ex)?;
    }
    Ok(())
}

/// With one example the padded and unpadded layouts are the same values,
/// so the dropout masks (drawn over the values in order) agree.
#[test]
fn step_matches_autograd_with_dropout() -> Result<(), TrainError> {
    let ex = random_examples(1, tiny_dims().vocab, 22);
    check_step(RopeLayout::Interleaved, 0.3, &ex)
}

/// Random `[rows, cols]` values in `(-1, 1)`.
fn rand(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect()
}

/// Gradient of `sum(f(x) * probe)` with respect to `x` by autograd.
fn autograd(
    x: &[f32],
    shape: (usize, usize),
    probe: &[f32],
    f: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
) -> (Vec<f32>, Vec<f32>) {
    let xv = Var::from_tensor(&Tensor::from_slice(x, shape, &Device::Cpu).unwrap()).unwrap();
    let y = f(xv.as_tensor()).unwrap();
    let p = Tensor::from_slice(probe, y.shape(), &Device::Cpu).unwrap();
    let g = (&y * &p).unwrap().sum_all().unwrap().backward().unwrap();
    (vec(&y), vec(g.get(xv.as_tensor()).unwrap()))
}

#[test]
fn rms_norm_and_swiglu_match_autograd() {
    let mut rng = Rng::new(8);
    let (n, h) = (7, 40);
    let x = rand(&mut rng, n * h);
    let w: Vec<f32> = rand(&mut rng, h).iter().map(|v| 1.0 + v * 0.3).collect();
    let probe = rand(&mut rng, n * h);
    let wt = Tensor::from_slice(&w, h, &Device::Cpu).unwrap();
    let (want_y, want_dx) = autograd(&x, (n, h), &probe, |x| ops::rms_norm(x, &wt, 1e-5));
    let mut y = vec![0f32; n * h];
    let r = kernels::rms_norm(&x, &w, 1e-5, &mut y);
    let mut dx = vec![0f32; n * h];
    kernels::rms_norm_backward(&probe, &x, &r, &w, &mut dx);
    assert!(rel_err(&y, &want_y) < 1e-5);
    assert!(rel_err(&dx, &want_dx) < 1e-4, "{}", rel_err(&dx, &want_dx));

    // silu(g) * u, gradients for both.
    let (g, u) = (rand(&mut rng, n * h), rand(&mut rng, n * h));
    let ut = Tensor::from_slice(&u, (n, h), &Device::Cpu).unwrap();
    let gt = Tensor::from_slice(&g, (n, h), &Device::Cpu).unwrap();
    let (want_h, want_dg) = autograd(&g, (n, h), &probe, |g| ops::silu(g)?.mul(&ut));
    let (_, want_du) = autograd(&u, (n, h), &probe, |u| ops::silu(&gt)?.mul(u));
    let mut got_h = vec![0f32; n * h];
    kernels::silu_mul(&g, &u, &mut got_h);
    let (mut dg, mut du) = (vec![7f32; n * h], vec![7f32; n * h]);
    kernels::silu_mul_backward(&probe, &g, &u, &mut dg, &mut du);
    assert!(rel_err(&got_h, &want_h) < 1e-5);
    assert!(rel_err(&dg, &want_dg) < 1e-4);
    assert!(rel_err(&du, &want_du) < 1e-4);
}

#[test]
fn softmax_cross_entropy_matches_autograd() {
    let mut rng = Rng::new(9);
    let (n, v) = (5, 37);
    let x: Vec<f32> = rand(&mut rng, n * v).iter().map(|x| x * 6.0).collect();
    let targets: Vec<u32> = (0..n as u32).map(|i| i * 7 % v as u32).collect();
    let tt = Tensor::new(targets.as_slice(), &Device::Cpu).unwrap();
    let ones = vec![1f32];
    let (want, want_dx) = autograd(&x, (n, v), &ones, |x| {
        nll_sum(x, &tt).map(|l| l.reshape(1).unwrap())
    });
    let mut lg = x.clone();
    let loss = kernels::softmax_nll_rows(&mut lg, &targets, Some(1.0));
    assert!((loss as f32 - want[0]).abs() < 1e-4 * want[0].abs());
    assert!(rel_err(&lg, &want_dx) < 1e-5);
    let mut lg = x.clone();
    let again = kernels::softmax_nll_rows(&mut lg, &targets, None);
    assert_eq!(again, loss);
    assert_eq!(lg, x, "without a gradient the logits are left as they were");
}

/// Attention over two examples (block-diagonal, causal) with grouped
/// heads, and RoPE's inverse, against autograd through the reference ops.
#[test]
fn attention_and_rope_match_autograd() {
    let mut rng = Rng::new(10);
    let hd = Heads {
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
    };
    let segs = [(0usize, 5usize), (5, 3)];
    let n = 8;
    let (qw, kw) = (32, 16);
    let (q, k, v) = (
        rand(&mut rng, n * qw),
        rand(&mut rng, n * kw),
        rand(&mut rng, n * kw),
    );
    let probe = rand(&mut rng, n * qw);
    // Reference: per example, per head, masked softmax from candle ops.
    let reference = |q: &Tensor, k: &Tensor, v: &Tensor| -> candle_core::Result<Tensor> {
        let mut outs = Vec::new();
        for &(s, len) in &segs {
            let mut heads = Vec::new();
            for h in 0..4 {
                let kh = h / 2;
                let qh = q.narrow(0, s, len)?.narrow(1, h * 8, 8)?;
                let kk = k.narrow(0, s, len)?.narrow(1, kh * 8, 8)?;
                let vv = v.narrow(0, s, len)?.narrow(1, kh * 8, 8)?;
                let mask: Vec<f32> = (0..len * len)
                    .map(|i| if i % len > i / len { -1e9 } else { 0.0 })
                    .collect();
                let mask = Tensor::from_vec(mask, (len, len), &Device::Cpu)?;
                let sc = ((qh.matmul(&kk.t()?)? / 8f64.sqrt())? + mask)?;
                heads.push(ops::softmax_last_dim(&sc)?.matmul(&vv)?);
            }
            outs.push(Tensor::cat(&heads, D::Minus1)?);
        }
        Tensor::cat(&outs, 0)
    };
    let (qt, kt, vt) = (
        Tensor::from_slice(&q, (n, qw), &Device::Cpu).unwrap(),
        Tensor::from_slice(&k, (n, kw), &Device::Cpu).unwrap(),
        Tensor::from_slice(&v, (n, kw), &Device::Cpu).unwrap(),
    );
    let (want_o, want_dq) = autograd(&q, (n, qw), &probe, |q| reference(q, &kt, &vt));
    let (_, want_dk) = autograd(&k, (n, kw), &probe, |k| reference(&qt, k, &vt));
    let (_, want_dv) = autograd(&v, (n, kw), &probe, |v| reference(&qt, &kt, v));
    let (mut o, mut lse) = (vec![0f32; n * qw], vec![0f32; n * 4]);
    kernels::attention(&q, &k, &v, &segs, hd, &mut o, &mut lse);
    assert!(rel_err(&o, &want_o) < 1e-5);
    let saved = AttentionSaved {
        q: &q,
        k: &k,
        v: &v,
        o: &o,
        lse: &lse,
    };
    let (mut dq, mut dk, mut dv) = (vec![0f32; n * qw], vec![0f32; n * kw], vec![0f32; n * kw]);
    kernels::attention_backward(saved, &probe, &segs, hd, (&mut dq, &mut dk, &mut dv));
    for (got, want, name) in [
        (&dq, &want_dq, "q"),
        (&dk, &want_dk, "k"),
        (&dv, &want_dv, "v"),
    ] {
        let e = rel_err(got, want);
        assert!(e < 1e-4, "d{name}: relative error {e}");
    }

    // RoPE: the forward as the reference op, the inverse undoes it.
    let positions: Vec<u32> = (0..n as u32).map(|i| i * 3 % 7).collect();
    let ang: Vec<f32> = (0..16 * 4)
        .map(|i| (i / 4) as f32 * 0.37 + (i % 4) as f32 * 0.11)
        .collect();
    let (cos, sin): (Vec<f32>, Vec<f32>) = ang.iter().map(|a| (a.cos(), a.sin())).unzip();
    for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
        let rope = Rope {
            cos: &cos,
            sin: &sin,
            head_dim: 8,
            layout,
        };
        let mut x = q.clone();
        rope.apply(&mut x, &positions, false);
        let pos = Tensor::new(positions.as_slice(), &Device::Cpu).unwrap();
        let c = Tensor::from_slice(&cos, (16, 4), &Device::Cpu)
            .unwrap()
            .index_select(&pos, 0)
            .unwrap();
        let s = Tensor::from_slice(&sin, (16, 4), &Device::Cpu)
            .unwrap()
            .index_select(&pos, 0)
            .unwrap();
        // [n, heads, d] -> [heads, n, d] for the reference's layout.
        let qh = qt
            .reshape((n, 4, 8))
            .unwrap()
            .transpose(0, 1)
            .unwrap()
            .contiguous()
            .unwrap();
        let want = ops::rope(&qh, &c, &s, layout)
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        assert!(
            rel_err(&x, &vec(&want.contiguous().unwrap())) < 1e-5,
            "{layout:?}"
        );
        rope.apply(&mut x, &positions, true);
        assert!(
            rel_err(&x, &q) < 1e-5,
            "{layout:?}: the inverse undoes the rotation"
        );
    }
}

/// The padded one-example-per-row layout of `tk` for the reference forward,
/// and its targets.
fn padded(tk: &Tokens) -> (Batch, Vec<u32>) {
    let len = tk.segs.iter().map(|s| s.1).max().unwrap_or(0);
    let rows = tk.segs.len();
    let mut b = Batch {
        rows,
        len,
        tokens: vec![0; rows * len],
        positions: vec![0; rows * len],
        segments: vec![0; rows * len],
        loss_rows: Vec::new(),
    };
    for (r, &(start, n)) in tk.segs.iter().enumerate() {
        for p in 0..n {
            b.tokens[r * len + p] = tk.ids[start + p];
            b.positions[r * len + p] = p as u32;
            b.segments[r * len + p] = r as u32 + 1;
        }
    }
    for &row in &tk.loss_rows {
        let r = tk
            .segs
            .iter()
            .position(|&(s, n)| (s..s + n).contains(&(row as usize)));
        let r = r.expect("a loss row inside an example");
        b.loss_rows
            .push((r * len + row as usize - tk.segs[r].0) as u32);
    }
    (b, tk.targets.clone())
}

/// Loss and gradients by candle autograd through the reference forward.
fn reference_grads(
    t: &Trainer,
    tk: &Tokens,
    dropout: Dropout,
) -> Result<(f64, Vec<Vec<f32>>), TrainError> {
    assert_eq!(dropout.p, 0.0, "the layouts draw different dropout masks");
    let (batch, targets) = padded(tk);
    let lora = t.lora(false);
    let f = Forward {
        base: &t.base,
        lora: Some(&lora),
        dropout: None,
    };
    let tt = Tensor::new(targets.as_slice(), &Device::Cpu)?;
    let sum = nll_sum(&f.logits(&batch)?, &tt)?;
    let grads = (sum.clone() / targets.len() as f64)?.backward()?;
    let mut out = Vec::new();
    for (a, b) in t.vars.iter().flatten() {
        for v in [a, b] {
            out.push(vec(grads.get(v.as_tensor()).expect("a gradient")));
        }
    }
    Ok((sum.to_scalar::<f32>()? as f64, out))
}

/// Training with the hand-written step and with autograd from the same
/// seed gives the same losses at every step: within 1e-4 of each other,
/// relative (f32 sums in a different order; the observed gap is ~1e-6).
#[test]
fn step_and_autograd_train_alike() -> Result<(), TrainError> {
    let mut c = cfg();
    c.lora_dropout = 0.0;
    c.n_epochs = 3;
    let mut fast = trainer(RopeLayout::Interleaved, c.clone())?;
    let mut slow = trainer(RopeLayout::Interleaved, c)?;
    let mut steps = 0;
    while fast.step() < fast.total_steps() {
        let a = fast.train_step()?;
        let b = slow.train_step_with(reference_grads)?;
        let gap = (a.train_loss - b.train_loss).abs() / b.train_loss.abs();
        assert!(
            gap < 1e-4,
            "step {}: loss {} vs {}",
            a.step,
            a.train_loss,
            b.train_loss
        );
        let gap = (a.grad_norm - b.grad_norm).abs() / b.grad_norm.abs();
        assert!(
            gap < 1e-3,
            "step {}: |g| {} vs {}",
            a.step,
            a.grad_norm,
            b.grad_norm
        );
        steps += 1;
    }
    assert!(steps >= 9, "{steps} steps");
    let (fa, sa) = (fast.lora_tensors(), slow.lora_tensors());
    for ((a1, b1), (a2, b2)) in fa.iter().flatten().zip(sa.iter().flatten()) {
        assert!(rel_err(&vec(a1), &vec(a2)) < 1e-3);
        assert!(rel_err(&vec(b1), &vec(b2)) < 1e-3);
    }
    Ok(())
}

/// Every large buffer of a step goes back to the pool, and the next steps
/// (and evaluations) take them from there: what is held settles at one
/// step's worth and stays there.
#[test]
fn steps_reuse_their_buffers() -> Result<(), TrainError> {
    let t = trainer(RopeLayout::Halves, cfg())?;
    let ex = random_examples(4, tiny_dims().vocab, 23);
    let refs: Vec<&TokenizedExample> = ex.iter().collect();
    let tokens = Tokens::new(&refs);
    let held = || t.bufs.lock().unwrap().held_bytes();
    let dropout = Dropout {
        p: 0.1,
        seed: 1,
        step: 0,
    };
    let first = t.loss_and_grads(&tokens, dropout)?;
    assert!(held() > 0, "the step's buffers were kept");
    let mut after = Vec::new();
    for _ in 0..4 {
        assert_eq!(
            t.loss_and_grads(&tokens, dropout)?,
            first,
            "reuse changes nothing"
        );
        after.push(held());
    }
    assert_eq!(after[2], after[3], "held buffers settle: {after:?}");
    // A shorter batch reuses the same buffers; an evaluation too.
    let short = Tokens::new(&refs[..2]);
    t.loss_and_grads(&short, dropout)?;
    t.evaluate(&ex)?;
    assert!(held() <= after[3], "{} > {}", held(), after[3]);
    Ok(())
}
