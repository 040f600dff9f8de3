//! LoRA adapters applied per sequence in `forward_paged`, on tiny random
//! models: against merged weights, mixed in one batch, and on a GGUF base.
//!
//! Tolerances: every model here keeps its KV cache in f32, so paths that
//! compute the same function agree to f32 rounding; 1e-4 on logits spread
//! over about +-10 (the tiny models' range) is a few hundred ulps.

mod common;

use std::collections::{BTreeMap, HashMap};

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::gguf::{load_gguf, write_gguf, GgufShape};
use common::{max_diff, tiny_config};
use hearth_models::{
    CausalLM, Llama, LoraAdapter, LoraConfig, LoraTarget, LoraWeights, PagedSeq, BLOCK_SIZE,
};

const TOL: f32 = 1e-4;

/// Deterministic values in [-1, 1) (xorshift), so the tests do not depend
/// on candle's unseeded CPU generator.
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn matrix(seed: u64, rows: usize, cols: usize, scale: f32) -> Result<Tensor> {
    let v: Vec<f32> = values(seed, rows * cols)
        .iter()
        .map(|x| x * scale)
        .collect();
    Tensor::from_vec(v, (rows, cols), &Device::Cpu)
}

/// A rank-4 adapter on every projection of the tiny model (hidden 64,
/// q 64, kv 32, intermediate 128), B nonzero.
fn random_adapter(seed: u64, layers: usize, ff: usize) -> Result<LoraAdapter> {
    let (h, q, kv, r) = (64, 64, 32, 4);
    let mut out = Vec::new();
    for i in 0..layers {
        let mut layer = BTreeMap::new();
        for (j, t) in LoraTarget::ALL.into_iter().enumerate() {
            let (o, inp) = t.features_of(h, q, kv, ff);
            let s = seed * 1000 + (i * 10 + j) as u64 * 2;
            layer.insert(
                t,
                LoraWeights::new(matrix(s, r, inp, 0.3)?, matrix(s + 1, o, r, 0.3)?),
            );
        }
        out.push(layer);
    }
    Ok(LoraAdapter {
        config: LoraConfig {
            r,
            alpha: 8.0,
            dropout: 0.0,
            use_rslora: false,
            targets: LoraTarget::ALL.to_vec(),
            base_model: "tiny".into(),
        },
        layers: out,
    })
}

/// The tiny model's weights and the model on them. The shapes and the
/// initialisers' scales come from candle's `VarMap`; the random values are
/// then replaced by deterministic ones of the same spread, so every run
/// checks the same model (tolerances hold run after run).
fn base_tensors() -> Result<HashMap<String, Tensor>> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    Llama::from_safetensors(&tiny_config(true), vb)?;
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    names
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let t = data[name].as_tensor();
            let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
            let mean = v.iter().sum::<f32>() / v.len() as f32;
            let spread =
                (v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / v.len() as f32).sqrt();
            if spread == 0.0 {
                // Constant initialisers (norm weights) are deterministic already.
                return Ok((name.clone(), t.copy()?));
            }
            // Uniform in [-1, 1) has standard deviation 1/sqrt(3).
            let scale = spread * 3f32.sqrt();
            let fixed: Vec<f32> = values(7000 + i as u64, v.len())
                .iter()
                .map(|x| x * scale)
                .collect();
            Ok((
                name.clone(),
                Tensor::from_vec(fixed, t.shape(), &Device::Cpu)?,
            ))
        })
        .collect()
}

fn model_from(tensors: &HashMap<String, Tensor>) -> Result<Llama> {
    let vb = VarBuilder::from_tensors(tensors.clone(), DType::F32, &Device::Cpu);
    Llama::from_safetensors(&tiny_config(true), vb)?.with_kv_dtype(DType::F32)
}

/// `W + scale * B A` for every adapted projection.
fn merged(tensors: &HashMap<String, Tensor>, a: &LoraAdapter) -> Result<HashMap<String, Tensor>> {
    let mut out = tensors.clone();
    let scale = a.config.scale();
    for (i, layer) in a.layers.iter().enumerate() {
        for (t, w) in layer {
            let name = format!("model.layers.{i}.{}.weight", t.module_path());
            let base = &out[&name];
            let m = (base + (w.b.matmul(&w.a)? * scale)?)?;
            out.insert(name, m);
        }
    }
    Ok(out)
}

