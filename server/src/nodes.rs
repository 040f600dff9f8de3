//! This node in the store's registry of nodes (`hearth_store::nodes`):
//! registered when the server starts listening, a heartbeat with its free
//! capacity every `--node-heartbeat-secs`, and removed on a clean shutdown.
//! A node silent for `--node-timeout-secs` is shown as gone by
//! `GET /v1/admin/nodes`; after ten timeouts any node removes its row.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use crate::state::AppState;

/// How this node names itself to the others.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// This node's id in the store's registry and in the claims of the
    /// work it runs (default: the host name and a random suffix, made once
    /// and kept in `<data-dir>/node-id`, so a restarted node takes its own
    /// work back at once). Nodes sharing a data folder need their own.
    #[arg(long, env = "HEARTH_NODE_ID")]
    pub node_id: Option<String>,
    /// The URL other nodes and load balancers reach this node's API at
    /// (default: `http://HOST:PORT` when `--host` is a specific address).
    #[arg(long, env = "HEARTH_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// Seconds between heartbeats.
    #[arg(long, env = "HEARTH_NODE_HEARTBEAT_SECS", default_value_t = 5)]
    pub node_heartbeat_secs: u64,
    /// Seconds without a heartbeat after which a node is gone.
    #[arg(long, env = "HEARTH_NODE_TIMEOUT_SECS", default_value_t = 30)]
    pub node_timeout_secs: u64,
}

impl Default for NodeArgs {
    fn default() -> Self {
        Self {
            node_id: None,
            advertise_url: None,
            node_heartbeat_secs: 5,
            node_timeout_secs: 30,
        }
    }
}

/// This node's id and the liveness timeout, as the handlers need them.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub id: Arc<str>,
    pub timeout_secs: i64,
}

impl Default for NodeIdentity {
    fn default() -> Self {
        Self {
            id: "".into(),
            timeout_secs: 30,
        }
    }
}

impl NodeIdentity {
    /// The name this node's workers claim work under: its id (`hearth`
    /// for a state made without one, as in tests).
    pub fn worker_id(&self) -> String {
        if self.id.is_empty() {
            "hearth".to_string()
        } else {
            self.id.to_string()
        }
    }
}

impl NodeArgs {
    /// This node's id (`--node-id`, else the one kept in `data_dir`) and
    /// timeout.
    pub fn identity(&self, data_dir: &Path) -> NodeIdentity {
        let id = self
            .node_id
            .clone()
            .filter(|id| !id.trim().is_empty())
            .unwrap_or_else(|| kept_node_id(data_dir));
        NodeIdentity {
            id: id.into(),
            timeout_secs: self.node_timeout_secs.max(1) as i64,
        }
    }
}

/// The id in `<data_dir>/node-id`, written there first when there is none:
/// the host name and six random hex digits. When the file cannot be
/// written the id is used for this run only (and said so).
fn kept_node_id(data_dir: &Path) -> String {
    use std::io::Write;
    let path = data_dir.join("node-id");
    let read = || {
        std::fs::read_to_string(&path)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    if let Some(id) = read() {
        return id;
    }
    let id = fresh_node_id();
    let created = std::fs::create_dir_all(data_dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
    });
    match created {
        Ok(mut file) => {
            if let Err(e) = file.write_all(format!("{id}\n").as_bytes()) {
                tracing::warn!("cannot keep the node id in {}: {e}", path.display());
            }
            id
        }
        // Another process on this folder was first: its id is ours.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::thread::sleep(Duration::from_millis(50));
            read().unwrap_or(id)
        }
        Err(e) => {
            tracing::warn!(
                "cannot keep the node id in {}: {e}; `{id}` is this run's only",
                path.display()
            );
            id
        }
    }
}

