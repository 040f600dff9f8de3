//! `hearth endpoints ...`: dedicated endpoints from the command line, over
//! the same store as `serve` (whose reconciler loads and drops replicas).

use anyhow::Context;
use hearth_api::endpoints::{GPU_TYPE_CPU, REGION_LOCAL};
use hearth_store::NewEndpoint;

use crate::config::EndpointsCommand;
use crate::keys_cli::{open, utc};

pub async fn endpoints(command: EndpointsCommand) -> anyhow::Result<()> {
    match command {
        EndpointsCommand::List(location) => {
            let store = open(&location).await?;
            println!(
                "{:<36} {:<20} {:<12} {:<13} {:<20} ROUTING KEY",
                "ID", "NAME", "FLAVOR", "STATUS", "CREATED"
            );
            for e in store.all_endpoints().await? {
                println!(
                    "{:<36} {:<20} {:<12} {:<13} {:<20} {}",
                    e.id,
                    e.name,
                    e.flavor_name,
                    e.status,
                    utc(e.created_at),
                    e.routing_key
                );
                if let Some(reason) = e.status_reason {
                    println!("    {reason}");
                }
            }
        }
        EndpointsCommand::Create {
            name,
            model,
            flavor,
            replicas,
            project,
            location,
        } => {
            let store = open(&location).await?;
            anyhow::ensure!(!name.trim().is_empty(), "--name must not be empty");
            let project = match project {
                Some(p) => {
                    anyhow::ensure!(
                        store.project(&p).await?.is_some(),
                        "no project with id `{p}` (see `hearth projects list`)"
                    );
                    p
                }
                None => store.default_project().await?.id,
            };
            let id = uuid::Uuid::new_v4().to_string();
            let row = store
                .create_endpoint(NewEndpoint {
                    routing_key: format!("{model}:{}", &id[..8]),
                    id,
                    project_id: project,
                    name,
                    description: None,
                    model_name: model,
                    flavor_name: flavor,
                    gpu_type: Some(GPU_TYPE_CPU.to_string()),
                    gpu_count: 0,
                    region: REGION_LOCAL.to_string(),
                    min_replicas: replicas.into(),
                    max_replicas: replicas.into(),
                    enabled: true,
                })
                .await
                .context("creating the endpoint")?;
            println!("{} {}", row.id, row.routing_key);
        }
        EndpointsCommand::Delete { id, location } => {
            let store = open(&location).await?;
            let row = store
                .mark_endpoint_deleting(&id)
                .await
                .with_context(|| format!("deleting `{id}`"))?;
            println!("Deleting endpoint {} ({}).", row.id, row.name);
        }
    }
    Ok(())
}
