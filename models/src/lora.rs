//! LoRA adapters of Llama models in PEFT's on-disk format.
//!
//! A LoRA adapter adds `scale * B (A x)` to a frozen linear layer `W x`, with
//! `A` `[r, in]`, `B` `[out, r]` and `scale = alpha / r` (`alpha / sqrt(r)`
//! with rsLoRA). PEFT stores them as `adapter_model.safetensors` with names
//! `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` (and
//! `lora_B`), and `adapter_config.json` (`peft_type: "LORA"`, `r`,
//! `lora_alpha`, `target_modules`, ...). Such files load in PEFT and vLLM
//! unchanged.
//!
//! An [`LoraAdapter`] is always held in Hugging Face's layout. A GGUF base
//! stores its q/k projection rows permuted for GGML's adjacent-pair rotary
//! (llama.cpp's converter), so the `B` matrices of `q_proj`/`k_proj` are
//! permuted the same way ([`LoraAdapter::permuted_for_gguf`]) before they
//! are applied to, or after they were trained on, a GGUF model.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Result, Tensor};
use serde::{Deserialize, Serialize};

/// A linear layer of a Llama block that can carry a LoRA adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraTarget {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
    ];

    /// PEFT's `target_modules` name.
    pub fn peft_name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q_proj",
            LoraTarget::K => "k_proj",
            LoraTarget::V => "v_proj",
            LoraTarget::O => "o_proj",
            LoraTarget::Gate => "gate_proj",
            LoraTarget::Up => "up_proj",
            LoraTarget::Down => "down_proj",
        }
    }

    /// The module path inside a Hugging Face Llama layer.
    pub fn module_path(self) -> &'static str {
        match self {
            LoraTarget::Q => "self_attn.q_proj",
            LoraTarget::K => "self_attn.k_proj",
            LoraTarget::V => "self_attn.v_proj",
            LoraTarget::O => "self_attn.o_proj",
            LoraTarget::Gate => "mlp.gate_proj",
            LoraTarget::Up => "mlp.up_proj",
            LoraTarget::Down => "mlp.down_proj",
        }
    }

    pub fn from_peft_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.peft_name() == name)
    }

    /// The projection's `(out, in)` features in a Llama model of `info`'s
    /// shapes with feed-forward width `intermediate_size` (`A` is `[r,
    /// in]`, `B` `[out, r]`).
    pub fn features(self, info: &crate::ModelInfo, intermediate_size: usize) -> (usize, usize) {
        self.features_of(
            info.hidden_size,
            info.num_heads * info.head_dim,
            info.num_kv_heads * info.head_dim,
            intermediate_size,
        )
    }

    /// The same from the widths themselves: the hidden size, the queries'
    /// and the keys' (heads times head size) and the feed-forward width.
    pub fn features_of(self, hidden: usize, q: usize, kv: usize, ff: usize) -> (usize, usize) {
        match self {
            LoraTarget::Q => (q, hidden),
            LoraTarget::K | LoraTarget::V => (kv, hidden),
            LoraTarget::O => (hidden, q),
            LoraTarget::Gate | LoraTarget::Up => (ff, hidden),
            LoraTarget::Down => (hidden, ff),
        }
    }
}

/// The settings of an adapter (`adapter_config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub r: usize,
    pub alpha: f64,
    pub dropout: f64,
    pub use_rslora: bool,
    pub targets: Vec<LoraTarget>,
    /// `base_model_name_or_path`.
    pub base_model: String,
}

impl LoraConfig {
    /// The factor on `B (A x)`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }
}

/// `adapter_config.json` as PEFT writes it (fields PEFT needs; unknown ones
/// are ignored when reading).
#[derive(Debug, Serialize, Deserialize)]
struct PeftConfigFile {
    #[serde(default)]
    base_model_name_or_path: Option<String>,
    peft_type: String,
    #[serde(default)]
    task_type: Option<String>,
    r: usize,
    lora_alpha: f64,
    #[serde(default)]
    lora_dropout: f64,
    target_modules: TargetModules,
    #[serde(default = "bias_none")]
    bias: String,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    inference_mode: bool,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    layers_to_transform: Option<serde_json::Value>,
    #[serde(default)]
    rank_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: serde_json::Map<String, serde_json::Value>,
}

