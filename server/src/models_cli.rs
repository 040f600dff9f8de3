//! `hearth models list` and `hearth models pull`.

use anyhow::Context;
use hearth_engine::catalog::{Catalog, CatalogEntry};
use hearth_engine::pull::{self, Progress};

use crate::config::StoreArgs;

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
