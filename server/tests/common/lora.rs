//! A seeded LoRA adapter over the default chat model and an
//! `AdapterSource` serving it as a fine-tuned model of any project.

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};
use hearth_api::ApiError;
use hearth_engine::adapters::dir_loader;
use hearth_models::{LoraAdapter, LoraConfig, LoraTarget, LoraWeights};
use hearth_server::models_resolve::{AdapterModel, AdapterSource, SourceFuture};

use super::MODEL;

/// The fine-tuned model [`Jobs`] serves.
pub const FT: &str = "HuggingFaceTB/SmolLM2-135M-Instruct:my-suffix:ftjob-01TEST";

/// A seeded rank-8 adapter on q and v of SmolLM2-135M (30 layers, hidden
/// 576, 9 x 64 query and 3 x 64 kv rows), `v_rows` rows in v's B.
pub fn adapter(seed: u64, v_rows: usize) -> LoraAdapter {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut m = |rows: usize, cols: usize| {
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 0.08
            })
            .collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
    };
    let layers = (0..30)
        .map(|_| {
            let mut l = BTreeMap::new();
            l.insert(LoraTarget::Q, LoraWeights::new(m(8, 576), m(576, 8)));
            l.insert(LoraTarget::V, LoraWeights::new(m(8, 576), m(v_rows, 8)));
            l
        })
        .collect();
    LoraAdapter {
        config: LoraConfig {
            r: 8,
            alpha: 16.0,
            dropout: 0.0,
            use_rslora: false,
            targets: vec![LoraTarget::Q, LoraTarget::V],
            base_model: MODEL.into(),
        },
        layers,
    }
}

/// Fine-tuned models of any project: one name, served from a folder.
pub struct Jobs(pub std::path::PathBuf);

impl AdapterSource for Jobs {
    fn resolve<'a>(
        &'a self,
        _project: &'a str,
        name: &'a str,
    ) -> SourceFuture<'a, Result<Option<AdapterModel>, ApiError>> {
        Box::pin(async move { Ok((name == FT).then(|| self.model())) })
    }

    fn list<'a>(
        &'a self,
        _project: &'a str,
    ) -> SourceFuture<'a, Result<Vec<AdapterModel>, ApiError>> {
        Box::pin(async move { Ok(vec![self.model()]) })
    }
}

impl Jobs {
    fn model(&self) -> AdapterModel {
        AdapterModel {
            id: FT.into(),
            base: MODEL.into(),
            owned_by: "user".into(),
            created: 1,
            description: None,
            loader: dir_loader(self.0.clone()),
        }
    }
}
