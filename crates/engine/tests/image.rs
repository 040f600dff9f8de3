//! The image worker on a tiny random-weight Stable Diffusion pipeline
//! (written in a temporary folder): a request's images, a full queue
//! refused at once, and a request whose caller went away stopped between
//! steps instead of running to the end.

use std::time::Duration;

use hearth_engine::catalog::{CatalogEntry, ModelKind, Source};
use hearth_engine::image::{ImageConfig, ImageError, ImageModel, ImageParams};
use hearth_models::diffusion::{write_tiny_pipeline, DiffusionPipeline};

fn model(max_waiting: usize) -> ImageModel {
    // Removed once loaded: the weights stay mapped.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    write_tiny_pipeline(&dir, 3).unwrap();
    let pipeline =
        DiffusionPipeline::load(&dir, &candle_core::Device::Cpu, candle_core::DType::F32).unwrap();
    let entry = CatalogEntry {
        id: "test/tiny-sd".into(),
        kind: ModelKind::Image,
        base: None,
        format: Default::default(),
        owned_by: None,
        description: None,
        context_length: 77,
        price_input_per_million: 0.0,
        price_output_per_million: 0.0,
        batch_price_input_per_million: None,
        batch_price_output_per_million: None,
        tokens_per_minute: None,
        requests_per_minute: None,
        default: false,
        chat_template: None,
        source: Source::Local { path: dir },
        files: vec![],
    };
    ImageModel::from_pipeline(
        entry,
        pipeline,
        ImageConfig {
            max_waiting,
            ..Default::default()
        },
    )
}

fn params(steps: usize) -> ImageParams {
    ImageParams {
        prompt: "a small house".into(),
        negative_prompt: None,
        n: 1,
        width: 64,
        height: 64,
        steps,
        guidance_scale: 0.0,
        seed: 5,
    }
}

async fn wait_until(
    model: &ImageModel,
    what: impl Fn(&hearth_engine::image::ImageSnapshot) -> bool,
) {
    for _ in 0..2000 {
        if what(&model.snapshot()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out; last snapshot {:?}", model.snapshot());
}

#[tokio::test]
async fn generates_counts_and_refuses_when_full() {
    let m = model(0);
    let images = m.generate(params(2)).await.unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!((images[0].width, images[0].height), (64, 64));
    let snap = m.snapshot();
    assert_eq!((snap.images_total, snap.steps_total), (1, 2));
    assert_eq!((snap.running, snap.waiting), (0, 0));

    // No waiting room: while one runs, the next is refused at once.
    let long = {
        let m = m.clone();
        tokio::spawn(async move { m.generate(params(200)).await })
    };
    wait_until(&m, |s| s.running == 1).await;
    assert!(matches!(
        m.generate(params(1)).await,
        Err(ImageError::QueueFull(_))
    ));
    assert_eq!(long.await.unwrap().unwrap().len(), 1);
}

#[tokio::test]
async fn a_departed_caller_stops_the_generation_between_steps() {
    let m = model(4);
    let task = {
        let m = m.clone();
        tokio::spawn(async move { m.generate(params(150)).await })
    };
    wait_until(&m, |s| s.running == 1 && s.progress.0 >= 1).await;
    task.abort();
    wait_until(&m, |s| s.cancelled_total == 1 && s.running == 0).await;
    let steps = m.snapshot().steps_total;
    assert!(steps < 150, "ran all {steps} steps after the caller left");
    assert_eq!(m.snapshot().images_total, 0);
    // The worker goes on serving.
    assert_eq!(m.generate(params(1)).await.unwrap().len(), 1);
}
