//! `hearth-synth-lora`: writes random-weight LoRA adapters (PEFT files) for
//! a GGUF base model and a catalogue file naming them, so that adapter
//! serving can be measured over HTTP without a fine-tuning run.
//!
//! ```sh
//! hearth-synth-lora --out /tmp/adapters        # four rank-8 adapters over the default chat model
//! hearth serve --catalog /tmp/adapters/catalog.toml \
//!     --models HuggingFaceTB/SmolLM2-135M-Instruct,bench/lora0,bench/lora1,bench/lora2,bench/lora3
//! ```

use std::path::PathBuf;

use clap::Parser;

const DEFAULT_BASE_FILE: &str =
    "data/models/HuggingFaceTB--SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Parser, Debug)]
#[command(name = "hearth-synth-lora", version, about)]
struct Args {
    /// The folder to write (`lora0`, `lora1`, ... and `catalog.toml`).
    #[arg(long)]
    out: PathBuf,
    /// The base model's GGUF, whose shapes the adapters fit (default: the
    /// default chat model, as `hearth models pull` stores it).
    #[arg(long, default_value = DEFAULT_BASE_FILE)]
    base_file: PathBuf,
    /// The base model's catalogue id.
    #[arg(long, default_value = "HuggingFaceTB/SmolLM2-135M-Instruct")]
    base: String,
    /// How many adapters.
    #[arg(long, default_value_t = 4)]
    count: usize,
    /// Their rank (`lora_alpha` is twice it).
    #[arg(long, default_value_t = 8)]
    rank: usize,
    /// The catalogue ids are this prefix and a number.
    #[arg(long, default_value = "bench/lora")]
    prefix: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut file = std::fs::File::open(&args.base_file)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.base_file.display()))?;
    let content = hearth_models::gguf_file::Content::read(&mut file)?;
    let spec = hearth_models::lora_spec_from_gguf(&content)?;
    let catalog = hearth_benches::synth_lora::write_all(
        &spec,
        &args.base,
        args.count,
        args.rank,
        &args.out,
        &args.prefix,
    )?;
    println!(
        "wrote {} rank-{} adapters over {} and {}",
        args.count,
        args.rank,
        args.base,
        catalog.display()
    );
    Ok(())
}
