//! Dedicated endpoints: named deployments of one model, each replica its own
//! engine (scheduler, KV pool, rayon pool) sized by a flavor.
//!
//! The store's rows are the desired state (`hearth_store::endpoints`); the
//! reconciler ([`reconcile`]) brings this node's replicas in line with them,
//! at start, every few seconds and when a route changes a row. The
//! [`Endpoints`] registry is what requests see: an endpoint's routing key
//! resolves to its least-loaded running replica, only for its own project.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use hearth_api::endpoints::{EndpointObject, Scaling, OBJECT_ENDPOINT};
use hearth_api::ApiError;
use hearth_engine::{
    BatcherConfig, ChatModel, EmbedModel, EncoderPrecision, EngineConfig, LoadedAdapter,
};
use hearth_store::DedicatedEndpoint;
use tokio::sync::Notify;

pub mod host;
pub mod reconcile;
pub mod templates;

pub use host::Capacity;

/// What a node needs to start replicas (set once by `serve`).
#[derive(Clone)]
pub struct HostConfig {
    pub models_dir: PathBuf,
    /// The shared engines' settings; a replica's flavor replaces the
    /// threads, KV cache and concurrency.
    pub engine: EngineConfig,
    pub capacity: Capacity,
    /// The shared encoders' batcher settings; a replica's flavor sets its
    /// threads and queue.
    pub encoder: BatcherConfig,
    pub encoder_precision: EncoderPrecision,
    /// Where replicas may run (each new one on the device with the most
    /// free memory; all of one kind, `--endpoint-devices`).
    pub devices: Vec<hearth_engine::Device>,
    /// How long an endpoint above `min_replicas` must be idle before it
    /// drops a replica.
    pub scale_down_after: std::time::Duration,
    /// How long a replica taken out of service (delete, update, scale-down,
    /// stop) may finish its requests before its engine is stopped.
    pub drain_deadline: std::time::Duration,
}

/// One running replica: its own engine (a fine-tuned model's adapter
/// merged into its weights), or its own encoder batcher.
pub enum Replica {
    Chat(ChatModel),
    Embed(EmbedModel),
}

impl Replica {
    /// Running and waiting requests (0 for an encoder, whose queue is not
    /// counted).
    fn load(&self) -> usize {
        match self {
            Replica::Chat(model) => {
                model.engine.active_sequences() + model.engine.waiting_requests()
            }
            Replica::Embed(_) => 0,
        }
    }

    fn waiting(&self) -> usize {
        match self {
            Replica::Chat(model) => model.engine.waiting_requests(),
            Replica::Embed(_) => 0,
        }
    }

    /// Lets the replica finish its requests for at most `deadline`, then
    /// stops its engine (the rest end with 503) so that its memory goes
    /// even while a request still holds it. An encoder replica goes when
    /// its last request does.
    fn retire(self: Arc<Self>, deadline: std::time::Duration) {
        let Replica::Chat(_) = &*self else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let start = std::time::Instant::now();
            while self.load() > 0 && start.elapsed() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            if let Replica::Chat(model) = &*self {
                if self.load() > 0 {
                    tracing::info!("drain deadline passed: stopping a replica with requests");
                }
                model.engine.stop();
            }
        });
    }

    /// The engine's counters (chat replicas).
    pub fn snapshot(&self) -> Option<hearth_engine::EngineSnapshot> {
        match self {
            Replica::Chat(model) => Some(model.engine.snapshot()),
            Replica::Embed(_) => None,
        }
    }
}

/// An endpoint as this node runs it.
pub struct Live {
    pub id: String,
    pub project_id: String,
    pub routing_key: String,
    /// The row's generation last taken up (loaded, or failed to).
    pub generation: Mutex<i64>,
    replicas: RwLock<Vec<Arc<Replica>>>,
    next: AtomicUsize,
    /// How long a retired replica may finish its requests.
    drain: std::time::Duration,
    /// Since when no replica has had a request (for scaling down).
    idle_since: Mutex<Option<std::time::Instant>>,
    /// Replicas serving on the node that runs the endpoint, when that is
    /// another node (0 here otherwise).
    pub(crate) elsewhere: AtomicUsize,
}

impl Live {
    fn new(row: &DedicatedEndpoint, drain: std::time::Duration) -> Self {
        Self {
            id: row.id.clone(),
            project_id: row.project_id.clone(),
            routing_key: row.routing_key.clone(),
            generation: Mutex::new(0),
            replicas: RwLock::default(),
            next: AtomicUsize::new(0),
            drain,
            idle_since: Mutex::new(None),
            elsewhere: AtomicUsize::new(0),
        }
    }

