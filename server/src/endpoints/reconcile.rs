//! The reconciler: brings this node's replicas in line with the store's
//! endpoint rows.
//!
//! A pass reads every row. An enabled row whose generation this node has
//! not taken up yet gets its replicas (re)loaded in a task of its own, one
//! replica at a time, each replacing the one at its place only once it is
//! loaded and warmed up, so an endpoint being updated keeps serving. A
//! disabled row loses its replicas (`stopped`); a `deleting` row is
//! forgotten (requests in flight finish on their replica) and purged. A
//! running endpoint scales between `min_replicas` and `max_replicas`: one
//! more replica while every replica has requests waiting for a slot, one
//! fewer after `scale_down_after` without requests.
//! Passes run at start, every [`PASS_EVERY`] and whenever a route changes
//! a row ([`Endpoints::wake`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hearth_api::endpoints::Flavor;
use hearth_core::{GenerateRequest, Priority, SamplingParams, TokenEvent};
use hearth_engine::{BatcherConfig, ChatModel, EmbedModel, EngineConfig};
use hearth_store::{DedicatedEndpoint, EndpointHost};

use super::host::{self, Need};
use super::templates::{deployable, Base, Deployable};
use super::{HostConfig, Live, Replica};
use crate::state::AppState;

/// Longest time between two passes.
pub const PASS_EVERY: Duration = Duration::from_secs(2);

/// Runs passes until the task is aborted.
pub fn spawn(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            reconcile_once(&state).await;
            tokio::select! {
                _ = tokio::time::sleep(PASS_EVERY) => {},
                _ = state.endpoints.woken() => {},
            }
        }
    })
}