/// Runs each sequence's prompt then three fixed tokens (depending on the
/// prompt), all sequences in one batch per step; every step's logits.
fn run_batch(
    model: &Llama,
    prompts: &[&[u32]],
    adapters: &[Option<&LoraAdapter>],
) -> Result<Vec<Tensor>> {
    let n = prompts.len();
    let per = 32usize.div_ceil(BLOCK_SIZE) as u32;
    let mut pool = model.new_pool(per as usize * n)?;
    let tables: Vec<Vec<u32>> = (0..n as u32)
        .map(|i| (i * per..(i + 1) * per).collect())
        .collect();
    let mut pos = vec![0usize; n];
    let mut steps = Vec::new();
    let follow: [u32; 3] = [7, 42, 3];
    let mut chunks: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    for step in 0..=follow.len() {
        let seqs: Vec<PagedSeq<'_>> = (0..n)
            .map(|i| PagedSeq {
                lora: adapters[i],
                ..PagedSeq::new(&chunks[i], pos[i], &tables[i])
            })
            .collect();
        steps.push(model.forward_paged(&seqs, &mut pool)?);
        for i in 0..n {
            pos[i] += chunks[i].len();
        }
        if step < follow.len() {
            chunks = (0..n).map(|i| vec![follow[step] + prompts[i][0]]).collect();
        }
    }
    Ok(steps)
}

/// The tiny model's tensors as GGUF bytes, matrices stored as `dtype`.
fn tiny_gguf(tensors: &HashMap<String, Tensor>, dtype: GgmlDType) -> Result<Vec<u8>> {
    let cfg = tiny_config(true);
    let list: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let shape = GgufShape {
        hidden: cfg.hidden_size,
        intermediate: cfg.intermediate_size,
        layers: cfg.num_hidden_layers,
        heads: cfg.num_attention_heads,
        kv_heads: cfg.num_kv_heads(),
        context: cfg.max_position_embeddings,
        theta: cfg.rope_theta,
    };
    write_gguf(&list, &shape, dtype)
}

fn rows(steps: &[Tensor], i: usize) -> Vec<Tensor> {
    steps.iter().map(|t| t.get(i).unwrap()).collect()
}

fn assert_close(a: &[Tensor], b: &[Tensor], what: &str) {
    for (s, (x, y)) in a.iter().zip(b).enumerate() {
        let d = max_diff(x, y);
        assert!(d < TOL, "{what}: step {s} logits differ by {d}");
    }
}

const P1: [u32; 9] = [5, 61, 2, 99, 40, 17, 0, 33, 8];
const P2: [u32; 5] = [11, 12, 13, 14, 15];
const P3: [u32; 18] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
];

#[test]
fn adapter_at_run_time_equals_merged_weights() -> Result<()> {
    let tensors = base_tensors()?;
    let base = model_from(&tensors)?;
    let x = base
        .lora_spec()
        .unwrap()
        .prepare(&random_adapter(1, 2, 128)?)?;
    let merged_model = model_from(&merged(&tensors, &x)?)?;
    let with = run_batch(&base, &[&P1], &[Some(&x)])?;
    let want = run_batch(&merged_model, &[&P1], &[None])?;
    assert_close(&with, &want, "adapter vs merged");
    // And the adapter does change the output.
    let plain = run_batch(&base, &[&P1], &[None])?;
    assert!(max_diff(&plain[0], &want[0]) > 0.1, "adapter had no effect");
    Ok(())
}

#[test]
fn mixed_batch_equals_solo_runs() -> Result<()> {
    let model = model_from(&base_tensors()?)?;
    let spec = model.lora_spec().unwrap();
    let x = spec.prepare(&random_adapter(1, 2, 128)?)?;
    let y = spec.prepare(&random_adapter(2, 2, 128)?)?;
    // X twice, not adjacent (a scattered group), Y once and the base once.
    let prompts: [&[u32]; 4] = [&P1, &P2, &P3, &P2];
    let adapters = [Some(&x), None, Some(&y), Some(&x)];
    let batch = run_batch(&model, &prompts, &adapters)?;
    for i in 0..prompts.len() {
        let solo = run_batch(&model, &prompts[i..=i], &adapters[i..=i])?;
        assert_close(&rows(&batch, i), &rows(&solo, 0), &format!("sequence {i}"));
    }
    // Same prompt P2 with X and without differ.
    assert!(max_diff(&batch[0].get(1)?, &batch[0].get(3)?) > 0.1);
    Ok(())
}

