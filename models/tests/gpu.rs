//! The model on a CUDA GPU against the same model on the CPU (`cargo test
//! --features cuda -p hearth-models --test gpu` on a machine with a GPU).
//! Without a CUDA device each test prints that it was skipped and passes.
//!
//! Tiny random-weight Llamas (hidden 256, 2 layers, 4/2 heads), loaded from
//! safetensors tensors and from GGUF bytes written here, so nothing needs to
//! be carried to the GPU machine: on the GPU the weights are candle's
//! (quantized) CUDA matmuls and the KV pool lives in GPU memory
//! (`KvPool::on_device`, attention through candle ops); on the CPU the same
//! files run on Hearth's CPU kernels and pool.

#![cfg(feature = "cuda")]

mod common;

use std::collections::HashMap;
use std::io::Cursor;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::cuda;
use common::gguf::{write_gguf, GgufShape};
use hearth_models::{CausalLM, Llama, LlamaConfig, PagedSeq, BLOCK_SIZE};

const HIDDEN: usize = 256;

/// Held by the tests that run quantized matmuls on the GPU: one of them
/// switches candle's process-wide choice of kernel (`set_force_dmmv`) for
/// a while, which would change the others' products mid-test.
static QUANTIZED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn quantized_lock() -> std::sync::MutexGuard<'static, ()> {
    QUANTIZED.lock().unwrap_or_else(|e| e.into_inner())
}

const FFN: usize = 512;
const VOCAB: usize = 100;
const CONTEXT: usize = 128;

fn config() -> LlamaConfig {
    serde_json::from_value(serde_json::json!({
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": CONTEXT,
        "vocab_size": VOCAB, "tie_word_embeddings": false,
    }))
    .expect("valid config")
}

/// The tiny model's weights by Hugging Face name (fixed seed), on the CPU.
fn weights() -> Result<Vec<(String, Tensor)>> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    vb.get_with_hints(
        (VOCAB, HIDDEN),
        "lm_head.weight",
        candle_nn::init::DEFAULT_KAIMING_NORMAL,
    )?;
    Llama::from_safetensors(&config(), vb)?;
    common::reseed(&varmap)?;
    let mut out: Vec<(String, Tensor)> = varmap
        .data()
        .lock()
        .expect("varmap lock")
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn safetensors_model(w: &[(String, Tensor)], dtype: DType, dev: &Device) -> Result<Llama> {
    let map: HashMap<String, Tensor> = w.iter().cloned().collect();
    Llama::from_safetensors(&config(), VarBuilder::from_tensors(map, dtype, dev))
}

fn gguf_model(bytes: &[u8], dev: &Device) -> Result<Llama> {
    let mut file = Cursor::new(bytes);
    let content = gguf_file::Content::read(&mut file)?;
    Llama::from_gguf(&content, &mut file, dev)
}

fn gguf_bytes(w: &[(String, Tensor)], dtype: GgmlDType) -> Result<Vec<u8>> {
    let hf: Vec<(String, Tensor)> = w
        .iter()
        .filter(|(n, _)| n != "lm_head.weight")
        .cloned()
        .collect();
    let shape = GgufShape {
        hidden: HIDDEN,
        intermediate: FFN,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        context: CONTEXT,
        theta: 10000.0,
    };
    write_gguf(&hf, &shape, dtype)
}

/// Logits of a batched prefill of three prompts and then of five decode
/// steps of all three together, through one pool per model.
fn run(model: &Llama) -> Result<Vec<Vec<f32>>> {
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5, 6, 7], &[9; 20], &[42, 17]];
    let tables: [Vec<u32>; 3] = [vec![3, 0], vec![5, 1, 6], vec![2, 4]];
    let mut pool = model.new_pool(8)?;
    let mut pos = [0usize; 3];
    let mut out = Vec::new();
    let mut next: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    for _ in 0..6 {
        let seqs: Vec<PagedSeq<'_>> = (0..3)
            .map(|i| PagedSeq::new(&next[i], pos[i], &tables[i]))
            .collect();
        let logits = model.forward_paged(&seqs, &mut pool)?;
        let rows = logits.to_device(&Device::Cpu)?.to_vec2::<f32>()?;
        for i in 0..3 {
            pos[i] += next[i].len();
        }
        // Greedy next tokens of the CPU and GPU runs may differ only where
        // two logits tie to within rounding; feed fixed tokens instead.
        next = (0..3).map(|i| vec![(pos[i] * 7 % VOCAB) as u32]).collect();
        out.extend(rows);
    }
    Ok(out)
}