fn bias_none() -> String {
    "none".into()
}

/// PEFT writes `target_modules` as a list; a regex string is also allowed.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum TargetModules {
    List(Vec<String>),
    Pattern(String),
}

/// One adapted layer: `A` `[r, in]` and `B` `[out, r]`, f32.
#[derive(Debug, Clone)]
pub struct LoraWeights {
    pub a: Tensor,
    pub b: Tensor,
    /// `A` and `B` transposed in half precision, for the CPU row kernel;
    /// set by [`crate::LoraSpec::prepare`].
    pub rows: Option<std::sync::Arc<RowWeights>>,
}

impl LoraWeights {
    pub fn new(a: Tensor, b: Tensor) -> Self {
        Self { a, b, rows: None }
    }
}

/// An adapted layer as the CPU row kernel reads it: `A` (`[r, in]`) and `B`
/// transposed (`[r, out]`), row major, as IEEE half-precision bits. Half
/// the bytes of f32: at one token per step the kernel's time is the time
/// to read these from memory. Rounding to half precision moves each weight
/// by at most 2^-11 of itself (or 2^-25 absolute below 2^-14).
#[derive(Debug, Clone)]
pub struct RowWeights {
    /// Holds `a` and `bt` (at `a_at` and `bt_at`), alone or beside the
    /// other layers' of the same adapter ([`RowWeights::pack`]).
    arena: std::sync::Arc<Vec<u16>>,
    a_at: std::ops::Range<usize>,
    bt_at: std::ops::Range<usize>,
}

impl RowWeights {
    /// From f32 `a` `[r, in]` and `b` `[out, r]` on any device.
    pub fn new(a: &Tensor, b: &Tensor) -> candle_core::Result<Self> {
        let half = |t: &Tensor| -> candle_core::Result<Vec<u16>> {
            let v = t
                .to_device(&candle_core::Device::Cpu)?
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let mut out = vec![0u16; v.len()];
            crate::vecmath::f32_to_f16(&v, &mut out);
            Ok(out)
        };
        let mut arena = half(&a.contiguous()?)?;
        let a_at = 0..arena.len();
        arena.extend(half(&b.t()?.contiguous()?)?);
        let bt_at = a_at.end..arena.len();
        Ok(Self {
            arena: std::sync::Arc::new(arena),
            a_at,
            bt_at,
        })
    }

    /// `A`, `[r, in]`, half-precision bits.
    pub fn a(&self) -> &[u16] {
        &self.arena[self.a_at.clone()]
    }

    /// `B` transposed, `[r, out]`, half-precision bits.
    pub fn bt(&self) -> &[u16] {
        &self.arena[self.bt_at.clone()]
    }

    /// The same weights moved into one shared buffer, one after another in
    /// the order given (the order a decode step reads them). One adapter's
    /// weights are a few MB read in small runs between the base's much
    /// larger ones: in one buffer they sit on a few huge pages (the
    /// allocator marks large blocks) instead of hundreds of small blocks'
    /// 4 KiB pages, each a page walk after the base has evicted the TLB.
    pub fn pack<'a>(all: impl IntoIterator<Item = &'a mut RowWeights>) {
        let mut all: Vec<&mut RowWeights> = all.into_iter().collect();
        let total = all.iter().map(|w| w.a_at.len() + w.bt_at.len()).sum();
        let mut arena = Vec::with_capacity(total);
        let mut spans = Vec::with_capacity(all.len());
        for w in &all {
            let start = arena.len();
            arena.extend_from_slice(w.a());
            let mid = arena.len();
            arena.extend_from_slice(w.bt());
            spans.push((start..mid, mid..arena.len()));
        }
        let arena = std::sync::Arc::new(arena);
        for (w, (a_at, bt_at)) in all.iter_mut().zip(spans) {
            **w = RowWeights {
                arena: arena.clone(),
                a_at,
                bt_at,
            };
        }
    }
}

