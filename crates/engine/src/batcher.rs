//! The encoder batcher: embedding and rerank requests from many clients,
//! packed into forward passes under a token budget, on the model's own thread.
//!
//! Handlers call [`EncoderHandle::encode`] with the token ids of one request's
//! inputs. At most `max_waiting` requests are held (queued or being
//! encoded); one more is refused at once with [`EngineError::Overloaded`].
//! Each batch holds at most `max_batch_tokens` tokens (a batch always takes
//! at least one input) and is shared fairly between the requests in hand:
//! each takes, in arrival order, inputs up to an equal share of the budget
//! (at least one input), then what is left of the budget goes to the oldest
//! requests first. A small request that arrives behind a large one is thus
//! encoded in the next batch instead of after all of the large one's. A
//! request's inputs may be split across batches; the vectors are put back at
//! their input's index and sent once all are done. A job whose client has
//! gone (its reply receiver dropped) is dropped before its next batch.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hearth_core::EngineError;
use hearth_models::EncoderInput;
use tokio::sync::{mpsc, oneshot};

/// Something that turns a batch of token sequences (single texts, or
/// sentence pairs with segment ids) into one vector each: an embedding, or
/// a cross-encoder's score as a vector of one.
pub trait Encoder: Send + 'static {
    /// One vector per sequence, in order.
    fn encode(&mut self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>, String>;
}

/// One input of a request: token ids and, for a sentence pair, the segment
/// id of each token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodeItem {
    pub ids: Vec<u32>,
    pub type_ids: Option<Vec<u32>>,
}

impl EncodeItem {
    fn as_input(&self) -> EncoderInput<'_> {
        EncoderInput {
            ids: &self.ids,
            type_ids: self.type_ids.as_deref(),
        }
    }
}

impl From<Vec<u32>> for EncodeItem {
    fn from(ids: Vec<u32>) -> Self {
        Self {
            ids,
            type_ids: None,
        }
    }
}

/// Tunables of the batcher.
#[derive(Debug, Clone)]
pub struct BatcherConfig {
    /// Most tokens in one forward pass (one input longer than this runs alone).
    pub max_batch_tokens: usize,
    /// Requests that may be held (queued or being encoded) before new ones
    /// are refused.
    pub max_waiting: usize,
    /// Threads of the encoder's own pool; `None`: rayon's global pool.
    pub threads: Option<usize>,
}

impl Default for BatcherConfig {
    fn default() -> Self {
        Self {
            max_batch_tokens: 8192,
            max_waiting: 256,
            threads: None,
        }
    }
}

type Reply = oneshot::Sender<Result<Vec<Vec<f32>>, EngineError>>;

struct Job {
    inputs: Vec<EncodeItem>,
    reply: Reply,
    _held: Held,
}

/// One request counted against `max_waiting` until its job is dropped
/// (answered, failed, or abandoned).
struct Held(Arc<AtomicUsize>);

impl Held {
    /// Counts one more request, or `None` when `limit` are already held.
    fn take(count: &Arc<AtomicUsize>, limit: usize) -> Option<Self> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(count.clone()))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A cheap, cloneable handle to a running batcher.
#[derive(Clone)]
pub struct EncoderHandle {
    tx: mpsc::Sender<Job>,
    max_waiting: usize,
    held: Arc<AtomicUsize>,
    _thread: Arc<std::thread::JoinHandle<()>>,
}

impl EncoderHandle {
    /// Starts the batcher loop on its own OS thread.
    pub fn start<E: Encoder>(encoder: E, config: BatcherConfig) -> Self {
        let max_waiting = config.max_waiting.max(1);
        let (tx, rx) = mpsc::channel(max_waiting);
        let thread = std::thread::Builder::new()
            .name("hearth-encoder".into())
            .spawn(move || {
                crate::threads::run_on_pool(config.threads, "hearth-encoder", move || {
                    run(encoder, config, rx)
                })
            })
            .expect("spawning the encoder thread");
        Self {
            tx,
            max_waiting,
            held: Arc::new(AtomicUsize::new(0)),
            _thread: Arc::new(thread),
        }
    }