    /// Replicas serving now.
    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        self.replicas.read().unwrap().clone()
    }

    /// Puts `replica` at `index` (the one there stops once its requests
    /// are done), or at the end.
    pub(crate) fn set_replica(&self, index: usize, replica: Replica) {
        let mut all = self.replicas.write().unwrap();
        if index < all.len() {
            let old = std::mem::replace(&mut all[index], Arc::new(replica));
            old.retire(self.drain);
        } else {
            all.push(Arc::new(replica));
        }
    }

    /// Keeps the first `n` replicas; the others drain and stop.
    pub(crate) fn truncate(&self, n: usize) {
        let gone: Vec<_> = {
            let mut all = self.replicas.write().unwrap();
            let n = n.min(all.len());
            all.drain(n..).collect()
        };
        for r in gone {
            r.retire(self.drain);
        }
    }

    /// Whether every replica has requests waiting for a slot (there is at
    /// least one).
    pub(crate) fn saturated(&self) -> bool {
        let all = self.replicas.read().unwrap();
        !all.is_empty() && all.iter().all(|r| r.waiting() > 0)
    }

    /// How long no replica has had a request (`None`: one has one now).
    pub(crate) fn idle_for(&self) -> Option<std::time::Duration> {
        let busy = self.replicas.read().unwrap().iter().any(|r| r.load() > 0);
        let mut since = self.idle_since.lock().unwrap();
        if busy {
            *since = None;
            return None;
        }
        Some(since.get_or_insert_with(std::time::Instant::now).elapsed())
    }

    /// The replica with the fewest running and waiting requests (ties go
    /// round).
    fn pick(&self) -> Option<Arc<Replica>> {
        let all = self.replicas.read().unwrap();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..all.len())
            .map(|i| &all[(start + i) % all.len()])
            .min_by_key(|r| r.load())
            .cloned()
    }
}

/// The registry of this node's endpoints.
#[derive(Clone, Default)]
pub struct Endpoints {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    host: OnceLock<HostConfig>,
    live: RwLock<HashMap<String, Arc<Live>>>,
    /// Endpoints whose replicas are being loaded.
    loading: Mutex<HashSet<String>>,
    wake: Notify,
    /// Held from a route's admission check to its store write, so that two
    /// requests never both take the last room.
    admission: tokio::sync::Mutex<()>,
    /// What endpoints may still reserve on this node, as of the last
    /// reconciler pass (reported to the other nodes in the heartbeat).
    room: Mutex<Option<host::Need>>,
}

impl Endpoints {
    /// A registry that can start replicas on this host.
    pub fn new(host: HostConfig) -> Self {
        let this = Self::default();
        let _ = this.inner.host.set(host);
        this
    }

    /// `None` on a state built without models (tests of other routes).
    pub fn host(&self) -> Option<&HostConfig> {
        self.inner.host.get()
    }

    /// Serializes admission checks with the writes they admit.
    pub async fn admission(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.admission.lock().await
    }

    /// Asks the reconciler to look at the store now.
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    pub(crate) async fn woken(&self) {
        self.inner.wake.notified().await
    }

    pub fn get(&self, id: &str) -> Option<Arc<Live>> {
        self.inner.live.read().unwrap().get(id).cloned()
    }

    /// The endpoint of `row`, registered if new.
    pub(crate) fn register(&self, row: &DedicatedEndpoint) -> Arc<Live> {
        let drain = self
            .host()
            .map_or(std::time::Duration::ZERO, |h| h.drain_deadline);
        let mut live = self.inner.live.write().unwrap();
        live.entry(row.id.clone())
            .or_insert_with(|| Arc::new(Live::new(row, drain)))
            .clone()
    }

    /// Forgets an endpoint: new requests no longer reach it; those in
    /// flight finish on their replica (within the drain deadline), whose
    /// engine then stops.
    pub(crate) fn remove(&self, id: &str) -> Option<Arc<Live>> {
        let live = self.inner.live.write().unwrap().remove(id)?;
        live.truncate(0);
        Some(live)
    }

    pub(crate) fn ids(&self) -> Vec<String> {
        self.inner.live.read().unwrap().keys().cloned().collect()
    }

    /// Marks `id` as loading; false when it already was.
    pub(crate) fn start_loading(&self, id: &str) -> bool {
        self.inner.loading.lock().unwrap().insert(id.to_string())
    }

    pub(crate) fn done_loading(&self, id: &str) {
        self.inner.loading.lock().unwrap().remove(id);
    }