/// One pass over the store's rows.
pub async fn reconcile_once(state: &AppState) {
    let endpoints = &state.endpoints;
    let Some(host) = endpoints.host().cloned() else {
        return;
    };
    let rows = match state.store.all_endpoints().await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the dedicated endpoints");
            return;
        }
    };
    let hosts: HashMap<String, EndpointHost> = match state.store.endpoint_hosts().await {
        Ok(hosts) => hosts.into_iter().map(|h| (h.id.clone(), h)).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read who runs the dedicated endpoints");
            return;
        }
    };
    let me = state.node.worker_id();
    let now = hearth_store::ids::now();
    let ids: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    for id in endpoints.ids() {
        if !ids.contains(id.as_str()) && !endpoints.is_loading(&id) {
            endpoints.remove(&id);
        }
    }
    let reserved = reserved_among(state, &host, &rows, &hosts, "").await;
    endpoints.set_room(host::Need {
        memory: host.capacity.memory.saturating_sub(reserved.memory),
        threads: host.capacity.threads.saturating_sub(reserved.threads),
    });
    let all = rows.clone();
    let mut others: Option<Vec<hearth_store::nodes::NodeRecord>> = None;
    for row in rows {
        if endpoints.is_loading(&row.id) {
            // Its load ends with a wake; the row is looked at then.
            continue;
        }
        if row.status == "deleting" {
            endpoints.remove(&row.id);
            match state.store.purge_endpoint(&row.id).await {
                Ok(_) => tracing::info!(endpoint = %row.id, "dedicated endpoint deleted"),
                Err(e) => tracing::warn!(endpoint = %row.id, error = %e, "cannot purge"),
            }
            continue;
        }
        let live = endpoints.register(&row);
        let claim = hosts.get(&row.id);
        if let Some(held) = claim.filter(|h| h.held_elsewhere(&me, now, state.node.timeout_secs)) {
            let node = held.node.as_deref().unwrap_or_default();
            live.elsewhere
                .store(held.ready_replicas.max(0) as usize, Ordering::Relaxed);
            // Another node runs it; requests for it are forwarded there.
            if !live.replicas().is_empty() {
                tracing::info!(endpoint = %row.id, node, "dedicated endpoint runs on another node now");
                live.truncate(0);
            }
            *live.generation.lock().unwrap() = 0;
            continue;
        }
        let mine = claim.is_some_and(|h| h.node.as_deref() == Some(me.as_str()));
        // To be (re)loaded: no replica here runs the row's generation.
        let to_load = *live.generation.lock().unwrap() != row.generation;
        if row.enabled && (!mine || to_load) {
            // Not runnable here (its model is not served, or there is no
            // room): leave it (or give it back) to an alive node that serves
            // its model and reports the room. With none, this node takes it
            // and says why it cannot run.
            let here = room_here(state, &host, &row, &all, &hosts).await;
            if !matches!(here, Here::Fits) {
                if others.is_none() {
                    others = Some(state.store.nodes().await.unwrap_or_default());
                }
                let names = models_for(&row);
                let elsewhere = others.as_deref().unwrap_or_default().iter().any(|n| {
                    *n.id != *me
                        && n.alive_at(now, state.node.timeout_secs)
                        && n.models.iter().any(|m| names.contains(&m.as_str()))
                        && match here {
                            Here::NoRoom(need) => reports_room(&n.capacity, need),
                            _ => true,
                        }
                });
                if elsewhere {
                    if mine {
                        let _ = state.store.release_endpoint(&row.id, &me).await;
                        live.truncate(0);
                        tracing::info!(endpoint = %row.id, "dedicated endpoint left to a node with room for it");
                    }
                    continue;
                }
            }
        }
        let ready = live.replicas().len() as i64;
        match state
            .store
            .claim_endpoint(&row.id, &me, state.node.timeout_secs, ready)
            .await
        {
            Ok(true) => {}
            Ok(false) => continue, // another node was first
            Err(e) => {
                tracing::warn!(endpoint = %row.id, error = %e, "cannot claim the endpoint");
                continue;
            }
        }
        live.elsewhere.store(0, Ordering::Relaxed);
        if !mine {
            tracing::info!(endpoint = %row.id, node = %me, "dedicated endpoint claimed");
        }
        if *live.generation.lock().unwrap() == row.generation {
            if row.enabled && row.status == "running" {
                autoscale(state, &host, live, row);
            }
            continue;
        }
        if !row.enabled {
            live.truncate(0);
            *live.generation.lock().unwrap() = row.generation;
            set_status(state, &row, "stopped", None).await;
            tracing::info!(endpoint = %row.id, "dedicated endpoint stopped");
            continue;
        }
        if !endpoints.start_loading(&row.id) {
            continue;
        }
        *live.generation.lock().unwrap() = row.generation;
        if !matches!(row.status.as_str(), "provisioning" | "updating") {
            // A restart: the row says how it ran before. It says loading
            // before this pass returns, so that nobody reads the last run's
            // `running` while no replica serves yet.
            set_status(state, &row, "provisioning", None).await;
        }
        let state = state.clone();
        let host = host.clone();
        tokio::spawn(async move {
            let id = row.id.clone();
            provision(&state, &host, live, row).await;
            state.endpoints.done_loading(&id);
            state.endpoints.wake();
        });
    }
}

/// Whether a row can run on this node.
enum Here {
    Fits,
    /// The model is served but the endpoint needs this much more room.
    NoRoom(host::Need),
    /// The model (or the flavor) is not served here.
    NoModel,
}

async fn room_here(
    state: &AppState,
    host: &HostConfig,
    row: &DedicatedEndpoint,
    rows: &[DedicatedEndpoint],
    hosts: &HashMap<String, EndpointHost>,
) -> Here {
    let Ok((_, flavor)) = model_and_flavor(state, host, row).await else {
        return Here::NoModel;
    };
    let wanted = host::need(&flavor).times(row.max_replicas.max(1) as u64);
    let others = reserved_among(state, host, rows, hosts, &row.id).await;
    match host::shortfall(&host.capacity, others, wanted) {
        None => Here::Fits,
        Some(_) => Here::NoRoom(wanted),
    }
}

/// Whether a node's reported capacity has room for `need`.
fn reports_room(capacity: &serde_json::Value, need: host::Need) -> bool {
    let memory = capacity["endpoint_memory_free_mb"].as_u64();
    let threads = capacity["endpoint_threads_free"].as_u64();
    matches!((memory, threads), (Some(m), Some(t))
        if m << 20 >= need.memory && t as usize >= need.threads)
}

