//! Tiny random-weight BERT and RoBERTa: the packed (unpadded) encoder
//! against a plain candle reference that pads to the longest sequence and
//! masks; a packed batch against one sequence at a time; the cross-encoder
//! heads against the reference pooler + classifier (BERT) and dense +
//! out_proj (RoBERTa); pooling and normalisation; bad inputs.

mod common;

use std::collections::HashMap;

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::VarBuilder;
use hearth_models::{
    l2_normalize, pool, Bert, BertConfig, EncoderConfig, EncoderInput, EncoderPrecision, Pooling,
};

const H: usize = 32;
const HEADS: usize = 4;
const FF: usize = 64;
const LAYERS: usize = 2;
const VOCAB: usize = 50;
const POS: usize = 40;

/// The two layouts under test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Arch {
    Bert,
    Roberta,
}

impl Arch {
    fn prefix(self) -> &'static str {
        match self {
            Arch::Bert => "bert.",
            Arch::Roberta => "roberta.",
        }
    }

    /// Rows of the position table before the first token's (RoBERTa:
    /// `pad_token_id + 1` with pad id 1).
    fn position_offset(self) -> usize {
        match self {
            Arch::Bert => 0,
            Arch::Roberta => 2,
        }
    }

    fn type_vocab(self) -> usize {
        match self {
            Arch::Bert => 2,
            Arch::Roberta => 1,
        }
    }
}

fn encoder_config(labels: usize, arch: Arch) -> EncoderConfig {
    let id2label: serde_json::Map<String, serde_json::Value> = (0..labels)
        .map(|i| (i.to_string(), format!("L{i}").into()))
        .collect();
    let (model_type, architecture) = match arch {
        Arch::Bert => ("bert", "BertForSequenceClassification"),
        Arch::Roberta => ("xlm-roberta", "XLMRobertaForSequenceClassification"),
    };
    serde_json::from_value(serde_json::json!({
        "model_type": model_type,
        "vocab_size": VOCAB,
        "hidden_size": H,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": FF,
        "hidden_act": "gelu",
        "max_position_embeddings": POS + arch.position_offset(),
        "type_vocab_size": arch.type_vocab(),
        "layer_norm_eps": 1e-12,
        "pad_token_id": 1,
        "id2label": id2label,
        "architectures": [architecture],
    }))
    .expect("valid config")
}

fn config(labels: usize) -> BertConfig {
    match encoder_config(labels, Arch::Bert) {
        EncoderConfig::Bert(cfg) => cfg,
        other => panic!("{other:?}"),
    }
}

/// Random weights for every tensor of a `BertForSequenceClassification`,
/// the same in every run: a fixed seed, so that the comparisons' small
/// tolerances (f32 rounding of two summation orders) hold or fail for good
/// (unseeded weights made them fail about once in a hundred runs).
fn weights(labels: usize, arch: Arch) -> HashMap<String, Tensor> {
    let dev = Device::Cpu;
    let mut w = HashMap::new();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut put = |name: String, shape: &[usize], scale: f64| {
        let n: usize = shape.iter().product();
        let values = common::seeded_uniform(&mut state, n, 0.0, scale as f32);
        w.insert(name, Tensor::from_vec(values, shape, &dev).unwrap());
    };
    let b = arch.prefix();
    put(
        format!("{b}embeddings.word_embeddings.weight"),
        &[VOCAB, H],
        1.0,
    );
    put(
        format!("{b}embeddings.position_embeddings.weight"),
        &[POS + arch.position_offset(), H],
        1.0,
    );
    put(
        format!("{b}embeddings.token_type_embeddings.weight"),
        &[arch.type_vocab(), H],
        1.0,
    );
    put(format!("{b}embeddings.LayerNorm.weight"), &[H], 1.0);
    put(format!("{b}embeddings.LayerNorm.bias"), &[H], 0.1);
    for l in 0..LAYERS {
        let p = format!("{b}encoder.layer.{l}.");
        for (name, o, i) in [
            ("attention.self.query", H, H),
            ("attention.self.key", H, H),
            ("attention.self.value", H, H),
            ("attention.output.dense", H, H),
            ("intermediate.dense", FF, H),
            ("output.dense", H, FF),
        ] {
            put(format!("{p}{name}.weight"), &[o, i], 0.3);
            put(format!("{p}{name}.bias"), &[o], 0.1);
        }
        for ln in ["attention.output.LayerNorm", "output.LayerNorm"] {
            put(format!("{p}{ln}.weight"), &[H], 1.0);
            put(format!("{p}{ln}.bias"), &[H], 0.1);
        }
    }
    let (dense, out) = match arch {
        Arch::Bert => ("bert.pooler.dense", "classifier"),
        Arch::Roberta => ("classifier.dense", "classifier.out_proj"),
    };
    put(format!("{dense}.weight"), &[H, H], 0.3);
    put(format!("{dense}.bias"), &[H], 0.1);
    put(format!("{out}.weight"), &[labels, H], 0.3);
    put(format!("{out}.bias"), &[labels], 0.1);
    w
}

