//! A cross-encoder rerank model served through the catalogue and the
//! encoder batcher: a tiny random-weight `BertForSequenceClassification`
//! written to a folder (MiniLM's real tokenizer, so pairs are tokenized as
//! `[CLS] query [SEP] document [SEP]` with segment ids), loaded as a `rerank`
//! catalogue entry with a local source.

mod common;
#[path = "common/tiny_cross_encoder.rs"]
mod tiny_cross_encoder;

use std::path::Path;

use candle_core::Device;
use hearth_engine::catalog::Catalog;
use hearth_engine::cross_encoder::{load_cross_encoder, pair_items};
use hearth_engine::{BatcherConfig, EmbedModel, EncodeItem};
use hearth_models::{EncoderInput, EncoderPrecision};

const MAX_TOKENS: usize = 24;

/// Writes a tiny random cross-encoder of `model_type` with MiniLM's
/// tokenizer.
fn write_model(dir: &Path, model_type: &str) {
    tiny_cross_encoder::write_model(
        dir,
        &tiny_cross_encoder::config(model_type),
        &common::minilm_dir().join("tokenizer.json"),
    );
}

fn catalog(dir: &Path) -> Catalog {
    let toml = format!(
        r#"
[[model]]
id = "test/tiny-cross-encoder"
kind = "rerank"
format = "safetensors"
context_length = {MAX_TOKENS}
source = {{ type = "local", path = "{}" }}
files = [{{ path = "config.json" }}, {{ path = "model.safetensors" }}, {{ path = "tokenizer.json" }}]
"#,
        dir.display()
    );
    Catalog::parse(&toml, "test").unwrap()
}

const QUERY: &str = "how do plants make food";
const DOCS: [&str; 3] = [
    "Photosynthesis turns light, water and carbon dioxide into sugar.",
    "The stock market closed higher today.",
    "A very long document about gardening that goes on and on about soil, compost, watering schedules, pests and the many kinds of vegetables one might grow.",
];

/// A tiny random cross-encoder of `model_type` in a temporary folder,
/// started as a `rerank` catalogue entry.
fn start(model_type: &str) -> (tempfile::TempDir, EmbedModel) {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), model_type);
    let catalog = catalog(dir.path());
    let entry = catalog.get("test/tiny-cross-encoder").unwrap();
    let model = EmbedModel::start(
        entry,
        Path::new("/nonexistent"),
        &Device::Cpu,
        BatcherConfig::default(),
        EncoderPrecision::Auto,
    )
    .unwrap();
    assert!(model.cross_encoder);
    (dir, model)
}

/// The scores the batcher gives `items`.
fn served_scores(model: &EmbedModel, items: &[EncodeItem]) -> Vec<f32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(model.encoder.encode_items(items.to_vec()))
        .unwrap()
        .into_iter()
        .map(|v| v[0])
        .collect()
}

#[test]
fn pairs_are_scored_through_the_batcher_as_the_model_scores_them() {
    let (dir, model) = start("bert");
    assert_eq!(model.max_tokens, MAX_TOKENS);

    let docs: Vec<String> = DOCS.iter().map(|d| d.to_string()).collect();
    let items = pair_items(&model.tokenizer, QUERY, &docs).unwrap();
    // Pair layout: [CLS] query [SEP] doc [SEP], segment 0 then 1; the long
    // document is cut so the pair fits.
    for item in &items {
        let types = item.type_ids.as_ref().unwrap();
        assert_eq!(types.len(), item.ids.len());
        assert!(item.ids.len() <= MAX_TOKENS);
        assert_eq!(item.ids[0], 101, "[CLS]");
        assert_eq!(*item.ids.last().unwrap(), 102, "[SEP]");
        let first_b = types
            .iter()
            .position(|&t| t == 1)
            .expect("a second segment");
        assert_eq!(item.ids[first_b - 1], 102, "the query ends with [SEP]");
        assert!(types[first_b..].iter().all(|&t| t == 1));
    }
    assert_eq!(items[2].ids.len(), MAX_TOKENS);

    let served = served_scores(&model, &items);

    // The same pairs straight through the model: sigmoid of the logit.
    let mut direct = load_cross_encoder(dir.path(), &Device::Cpu, MAX_TOKENS).unwrap();
    // The served model's arithmetic (bf16 on CPUs with AVX-512 BF16).
    let precision = direct.encoder.model.set_precision(model.precision).unwrap();
    assert_eq!(precision, model.precision);
    let inputs: Vec<EncoderInput> = items
        .iter()
        .map(|i| EncoderInput {
            ids: &i.ids,
            type_ids: i.type_ids.as_deref(),
        })
        .collect();
    let logits = direct
        .encoder
        .model
        .forward(&inputs)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    for (s, l) in served.iter().zip(&logits) {
        let want = 1.0 / (1.0 + (-l[0]).exp());
        assert!((s - want).abs() < 1e-6, "{s} vs {want}");
        assert!(*s > 0.0 && *s < 1.0);
    }
    assert!(
        (served[0] - served[1]).abs() > 1e-4,
        "distinct pairs get distinct scores: {served:?}"
    );
    // Segment ids matter: scoring the pairs as one segment changes the scores.
    let flat: Vec<EncoderInput> = items.iter().map(|i| EncoderInput::new(&i.ids)).collect();
    let flat_logits = direct
        .encoder
        .model
        .forward(&flat)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert!(flat_logits
        .iter()
        .zip(&logits)
        .any(|(a, b)| (a[0] - b[0]).abs() > 1e-6));
}

#[test]
fn an_xlm_roberta_cross_encoder_is_served_as_its_model_scores_it() {
    let (dir, model) = start("xlm-roberta");
    let docs: Vec<String> = DOCS.iter().map(|d| d.to_string()).collect();
    let items = pair_items(&model.tokenizer, QUERY, &docs).unwrap();
    let served = served_scores(&model, &items);
    let mut direct = load_cross_encoder(dir.path(), &Device::Cpu, MAX_TOKENS).unwrap();
    // The served model's arithmetic (bf16 on CPUs with AVX-512 BF16).
    let precision = direct.encoder.model.set_precision(model.precision).unwrap();
    assert_eq!(precision, model.precision);
    // RoBERTa has one segment: the tokenizer's segment ids are not read, so
    // the pairs score the same with and without them.
    for (item, s) in items.iter().zip(&served) {
        for type_ids in [item.type_ids.as_deref(), None] {
            let input = EncoderInput {
                ids: &item.ids,
                type_ids,
            };
            let logit = direct.encoder.model.forward(&[input]).unwrap();
            let logit = logit.to_vec2::<f32>().unwrap()[0][0];
            let want = 1.0 / (1.0 + (-logit).exp());
            assert!((s - want).abs() < 1e-5, "{s} vs {want}");
        }
    }
    assert!(
        (served[0] - served[1]).abs() > 1e-4,
        "distinct pairs get distinct scores: {served:?}"
    );
}
