//! With `hearth_kernels::set_batch_invariant` (a choice made once per
//! process, hence a test binary of its own), a K-quant model gives each
//! sequence the same logits, bit for bit, whether it decodes alone or in
//! a step with five others (more rows than the kernels' decode tiles take,
//! so other tiles, and on CPUs with AVX-512 VNNI other activation scales
//! without the switch). A tiny random Llama written as GGUF with Q4_K and
//! with Q6_K matrices (rows of whole 256-value super-blocks).

mod common;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Result, Tensor};
use common::gguf::{load_gguf, write_gguf, GgufShape};
use common::seeded_uniform;
use hearth_models::{CausalLM, KvPool, PagedSeq};

const SHAPE: GgufShape = GgufShape {
    hidden: 256,
    intermediate: 512,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    context: 64,
    theta: 10000.0,
};
const VOCAB: usize = 100;
/// Prompts of different lengths, one per sequence.
const PROMPTS: [&[u32]; 6] = [
    &[3, 17, 42],
    &[23, 71, 5, 64, 1],
    &[11],
    &[9, 88, 2, 47, 60, 6, 7],
    &[50, 51],
    &[99, 0, 56, 8],
];

/// Hugging Face names and random values of the tiny model's tensors.
fn tensors() -> Result<Vec<(String, Tensor)>> {
    let (h, f, kv) = (
        SHAPE.hidden,
        SHAPE.intermediate,
        SHAPE.hidden / SHAPE.heads * SHAPE.kv_heads,
    );
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut t = |name: String, shape: &[usize], mean: f32, std: f32| -> Result<(String, Tensor)> {
        let n = shape.iter().product();
        let v = seeded_uniform(&mut state, n, mean, std);
        Ok((name, Tensor::from_vec(v, shape, &Device::Cpu)?))
    };
    let mut out = vec![
        t("model.embed_tokens.weight".into(), &[VOCAB, h], 0.0, 1.0)?,
        t("model.norm.weight".into(), &[h], 1.0, 0.2)?,
    ];
    for i in 0..SHAPE.layers {
        let p = format!("model.layers.{i}");
        let w = 1.0 / (h as f32).sqrt();
        out.push(t(format!("{p}.input_layernorm.weight"), &[h], 1.0, 0.2)?);
        out.push(t(
            format!("{p}.post_attention_layernorm.weight"),
            &[h],
            1.0,
            0.2,
        )?);
        out.push(t(format!("{p}.self_attn.q_proj.weight"), &[h, h], 0.0, w)?);
        out.push(t(format!("{p}.self_attn.k_proj.weight"), &[kv, h], 0.0, w)?);
        out.push(t(format!("{p}.self_attn.v_proj.weight"), &[kv, h], 0.0, w)?);
        out.push(t(format!("{p}.self_attn.o_proj.weight"), &[h, h], 0.0, w)?);
        out.push(t(format!("{p}.mlp.gate_proj.weight"), &[f, h], 0.0, w)?);
        out.push(t(format!("{p}.mlp.up_proj.weight"), &[f, h], 0.0, w)?);
        let wd = 1.0 / (f as f32).sqrt();
        out.push(t(format!("{p}.mlp.down_proj.weight"), &[h, f], 0.0, wd)?);
    }
    Ok(out)
}

/// Block tables: two blocks per sequence, the same in every pool.
fn table(i: usize) -> [u32; 2] {
    [2 * i as u32, 2 * i as u32 + 1]
}

/// Each sequence's prompt prefilled alone into `pool`, then one decode
/// step of the sequences `which` together; their logits as bit patterns.
fn decode_step(model: &impl CausalLM, pool: &mut KvPool, which: &[usize]) -> Result<Vec<Vec<u32>>> {
    let tables: Vec<[u32; 2]> = (0..PROMPTS.len()).map(table).collect();
    for &i in which {
        let seq = PagedSeq {
            tokens: PROMPTS[i],
            pos: 0,
            blocks: &tables[i],
            lora: None,
        };
        model.forward_paged(&[seq], pool)?;
    }
    let next: Vec<[u32; 1]> = which.iter().map(|&i| [(7 * i + 1) as u32]).collect();
    let seqs: Vec<PagedSeq> = which
        .iter()
        .zip(&next)
        .map(|(&i, tok)| PagedSeq {
            tokens: tok,
            pos: PROMPTS[i].len(),
            blocks: &tables[i],
            lora: None,
        })
        .collect();
    let logits = model.forward_paged(&seqs, pool)?;
    let rows: Vec<Vec<f32>> = logits.to_vec2()?;
    Ok(rows
        .into_iter()
        .map(|r| r.into_iter().map(f32::to_bits).collect())
        .collect())
}

#[test]
fn k_quant_logits_are_the_same_bits_alone_and_in_a_batch() -> Result<()> {
    assert!(hearth_kernels::set_batch_invariant(true));
    let tensors = tensors()?;
    for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
        let model = load_gguf(write_gguf(&tensors, &SHAPE, dtype)?)?;
        assert!(model.runs_slice_path(), "{dtype:?}: not on the kernels");
        let all: Vec<usize> = (0..PROMPTS.len()).collect();
        let mut pool = model.new_pool(2 * PROMPTS.len())?;
        let together = decode_step(&model, &mut pool, &all)?;
        for i in all {
            let mut pool = model.new_pool(2 * PROMPTS.len())?;
            let alone = decode_step(&model, &mut pool, &[i])?;
            assert_eq!(alone[0].len(), VOCAB);
            assert!(
                alone[0] == together[i],
                "{dtype:?}: sequence {i}'s logits differ alone and among six"
            );
        }
    }
    Ok(())
}