fn spread(rows: &[Vec<f32>]) -> f32 {
    let (lo, hi) = rows
        .iter()
        .flatten()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    hi - lo
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// The f32 tiny model with an f32 KV cache, on the CPU and on `gpu`.
fn f32_models(gpu: &Device) -> Result<(Llama, Llama)> {
    let w = weights()?;
    let on = |dev: &Device| safetensors_model(&w, DType::F32, dev)?.with_kv_dtype(DType::F32);
    Ok((on(&Device::Cpu)?, on(gpu)?))
}

#[test]
fn f32_safetensors_model_on_the_gpu_matches_the_cpu() -> Result<()> {
    let Some(gpu) = cuda() else { return Ok(()) };
    let (cpu, gm) = f32_models(&gpu)?;
    assert!(gm.device().is_cuda());
    let (a, b) = (run(&cpu)?, run(&gm)?);
    let d = max_diff(&a, &b);
    assert!(d < 1e-3 * spread(&a), "f32: logits differ by {d}");
    Ok(())
}

#[test]
fn bf16_weights_on_the_gpu_stay_close_to_f32() -> Result<()> {
    let Some(gpu) = cuda() else { return Ok(()) };
    let w = weights()?;
    let cpu = safetensors_model(&w, DType::F32, &Device::Cpu)?;
    let gm = safetensors_model(&w, DType::BF16, &gpu)?;
    let (a, b) = (run(&cpu)?, run(&gm)?);
    let d = max_diff(&a, &b);
    assert!(d < 0.05 * spread(&a), "bf16: logits differ by {d}");
    Ok(())
}

/// Candle's CUDA quantized matmuls against Hearth's CPU kernels on the same
/// GGUF: both round activations to 8 bits, in different blocks, so the
/// limit is 5% of the logits' spread (a wrong layout is off by far more).
#[test]
fn quantized_gguf_on_the_gpu_matches_the_cpu() -> Result<()> {
    let Some(gpu) = cuda() else { return Ok(()) };
    let _quantized = quantized_lock();
    let w = weights()?;
    for dtype in [
        GgmlDType::Q8_0,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
    ] {
        let bytes = gguf_bytes(&w, dtype)?;
        let cpu = gguf_model(&bytes, &Device::Cpu)?;
        let gm = gguf_model(&bytes, &gpu)?;
        let (a, b) = (run(&cpu)?, run(&gm)?);
        let d = max_diff(&a, &b);
        assert!(d < 0.05 * spread(&a), "{dtype:?}: logits differ by {d}");
    }
    Ok(())
}

/// 64 sequences decoded together in one pool on the GPU give each
/// sequence's logits as when it runs alone.
#[test]
fn sixty_four_streams_in_one_batch_match_each_alone() -> Result<()> {
    let Some(gpu) = cuda() else { return Ok(()) };
    let _quantized = quantized_lock();
    let w = weights()?;
    let model = gguf_model(&gguf_bytes(&w, GgmlDType::Q8_0)?, &gpu)?;
    let n = 64;
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            (0..(3 + i % 13))
                .map(|j| ((i * 31 + j * 7) % VOCAB) as u32)
                .collect()
        })
        .collect();
    let blocks_each = CONTEXT / BLOCK_SIZE;
    let tables: Vec<Vec<u32>> = (0..n)
        .map(|i| ((i * blocks_each) as u32..((i + 1) * blocks_each) as u32).collect())
        .collect();
    let mut pool = model.new_pool(n * blocks_each)?;
    let seqs: Vec<PagedSeq<'_>> = (0..n)
        .map(|i| PagedSeq::new(&prompts[i], 0, &tables[i]))
        .collect();
    model.forward_paged(&seqs, &mut pool)?;
    let step: Vec<Vec<u32>> = (0..n).map(|i| vec![(i % VOCAB) as u32]).collect();
    let seqs: Vec<PagedSeq<'_>> = (0..n)
        .map(|i| PagedSeq::new(&step[i], prompts[i].len(), &tables[i]))
        .collect();
    let batched = model
        .forward_paged(&seqs, &mut pool)?
        .to_device(&Device::Cpu)?
        .to_vec2::<f32>()?;
    for i in [0, 1, 17, 63] {
        let mut cache = model.new_cache();
        model.forward(&prompts[i], &mut cache)?;
        let alone = model
            .forward(&step[i], &mut cache)?
            .to_device(&Device::Cpu)?
            .to_vec1::<f32>()?;
        let alone = [alone];
        let d = max_diff(&alone, std::slice::from_ref(&batched[i]));
        assert!(d < 1e-2 * spread(&alone), "stream {i}: differs by {d}");
    }
    Ok(())
}

/// Greedy tokens of `prompt` through the paged pool: `steps` tokens, or
/// fewer where the two best logits come within `tie` of each other (a
/// rounding difference could then pick either).
fn greedy(model: &Llama, prompt: &[u32], steps: usize, tie: f32) -> Result<Vec<u32>> {
    let table: Vec<u32> = (0..(CONTEXT / BLOCK_SIZE) as u32).collect();
    let mut pool = model.new_pool(table.len())?;
    let mut out = Vec::new();
    let mut next = prompt.to_vec();
    let mut pos = 0;
    for _ in 0..steps {
        let seqs = [PagedSeq::new(&next, pos, &table)];
        let logits = model.forward_paged(&seqs, &mut pool)?;
        let row = logits.to_device(&Device::Cpu)?.to_vec2::<f32>()?.remove(0);
        pos += next.len();
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        if row[order[0]] - row[order[1]] < tie {
            break;
        }
        out.push(order[0] as u32);
        next = vec![order[0] as u32];
    }
    Ok(out)
}