#[test]
fn hf_adapter_on_safetensors_equals_permuted_on_gguf() -> Result<()> {
    let tensors = base_tensors()?;
    let hf = model_from(&tensors)?;
    let gguf = load_gguf(tiny_gguf(&tensors, GgmlDType::F32)?)?.with_kv_dtype(DType::F32)?;
    let adapter = random_adapter(3, 2, 128)?;
    let on_hf = hf.lora_spec().unwrap().prepare(&adapter)?;
    let gspec = gguf.lora_spec().unwrap();
    assert!(gspec.gguf_layout);
    let on_gguf = gspec.prepare(&adapter)?;
    // prepare is exactly the documented permutation.
    let by_hand = adapter.permuted_for_gguf(4, 2, 16, true)?;
    let qb = |a: &LoraAdapter| a.layers[1][&LoraTarget::Q].b.clone();
    assert_eq!(max_diff(&qb(&on_gguf), &qb(&by_hand)), 0.0);
    let a = run_batch(&hf, &[&P1, &P2], &[Some(&on_hf), None])?;
    let b = run_batch(&gguf, &[&P1, &P2], &[Some(&on_gguf), None])?;
    assert_close(&rows(&a, 0), &rows(&b, 0), "hf vs gguf with adapter");
    assert_close(&rows(&a, 1), &rows(&b, 1), "hf vs gguf without");
    // Unpermuted, the GGUF model gives something else.
    let wrong = gguf.lora_spec().map(|mut s| {
        s.gguf_layout = false;
        s.prepare(&adapter).unwrap()
    });
    let c = run_batch(&gguf, &[&P1], &[wrong.as_ref()])?;
    assert!(max_diff(&a[0].get(0)?, &c[0].get(0)?) > 1e-3);
    Ok(())
}

#[test]
fn mismatched_adapter_is_refused() -> Result<()> {
    let model = model_from(&base_tensors()?)?;
    let spec = model.lora_spec().unwrap();
    let err = spec.prepare(&random_adapter(1, 2, 96)?).unwrap_err();
    assert!(err.to_string().contains("gate_proj"), "{err}");
    assert!(spec.prepare(&random_adapter(1, 3, 128)?).is_err());
    // A three-layer adapter passed straight to forward_paged is refused too.
    let three = random_adapter(1, 3, 128)?;
    let mut pool = model.new_pool(2)?;
    let seq = PagedSeq {
        lora: Some(&three),
        ..PagedSeq::new(&P2, 0, &[0])
    };
    assert!(model.forward_paged(&[seq], &mut pool).is_err());
    Ok(())
}

#[test]
fn a_merged_adapter_equals_the_adapter_at_run_time() -> Result<()> {
    let tensors = base_tensors()?;
    let base = model_from(&tensors)?;
    let x = base
        .lora_spec()
        .unwrap()
        .prepare(&random_adapter(5, 2, 128)?)?;
    let mut merged_model = model_from(&tensors)?;
    merged_model.merge_lora(&x)?;
    let with = run_batch(&base, &[&P1, &P3], &[Some(&x), Some(&x)])?;
    let want = run_batch(&merged_model, &[&P1, &P3], &[None, None])?;
    assert_close(&with, &want, "run-time adapter vs merge_lora");
    Ok(())
}

