//! `hearth models list`, `hearth models pull` and
//! `hearth models import-adapter`.

use anyhow::Context;
use hearth_engine::adapters::{base_lora_spec, check_files};
use hearth_engine::catalog::{Catalog, CatalogEntry};
use hearth_engine::pull::{self, Progress};
use hearth_engine::PeftFiles;
use hearth_store::{NewAdapter, Store};

use crate::config::{ImportAdapterArgs, StoreArgs};
use crate::imported_adapters::{details, stored_files};

pub fn catalog(store: &StoreArgs) -> anyhow::Result<Catalog> {
    Ok(Catalog::load(Some(&store.catalog_file()))?)
}

pub fn list(store: &StoreArgs) -> anyhow::Result<()> {
    let catalog = catalog(store)?;
    let models_dir = store.models_dir();
    println!(
        "{:<45} {:<7} {:<6} {:>8}  DESCRIPTION",
        "ID", "KIND", "PULLED", "CONTEXT"
    );
    for e in catalog.entries() {
        println!(
            "{:<45} {:<7} {:<6} {:>8}  {}{}",
            e.id,
            e.kind.as_str(),
            if e.is_present(&models_dir) {
                "yes"
            } else {
                "no"
            },
            e.context_length,
            e.description.as_deref().unwrap_or(""),
            if e.default { " (default)" } else { "" },
        );
    }
    Ok(())
}

pub fn pull(id: Option<&str>, store: &StoreArgs) -> anyhow::Result<()> {
    let catalog = catalog(store)?;
    let entries: Vec<&CatalogEntry> = match id {
        Some(id) => vec![catalog.get(id).with_context(|| {
            format!("`{id}` is not in the catalogue (see `hearth models list`)")
        })?],
        None => catalog.defaults().collect(),
    };
    for entry in entries {
        eprintln!("pulling {}", entry.id);
        let dir = pull::pull(entry, &store.models_dir(), Progress::Bars)
            .with_context(|| format!("pulling {}", entry.id))?;
        eprintln!("{} is ready in {}", entry.id, dir.display());
    }
    Ok(())
}

/// Checks a PEFT folder against the base's shapes (read from its files'
/// metadata, without loading it), then registers it for the project in the
/// store; prints the model name on stdout. A server on the same store
/// serves it at once.
pub async fn import_adapter(args: &ImportAdapterArgs) -> anyhow::Result<()> {
    let catalog = catalog(&args.store)?;
    let entry = catalog.get(&args.base).with_context(|| {
        format!(
            "the base `{}` is not in the catalogue (see `hearth models list`)",
            args.base
        )
    })?;
    let spec = base_lora_spec(entry, &args.store.models_dir())?;
    let files = PeftFiles::read_dir(&args.path)
        .with_context(|| format!("reading the PEFT folder {}", args.path.display()))?;
    let adapter = check_files(&spec, &files)
        .with_context(|| format!("{} over `{}`", args.path.display(), args.base))?;
    let store = Store::open(&args.db.store_config(&args.store.data_dir))
        .await
        .context("opening the store")?;
    let project = match &args.project {
        Some(p) => p.clone(),
        None => store.default_project().await?.id,
    };
    let created = store
        .create_adapter(NewAdapter {
            project_id: &project,
            name: &args.name,
            base_model: &args.base,
            details: details(&adapter),
            files: &stored_files(&files),
        })
        .await
        .context("registering the adapter")?;
    eprintln!(
        "imported {} (rank {}, {} parameters) for {}; use it as:",
        created.id,
        adapter.config.r,
        adapter.num_params(),
        created.project_id
    );
    println!("{}", created.model);
    Ok(())
}
