//! Sentences per second of the default embedding model (all-MiniLM-L6-v2)
//! on ~20-word sentences: the encoder alone at batch 1, 8, 32 and 128, and
//! 16 concurrent clients through the token-budget batcher.
//!
//! ```sh
//! cargo run --release -p hearth-engine --example embed_throughput
//! ```
//! The model is pulled into `./data/models` first if missing.

use std::path::PathBuf;
use std::time::Instant;

use hearth_engine::batcher::{BatcherConfig, EncoderHandle};
use hearth_engine::catalog::Catalog;
use hearth_engine::embed::load_sentence_encoder;
use hearth_engine::pull::{self, Progress};

const WORDS: &[&str] = &[
    "the", "quick", "river", "carried", "old", "boats", "past", "quiet", "villages", "while",
    "children", "watched", "from", "stone", "bridges", "under", "a", "pale", "autumn", "sky",
    "and", "farmers", "counted", "their", "harvest", "near", "green", "hills",
];

fn sentence(i: usize) -> String {
    (0..20)
        .map(|k| WORDS[(i * 7 + k * 3 + k * k) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> anyhow::Result<()> {
    let data = std::env::var_os("HEARTH_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("data"));
    let catalog = Catalog::built_in();
    let entry = catalog
        .get("sentence-transformers/all-MiniLM-L6-v2")
        .expect("in the catalogue");
    let dir = pull::ensure(entry, &data.join("models"), Progress::Quiet)?;
    let loaded = load_sentence_encoder(&dir, &hearth_engine::Device::Cpu)?;
    let ids: Vec<Vec<u32>> = (0..512)
        .map(|i| {
            loaded
                .tokenizer
                .encode(sentence(i), true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| anyhow::anyhow!("{e}"))
        })
        .collect::<anyhow::Result<_>>()?;
    let mean_len = ids.iter().map(Vec::len).sum::<usize>() as f64 / ids.len() as f64;
    println!(
        "threads: {}, mean tokens per sentence: {mean_len:.1}",
        rayon_threads()
    );
    for batch in [1usize, 8, 32, 128] {
        let total = if batch == 1 { 128 } else { 512 };
        let chunks: Vec<Vec<&[u32]>> = ids[..total]
            .chunks(batch)
            .map(|c| c.iter().map(Vec::as_slice).collect())
            .collect();
        loaded.encoder.embed(&chunks[0])?; // warm up
        let start = Instant::now();
        for chunk in &chunks {
            loaded.encoder.embed(chunk)?;
        }
        let secs = start.elapsed().as_secs_f64();
        println!("batch {batch:>3}: {:>7.1} sentences/s", total as f64 / secs);
    }
    let handle = EncoderHandle::start(loaded.encoder, BatcherConfig::default());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let per_client = 32;
    let start = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..16)
            .map(|c| {
                let h = handle.clone();
                let mine: Vec<Vec<u32>> = (0..per_client)
                    .map(|k| ids[(c * per_client + k) % ids.len()].clone())
                    .collect();
                tokio::spawn(async move {
                    for one in mine {
                        h.encode(vec![one]).await.expect("encode");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("client");
        }
    });
    let secs = start.elapsed().as_secs_f64();
    println!(
        "batcher, 16 concurrent clients, 1 sentence per request: {:.1} sentences/s",
        (16 * per_client) as f64 / secs
    );
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
