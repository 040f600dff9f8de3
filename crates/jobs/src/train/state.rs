//! Saving and restoring the full training state of a [`Trainer`].

use candle_core::{Tensor, Var};
use hearth_models::LoraTarget;

use super::model::TokenizedExample;
use super::trainer::Trainer;
use crate::{TrainConfig, TrainError};

impl Trainer {
    /// The full training state (adapter variables in the base's layout,
    /// AdamW moments and step count, step, a fingerprint of the config and
    /// data) as one safetensors file whose metadata key `hearth_trainer`
    /// holds the JSON.
    pub fn save_state(&self) -> Result<Vec<u8>, TrainError> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        let mut k = 0;
        for (l, layer) in self.vars.iter().enumerate() {
            for (t, (a, b)) in LoraTarget::ALL.iter().zip(layer) {
                for (ab, v) in [("a", a), ("b", b)] {
                    let name = format!("{l}.{}.{ab}", t.peft_name());
                    let shape = v.shape().clone();
                    tensors.push((format!("param.{name}"), v.as_tensor().detach()));
                    tensors.push((
                        format!("adam_m.{name}"),
                        Tensor::from_slice(&self.opt.m[k], shape.clone(), v.device())?,
                    ));
                    tensors.push((
                        format!("adam_v.{name}"),
                        Tensor::from_slice(&self.opt.v[k], shape.clone(), v.device())?,
                    ));
                    k += 1;
                }
            }
        }
        let meta = serde_json::json!({
            "version": 1,
            "step": self.step,
            "adam_t": self.opt.t,
            "fingerprint": self.fingerprint,
        });
        let mut md = std::collections::HashMap::new();
        md.insert("hearth_trainer".to_string(), meta.to_string());
        safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(md))
            .map_err(|e| TrainError::State(e.to_string()))
    }

    /// Restores what [`Trainer::save_state`] wrote, from a trainer built
    /// with the same base, data and config (checked by the fingerprint).
    pub fn restore_state(&mut self, bytes: &[u8]) -> Result<(), TrainError> {
        let bad = |m: String| TrainError::State(m);
        let (_, header) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| bad(format!("not a trainer state: {e}")))?;
        let meta: serde_json::Value = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get("hearth_trainer"))
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| bad("not a trainer state (no hearth_trainer metadata)".into()))?;
        if meta["version"] != 1 {
            return Err(bad(format!(
                "unknown trainer state version {}",
                meta["version"]
            )));
        }
        if meta["fingerprint"].as_str() != Some(self.fingerprint.as_str()) {
            return Err(bad(
                "the state was saved by a run with another config or dataset".into(),
            ));
        }
        let step = meta["step"].as_u64().ok_or_else(|| bad("no step".into()))? as usize;
        let adam_t = meta["adam_t"]
            .as_u64()
            .ok_or_else(|| bad("no adam_t".into()))?;
        if step > self.total_steps() {
            return Err(bad(format!(
                "step {step} past the run's {}",
                self.total_steps()
            )));
        }
        let mut tensors = candle_core::safetensors::load_buffer(bytes, &candle_core::Device::Cpu)?;
        let mut take = |name: &str, like: &Var| -> Result<Tensor, TrainError> {
            let t = tensors
                .remove(name)
                .ok_or_else(|| bad(format!("tensor {name} missing")))?;
            if t.shape() != like.shape() {
                return Err(bad(format!("tensor {name} has shape {:?}", t.shape())));
            }
            Ok(t)
        };
        let mut params = Vec::new();
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for (l, layer) in self.vars.iter().enumerate() {
            for (t, (a, b)) in LoraTarget::ALL.iter().zip(layer) {
                for (ab, var) in [("a", a), ("b", b)] {
                    let name = format!("{l}.{}.{ab}", t.peft_name());
                    params.push(take(&format!("param.{name}"), var)?);
                    m.push(
                        take(&format!("adam_m.{name}"), var)?
                            .flatten_all()?
                            .to_vec1::<f32>()?,
                    );
                    v.push(
                        take(&format!("adam_v.{name}"), var)?
                            .flatten_all()?
                            .to_vec1::<f32>()?,
                    );
                }
            }
        }
        for ((a, b), p) in self.vars.iter().flatten().zip(params.chunks(2)) {
            a.set(&p[0])?;
            b.set(&p[1])?;
        }
        self.opt.m = m;
        self.opt.v = v;
        self.opt.t = adam_t;
        self.step = step;
        Ok(())
    }
}

/// FNV-1a over the config and the tokenised data.
pub(crate) fn fingerprint(
    cfg: &TrainConfig,
    train: &[TokenizedExample],
    valid: &[TokenizedExample],
) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(format!("{cfg:?}").as_bytes());
    for (tag, set) in [(b"T", train), (b"V", valid)] {
        eat(tag);
        for e in set {
            eat(&(e.tokens.len() as u64).to_le_bytes());
            for (t, m) in e.tokens.iter().zip(&e.loss) {
                eat(&t.to_le_bytes());
                eat(&[*m as u8]);
            }
        }
    }
    format!("{h:016x}")
}