/// On a quantized GGUF base whose matrices run on the kernels: the merged
/// layers are Q8_0 kernel matrices (the slice path stays), and the logits
/// are those of the adapter at run time up to Q8_0's rounding of the sums.
#[test]
fn merging_into_a_quantized_gguf_keeps_the_kernels_and_the_adapter() -> Result<()> {
    let tensors = base_tensors()?;
    let bytes = tiny_gguf(&tensors, GgmlDType::Q4_0)?;
    let base = load_gguf(bytes.clone())?.with_kv_dtype(DType::F32)?;
    assert!(base.runs_slice_path());
    let x = base
        .lora_spec()
        .unwrap()
        .prepare(&random_adapter(6, 2, 128)?)?;
    let mut merged_model = load_gguf(bytes)?.with_kv_dtype(DType::F32)?;
    merged_model.merge_lora(&x)?;
    assert!(merged_model.runs_slice_path());
    let with = run_batch(&base, &[&P1], &[Some(&x)])?;
    let want = run_batch(&merged_model, &[&P1], &[None])?;
    let plain = run_batch(&base, &[&P1], &[None])?;
    for (s, ((a, b), p)) in with.iter().zip(&want).zip(&plain).enumerate() {
        let d = max_diff(a, b);
        let effect = max_diff(a, p);
        // Q8_0 moves each summed weight by at most half a step (max|block|
        // / 254); these random models amplify that to about 5% of the
        // adapter's effect on the logits (requantizing the base alone, with
        // a zero update, moves them by 0.5-0.7). A merge that lost or
        // misplaced the update would differ by the whole effect.
        assert!(
            d < effect / 8.0,
            "step {s}: merged differs by {d}, the adapter's effect is {effect}"
        );
    }
    Ok(())
}

/// Adapters on a CUDA GPU (`--features cuda`: the model, its KV pool and
/// the adapters' weights there, the deltas through candle's ops) against
/// the CPU's row kernels, in a batch mixing two adapters and the base.
/// Without a CUDA device it says so and passes.
#[cfg(feature = "cuda")]
#[test]
fn adapters_on_the_gpu_match_the_cpu() -> Result<()> {
    let Some(gpu) = common::cuda() else {
        return Ok(());
    };
    let tensors = base_tensors()?;
    let cpu = model_from(&tensors)?;
    let vb = VarBuilder::from_tensors(tensors.clone(), DType::F32, &gpu);
    let cuda = Llama::from_safetensors(&tiny_config(true), vb)?.with_kv_dtype(DType::F32)?;
    let (a, b) = (random_adapter(1, 2, 128)?, random_adapter(2, 2, 128)?);
    let on = |m: &Llama, x: &LoraAdapter| m.lora_spec().unwrap().prepare(x);
    let (ca, cb, ga, gb) = (on(&cpu, &a)?, on(&cpu, &b)?, on(&cuda, &a)?, on(&cuda, &b)?);
    let prompts: [&[u32]; 4] = [&P1, &P2, &P3, &P2];
    let want = run_batch(&cpu, &prompts, &[Some(&ca), None, Some(&cb), Some(&ca)])?;
    let got = run_batch(&cuda, &prompts, &[Some(&ga), None, Some(&gb), Some(&ga)])?;
    let got: Vec<Tensor> = got
        .iter()
        .map(|t| t.to_device(&Device::Cpu))
        .collect::<Result<_>>()?;
    for (s, (g, w)) in got.iter().zip(&want).enumerate() {
        // f32 throughout; the GPU's matmuls sum in other orders.
        let d = max_diff(g, w);
        assert!(d < 1e-3, "step {s}: the GPU's logits differ by {d}");
    }
    // The adapter acts on the GPU: the same prompt with and without it.
    assert!(max_diff(&got[0].get(1)?, &got[0].get(3)?) > 0.1);
    Ok(())
}

/// With q/k/v and gate/up weights joined, as a GPU loads them (on the
/// tensor path here): an adapter at run time reads its projections from
/// the joined product, and merging takes the parts apart first; both give
/// what the separate weights give.
#[test]
fn joined_projections_take_adapters_as_separate_ones_do() -> Result<()> {
    let tensors = base_tensors()?;
    let x = model_from(&tensors)?
        .lora_spec()
        .unwrap()
        .prepare(&random_adapter(7, 2, 128)?)?;
    let separate = model_from(&tensors)?.with_tensor_kv();
    let mut joined = model_from(&tensors)?.with_tensor_kv();
    joined.fuse_projections()?;
    let want = run_batch(&separate, &[&P1, &P3], &[Some(&x), None])?;
    let got = run_batch(&joined, &[&P1, &P3], &[Some(&x), None])?;
    assert_close(&got, &want, "adapter at run time, joined vs separate");
    let mut separate = separate;
    separate.merge_lora(&x)?;
    joined.merge_lora(&x)?;
    let want = run_batch(&separate, &[&P1], &[None])?;
    let got = run_batch(&joined, &[&P1], &[None])?;
    assert_close(&got, &want, "merged, joined vs separate");
    Ok(())
}
