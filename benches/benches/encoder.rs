//! Criterion bench of the default embedding model
//! (sentence-transformers/all-MiniLM-L6-v2) on ~20-word sentences: Hearth's
//! packed BERT forward with mean pooling and normalisation, at batch 1, 8,
//! 32 and 128 (throughput in sentences); `mixed32`: one batch of 32
//! sentences of 4 to 60 words. `encoder/hearth` runs the dense layers as
//! the server does by default (`--encoder-precision auto`: bf16 on AMX-BF16
//! tiles or on non-Intel CPUs with AVX-512 BF16, else int16 on x86 CPUs
//! with AVX2 and FMA); where that is not f32, `encoder/hearth-f32` runs
//! them in f32 too.
//!
//! `encoder/batcher/clients16`: 16 concurrent clients, each sending 8
//! one-sentence requests through the token-budget batcher (the path of
//! `/v1/embeddings` under load); throughput in sentences.
//!
//! With `--features stock-candle` the same batches also run through stock
//! candle-transformers' `BertModel` on the same safetensors (padded to the
//! batch's longest sentence, with an attention mask, then the same pooling),
//! so the two can be compared within one run.
//!
//! ```sh
//! cargo bench -p hearth-benches --bench encoder
//! cargo bench -p hearth-benches --bench encoder --features stock-candle
//! ```
//! The model is read from `$HEARTH_DATA_DIR/models` (default: the
//! repository's `data/models`); without it the bench says so and skips.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use hearth_engine::embed::{load_sentence_encoder, LoadedEncoder, SentenceEncoder};
use hearth_engine::{BatcherConfig, Device, EncoderHandle, EncoderPrecision};
use hearth_models::{EncoderInput, Pooling};

const MODEL: &str = "models/sentence-transformers--all-MiniLM-L6-v2";
const BATCHES: [usize; 4] = [1, 8, 32, 128];

const WORDS: &[&str] = &[
    "the", "quick", "river", "carried", "old", "boats", "past", "quiet", "villages", "while",
    "children", "watched", "from", "stone", "bridges", "under", "a", "pale", "autumn", "sky",
    "and", "farmers", "counted", "their", "harvest", "near", "green", "hills",
];

fn sentence(i: usize) -> String {
    sentence_of(i, 20)
}

