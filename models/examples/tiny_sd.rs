//! Writes the tiny random-weight Stable Diffusion pipeline that the tests
//! use (diffusers layout) into a folder, and prints a catalogue entry that
//! serves it, to try `/v1/images/generations` without a real model. Its
//! images are noise-like patterns: the weights are random.
//!
//! ```sh
//! cargo run --release -p hearth-models --example tiny_sd -- /tmp/tiny-sd >> data/catalog.toml
//! cargo run --release -p hearth-server -- serve --models hearth/tiny-sd
//! ```

use std::path::PathBuf;

fn main() -> candle_core::Result<()> {
    let dir: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("tiny-sd"));
    hearth_models::diffusion::write_tiny_pipeline(&dir, 7)?;
    let dir = std::fs::canonicalize(&dir)?;
    let mut files = Vec::new();
    for sub in ["", "scheduler", "text_encoder", "tokenizer", "unet", "vae"] {
        for entry in std::fs::read_dir(dir.join(sub))? {
            let path = entry?.path();
            if path.is_file() {
                let rel = path.strip_prefix(&dir).expect("under the folder");
                files.push(format!("{{ path = \"{}\" }}", rel.display()));
            }
        }
    }
    files.sort();
    println!(
        "\n[[model]]\nid = \"hearth/tiny-sd\"\nkind = \"image\"\ncontext_length = 77\n\
         description = \"tiny random-weight Stable Diffusion (tests and trials; images are noise)\"\n\
         source = {{ type = \"local\", path = \"{}\" }}\nfiles = [{}]",
        dir.display(),
        files.join(", ")
    );
    Ok(())
}
