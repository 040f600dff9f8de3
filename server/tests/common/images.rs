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