/// Sentence `i` with `words` words.
fn sentence_of(i: usize, words: usize) -> String {
    (0..words)
        .map(|k| WORDS[(i * 7 + k * 3 + k * k) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

fn model_dir() -> PathBuf {
    std::env::var_os("HEARTH_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data"))
        .join(MODEL)
}

fn configure(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
}

fn bench_encoder(c: &mut Criterion) {
    hearth_benches::pin_rayon_threads();
    let dir = model_dir();
    if !dir.join("model.safetensors").exists() {
        eprintln!(
            "encoder bench skipped: {} is missing (run `hearth models pull` first)",
            dir.display()
        );
        return;
    }
    let loaded = load(&dir, EncoderPrecision::Auto);
    let ids: Vec<Vec<u32>> = (0..128)
        .map(|i| {
            loaded
                .tokenizer
                .encode(sentence(i), true)
                .expect("tokenize")
                .get_ids()
                .to_vec()
        })
        .collect();

    // 32 sentences of 4 to 60 words: a batch as clients send them, where
    // padding to the longest costs the padded model the most.
    let mixed: Vec<Vec<u32>> = (0..32)
        .map(|i| {
            let text = sentence_of(i, 4 + (i * 17) % 57);
            let enc = loaded.tokenizer.encode(text, true).expect("tokenize");
            enc.get_ids().to_vec()
        })
        .collect();

    bench_batches(c, "encoder/hearth", &loaded.encoder, &ids, &mixed, true);
    let f32 = load(&dir, EncoderPrecision::F32);
    if loaded.encoder.bert.precision() != EncoderPrecision::F32 {
        bench_batches(c, "encoder/hearth-f32", &f32.encoder, &ids, &mixed, false);
    }

    bench_batcher(c, &dir, &ids);

    #[cfg(feature = "stock-candle")]
    stock::bench(c, &dir, &ids, &mixed, &loaded.encoder, &f32.encoder);
}

/// The encoder with its dense layers at `precision`.
fn load(dir: &std::path::Path, precision: EncoderPrecision) -> LoadedEncoder {
    let mut loaded = load_sentence_encoder(dir, &Device::Cpu).expect("loading the encoder");
    loaded
        .encoder
        .bert
        .set_precision(precision)
        .expect("encoder precision");
    loaded
}

/// `B1`..`B128` and `mixed32` (and with `cls`, `B32cls`) as group `name`.
fn bench_batches(
    c: &mut Criterion,
    name: &str,
    encoder: &SentenceEncoder,
    ids: &[Vec<u32>],
    mixed: &[Vec<u32>],
    cls: bool,
) {
    let mut group = c.benchmark_group(name);
    configure(&mut group);
    for b in BATCHES {
        let batch: Vec<&[u32]> = ids[..b].iter().map(Vec::as_slice).collect();
        group.throughput(Throughput::Elements(b as u64));
        group.bench_function(format!("B{b}"), |bench| {
            bench.iter(|| encoder.embed(&batch).expect("embed"))
        });
    }
    let batch: Vec<&[u32]> = mixed.iter().map(Vec::as_slice).collect();
    group.throughput(Throughput::Elements(32));
    group.bench_function("mixed32", |bench| {
        bench.iter(|| encoder.embed(&batch).expect("embed"))
    });
    // The B32 batch pooled on [CLS], as a cross-encoder or a CLS-pooled
    // model of this size runs it (the last layer keeps one row per
    // sequence).
    if cls {
        let inputs: Vec<EncoderInput> = ids[..32].iter().map(|s| EncoderInput::new(s)).collect();
        group.bench_function("B32cls", |bench| {
            bench.iter(|| {
                (encoder.bert)
                    .forward_pooled(&inputs, Pooling::Cls)
                    .expect("encode")
            })
        });
    }
    group.finish();
}

/// 16 clients x 8 single-sentence requests through the batcher.
fn bench_batcher(c: &mut Criterion, dir: &std::path::Path, ids: &[Vec<u32>]) {
    const CLIENTS: usize = 16;
    const PER_CLIENT: usize = 8;
    let encoder = load(dir, EncoderPrecision::Auto);
    let handle = EncoderHandle::start(encoder.encoder, BatcherConfig::default());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let round = || {
        runtime.block_on(async {
            let clients: Vec<_> = (0..CLIENTS)
                .map(|c| {
                    let h = handle.clone();
                    let mine: Vec<Vec<u32>> = (0..PER_CLIENT)
                        .map(|k| ids[(c * PER_CLIENT + k) % ids.len()].clone())
                        .collect();
                    tokio::spawn(async move {
                        for one in mine {
                            h.encode(vec![one]).await.expect("encode");
                        }
                    })
                })
                .collect();
            for client in clients {
                client.await.expect("client");
            }
        })
    };
    let mut group = c.benchmark_group("encoder/batcher");
    configure(&mut group);
    group.throughput(Throughput::Elements((CLIENTS * PER_CLIENT) as u64));
    group.bench_function(format!("clients{CLIENTS}"), |bench| bench.iter(round));
    group.finish();
}

#[cfg(feature = "stock-candle")]
mod stock {
    //! The same batches through candle-transformers' `BertModel`.

    use std::path::Path;

    use candle_core::{DType, Device, Tensor};
    use candle_transformers::models::bert::{BertModel, Config};
    use criterion::{Criterion, Throughput};
    use hearth_engine::embed::SentenceEncoder;

    /// Padded forward, masked mean pooling, L2 normalisation.
    fn embed(model: &BertModel, batch: &[&[u32]]) -> candle_core::Result<Tensor> {
        let len = batch.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(batch.len() * len);
        let mut mask = Vec::with_capacity(batch.len() * len);
        for s in batch {
            ids.extend_from_slice(s);
            ids.extend(std::iter::repeat_n(0u32, len - s.len()));
            mask.extend(std::iter::repeat_n(1u32, s.len()));
            mask.extend(std::iter::repeat_n(0u32, len - s.len()));
        }
        let dev = Device::Cpu;
        let ids = Tensor::from_vec(ids, (batch.len(), len), &dev)?;
        let mask = Tensor::from_vec(mask, (batch.len(), len), &dev)?;
        let types = ids.zeros_like()?;
        let hidden = model.forward(&ids, &types, Some(&mask))?;
        let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let pooled = hidden
            .broadcast_mul(&m)?
            .sum(1)?
            .broadcast_div(&m.sum(1)?)?;
        let norm = pooled.sqr()?.sum_keepdim(1)?.sqrt()?;
        pooled.broadcast_div(&norm)
    }

    pub fn bench(
        c: &mut Criterion,
        dir: &Path,
        ids: &[Vec<u32>],
        mixed: &[Vec<u32>],
        hearth: &SentenceEncoder,
        hearth_f32: &SentenceEncoder,
    ) {
        let config: Config =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("config.json"))
                .expect("BERT config");
        // SAFETY: the file is memory-mapped read-only and not modified while mapped.
        let vb = unsafe {
            candle_nn::VarBuilder::from_mmaped_safetensors(
                &[dir.join("model.safetensors")],
                DType::F32,
                &Device::Cpu,
            )
        }
        .expect("safetensors");
        let model = BertModel::load(vb, &config).expect("stock BertModel");

        // Same vectors as Hearth's, or the comparison means nothing: within
        // 1e-3 per component in f32, cosine >= 0.9999 as served (bf16).
        let batch: Vec<&[u32]> = ids[..8].iter().map(Vec::as_slice).collect();
        let theirs = embed(&model, &batch)
            .and_then(|t| t.to_vec2::<f32>())
            .expect("stock embed");
        let ours = hearth_f32.embed(&batch).expect("hearth embed");
        let diff = ours
            .iter()
            .flatten()
            .zip(theirs.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-3, "stock and Hearth vectors differ by {diff}");
        let served = hearth.embed(&batch).expect("hearth embed");
        for (a, b) in served.iter().zip(&theirs) {
            let c = hearth_engine::embed::cosine(a, b);
            assert!(c >= 0.9999, "stock and served Hearth vectors: cosine {c}");
        }

        let mut group = c.benchmark_group("encoder/stock-candle");
        super::configure(&mut group);
        for b in super::BATCHES {
            let batch: Vec<&[u32]> = ids[..b].iter().map(Vec::as_slice).collect();
            group.throughput(Throughput::Elements(b as u64));
            group.bench_function(format!("B{b}"), |bench| {
                bench.iter(|| embed(&model, &batch).expect("stock embed"))
            });
        }
        let batch: Vec<&[u32]> = mixed.iter().map(Vec::as_slice).collect();
        group.throughput(Throughput::Elements(batch.len() as u64));
        group.bench_function("mixed32", |bench| {
            bench.iter(|| embed(&model, &batch).expect("stock embed"))
        });
        group.finish();
    }
}

criterion_group!(benches, bench_encoder);
criterion_main!(benches);