fn vb(w: &HashMap<String, Tensor>) -> VarBuilder<'static> {
    VarBuilder::from_tensors(w.clone(), DType::F32, &Device::Cpu)
}

/// Plain reference: pad to the longest, additive mask, separate Q/K/V.
/// Returns hidden states `[batch, longest, H]`.
fn reference(
    w: &HashMap<String, Tensor>,
    arch: Arch,
    seqs: &[Vec<u32>],
    types: Option<&[Vec<u32>]>,
) -> Result<Tensor> {
    let dev = Device::Cpu;
    let g = |n: &str| w[&format!("{}{n}", arch.prefix())].clone();
    let lin = |x: &Tensor, n: &str| -> Result<Tensor> {
        candle_nn::Linear::new(g(&format!("{n}.weight")), Some(g(&format!("{n}.bias")))).forward(x)
    };
    let ln = |x: &Tensor, n: &str| -> Result<Tensor> {
        candle_nn::LayerNorm::new(g(&format!("{n}.weight")), g(&format!("{n}.bias")), 1e-12)
            .forward(x)
    };
    let b = seqs.len();
    let l = seqs.iter().map(Vec::len).max().unwrap();
    let mut ids = vec![0u32; b * l];
    let mut tys = vec![0u32; b * l];
    let mut mask = vec![f32::NEG_INFINITY; b * l];
    for (i, s) in seqs.iter().enumerate() {
        for (j, &t) in s.iter().enumerate() {
            ids[i * l + j] = t;
            mask[i * l + j] = 0.0;
            if let Some(types) = types {
                tys[i * l + j] = types[i][j];
            }
        }
    }
    let ids = Tensor::from_vec(ids, (b, l), &dev)?;
    let tys = Tensor::from_vec(tys, (b, l), &dev)?;
    let first = arch.position_offset() as u32;
    let pos = Tensor::arange(first, first + l as u32, &dev)?;
    let emb = candle_nn::Embedding::new(g("embeddings.word_embeddings.weight"), H).forward(&ids)?;
    let pemb =
        candle_nn::Embedding::new(g("embeddings.position_embeddings.weight"), H).forward(&pos)?;
    let temb =
        candle_nn::Embedding::new(g("embeddings.token_type_embeddings.weight"), H).forward(&tys)?;
    let mut x = ln(&(emb.broadcast_add(&pemb)? + temb)?, "embeddings.LayerNorm")?;
    let mask = Tensor::from_vec(mask, (b, 1, 1, l), &dev)?;
    let hd = H / HEADS;
    for layer in 0..LAYERS {
        let p = format!("encoder.layer.{layer}.");
        let heads = |t: Tensor| -> Result<Tensor> {
            t.reshape((b, l, HEADS, hd))?.transpose(1, 2)?.contiguous()
        };
        let q = heads(lin(&x, &format!("{p}attention.self.query"))?)?;
        let k = heads(lin(&x, &format!("{p}attention.self.key"))?)?;
        let v = heads(lin(&x, &format!("{p}attention.self.value"))?)?;
        let att = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?.broadcast_add(&mask)?;
        let att = candle_nn::ops::softmax(&att, D::Minus1)?;
        let ctx = att.matmul(&v)?.transpose(1, 2)?.reshape((b, l, H))?;
        let a = lin(&ctx, &format!("{p}attention.output.dense"))?;
        x = ln(&(a + &x)?, &format!("{p}attention.output.LayerNorm"))?;
        let f = lin(&x, &format!("{p}intermediate.dense"))?.gelu_erf()?;
        let f = lin(&f, &format!("{p}output.dense"))?;
        x = ln(&(f + &x)?, &format!("{p}output.LayerNorm"))?;
    }
    Ok(x)
}

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

