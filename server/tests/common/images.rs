//! A state serving the tiny random-weight Stable Diffusion pipeline
//! (written in a temporary folder in the diffusers layout and registered as
//! a local catalogue model), beside other served models.

use hearth_server::AppState;

use super::{new_store, serve_args, temp_dir, KEY};

/// The tiny image model's catalogue id.
pub const IMAGE: &str = "hearth/tiny-sd";

/// A state serving `models` and [`IMAGE`], the image queue `queue` long.
pub fn image_state(models: &[&str], queue: usize) -> AppState {
    let dir = temp_dir();
    let pipeline = dir.join("tiny-sd");
    hearth_models::diffusion::write_tiny_pipeline(&pipeline, 7).expect("writing the pipeline");
    let files: Vec<String> = ["", "scheduler", "text_encoder", "tokenizer", "unet", "vae"]
        .iter()
        .flat_map(|sub| std::fs::read_dir(pipeline.join(sub)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let rel = p.strip_prefix(&pipeline).unwrap().display().to_string();
            format!("{{ path = \"{rel}\" }}")
        })
        .collect();
    assert!(files.len() >= 8, "{files:?}");
    let catalog = dir.join("catalog.toml");
    std::fs::write(
        &catalog,
        format!(
            "[[model]]\nid = \"{IMAGE}\"\nkind = \"image\"\ncontext_length = 77\n\
             description = \"tiny random-weight Stable Diffusion (tests)\"\n\
             source = {{ type = \"local\", path = \"{}\" }}\nfiles = [{}]\n",
            pipeline.display(),
            files.join(", ")
        ),
    )
    .unwrap();
    let mut all: Vec<String> = models.iter().map(|m| m.to_string()).collect();
    all.push(IMAGE.to_string());
    let mut args = serve_args(all, 64, 8);
    args.store.catalog = Some(catalog);
    args.max_image_queue = queue;
    let (store, project) = new_store();
    hearth_server::serve::build_state(&args, vec![KEY.to_string()], store, &project)
        .expect("loading the models")
}

/// Starts a 60-step generation on [`IMAGE`] and returns once it runs (as
/// `/metrics` says), so that the model's one slot is taken; its reply.
pub async fn occupy(state: &AppState) -> tokio::task::JoinHandle<super::Reply> {
    let long = {
        let state = state.clone();
        tokio::spawn(async move {
            let body = serde_json::json!({"model": IMAGE, "prompt": "slow",
                "num_inference_steps": 60, "response_format": "b64_json"});
            super::post(&state, "/v1/images/generations", &body.to_string()).await
        })
    };
    let running = format!("hearth_image_requests_running{{model=\"{IMAGE}\"}} 1");
    for _ in 0..400 {
        let m = super::send(state, "GET", "/metrics", Some(KEY), None).await;
        if m.text.contains(&running) {
            return long;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the first request never ran");
}