/// A LoRA adapter over every layer of a Llama model, in Hugging Face layout.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    pub config: LoraConfig,
    /// Per layer, the adapted linears.
    pub layers: Vec<BTreeMap<LoraTarget, LoraWeights>>,
}

pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";

fn tensor_name(layer: usize, target: LoraTarget, ab: &str) -> String {
    format!(
        "base_model.model.model.layers.{layer}.{}.lora_{ab}.weight",
        target.module_path()
    )
}

impl LoraAdapter {
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Total parameters of the adapter.
    pub fn num_params(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.values())
            .map(|w| w.a.elem_count() + w.b.elem_count())
            .sum()
    }

    /// PEFT's two files: the safetensors bytes and the config JSON.
    pub fn to_peft(&self) -> Result<(Vec<u8>, String)> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (t, w) in layer {
                tensors.push((
                    tensor_name(i, *t, "A"),
                    w.a.to_dtype(DType::F32)?.contiguous()?,
                ));
                tensors.push((
                    tensor_name(i, *t, "B"),
                    w.b.to_dtype(DType::F32)?.contiguous()?,
                ));
            }
        }
        let mut metadata = HashMap::new();
        metadata.insert("format".to_string(), "pt".to_string());
        let bytes =
            safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(metadata))
                .map_err(|e| candle_core::Error::Msg(format!("cannot write safetensors: {e}")))?;
        let c = &self.config;
        let file = PeftConfigFile {
            base_model_name_or_path: Some(c.base_model.clone()),
            peft_type: "LORA".into(),
            task_type: Some("CAUSAL_LM".into()),
            r: c.r,
            lora_alpha: c.alpha,
            lora_dropout: c.dropout,
            target_modules: TargetModules::List(
                c.targets
                    .iter()
                    .map(|t| t.peft_name().to_string())
                    .collect(),
            ),
            bias: "none".into(),
            fan_in_fan_out: false,
            use_rslora: c.use_rslora,
            use_dora: false,
            inference_mode: true,
            modules_to_save: None,
            layers_to_transform: None,
            rank_pattern: Default::default(),
            alpha_pattern: Default::default(),
        };
        let json = serde_json::to_string_pretty(&file)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok((bytes, json))
    }

    /// Reads PEFT's two files for a model of `num_layers` layers. Refuses
    /// what this server cannot apply (DoRA, biases, per-module ranks, saved
    /// full modules, unknown targets) with a message saying so.
    pub fn from_peft(weights: &[u8], config_json: &str, num_layers: usize) -> Result<Self> {
        let bad = |m: String| candle_core::Error::Msg(m);
        let file: PeftConfigFile = serde_json::from_str(config_json)
            .map_err(|e| bad(format!("adapter_config.json: {e}")))?;
        if file.peft_type != "LORA" {
            return Err(bad(format!("peft_type {} is not LORA", file.peft_type)));
        }
        if file.use_dora || file.bias != "none" || file.fan_in_fan_out {
            return Err(bad(
                "DoRA, LoRA biases and fan_in_fan_out adapters are not supported".into(),
            ));
        }
        if !file.rank_pattern.is_empty() || !file.alpha_pattern.is_empty() {
            return Err(bad(
                "per-module rank_pattern/alpha_pattern is not supported".into(),
            ));
        }
        if file.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(bad("adapters with modules_to_save are not supported".into()));
        }
        if file.r == 0 {
            return Err(bad("r must be positive".into()));
        }
        let tensors = candle_core::safetensors::load_buffer(weights, &Device::Cpu)?;
        let mut layers: Vec<BTreeMap<LoraTarget, LoraWeights>> = vec![BTreeMap::new(); num_layers];
        let mut targets = Vec::new();
        let mut seen = 0usize;
        for (name, _) in tensors.iter() {
            if !name.contains("lora_A") && !name.contains("lora_B") {
                return Err(bad(format!("unexpected tensor {name} in the adapter")));
            }
        }
        for (i, layer) in layers.iter_mut().enumerate() {
            for t in LoraTarget::ALL {
                let find = |ab: &str| {
                    let suffix = format!("layers.{i}.{}.lora_{ab}.weight", t.module_path());
                    tensors
                        .iter()
                        .find(|(n, _)| {
                            n.ends_with(&suffix) && n[..n.len() - suffix.len()].ends_with('.')
                        })
                        .map(|(_, v)| v.clone())
                };
                match (find("A"), find("B")) {
                    (None, None) => {}
                    (Some(a), Some(b)) => {
                        let (ra, _) = a.dims2()?;
                        let (_, rb) = b.dims2()?;
                        if ra != file.r || rb != file.r {
                            return Err(bad(format!(
                                "layer {i} {}: rank {ra}/{rb}, config says r = {}",
                                t.peft_name(),
                                file.r
                            )));
                        }
                        layer.insert(
                            t,
                            LoraWeights::new(a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?),
                        );
                        if !targets.contains(&t) {
                            targets.push(t);
                        }
                        seen += 2;
                    }
                    _ => {
                        return Err(bad(format!(
                            "layer {i} {}: lora_A and lora_B must both be present",
                            t.peft_name()
                        )))
                    }
                }
            }
        }
        if seen != tensors.len() {
            return Err(bad(format!(
                "{} adapter tensors do not belong to layers 0..{num_layers} of a Llama model",
                tensors.len() - seen
            )));
        }
        if seen == 0 {
            return Err(bad("the adapter holds no LoRA weights".into()));
        }
        targets.sort();
        Ok(Self {
            config: LoraConfig {
                r: file.r,
                alpha: file.lora_alpha,
                dropout: file.lora_dropout,
                use_rslora: file.use_rslora,
                targets,
                base_model: file.base_model_name_or_path.unwrap_or_default(),
            },
            layers,
        })
    }

    /// Writes the two PEFT files into `dir` (created if needed).
    pub fn save_dir(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let (weights, config) = self.to_peft()?;
        std::fs::write(dir.join(ADAPTER_WEIGHTS_FILE), weights)?;
        std::fs::write(dir.join(ADAPTER_CONFIG_FILE), config)?;
        Ok(())
    }

    /// Reads a PEFT adapter folder.
    pub fn load_dir(dir: &Path, num_layers: usize) -> Result<Self> {
        let weights = std::fs::read(dir.join(ADAPTER_WEIGHTS_FILE))?;
        let config = std::fs::read_to_string(dir.join(ADAPTER_CONFIG_FILE))?;
        Self::from_peft(&weights, &config, num_layers)
    }

    /// Checks every matrix against a model's shapes: `A` `[r, in]`, `B`
    /// `[out, r]` for the projection it adapts.
    pub fn check_shapes(&self, info: &crate::ModelInfo, intermediate_size: usize) -> Result<()> {
        if self.layers.len() != info.num_layers {
            candle_core::bail!(
                "adapter has {} layers, model {}",
                self.layers.len(),
                info.num_layers
            )
        }
        for (i, layer) in self.layers.iter().enumerate() {
            for (t, w) in layer {
                let (out, inp) = t.features(info, intermediate_size);
                let r = self.config.r;
                if w.a.dims2()? != (r, inp) || w.b.dims2()? != (out, r) {
                    candle_core::bail!(
                        "layer {i} {}: A {:?} B {:?}, the model needs [{r}, {inp}] and [{out}, {r}]",
                        t.peft_name(),
                        w.a.shape(),
                        w.b.shape()
                    )
                }
            }
        }
        Ok(())
    }

    /// The adapter with the `B` rows of `q_proj`/`k_proj` permuted between
    /// Hugging Face's layout and GGUF's (`to_gguf` true: HF -> GGUF, as
    /// llama.cpp's converter permutes the base weights; false: back).
    pub fn permuted_for_gguf(
        &self,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        to_gguf: bool,
    ) -> Result<Self> {
        let mut out = self.clone();
        for layer in out.layers.iter_mut() {
            for (t, heads) in [(LoraTarget::Q, num_heads), (LoraTarget::K, num_kv_heads)] {
                if let Some(w) = layer.get_mut(&t) {
                    w.b = permute_rows(&w.b, heads, head_dim, to_gguf)?;
                }
            }
        }
        Ok(out)
    }
}