fn seqs() -> Vec<Vec<u32>> {
    vec![
        vec![1, 5, 9, 2],
        (0..37).map(|i| (i * 7 % VOCAB) as u32).collect(),
        vec![3],
        vec![1, 20, 30, 40, 49, 2],
    ]
}

#[test]
fn packed_batch_equals_padded_reference_and_single_runs() -> Result<()> {
    for arch in [Arch::Bert, Arch::Roberta] {
        packed_batch_equals_reference(arch)?;
    }
    Ok(())
}

fn packed_batch_equals_reference(arch: Arch) -> Result<()> {
    let w = weights(1, arch);
    let bert = encoder_config(1, arch).load_encoder(vb(&w))?;
    assert_eq!(bert.max_positions(), POS);
    let seqs = seqs();
    let inputs: Vec<EncoderInput> = seqs.iter().map(|s| EncoderInput::new(s)).collect();
    let packed = bert.forward_packed(&inputs)?;
    let reference = reference(&w, arch, &seqs, None)?;
    let mut offset = 0;
    for (i, s) in seqs.iter().enumerate() {
        let ours = packed.narrow(0, offset, s.len())?;
        offset += s.len();
        let want = reference.get(i)?.narrow(0, 0, s.len())?;
        assert!(max_diff(&ours, &want) < 1e-4, "sequence {i} vs reference");
        let alone = bert.forward_packed(&[EncoderInput::new(s)])?;
        let d = max_diff(&ours, &alone);
        assert!(d < 1e-5, "sequence {i} ({arch:?}) batched vs alone: {d}");
    }
    // Mean pooling over the unpadded rows equals the masked mean of the reference.
    let lens: Vec<usize> = seqs.iter().map(Vec::len).collect();
    let pooled = pool(&packed, &lens, Pooling::Mean)?;
    for (i, s) in seqs.iter().enumerate() {
        let want = reference.get(i)?.narrow(0, 0, s.len())?.mean(0)?;
        assert!(max_diff(&pooled.get(i)?, &want) < 1e-4);
    }
    Ok(())
}

#[test]
fn cross_encoder_matches_reference_head() -> Result<()> {
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = vec![
        (vec![1, 4, 5, 2, 7, 8, 9, 2], vec![0, 0, 0, 0, 1, 1, 1, 1]),
        (vec![1, 4, 2, 11, 2], vec![0, 0, 0, 1, 1]),
        (
            (0..30).map(|i| (i % 49 + 1) as u32).collect(),
            (0..30).map(|i| u32::from(i >= 12)).collect(),
        ),
    ];
    let inputs: Vec<EncoderInput> = pairs
        .iter()
        .map(|(ids, tys)| EncoderInput {
            ids,
            type_ids: Some(tys),
        })
        .collect();
    let seqs: Vec<Vec<u32>> = pairs.iter().map(|p| p.0.clone()).collect();
    let types: Vec<Vec<u32>> = pairs.iter().map(|p| p.1.clone()).collect();
    let lin = |w: &HashMap<String, Tensor>, n: &str| {
        candle_nn::Linear::new(
            w[&format!("{n}.weight")].clone(),
            Some(w[&format!("{n}.bias")].clone()),
        )
    };
    for (arch, labels) in [(Arch::Bert, 1), (Arch::Roberta, 3)] {
        let w = weights(labels, arch);
        let model = encoder_config(labels, arch).load_cross_encoder(vb(&w))?;
        let logits = model.forward(&inputs)?;
        assert_eq!(logits.dims(), &[3, labels]);
        // RoBERTa has one segment: its reference sees no segment ids.
        let segments = (arch == Arch::Bert).then_some(types.as_slice());
        let hidden = reference(&w, arch, &seqs, segments)?;
        let cls = hidden.narrow(1, 0, 1)?.squeeze(1)?;
        let (dense, out) = match arch {
            Arch::Bert => (lin(&w, "bert.pooler.dense"), lin(&w, "classifier")),
            Arch::Roberta => (lin(&w, "classifier.dense"), lin(&w, "classifier.out_proj")),
        };
        let want = out.forward(&dense.forward(&cls)?.tanh()?)?;
        assert!(max_diff(&logits, &want) < 1e-4, "{logits} vs {want}");
        // BERT reads segment ids (the same ids as one segment score
        // differently); RoBERTa has none to read.
        let plain = model.forward(&[EncoderInput::new(&pairs[0].0)])?;
        let diff = max_diff(&plain, &logits.narrow(0, 0, 1)?);
        match arch {
            Arch::Bert => assert!(diff > 1e-6),
            Arch::Roberta => assert!(diff < 1e-5, "{diff}"),
        }
    }
    Ok(())
}