/// Greedy decoding on the GPU (its matmuls, its KV pool and the fused
/// paged-attention kernel) picks the CPU's tokens.
#[test]
fn greedy_tokens_on_the_gpu_equal_the_cpus() -> Result<()> {
    let Some(gpu) = cuda() else { return Ok(()) };
    let (cpu, gm) = f32_models(&gpu)?;
    let mut compared = 0;
    for prompt in [&[1u32, 2, 3][..], &[50, 7, 7, 7, 99, 0, 13], &[42]] {
        let want = greedy(&cpu, prompt, 40, 1e-3)?;
        let got = greedy(&gm, prompt, want.len(), 0.0)?;
        assert_eq!(got, want, "prompt {prompt:?}");
        compared += want.len();
    }
    assert!(compared >= 30, "only {compared} tokens without near ties");
    eprintln!("{compared} greedy tokens equal");
    Ok(())
}

/// One quantized matmul on the GPU (candle's CUDA kernels) against the f64
/// product of the dequantized weights, beside the error that rounding the
/// activations to 8 bits per 32 values accounts for (candle's kernels do
/// that, as Hearth's CPU kernels do: `quantized_linear.rs` holds the CPU
/// to it) and beside candle's dequantizing kernels (`set_force_dmmv`,
/// activations kept in f32). The whole table is printed first.
///
/// Measured on an H100 and an H200: Q8_0 and Q6_K, and Q4_K up to 8 rows,
/// are at the rounding's error; on raw activations, the formats with a
/// per-block minimum, Q4_1 at every row count and Q4_K from 16 rows, are
/// at 1.7 to 3 times it (`CANDLE_GAP`): the kernels take a minimum's term
/// from the raw activations' sum and the rest from the rounded values, so
/// the rounding errors no longer cancel between the two. On activations
/// rounded first (`round_q8`, what `Linear` does on those formats unless
/// `HEARTH_CUDA_ROUND_ACTIVATIONS=0`) every format is at 0.97-1.02 times
/// (H200). Held: `Linear` to 1.25 times (4 times for those formats when the
/// rounding is switched off), rounded activations to 1.25 times on every
/// format, the dequantizing kernels to 1e-5 of the exact product of the
/// activations they were given.
#[test]
fn quantized_matmul_errors_on_the_gpu_are_of_the_cpus_size() -> Result<()> {
    use candle_core::quantized::{cuda::set_force_dmmv, QStorage, QTensor};
    use candle_core::Module;
    use common::quant_error::{exact, rms_error, rounding_rms, weight, CASES, ROWS};
    use hearth_models::Linear;
    const CANDLE_GAP: f64 = 4.0;
    let Some(gpu) = cuda() else { return Ok(()) };
    let _quantized = quantized_lock();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut failures = Vec::new();
    for (dtype, n, k) in CASES {
        let (q, deq) = weight(&mut state, dtype, n, k)?;
        let storage = QStorage::from_data(q.data()?, &gpu, dtype)?;
        let linear = Linear::from_qtensor(QTensor::new(storage, (n, k))?)?;
        for rows in ROWS {
            let x = common::seeded_uniform(&mut state, rows * k, 0.0, 1.0);
            let want = exact(&x, &deq, rows, n, k);
            let theory = rounding_rms(&x, &deq, rows, n, k);
            let xt = Tensor::from_vec(x, (rows, k), &gpu)?;
            let run = |xt: &Tensor| -> Result<Vec<f32>> {
                linear
                    .forward(xt)?
                    .to_device(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()
            };
            let e = rms_error(&run(&xt)?, &want);
            // On activations already rounded as the kernels quantize them
            // (`round_q8`), a block minimum's term sums the same values as
            // the rest: every format is at the rounding's error.
            let rounded = hearth_models::round_q8(&xt)?;
            let e_rounded = rms_error(&run(&rounded)?, &want);
            // The dequantizing kernels keep their input in f32: exact to
            // the product of what they were given, the rounded activations
            // on the formats `Linear` rounds them for.
            let rounded_x = rounded
                .to_device(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            set_force_dmmv(true);
            let dequantizing = run(&xt);
            set_force_dmmv(false);
            let dequantizing = dequantizing?;
            let e_deq = rms_error(&dequantizing, &want).min(rms_error(
                &dequantizing,
                &exact(&rounded_x, &deq, rows, n, k),
            ));
            let ratio = e / theory;
            eprintln!(
                "{dtype:?} {n}x{k}, {rows} rows: RMS error {e:.2e} = {ratio:.2}x the rounding's \
                 {theory:.2e}; on rounded activations {:.2}x; dequantizing kernels {e_deq:.2e}",
                e_rounded / theory
            );
            let gap = matches!(dtype, GgmlDType::Q4_1) || dtype == GgmlDType::Q4K && rows > 8;
            let limit = if gap && !hearth_models::cuda_rounds_activations() {
                CANDLE_GAP
            } else {
                1.25
            };
            if ratio > limit || e_rounded > 1.25 * theory || e_deq > 1e-5 {
                failures.push(format!(
                    "{dtype:?} {n}x{k}, {rows} rows: {ratio:.2}x, {e_deq:.2e}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    Ok(())
}
