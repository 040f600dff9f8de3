//! `hearth-synth-gguf`: writes a random-weight GGUF shaped like Llama-3.2-1B
//! or Llama-3.1-8B, in Q4_K_M, Q3_K_M, Q2_K, Q6_K or Q8_0, with the default chat model's
//! tokenizer metadata (padded to the shape's vocabulary), so that decode and
//! prefill can be measured at those sizes without a download.
//!
//! ```sh
//! hearth-synth-gguf --shape llama-3.2-1b --quant q8_0 --out /tmp/synth-1b.Q8_0.gguf
//! ```

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use hearth_benches::synth_gguf::{write, Quant, Shape};

const DEFAULT_SOURCE: &str =
    "data/models/HuggingFaceTB--SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Parser, Debug)]
#[command(name = "hearth-synth-gguf", version, about)]
struct Args {
    /// `llama-3.2-1b` or `llama-3.1-8b`.
    #[arg(long)]
    shape: String,
    /// `q4_k_m`, `q3_k_m`, `q2_k`, `q6_k` or `q8_0`.
    #[arg(long)]
    quant: String,
    /// The GGUF to write.
    #[arg(long)]
    out: PathBuf,
    /// The GGUF whose tokenizer metadata is copied (default: the default
    /// chat model, as `hearth models pull` stores it).
    #[arg(long, default_value = DEFAULT_SOURCE)]
    tokenizer_from: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let shape = Shape::preset(&args.shape)?;
    let quant = Quant::parse(&args.quant)?;
    let start = Instant::now();
    let bytes = write(&shape, quant, &args.tokenizer_from, &args.out)?;
    println!(
        "wrote {} ({:.2} GB, {:?} {}) in {:.0} s",
        args.out.display(),
        bytes as f64 / 1e9,
        quant,
        shape.name,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