#[test]
fn roberta_positions_start_after_the_padding_token() -> Result<()> {
    // The same weights read as BERT (positions from 0) give other vectors.
    let w = weights(1, Arch::Roberta);
    let roberta = encoder_config(1, Arch::Roberta).load_encoder(vb(&w))?;
    let seq = [0u32, 7, 9, 2];
    let ours = roberta.forward_packed(&[EncoderInput::new(&seq)])?;
    let shifted = reference(&w, Arch::Roberta, &[seq.to_vec()], None)?.get(0)?;
    assert!(max_diff(&ours, &shifted) < 1e-4);
    let mut at_zero = w.clone();
    let table = &w["roberta.embeddings.position_embeddings.weight"];
    at_zero.insert(
        "roberta.embeddings.position_embeddings.weight".into(),
        table.narrow(0, 2, POS)?.pad_with_zeros(0, 0, 2)?,
    );
    let moved = encoder_config(1, Arch::Roberta).load_encoder(vb(&at_zero))?;
    let moved = moved.forward_packed(&[EncoderInput::new(&seq)])?;
    assert!(max_diff(&ours, &moved) > 1e-3, "positions are offset by 2");
    // 40 tokens fit the 42-row table, 41 do not.
    assert!(roberta
        .forward_packed(&[EncoderInput::new(&[5; POS])])
        .is_ok());
    assert!(roberta
        .forward_packed(&[EncoderInput::new(&[5; POS + 1])])
        .is_err());
    // Unknown architectures are refused by name.
    let err = serde_json::from_value::<EncoderConfig>(serde_json::json!({
        "model_type": "distilbert", "vocab_size": 5, "hidden_size": 4,
        "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 4
    }))
    .unwrap_err();
    assert!(err.to_string().contains("distilbert"), "{err}");
    Ok(())
}

#[test]
fn pooling_modes_and_normalisation() -> Result<()> {
    let dev = Device::Cpu;
    let hidden = Tensor::new(&[[1f32, 2.], [3., 4.], [5., 6.], [10., 0.], [0., 0.]], &dev)?;
    let lens = [3, 2];
    let mean = pool(&hidden, &lens, Pooling::Mean)?.to_vec2::<f32>()?;
    assert_eq!(mean, vec![vec![3., 4.], vec![5., 0.]]);
    let cls = pool(&hidden, &lens, Pooling::Cls)?.to_vec2::<f32>()?;
    assert_eq!(cls, vec![vec![1., 2.], vec![10., 0.]]);
    let last = pool(&hidden, &lens, Pooling::LastToken)?.to_vec2::<f32>()?;
    assert_eq!(last, vec![vec![5., 6.], vec![0., 0.]]);
    let normed = l2_normalize(&Tensor::new(&[[3f32, 4.], [0., 0.]], &dev)?)?.to_vec2::<f32>()?;
    assert_eq!(normed, vec![vec![0.6, 0.8], vec![0., 0.]]);
    assert!(pool(&hidden, &[3, 0], Pooling::Mean).is_err());
    Ok(())
}