    /// Queues one request's inputs; resolves to one vector per input, in order.
    /// Refused at once when the queue is full. Dropping the future abandons
    /// the work.
    pub async fn encode(&self, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, EngineError> {
        self.encode_items(inputs.into_iter().map(EncodeItem::from).collect())
            .await
    }

    /// [`EncoderHandle::encode`] for inputs that may be sentence pairs.
    pub async fn encode_items(
        &self,
        inputs: Vec<EncodeItem>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let held = Held::take(&self.held, self.max_waiting)
            .ok_or(EngineError::Overloaded(self.max_waiting))?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .try_send(Job {
                inputs,
                reply,
                _held: held,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => EngineError::Overloaded(self.max_waiting),
                mpsc::error::TrySendError::Closed(_) => EngineError::Stopped,
            })?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }
}

/// A job being worked on: its inputs, the vectors done so far, and the next
/// input to schedule.
struct Active {
    job: Job,
    done: Vec<Option<Vec<f32>>>,
    next: usize,
    remaining: usize,
}

impl Active {
    fn new(job: Job) -> Self {
        let n = job.inputs.len();
        Self {
            job,
            done: vec![None; n],
            next: 0,
            remaining: n,
        }
    }
}

/// One input of a batch: which active job and which of its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub job: usize,
    pub input: usize,
}

/// Picks the next batch from jobs' input lengths (`jobs[j][i]`: tokens of
/// input `i` of job `j`, starting at `next[j]`) under `budget` tokens, and
/// advances `next`. First each job with inputs left takes, in order, inputs
/// up to an equal share of the budget (at least one input while the batch
/// has room); then the budget's rest goes to the jobs in order. A job's
/// inputs are taken in order; an input that does not fit passes the turn to
/// the next job. Always at least one input when any is left.
pub fn plan_batch(jobs: &[&[usize]], next: &mut [usize], budget: usize) -> Vec<Slot> {
    let waiting = jobs
        .iter()
        .zip(next.iter())
        .filter(|(lens, n)| **n < lens.len())
        .count();
    let mut slots = Vec::new();
    if waiting == 0 {
        return slots;
    }
    let share = (budget / waiting).max(1);
    let mut tokens = 0;
    for pass_share in [Some(share), None] {
        for (j, lens) in jobs.iter().enumerate() {
            let mut mine = 0;
            while next[j] < lens.len() {
                let len = lens[next[j]];
                let fits = slots.is_empty() || tokens + len <= budget;
                let within_share = match pass_share {
                    Some(share) => mine == 0 || mine + len <= share,
                    None => true,
                };
                if !fits || !within_share {
                    break;
                }
                tokens += len;
                mine += len;
                slots.push(Slot {
                    job: j,
                    input: next[j],
                });
                next[j] += 1;
            }
        }
    }
    slots
}