/// Between `min_replicas` and `max_replicas`: one more replica while every
/// replica has requests waiting, one fewer once all have been idle for
/// `scale_down_after`. (Admission reserved `max_replicas`.)
fn autoscale(state: &AppState, host: &HostConfig, live: Arc<Live>, row: DedicatedEndpoint) {
    let count = live.replicas().len();
    let idle = live.idle_for();
    if count > row.min_replicas.max(1) as usize && idle.is_some_and(|d| d >= host.scale_down_after)
    {
        live.truncate(count - 1);
        tracing::info!(endpoint = %row.id, replicas = count - 1, "scaled down (idle)");
        return;
    }
    if count >= row.max_replicas as usize
        || !live.saturated()
        || !state.endpoints.start_loading(&row.id)
    {
        return;
    }
    let state = state.clone();
    let host = host.clone();
    tokio::spawn(async move {
        let id = row.id.clone();
        match scale_up(&state, &host, &live, &row).await {
            Ok(true) => {
                tracing::info!(endpoint = %id, replicas = count + 1, "scaled up (requests waiting)")
            }
            Ok(false) => {}
            Err(reason) => tracing::warn!(endpoint = %id, "cannot add a replica: {reason}"),
        }
        state.endpoints.done_loading(&id);
        state.endpoints.wake();
    });
}

/// Loads one more replica of the row; `Ok(false)` when the row changed
/// meanwhile (the replica is dropped).
async fn scale_up(
    state: &AppState,
    host: &HostConfig,
    live: &Live,
    row: &DedicatedEndpoint,
) -> Result<bool, String> {
    let (model, flavor) = model_and_flavor(state, host, row).await?;
    let replica = start_replica(host, &model, &flavor).await?;
    if !still_current(state, row).await {
        return Ok(false);
    }
    let count = live.replicas().len();
    live.set_replica(count, replica);
    Ok(true)
}

async fn set_status(state: &AppState, row: &DedicatedEndpoint, status: &str, reason: Option<&str>) {
    if let Err(e) = state
        .store
        .set_endpoint_status(&row.id, row.generation, status, reason)
        .await
    {
        tracing::warn!(endpoint = %row.id, error = %e, "cannot record the endpoint's status");
    }
}

/// Loads the row's replicas and records how that went.
async fn provision(state: &AppState, host: &HostConfig, live: Arc<Live>, row: DedicatedEndpoint) {
    tracing::info!(endpoint = %row.id, model = %row.model_name, flavor = %row.flavor_name,
        replicas = row.min_replicas, "provisioning dedicated endpoint");
    match load_replicas(state, host, &live, &row).await {
        Ok(true) => {
            // Other nodes see its replicas and forward to it at once.
            let ready = live.replicas().len() as i64;
            let me = state.node.worker_id();
            if let Err(e) = (state.store)
                .claim_endpoint(&row.id, &me, state.node.timeout_secs, ready)
                .await
            {
                tracing::warn!(endpoint = %row.id, error = %e, "cannot renew the endpoint's claim");
            }
            crate::nodes::refresh(state).await;
            set_status(state, &row, "running", None).await;
            tracing::info!(endpoint = %row.id, routing_key = %row.routing_key, "dedicated endpoint running");
        }
        Ok(false) => {} // superseded by a newer generation or deleted
        Err(reason) => {
            tracing::warn!(endpoint = %row.id, "dedicated endpoint failed: {reason}");
            set_status(state, &row, "failed", Some(&reason)).await;
        }
    }
}