/// The host name and six random hex digits.
fn fresh_node_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_string());
    format!("{host}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// This node's free capacity now: its chat engines' sequences and KV cache
/// blocks, summed, and its image queues.
pub fn capacity(state: &AppState) -> Value {
    let (mut running, mut waiting, mut used, mut total) = (0, 0, 0, 0);
    for m in state.chat.values() {
        let s = m.engine.snapshot();
        running += s.active;
        waiting += s.waiting;
        used += s.blocks_in_use;
        total += s.blocks_total;
    }
    let images_waiting: usize = state
        .images
        .values()
        .map(|m| {
            let s = m.snapshot();
            s.waiting + s.running
        })
        .sum();
    let room = state.endpoints.room();
    json!({
        "endpoint_memory_free_mb": room.map(|r| r.memory >> 20),
        "endpoint_threads_free": room.map(|r| r.threads),
        "sequences_running": running,
        "sequences_waiting": waiting,
        "kv_blocks_free": total - used.min(total),
        "kv_blocks_total": total,
        "image_requests": images_waiting,
    })
}

/// Tells the usage ledger how many alive nodes share the quotas.
async fn count_alive(state: &AppState) {
    if let Ok(nodes) = state.store.nodes().await {
        let now = hearth_store::ids::now();
        let alive = nodes
            .iter()
            .filter(|n| n.alive_at(now, state.node.timeout_secs))
            .count();
        state.usage.set_alive_nodes(alive.max(1));
    }
}

/// The registration's heartbeat task; [`Heartbeat::stop`] removes the row.
pub struct Heartbeat {
    task: tokio::task::JoinHandle<()>,
    state: AppState,
}

/// Registers this node (listening on `addr`) and starts its heartbeat.
pub async fn register(state: &AppState, args: &NodeArgs, addr: std::net::SocketAddr) -> Heartbeat {
    let url = args
        .advertise_url
        .clone()
        .or_else(|| (!addr.ip().is_unspecified()).then(|| format!("http://{addr}")));
    let row = Row { url };
    let id = state.node.id.clone();
    match row.write(state).await {
        Ok(()) => tracing::info!(node = %id, url = ?row.url, "registered in the store's nodes"),
        Err(e) => tracing::warn!(node = %id, "cannot register this node: {e}"),
    }
    count_alive(state).await;
    let every = Duration::from_secs(args.node_heartbeat_secs.max(1));
    let forget_after = state.node.timeout_secs * 10;
    let task = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let models = serving(&state);
                match state
                    .store
                    .node_heartbeat(&id, &models, &capacity(&state))
                    .await
                {
                    Ok(true) => {}
                    // Forgotten as dead (a long pause): register again.
                    Ok(false) => {
                        if let Err(e) = row.write(&state).await {
                            tracing::warn!(node = %id, "cannot register this node again: {e}");
                        }
                    }
                    Err(e) => tracing::warn!(node = %id, "node heartbeat: {e}"),
                }
                if let Err(e) = state.store.forget_dead_nodes(forget_after).await {
                    tracing::warn!("forgetting dead nodes: {e}");
                }
                count_alive(&state).await;
            }
        })
    };
    Heartbeat {
        task,
        state: state.clone(),
    }
}

/// Writes what this node serves and its capacity now, between heartbeats
/// (an endpoint just started here: other nodes forward to it at once).
pub async fn refresh(state: &AppState) {
    if state.node.id.is_empty() {
        return;
    }
    let models = serving(state);
    if let Err(e) = state
        .store
        .node_heartbeat(&state.node.id, &models, &capacity(state))
        .await
    {
        tracing::warn!("updating this node's row: {e}");
    }
}

/// What this node writes in its row besides its id, models and capacity.
struct Row {
    url: Option<String>,
}

/// What this node serves now: its models, and the routing keys of the
/// dedicated endpoints with replicas here.
fn serving(state: &AppState) -> Vec<String> {
    let mut models: Vec<String> = state.local_models().cloned().collect();
    models.extend(state.endpoints.hosted_keys());
    models.sort();
    models
}

impl Row {
    /// Registers (or re-registers) this node with its capacity now.
    async fn write(&self, state: &AppState) -> hearth_store::Result<()> {
        state
            .store
            .register_node(
                &state.node.id,
                self.url.as_deref(),
                &serving(state),
                &capacity(state),
            )
            .await
    }
}

impl Heartbeat {
    /// Stops the heartbeat and removes this node's row.
    pub async fn stop(self) {
        self.task.abort();
        if let Err(e) = self.state.store.deregister_node(&self.state.node.id).await {
            tracing::warn!("removing this node from the store: {e}");
        }
    }
}