#[test]
fn bad_inputs_fail_cleanly() -> Result<()> {
    let w = weights(1, Arch::Bert);
    let bert = Bert::load(&config(1), vb(&w))?;
    assert!(bert.forward_packed(&[]).is_err());
    assert!(bert.forward_packed(&[EncoderInput::new(&[])]).is_err());
    assert!(bert
        .forward_packed(&[EncoderInput::new(&[VOCAB as u32])])
        .is_err());
    let long = vec![1u32; POS + 1];
    assert!(bert.forward_packed(&[EncoderInput::new(&long)]).is_err());
    let bad_types = EncoderInput {
        ids: &[1, 2],
        type_ids: Some(&[0, 2]),
    };
    assert!(bert.forward_packed(&[bad_types]).is_err());
    let mut cfg = config(1);
    cfg.hidden_act = "gelu_new".into();
    assert!(Bert::load(&cfg, vb(&w)).is_err());
    Ok(())
}

#[test]
fn slice_layers_match_candle_ops() -> Result<()> {
    // f32 on the CPU runs the layers on slices (`bert_cpu.rs`); the candle
    // path (GPUs, half weights) must give the same vectors.
    let w = weights(1, Arch::Bert);
    let slices = Bert::load(&config(1), vb(&w))?;
    let candle = Bert::load_candle_ops(&config(1), vb(&w))?;
    let seqs = seqs();
    let inputs: Vec<EncoderInput> = seqs.iter().map(|s| EncoderInput::new(s)).collect();
    let (a, b) = (
        slices.forward_packed(&inputs)?,
        candle.forward_packed(&inputs)?,
    );
    assert_eq!(a.dims(), b.dims());
    let d = max_diff(&a, &b);
    assert!(d < 1e-5, "{d}");
    // Pooled: with one row kept per sequence the slice path's last layer
    // computes only those rows; the vectors are the pooled full states.
    let lens: Vec<usize> = seqs.iter().map(Vec::len).collect();
    for pooling in [Pooling::Cls, Pooling::LastToken, Pooling::Mean] {
        let want = pool(&b, &lens, pooling)?;
        for model in [&slices, &candle] {
            let got = model.forward_pooled(&inputs, pooling)?;
            assert_eq!(got.dims(), &[seqs.len(), H]);
            let d = max_diff(&got, &want);
            assert!(d < 1e-5, "{pooling:?}: {d}");
        }
    }
    Ok(())
}

#[test]
fn bf16_layers_stay_close_to_f32() -> Result<()> {
    rounded_layers_stay_close_to_f32(EncoderPrecision::Bf16)
}

#[test]
fn int16_layers_stay_close_to_f32() -> Result<()> {
    rounded_layers_stay_close_to_f32(EncoderPrecision::Int16)
}

/// `Auto` is what this CPU resolves it to, on the slice layers.
#[test]
fn auto_precision_is_the_cpus() -> Result<()> {
    let w = weights(1, Arch::Bert);
    let mut model = Bert::load(&config(1), vb(&w))?;
    let here = EncoderPrecision::Auto.resolve()?;
    assert_ne!(here, EncoderPrecision::Auto);
    assert_eq!(model.set_precision(EncoderPrecision::Auto)?, here);
    assert_eq!(model.precision(), here);
    Ok(())
}