/// Loads `min_replicas` replicas of the row's model and flavor in place of
/// the ones there. `Ok(false)` when the row changed meanwhile (a newer
/// pass takes over).
async fn load_replicas(
    state: &AppState,
    host: &HostConfig,
    live: &Live,
    row: &DedicatedEndpoint,
) -> Result<bool, String> {
    let (model, flavor) = model_and_flavor(state, host, row).await?;
    let others = reserved_by_others(state, host, &row.id).await;
    let wanted = host::need(&flavor).times(row.max_replicas.max(1) as u64);
    if let Some(missing) = host::shortfall(&host.capacity, others, wanted) {
        return Err(format!("the endpoint does not fit on this node: {missing}"));
    }
    let target = row.min_replicas.max(1) as usize;
    for index in 0..target {
        if !still_current(state, row).await {
            return Ok(false);
        }
        let replica = start_replica(host, &model, &flavor).await?;
        live.set_replica(index, replica);
        tracing::info!(endpoint = %row.id, replica = index, "replica ready");
    }
    live.truncate(target);
    Ok(still_current(state, row).await)
}

/// The row's model and flavor on this node (why not, otherwise).
async fn model_and_flavor(
    state: &AppState,
    host: &HostConfig,
    row: &DedicatedEndpoint,
) -> Result<(Deployable, Flavor), String> {
    let model = deployable(state, &row.project_id, &row.model_name)
        .await
        .map_err(|e| format!("cannot resolve the model: {}", e.0.message()))?
        .ok_or_else(|| format!("the model `{}` is not served by this node", row.model_name))?;
    let flavor = model.flavor(host, &row.flavor_name).ok_or_else(|| {
        format!(
            "the flavor `{}` does not exist on this node",
            row.flavor_name
        )
    })?;
    Ok((model, flavor))
}

async fn still_current(state: &AppState, row: &DedicatedEndpoint) -> bool {
    match state.store.endpoint_by_id(&row.id).await {
        Ok(now) => now.generation == row.generation && now.status != "deleting",
        Err(_) => false,
    }
}

/// What the store's other enabled endpoints reserve on this host: all but
/// those another alive node runs.
pub async fn reserved_by_others(state: &AppState, host: &HostConfig, except: &str) -> Need {
    let rows = state.store.all_endpoints().await.unwrap_or_default();
    let hosts = state.store.endpoint_hosts().await.unwrap_or_default();
    let hosts = hosts.into_iter().map(|h| (h.id.clone(), h)).collect();
    reserved_among(state, host, &rows, &hosts, except).await
}

/// [`reserved_by_others`] over rows and claims already read.
async fn reserved_among(
    state: &AppState,
    host: &HostConfig,
    rows: &[DedicatedEndpoint],
    hosts: &HashMap<String, EndpointHost>,
    except: &str,
) -> Need {
    let (me, now) = (state.node.worker_id(), hearth_store::ids::now());
    let elsewhere = |id: &str| {
        hosts
            .get(id)
            .is_some_and(|h| h.held_elsewhere(&me, now, state.node.timeout_secs))
    };
    let mut total = Need::default();
    for row in rows {
        if row.id == except || !row.enabled || row.status == "deleting" || elsewhere(&row.id) {
            continue;
        }
        let Ok(Some(model)) = deployable(state, &row.project_id, &row.model_name).await else {
            continue;
        };
        if let Some(flavor) = model.flavor(host, &row.flavor_name) {
            total = total.plus(host::need(&flavor).times(row.max_replicas.max(1) as u64));
        }
    }
    total
}

