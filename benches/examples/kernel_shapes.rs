//! The quantized products alone, on the shapes and formats of one layer of
//! a GGUF file: what the engine's prefill figure is made of, without the
//! attention, norms and activations between them.
//!
//! ```sh
//! cargo run --release -p hearth-benches --example kernel_shapes -- FILE.gguf [M [REPS]]
//! ```
//!
//! For each weight of layer 0 (`blk.0.*`, two dimensions, a format of
//! `hearth-kernels`), times `QuantMatrix::matmul` of M activation rows
//! (default 512, a `pp512` step) over REPS runs (default 10, after two
//! unmeasured ones) and prints milliseconds and G multiply-adds per
//! second (`m n k` per second; the activations' quantization included, as
//! in the engine), then the layer's total. The weights are the file's,
//! read once into memory; the activations are deterministic filler.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use candle_core::quantized::gguf_file::Content;
use hearth_kernels::QuantMatrix;
use hearth_models::kernel_format;

fn main() -> anyhow::Result<()> {
    hearth_benches::pin_rayon_threads();
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(
        args.next()
            .context("usage: kernel_shapes FILE.gguf [M [REPS]]")?,
    );
    let m: usize = args.next().map_or(Ok(512), |s| s.parse())?;
    let reps: usize = args.next().map_or(Ok(10), |s| s.parse())?;
    anyhow::ensure!(m > 0 && reps > 0, "M and REPS must be positive");
    let mut file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let content = Content::read(&mut file).context("reading the GGUF header")?;
    let mut names: Vec<&String> = content
        .tensor_infos
        .keys()
        .filter(|n| n.starts_with("blk.0.") && n.ends_with(".weight"))
        .collect();
    names.sort();
    let mut x_seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut total = (0.0, 0.0);
    for name in names {
        let info = &content.tensor_infos[name];
        let (Some(format), [n, k]) = (kernel_format(info.ggml_dtype), info.shape.dims()) else {
            continue;
        };
        let (n, k) = (*n, *k);
        let mut bytes = vec![0u8; n * k / format.block_values() * format.block_bytes()];
        file.seek(SeekFrom::Start(content.tensor_data_offset + info.offset))?;
        file.read_exact(&mut bytes)?;
        let q =
            QuantMatrix::new(format, &bytes, n, k).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        let x: Vec<f32> = (0..m * k)
            .map(|_| {
                x_seed ^= x_seed << 13;
                x_seed ^= x_seed >> 7;
                x_seed ^= x_seed << 17;
                (x_seed % 2001) as f32 / 1000.0 - 1.0
            })
            .collect();
        let mut out = vec![0f32; m * n];
        for _ in 0..2 {
            q.matmul(&x, m, &mut out);
        }
        let start = Instant::now();
        for _ in 0..reps {
            q.matmul(&x, m, &mut out);
        }
        let secs = start.elapsed().as_secs_f64() / reps as f64;
        let macs = (m * n * k) as f64;
        total = (total.0 + secs, total.1 + macs);
        println!(
            "{name:<28} {format:>5?} [{n:>6}, {k:>5}] M{m}: {:>8.2} ms {:>7.1} G multiply-adds/s",
            secs * 1e3,
            macs / secs / 1e9
        );
    }
    anyhow::ensure!(
        total.1 > 0.0,
        "no layer-0 weight in a format of the kernels"
    );
    println!(
        "layer 0 in all: {:.2} ms, {:.1} G multiply-adds/s",
        total.0 * 1e3,
        total.1 / total.0 / 1e9
    );
    Ok(())
}
