//! Differentiable building blocks written only from candle ops that have a
//! backward pass (candle_nn's `rms_norm`, `softmax_last_dim` and
//! `rotary_emb` kernels are custom ops without one).

use candle_core::{Result, Tensor, D};

/// Which head dimensions rotate together (see hearth-models' `rotary.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// `(2i, 2i+1)`: GGML / GGUF files (q/k rows permuted by the converter).
    Interleaved,
    /// `(i, i + d/2)`: Hugging Face safetensors.
    Halves,
}

/// `x * rsqrt(mean(x^2) + eps) * w` over the last dimension.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ms + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&inv)?.broadcast_mul(w)
}

/// Softmax over the last dimension with max subtraction (the max is
/// detached: softmax does not depend on the shift, so the gradient is exact).
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&m)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// `log_softmax` over the last dimension.
pub fn log_softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?.detach();
    let d = x.broadcast_sub(&m)?;
    d.broadcast_sub(&d.exp()?.sum_keepdim(D::Minus1)?.log()?)
}

/// Rotary embedding of `x` `[.., tokens, head_dim]` with `cos`/`sin`
/// `[.., tokens, head_dim / 2]` (broadcast over the leading dimensions).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, layout: RopeLayout) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let half = d / 2;
    match layout {
        RopeLayout::Halves => {
            let x1 = x.narrow(D::Minus1, 0, half)?;
            let x2 = x.narrow(D::Minus1, half, half)?;
            let a = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
            let b = (x1.broadcast_mul(sin)? + x2.broadcast_mul(cos)?)?;
            Tensor::cat(&[a, b], D::Minus1)
        }
        RopeLayout::Interleaved => {
            let mut pairs = x.dims().to_vec();
            pairs.pop();
            pairs.push(half);
            pairs.push(2);
            let xp = x.reshape(pairs)?;
            let x0 = xp.narrow(D::Minus1, 0, 1)?;
            let x1 = xp.narrow(D::Minus1, 1, 1)?;
            let (cos, sin) = (cos.unsqueeze(D::Minus1)?, sin.unsqueeze(D::Minus1)?);
            let a = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
            let b = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
            Tensor::cat(&[a, b], D::Minus1)?.reshape(x.dims())
        }
    }
}

/// `x * sigmoid(x)` from primitives.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    x.mul(&(x.neg()?.exp()? + 1.0)?.recip()?)
}

/// Sum over rows of `-log_softmax(logits)[row, target[row]]`; `logits`
/// `[n, vocab]`, `targets` u32 `[n]`.
pub fn nll_sum(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let lp = log_softmax_last_dim(logits)?;
    lp.gather(&targets.unsqueeze(1)?, 1)?.sum_all()?.neg()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn primitives_match_candle_kernels() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 2.0, (3, 5, 16), &dev)?;
        let w = Tensor::randn(1f32, 0.3, 16, &dev)?;
        let want = candle_nn::ops::rms_norm(&x, &w, 1e-5)?;
        assert!(max_diff(&rms_norm(&x, &w, 1e-5)?, &want) < 1e-5);

        let want = candle_nn::ops::softmax_last_dim(&x)?;
        assert!(max_diff(&softmax_last_dim(&x)?, &want) < 1e-6);
        let want = candle_nn::ops::log_softmax(&x, D::Minus1)?;
        assert!(max_diff(&log_softmax_last_dim(&x)?, &want) < 1e-5);
        assert!(max_diff(&silu(&x)?, &candle_nn::ops::silu(&x)?) < 1e-5);

        // rope: x [1, heads, tokens, d], tables [tokens, d/2]
        let x = Tensor::randn(0f32, 1.0, (1, 3, 5, 16), &dev)?;
        let ang = Tensor::randn(0f32, 3.0, (5, 8), &dev)?;
        let (cos, sin) = (ang.cos()?, ang.sin()?);
        let want_i = candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?;
        let want_h = candle_nn::rotary_emb::rope(&x, &cos, &sin)?;
        let got_i = rope(&x, &cos, &sin, RopeLayout::Interleaved)?;
        let got_h = rope(&x, &cos, &sin, RopeLayout::Halves)?;
        assert!(max_diff(&got_i, &want_i) < 1e-5);
        assert!(max_diff(&got_h, &want_h) < 1e-5);
        assert!(max_diff(&got_h, &got_i) > 1e-2, "layouts must differ");
        Ok(())
    }

    /// The primitives have working gradients (finite differences).
    #[test]
    fn primitives_have_gradients() -> Result<()> {
        let dev = Device::Cpu;
        let x0 = Tensor::randn(0f64, 1.0, (2, 6), &dev)?;
        let w = Tensor::randn(1f64, 0.3, 6, &dev)?;
        let t = Tensor::new(&[1u32, 4], &dev)?;
        let f = |x: &Tensor| -> Result<Tensor> {
            let n = rms_norm(x, &w, 1e-5)?;
            let s = softmax_last_dim(&silu(&n)?)?;
            nll_sum(&(s * 3.0)?, &t)
        };
        let xv = Var::from_tensor(&x0)?;
        let g = f(xv.as_tensor())?.backward()?;
        let g = g.get(xv.as_tensor()).unwrap().to_vec2::<f64>()?;
        let base = x0.to_vec2::<f64>()?;
        for i in 0..2 {
            for j in 0..6 {
                let h = 1e-5;
                let mut p = base.clone();
                p[i][j] += h;
                let up = f(&Tensor::new(p.clone(), &dev)?)?.to_scalar::<f64>()?;
                p[i][j] -= 2.0 * h;
                let dn = f(&Tensor::new(p, &dev)?)?.to_scalar::<f64>()?;
                let fd = (up - dn) / (2.0 * h);
                assert!((fd - g[i][j]).abs() < 1e-6, "{i},{j}: {fd} vs {}", g[i][j]);
            }
        }
        Ok(())
    }
}