/// A new engine (or encoder) for `model` sized by `flavor`, a fine-tuned
/// model's adapter merged into its weights, warmed up by one generated
/// token (one encoded input).
async fn start_replica(
    host: &HostConfig,
    model: &Deployable,
    flavor: &Flavor,
) -> Result<Replica, String> {
    let r = &flavor.resources;
    let entry = model.base.entry().clone();
    let dir = host.models_dir.clone();
    let device = hearth_engine::device::most_free(&host.devices);
    tracing::info!(
        model = %model.name,
        device = %hearth_engine::device::describe(&device),
        "starting a replica"
    );
    if let Base::Embed(_) = model.base {
        let config = BatcherConfig {
            max_waiting: r.max_active as usize,
            threads: Some(r.threads as usize),
            ..host.encoder.clone()
        };
        let precision = host.encoder_precision;
        let embed = tokio::task::spawn_blocking(move || {
            EmbedModel::start(&entry, &dir, &device, config, precision)
        })
        .await
        .map_err(|e| format!("loading the model stopped: {e}"))?
        .map_err(|e| format!("cannot load the model: {e:#}"))?;
        let ids = embed
            .tokenizer
            .encode("Hello", true)
            .map_err(|e| format!("warm-up: {e}"))?
            .get_ids()
            .to_vec();
        embed
            .encoder
            .encode(vec![ids])
            .await
            .map_err(|e| format!("warm-up: {e}"))?;
        return Ok(Replica::Embed(embed));
    }
    // A fine-tuned model: its adapter, checked against the base by the
    // shared engine's cache, is folded into this replica's weights.
    let adapter = match (&model.adapter, &model.base) {
        (Some(a), Base::Chat(base)) => {
            let files = (a.loader)()
                .await
                .map_err(|e| format!("cannot read the adapter: {e:#}"))?;
            let cache = base.engine.adapters().clone();
            let prepared = tokio::task::spawn_blocking(move || cache.prepare(&files))
                .await
                .map_err(|e| format!("reading the adapter stopped: {e}"))?
                .map_err(|e| format!("cannot use the adapter: {e:#}"))?;
            Some(prepared)
        }
        _ => None,
    };
    let config = EngineConfig {
        kv_cache_bytes: Some((r.kv_cache_mb as usize) << 20),
        max_active: r.max_active as usize,
        threads: Some(r.threads as usize),
        ..host.engine.clone()
    };
    let chat = tokio::task::spawn_blocking(move || {
        ChatModel::start_merged(&entry, &dir, &device, config, adapter.as_ref())
    })
    .await
    .map_err(|e| format!("loading the model stopped: {e}"))?
    .map_err(|e| format!("cannot load the model: {e:#}"))?;
    warm_up(&chat).await?;
    Ok(Replica::Chat(chat))
}

/// Generates one token, so the first request finds the pages touched and
/// the pool's threads started.
async fn warm_up(model: &ChatModel) -> Result<(), String> {
    let prompt_ids = model
        .tokenizer
        .encode("Hello", true)
        .map_err(|e| format!("warm-up: {e}"))?
        .get_ids()
        .to_vec();
    let request = GenerateRequest {
        id: "endpoint-warm-up".into(),
        prompt_ids,
        params: SamplingParams {
            max_tokens: Some(1),
            ..SamplingParams::default()
        },
        priority: Priority::Interactive,
        adapter: None,
        cache_scope: Some("endpoint-warm-up".into()),
        constraint: None,
    };
    let mut events = model
        .engine
        .submit_with(request, None)
        .map_err(|e| format!("warm-up: {e}"))?;
    while let Some(event) = events.recv().await {
        match event {
            TokenEvent::Finished { .. } => return Ok(()),
            TokenEvent::Error(e) => return Err(format!("warm-up: {e}")),
            _ => {}
        }
    }
    Err("warm-up: the engine stopped".into())
}

/// The names an alive node lists when it can run the row: the model
/// itself, and for a fine-tuned model (`<base>:...`) its base.
fn models_for(row: &DedicatedEndpoint) -> [&str; 2] {
    let base = row
        .model_name
        .split_once(':')
        .map_or(row.model_name.as_str(), |(base, _)| base);
    [row.model_name.as_str(), base]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_has_room_only_when_it_reports_enough_of_both() {
        let need = host::Need {
            memory: 300 << 20,
            threads: 2,
        };
        let report = |m: Option<u64>, t: Option<u64>| serde_json::json!({"endpoint_memory_free_mb": m, "endpoint_threads_free": t});
        assert!(reports_room(&report(Some(300), Some(2)), need));
        assert!(reports_room(&report(Some(4096), Some(8)), need));
        assert!(!reports_room(&report(Some(299), Some(8)), need));
        assert!(!reports_room(&report(Some(4096), Some(1)), need));
        // A node that runs no endpoints (or an older one) reports nothing.
        assert!(!reports_room(&report(None, None), need));
        assert!(!reports_room(&serde_json::json!({}), need));
    }
}