/// Rows of `m` (`[heads * head_dim, cols]`): HF's per-head `[2, d/2]` halves
/// order to GGUF's `[d/2, 2]` interleaved pairs (or back).
pub fn permute_rows(m: &Tensor, heads: usize, head_dim: usize, to_gguf: bool) -> Result<Tensor> {
    let (rows, cols) = m.dims2()?;
    if rows != heads * head_dim || !head_dim.is_multiple_of(2) {
        candle_core::bail!("cannot permute {rows} rows as {heads} heads of {head_dim}")
    }
    let (a, b) = if to_gguf {
        (2, head_dim / 2)
    } else {
        (head_dim / 2, 2)
    };
    m.reshape((heads, a, b, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(num_layers: usize, r: usize) -> Result<LoraAdapter> {
        let dev = Device::Cpu;
        let mut layers = Vec::new();
        for _ in 0..num_layers {
            let mut m = BTreeMap::new();
            for (t, out, inp) in [(LoraTarget::Q, 8, 6), (LoraTarget::Down, 6, 10)] {
                m.insert(
                    t,
                    LoraWeights::new(
                        Tensor::randn(0f32, 1.0, (r, inp), &dev)?,
                        Tensor::randn(0f32, 1.0, (out, r), &dev)?,
                    ),
                );
            }
            layers.push(m);
        }
        Ok(LoraAdapter {
            config: LoraConfig {
                r,
                alpha: 16.0,
                dropout: 0.05,
                use_rslora: false,
                targets: vec![LoraTarget::Q, LoraTarget::Down],
                base_model: "base".into(),
            },
            layers,
        })
    }

    fn same(a: &Tensor, b: &Tensor) -> Result<bool> {
        Ok(a.shape() == b.shape()
            && a.flatten_all()?.to_vec1::<f32>()? == b.flatten_all()?.to_vec1::<f32>()?)
    }

    #[test]
    fn peft_roundtrip_keeps_names_and_values() -> Result<()> {
        let ad = adapter(2, 4)?;
        let (bytes, json) = ad.to_peft()?;
        let names: Vec<String> = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)?
            .into_keys()
            .collect();
        assert!(names
            .contains(&"base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight".into()));
        assert!(
            names.contains(&"base_model.model.model.layers.0.mlp.down_proj.lora_B.weight".into())
        );
        let cfg: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(cfg["peft_type"], "LORA");
        assert_eq!(cfg["r"], 4);
        assert_eq!(
            cfg["target_modules"],
            serde_json::json!(["q_proj", "down_proj"])
        );
        let back = LoraAdapter::from_peft(&bytes, &json, 2)?;
        assert_eq!(back.config, ad.config);
        assert!((back.config.scale() - 4.0).abs() < 1e-12);
        for (l, m) in ad.layers.iter().zip(&back.layers) {
            for (t, w) in l {
                assert!(same(&w.a, &m[t].a)? && same(&w.b, &m[t].b)?);
            }
        }
        // Layers past the model's are refused, as is a bad config.
        assert!(LoraAdapter::from_peft(&bytes, &json, 1).is_err());
        assert!(LoraAdapter::from_peft(&bytes, &json.replace("LORA", "IA3"), 2).is_err());
        Ok(())
    }

    /// The permutation is llama.cpp's: HF row `h*d + half*d/2 + j` goes to
    /// GGUF row `h*d + 2j + half`; and it inverts.
    #[test]
    fn gguf_permutation_matches_llama_cpp() -> Result<()> {
        let (heads, d, cols) = (2, 6, 1);
        let rows: Vec<f32> = (0..heads * d).map(|i| i as f32).collect();
        let m = Tensor::from_vec(rows, (heads * d, cols), &Device::Cpu)?;
        let g = permute_rows(&m, heads, d, true)?;
        let got: Vec<f32> = g.flatten_all()?.to_vec1()?;
        for h in 0..heads {
            for j in 0..d / 2 {
                for half in 0..2 {
                    assert_eq!(got[h * d + 2 * j + half], (h * d + half * d / 2 + j) as f32);
                }
            }
        }
        assert!(same(&permute_rows(&g, heads, d, false)?, &m)?);
        Ok(())
    }
}