fn run<E: Encoder>(mut encoder: E, config: BatcherConfig, mut rx: mpsc::Receiver<Job>) {
    let budget = config.max_batch_tokens.max(1);
    let mut active: VecDeque<Active> = VecDeque::new();
    loop {
        // Drop the work of clients that left.
        active.retain(|a| !a.job.reply.is_closed());
        // Take every queued job (at most `max_waiting` are held), so that
        // the next batch is shared with the ones that just came.
        loop {
            let job = if active.is_empty() {
                match rx.blocking_recv() {
                    Some(job) => job,
                    None => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            };
            if job.reply.is_closed() {
                continue;
            }
            active.push_back(Active::new(job));
        }
        let lens: Vec<Vec<usize>> = active
            .iter()
            .map(|a| a.job.inputs.iter().map(|i| i.ids.len()).collect())
            .collect();
        let lens_ref: Vec<&[usize]> = lens.iter().map(Vec::as_slice).collect();
        let mut next: Vec<usize> = active.iter().map(|a| a.next).collect();
        let slots = plan_batch(&lens_ref, &mut next, budget);
        if slots.is_empty() {
            continue;
        }
        for (a, n) in active.iter_mut().zip(&next) {
            a.next = *n;
        }
        let batch: Vec<EncoderInput<'_>> = slots
            .iter()
            .map(|s| active[s.job].job.inputs[s.input].as_input())
            .collect();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| encoder.encode(&batch)))
            .unwrap_or_else(|_| Err("the encoder panicked".to_string()))
            .and_then(|v| {
                if v.len() == batch.len() {
                    Ok(v)
                } else {
                    Err(format!("{} vectors for {} inputs", v.len(), batch.len()))
                }
            });
        match result {
            Ok(vectors) => {
                for (slot, vector) in slots.iter().zip(vectors) {
                    let a = &mut active[slot.job];
                    a.done[slot.input] = Some(vector);
                    a.remaining -= 1;
                }
            }
            Err(message) => {
                tracing::error!(%message, "encoder batch failed");
                let mut failed: Vec<usize> = slots.iter().map(|s| s.job).collect();
                failed.sort_unstable();
                failed.dedup();
                for j in failed.into_iter().rev() {
                    if let Some(a) = active.remove(j) {
                        let _ = a.job.reply.send(Err(EngineError::Model(message.clone())));
                    }
                }
                continue;
            }
        }
        // Answer finished jobs (anywhere: a batch is shared between jobs).
        let mut i = 0;
        while i < active.len() {
            if active[i].remaining > 0 {
                i += 1;
                continue;
            }
            let a = active.remove(i).expect("in range");
            let vectors = a.done.into_iter().map(Option::unwrap_or_default).collect();
            let _ = a.job.reply.send(Ok(vectors));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_shares_the_budget_then_fills_it_in_order() {
        let a = [3, 4, 5];
        let b = [2, 9];
        let jobs: Vec<&[usize]> = vec![&a, &b];
        let mut next = vec![0, 0];
        // A share of 5 each: 3 from the first job, 2 from the second; then
        // the rest of the budget goes to the first job.
        let s1 = plan_batch(&jobs, &mut next, 10);
        assert_eq!(
            s1,
            vec![
                Slot { job: 0, input: 0 },
                Slot { job: 1, input: 0 },
                Slot { job: 0, input: 1 }
            ]
        );
        // 5 fits, 9 does not fit beside it.
        let s2 = plan_batch(&jobs, &mut next, 10);
        assert_eq!(s2, vec![Slot { job: 0, input: 2 }]);
        // An input over the budget runs alone.
        let s3 = plan_batch(&jobs, &mut next, 5);
        assert_eq!(s3, vec![Slot { job: 1, input: 1 }]);
        assert!(plan_batch(&jobs, &mut next, 5).is_empty());
    }

    #[test]
    fn a_small_job_behind_a_large_one_is_in_the_next_batch() {
        let large = [10; 100];
        let small = [5];
        let jobs: Vec<&[usize]> = vec![&large, &small];
        let mut next = vec![3, 0];
        let s = plan_batch(&jobs, &mut next, 100);
        assert!(s.contains(&Slot { job: 1, input: 0 }), "{s:?}");
        // The budget is still filled: 9 inputs of the large job beside it.
        assert_eq!(s.iter().filter(|x| x.job == 0).count(), 9);
        assert_eq!(next, vec![12, 1]);
        // Alone, a job takes the whole budget.
        let mut next = vec![0];
        assert_eq!(plan_batch(&[&large], &mut next, 100).len(), 10);
    }

    /// Encodes a sequence as [first id, length, batch size] and records batches.
    struct Fake {
        batches: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl Encoder for Fake {
        fn encode(&mut self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>, String> {
            self.batches.lock().unwrap().push(batch.len());
            if batch.iter().any(|s| s.ids.first() == Some(&666)) {
                return Err("bad input".into());
            }
            Ok(batch
                .iter()
                .map(|s| vec![s.ids[0] as f32, s.ids.len() as f32, batch.len() as f32])
                .collect())
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn inputs_split_across_batches_come_back_in_order() {
        let batches = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handle = EncoderHandle::start(
            Fake {
                batches: batches.clone(),
            },
            BatcherConfig {
                max_batch_tokens: 8,
                max_waiting: 16,
                threads: None,
            },
        );
        let inputs: Vec<Vec<u32>> = (0..10).map(|i| vec![i; (i % 3 + 1) as usize]).collect();
        let out = rt().block_on(handle.encode(inputs.clone())).unwrap();
        assert_eq!(out.len(), 10);
        for (i, v) in out.iter().enumerate() {
            assert_eq!(v[0], i as f32);
            assert_eq!(v[1], inputs[i].len() as f32);
        }
        let batches = batches.lock().unwrap();
        assert!(batches.len() > 1, "split into several batches: {batches:?}");
    }

    #[test]
    fn concurrent_requests_share_batches_and_errors_stay_per_batch() {
        let batches = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handle = EncoderHandle::start(
            Fake {
                batches: batches.clone(),
            },
            BatcherConfig {
                max_batch_tokens: 1000,
                max_waiting: 64,
                threads: None,
            },
        );
        let results = rt().block_on(async {
            let tasks: Vec<_> = (0..16u32)
                .map(|r| {
                    let h = handle.clone();
                    tokio::spawn(async move { h.encode(vec![vec![r, 1], vec![r + 100]]).await })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap().unwrap());
            }
            out
        });
        for (r, v) in results.iter().enumerate() {
            assert_eq!(v[0][..2], [r as f32, 2.0]);
            assert_eq!(v[1][..2], [r as f32 + 100.0, 1.0]);
        }
        let failed = rt().block_on(handle.encode(vec![vec![666]]));
        assert!(matches!(failed, Err(EngineError::Model(_))));
        let ok = rt().block_on(handle.encode(vec![vec![7]])).unwrap();
        assert_eq!(ok[0][0], 7.0);
    }

    #[test]
    fn work_of_a_departed_client_is_dropped() {
        struct Recording(Arc<std::sync::Mutex<Vec<u32>>>);
        impl Encoder for Recording {
            fn encode(&mut self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>, String> {
                std::thread::sleep(std::time::Duration::from_millis(100));
                self.0
                    .lock()
                    .unwrap()
                    .extend(batch.iter().map(|s| s.ids[0]));
                Ok(vec![vec![0.0]; batch.len()])
            }
        }
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handle = EncoderHandle::start(
            Recording(seen.clone()),
            BatcherConfig {
                max_batch_tokens: 1,
                max_waiting: 8,
                threads: None,
            },
        );
        rt().block_on(async {
            let h = handle.clone();
            let first = tokio::spawn(async move { h.encode(vec![vec![1]]).await });
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            // Queued behind the first, then abandoned before its turn.
            let h = handle.clone();
            let gone = tokio::spawn(async move { h.encode(vec![vec![2], vec![2]]).await });
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            gone.abort();
            let _ = gone.await;
            first.await.unwrap().unwrap();
            handle.encode(vec![vec![3]]).await.unwrap();
        });
        assert_eq!(*seen.lock().unwrap(), vec![1, 3]);
    }

    #[test]
    fn a_small_request_is_answered_before_a_large_one_ahead_of_it() {
        struct Slow;
        impl Encoder for Slow {
            fn encode(&mut self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>, String> {
                std::thread::sleep(std::time::Duration::from_millis(20));
                Ok(batch.iter().map(|s| vec![s.ids[0] as f32]).collect())
            }
        }
        let handle = EncoderHandle::start(
            Slow,
            BatcherConfig {
                max_batch_tokens: 4,
                max_waiting: 8,
                threads: None,
            },
        );
        let order = rt().block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let h = handle.clone();
            let t = tx.clone();
            // 40 batches of work when alone.
            tokio::spawn(async move {
                let out = h.encode((0..160).map(|i| vec![i]).collect()).await;
                t.send(("large", out)).unwrap();
            });
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let h = handle.clone();
            tokio::spawn(async move {
                let out = h.encode(vec![vec![7]]).await;
                tx.send(("small", out)).unwrap();
            });
            let mut order = Vec::new();
            while let Some((name, out)) = rx.recv().await {
                let out = out.unwrap();
                if name == "large" {
                    assert_eq!(out.len(), 160);
                    assert_eq!(out[159], vec![159.0]);
                } else {
                    assert_eq!(out, vec![vec![7.0]]);
                }
                order.push(name);
            }
            order
        });
        assert_eq!(order, vec!["small", "large"]);
    }

    #[test]
    fn full_queue_is_refused() {
        struct Slow;
        impl Encoder for Slow {
            fn encode(&mut self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>, String> {
                std::thread::sleep(std::time::Duration::from_millis(200));
                Ok(vec![vec![0.0]; batch.len()])
            }
        }
        let handle = EncoderHandle::start(
            Slow,
            BatcherConfig {
                max_batch_tokens: 1,
                max_waiting: 1,
                threads: None,
            },
        );
        let outcomes = rt().block_on(async {
            let tasks: Vec<_> = (0..6)
                .map(|_| {
                    let h = handle.clone();
                    tokio::spawn(async move { h.encode(vec![vec![1]]).await })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        assert!(outcomes
            .iter()
            .any(|o| matches!(o, Err(EngineError::Overloaded(1)))));
        assert!(outcomes.iter().any(|o| o.is_ok()));
    }
}