    pub(crate) fn is_loading(&self, id: &str) -> bool {
        self.inner.loading.lock().unwrap().contains(id)
    }

    /// What endpoints may still reserve on this node (memory, threads), as
    /// of the last reconciler pass; `None` on a node that runs no endpoints.
    pub fn room(&self) -> Option<host::Need> {
        *self.inner.room.lock().unwrap()
    }

    pub(crate) fn set_room(&self, room: host::Need) {
        *self.inner.room.lock().unwrap() = Some(room);
    }

    /// Replicas serving `id` now, here or on the node that runs it.
    pub fn ready_replicas(&self, id: &str) -> usize {
        self.get(id).map_or(0, |l| {
            l.replicas.read().unwrap().len() + l.elsewhere.load(Ordering::Relaxed)
        })
    }

    /// Whether `name` is the routing key of an endpoint with replicas on
    /// this node.
    pub fn hosts_here(&self, name: &str) -> bool {
        self.inner
            .live
            .read()
            .unwrap()
            .values()
            .any(|l| l.routing_key == name && !l.replicas.read().unwrap().is_empty())
    }

    /// The routing keys of the endpoints with replicas on this node.
    pub fn hosted_keys(&self) -> Vec<String> {
        self.inner
            .live
            .read()
            .unwrap()
            .values()
            .filter(|l| !l.replicas.read().unwrap().is_empty())
            .map(|l| l.routing_key.clone())
            .collect()
    }

    /// Every registered endpoint.
    pub fn all(&self) -> Vec<Arc<Live>> {
        self.inner.live.read().unwrap().values().cloned().collect()
    }

    /// The endpoint of `project` whose routing key is `name`, if any.
    fn find(&self, project: &str, name: &str) -> Option<Arc<Live>> {
        self.inner
            .live
            .read()
            .unwrap()
            .values()
            .find(|l| l.routing_key == name && l.project_id == project)
            .cloned()
    }

    /// What `model` = `name` means for `project` on a generation route if
    /// it is a routing key: `None` when no endpoint of the project has it;
    /// the least-loaded replica; 503 shape B while none runs; 400 for an
    /// embedding endpoint.
    pub fn route(
        &self,
        project: &str,
        name: &str,
    ) -> Option<Result<(ChatModel, Option<LoadedAdapter>), ApiError>> {
        let live = self.find(project, name)?;
        Some(match live.pick().as_deref() {
            Some(Replica::Chat(model)) => Ok((model.clone(), None)),
            Some(Replica::Embed(_)) => Err(ApiError::bad_request(
                Some("model"),
                format!(
                    "`{name}` is an embedding endpoint: it serves /v1/embeddings and /v1/rerank."
                ),
            )),
            None => Err(no_replica(name)),
        })
    }

    /// [`Endpoints::route`] for `/v1/embeddings` and `/v1/rerank`.
    pub fn route_embed(&self, project: &str, name: &str) -> Option<Result<EmbedModel, ApiError>> {
        let live = self.find(project, name)?;
        Some(match live.pick().as_deref() {
            Some(Replica::Embed(model)) => Ok(model.clone()),
            Some(Replica::Chat(_)) => Err(ApiError::bad_request(
                Some("model"),
                format!("`{name}` is a chat endpoint: it serves chat, completions and responses."),
            )),
            None => Err(no_replica(name)),
        })
    }
}

fn no_replica(name: &str) -> ApiError {
    ApiError::unavailable(format!(
        "no available endpoints: the dedicated endpoint `{name}` has no running replica \
         (see its status at GET /v0/dedicated_endpoints)"
    ))
}

/// The endpoint as the API shows it.
pub fn endpoint_object(row: DedicatedEndpoint, endpoints: &Endpoints) -> EndpointObject {
    let ready = endpoints.ready_replicas(&row.id) as u32;
    EndpointObject {
        object: OBJECT_ENDPOINT.to_string(),
        ready_replicas: ready,
        endpoint_id: row.id,
        name: row.name,
        description: row.description,
        model_name: row.model_name,
        routing_key: row.routing_key,
        flavor_name: row.flavor_name,
        gpu_type: row.gpu_type,
        gpu_count: row.gpu_count.max(0) as u32,
        region: row.region,
        scaling: Scaling {
            min_replicas: row.min_replicas.max(0) as u32,
            max_replicas: row.max_replicas.max(0) as u32,
        },
        enabled: row.enabled,
        status: row.status,
        status_reason: row.status_reason,
        created_at: row.created_at,
        updated_at: row.updated_at,
        ai_project_id: row.project_id,
    }
}