/// Dense layers with rounded inputs (`precision`: bf16 or int16) against
/// the same weights in f32; where the CPU cannot run them, asking is an
/// error.
fn rounded_layers_stay_close_to_f32(precision: EncoderPrecision) -> Result<()> {
    let w = weights(1, Arch::Bert);
    let f32_model = Bert::load(&config(1), vb(&w))?;
    assert_eq!(f32_model.precision(), EncoderPrecision::F32);
    let mut candle = Bert::load_candle_ops(&config(1), vb(&w))?;
    // The candle path (GPUs, half weights) has no such kernels: auto keeps
    // f32 there and asking for them is an error.
    assert_eq!(
        candle.set_precision(EncoderPrecision::Auto)?,
        EncoderPrecision::F32
    );
    assert!(candle.set_precision(precision).is_err());
    let mut model = Bert::load(&config(1), vb(&w))?;
    if precision.resolve().is_err() {
        assert!(model.set_precision(precision).is_err());
        eprintln!(
            "this CPU cannot run {}: those layers not run",
            precision.as_str()
        );
        return Ok(());
    }
    assert_eq!(model.set_precision(precision)?, precision);
    assert_eq!(model.precision(), precision);
    let seqs = seqs();
    let inputs: Vec<EncoderInput> = seqs.iter().map(|s| EncoderInput::new(s)).collect();
    let want = f32_model.forward_pooled(&inputs, Pooling::Mean)?;
    let got = model.forward_pooled(&inputs, Pooling::Mean)?;
    let d = max_diff(&got, &want);
    // Inputs rounded (bf16: 8 mantissa bits; int16: 13 and 12 bits of the
    // row's and column's largest): close, but not the same.
    assert!(d > 0.0 && d < 0.05, "{d}");
    let (rows, want_rows) = (got.to_vec2::<f32>()?, want.to_vec2::<f32>()?);
    for (g, w) in rows.iter().zip(&want_rows) {
        let dot: f32 = g.iter().zip(w).map(|(a, b)| a * b).sum();
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let cos = dot / (norm(g) * norm(w));
        assert!(cos > 0.9995, "cosine {cos}");
    }
    // Back to f32: the weights stay rounded, the activations are f32 again.
    assert_eq!(
        model.set_precision(EncoderPrecision::F32)?,
        EncoderPrecision::F32
    );
    let back = model.forward_pooled(&inputs, Pooling::Mean)?;
    assert!(max_diff(&back, &want) < 0.05);
    Ok(())
}

/// The encoder and the cross-encoder on a CUDA GPU (`--features cuda`;
/// candle's ops there) against the same weights on the CPU: packed hidden
/// states, pooled vectors and scores. Without a CUDA device it says so and
/// passes.
#[cfg(feature = "cuda")]
#[test]
fn encoders_on_the_gpu_match_the_cpu() -> Result<()> {
    let Some(gpu) = common::cuda() else {
        return Ok(());
    };
    let on = |w: &HashMap<String, Tensor>, dev: &Device| {
        VarBuilder::from_tensors(w.clone(), DType::F32, dev)
    };
    let seqs = seqs();
    let inputs: Vec<EncoderInput> = seqs.iter().map(|s| EncoderInput::new(s)).collect();
    for arch in [Arch::Bert, Arch::Roberta] {
        let w = weights(3, arch);
        let cpu = encoder_config(3, arch).load_encoder(vb(&w))?;
        let cuda = encoder_config(3, arch).load_encoder(on(&w, &gpu))?;
        let want = cpu.forward_packed(&inputs)?;
        let got = cuda.forward_packed(&inputs)?.to_device(&Device::Cpu)?;
        assert_eq!(got.dims(), want.dims());
        let d = max_diff(&got, &want);
        // f32 on both; the GPU's matmuls and reductions sum in other orders.
        assert!(d < 1e-3, "{arch:?} hidden states differ by {d}");
        let lens: Vec<usize> = seqs.iter().map(Vec::len).collect();
        let pooled =
            |h: &Tensor| -> Result<Tensor> { l2_normalize(&pool(h, &lens, Pooling::Mean)?) };
        let d = max_diff(&pooled(&got)?, &pooled(&want)?);
        assert!(d < 1e-4, "{arch:?} pooled vectors differ by {d}");

        let cpu = encoder_config(3, arch).load_cross_encoder(vb(&w))?;
        let cuda = encoder_config(3, arch).load_cross_encoder(on(&w, &gpu))?;
        let want = cpu.forward(&inputs)?;
        let got = cuda.forward(&inputs)?.to_device(&Device::Cpu)?;
        assert_eq!(got.dims(), &[seqs.len(), 3]);
        let d = max_diff(&got, &want);
        assert!(d < 1e-3, "{arch:?} scores differ by {d}");
    }
    Ok(())
}
