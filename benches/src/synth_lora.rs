//! Random-weight LoRA adapters for a GGUF base model, as PEFT writes them
//! (`adapter_model.safetensors` and `adapter_config.json`), and a catalogue
//! file naming them as `kind = "adapter"` entries: the `hearth-synth-lora`
//! tool, so that adapter serving can be measured over HTTP (`loadgen.py`
//! with `model` set to an adapter's id) without a fine-tuning run.
//!
//! The weights are uniform with standard deviations 0.05 (`A`) and 0.02
//! (`B`): unlike PEFT's initialisation (`B = 0`), every delta is non-zero,
//! as a trained adapter's is.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use hearth_models::{LoraAdapter, LoraConfig, LoraSpec, LoraTarget, LoraWeights};

use crate::synth_gguf::Rng;

/// `[rows, cols]` random values scaled by `scale` (standard deviation
/// `0.02 * scale`).
fn random(rng: &mut Rng, rows: usize, cols: usize, scale: f32) -> anyhow::Result<Tensor> {
    let v: Vec<f32> = (0..rows * cols).map(|_| rng.uniform() * scale).collect();
    Ok(Tensor::from_vec(v, (rows, cols), &Device::Cpu)?)
}

/// A random rank-`rank` adapter on all seven projections of every layer of
/// a model of `spec`'s shapes, in Hugging Face layout.
pub fn random_adapter(
    spec: &LoraSpec,
    rank: usize,
    alpha: f64,
    seed: u64,
    base_model: &str,
) -> anyhow::Result<LoraAdapter> {
    anyhow::ensure!(rank > 0, "the rank must be at least 1");
    let mut rng = Rng::new(seed);
    let mut layers = Vec::with_capacity(spec.info.num_layers);
    for _ in 0..spec.info.num_layers {
        let mut layer = std::collections::BTreeMap::new();
        for target in LoraTarget::ALL {
            let (n, k) = target.features(&spec.info, spec.intermediate_size);
            let a = random(&mut rng, rank, k, 2.5)?;
            let b = random(&mut rng, n, rank, 1.0)?;
            layer.insert(target, LoraWeights::new(a, b));
        }
        layers.push(layer);
    }
    let adapter = LoraAdapter {
        config: LoraConfig {
            r: rank,
            alpha,
            dropout: 0.0,
            use_rslora: false,
            targets: LoraTarget::ALL.to_vec(),
            base_model: base_model.to_string(),
        },
        layers,
    };
    adapter.check_shapes(&spec.info, spec.intermediate_size)?;
    Ok(adapter)
}

/// A catalogue file with one `kind = "adapter"` entry per `(id, folder)`
/// over the base `base`.
pub fn catalogue(entries: &[(String, PathBuf)], base: &str) -> String {
    let mut out = String::new();
    for (id, dir) in entries {
        out += &format!(
            "[[model]]\nid = {}\nkind = \"adapter\"\nbase = {}\nsource = {{ type = \"local\", path = {} }}\n\n",
            quoted(id),
            quoted(base),
            quoted(&dir.to_string_lossy())
        );
    }
    out
}

/// `s` as a TOML string.
fn quoted(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Writes `count` random adapters into `out/lora0`, `out/lora1`, ... and
/// `out/catalog.toml` naming them `{prefix}0`, `{prefix}1`, ...; returns
/// the catalogue's path.
pub fn write_all(
    spec: &LoraSpec,
    base: &str,
    count: usize,
    rank: usize,
    out: &Path,
    prefix: &str,
) -> anyhow::Result<PathBuf> {
    let out = std::path::absolute(out)?;
    let mut entries = Vec::new();
    for i in 0..count {
        let dir = out.join(format!("lora{i}"));
        random_adapter(spec, rank, 2.0 * rank as f64, i as u64 + 1, base)?.save_dir(&dir)?;
        entries.push((format!("{prefix}{i}"), dir));
    }
    let path = out.join("catalog.toml");
    std::fs::write(&path, catalogue(&entries, base))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_models::ModelInfo;

    fn tiny() -> LoraSpec {
        LoraSpec {
            info: ModelInfo {
                architecture: "llama".into(),
                vocab_size: 32,
                context_length: 64,
                num_layers: 2,
                hidden_size: 16,
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: 4,
            },
            intermediate_size: 24,
            gguf_layout: true,
            device: Device::Cpu,
        }
    }

    /// The files load back as PEFT adapters of the asked rank on every
    /// projection, fit the model (`prepare`), differ between seeds, and the
    /// catalogue parses with the entries' ids, base and folders.
    #[test]
    fn adapters_load_back_and_the_catalogue_names_them() {
        let spec = tiny();
        let dir = std::env::temp_dir().join(format!("synth-lora-{}", std::process::id()));
        let catalog = write_all(&spec, "me/base \"x\"", 2, 4, &dir, "bench/lora").unwrap();
        let a0 = LoraAdapter::load_dir(&dir.join("lora0"), 2).unwrap();
        let a1 = LoraAdapter::load_dir(&dir.join("lora1"), 2).unwrap();
        assert_eq!(a0.config.r, 4);
        assert_eq!(a0.config.targets.len(), 7);
        assert_eq!(a0.layers[1].len(), 7);
        spec.prepare(&a0).unwrap();
        let b = |a: &LoraAdapter| {
            a.layers[0][&LoraTarget::Down]
                .b
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        assert_eq!(b(&a0).len(), 16 * 4);
        assert!(b(&a0).iter().any(|&v| v != 0.0));
        assert_ne!(b(&a0), b(&a1));
        let text = std::fs::read_to_string(&catalog).unwrap();
        let parsed = hearth_engine::catalog::Catalog::parse(&text, "synth").unwrap();
        for i in 0..2 {
            let e = parsed.get(&format!("bench/lora{i}")).unwrap();
            assert_eq!(e.kind, hearth_engine::catalog::ModelKind::Adapter);
            assert_eq!(e.base.as_deref(), Some("me/base \"x\""));
            assert_eq!(e.dir(Path::new("/unused")), dir.join(format!("lora{i}")));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
