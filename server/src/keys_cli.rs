//! `hearth keys ...` and `hearth projects ...`: manage the store from the
//! command line (the same store `serve` uses; safe while it runs).

use anyhow::Context;
use hearth_store::Store;

use crate::config::{KeysCommand, ProjectsCommand, StoreLocation};

pub(crate) async fn open(location: &StoreLocation) -> anyhow::Result<Store> {
    Store::open(&location.store_config())
        .await
        .context("opening the store")
}

pub async fn keys(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create {
            name,
            project,
            admin,
            location,
        } => {
            let store = open(&location).await?;
            let new = store.create_key(&name, project.as_deref(), admin).await?;
            println!(
                "Created key {} ({}) for project {}{}. Copy it now, it is not shown again:\n\n    {}\n",
                new.info.id,
                new.info.name,
                new.info.default_project_id,
                if admin { ", admin" } else { "" },
                new.secret
            );
        }
        KeysCommand::List(location) => {
            let store = open(&location).await?;
            println!(
                "{:<30} {:<16} {:<18} {:<34} {:<20} {:<20} STATUS",
                "ID", "NAME", "PREFIX", "PROJECT", "CREATED", "LAST USED"
            );
            for key in store.keys().await? {
                let status = match (key.revoked_at, key.is_admin) {
                    (Some(t), _) => format!("revoked {}", utc(t)),
                    (None, true) => "active, admin".to_string(),
                    (None, false) => "active".to_string(),
                };
                println!(
                    "{:<30} {:<16} {:<18} {:<34} {:<20} {:<20} {}",
                    key.id,
                    key.name,
                    format!("{}...", key.prefix),
                    key.default_project_id,
                    utc(key.created_at),
                    key.last_used_at.map_or("never".to_string(), utc),
                    status
                );
            }
        }
        KeysCommand::Revoke { id, location } => {
            let store = open(&location).await?;
            if let Some(key) = store.key(&id).await? {
                if let Some(t) = key.revoked_at {
                    println!(
                        "Key {} ({}) was already revoked at {} UTC.",
                        key.id,
                        key.name,
                        utc(t)
                    );
                    return Ok(());
                }
            }
            let key = store
                .revoke_key(&id)
                .await
                .with_context(|| format!("revoking `{id}`"))?;
            println!("Revoked key {} ({}).", key.id, key.name);
        }
    }
    Ok(())
}

pub async fn projects(command: ProjectsCommand) -> anyhow::Result<()> {
    match command {
        ProjectsCommand::Create { name, location } => {
            let store = open(&location).await?;
            store.default_project().await?;
            let project = store.create_project(&name).await?;
            println!("{}", project.id);
        }
        ProjectsCommand::List(location) => {
            let store = open(&location).await?;
            let default = store.default_project().await?;
            println!("{:<34} {:<20} NAME", "ID", "CREATED");
            for p in store.projects().await? {
                let mark = if p.id == default.id { " (default)" } else { "" };
                println!("{:<34} {:<20} {}{mark}", p.id, utc(p.created_at), p.name);
            }
        }
        ProjectsCommand::Budget(command) => crate::usage_cli::budget(command).await?,
        ProjectsCommand::Quota(command) => crate::usage_cli::quota(command).await?,
    }
    Ok(())
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of seconds since the epoch.
pub fn utc(secs: i64) -> String {
    let day = secs.div_euclid(hearth_store::usage::DAY);
    let rem = secs.rem_euclid(hearth_store::usage::DAY);
    format!(
        "{} {:02}:{:02}:{:02}",
        hearth_store::usage::day_string(day),
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc_times() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(1_700_000_000), "2023-11-14 22:13:20");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00");
    }
}
