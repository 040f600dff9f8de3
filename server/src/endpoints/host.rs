//! What this host can give dedicated endpoints, and the flavors a model
//! may be deployed with.
//!
//! A flavor reserves, per replica, a number of threads (the replica's own
//! rayon pool), a KV cache, a number of concurrent sequences and the memory
//! all of that takes with the weights. Flavors are derived from the host:
//! `small` a quarter of its cores, `medium` half, `large` all of them
//! (fewer when cores are few: equal thread counts are listed once). The
//! endpoints of the store together may reserve at most `--endpoint-memory-mb`
//! and `--endpoint-threads`; creation and updates that would go past them
//! are refused with what is missing.
//!
//! On a GPU host (models on a CUDA device) the flavors are `gpu-small`,
//! `gpu-medium` and `gpu-large` instead: one GPU each (`gpu_type` the
//! device's product name in lower case with dashes, e.g.
//! `nvidia-h100-80gb-hbm3`), one host thread driving it, larger KV caches
//! and more sequences; the memory accounted is the GPU's (80% of what is
//! free once the shared models are loaded, unless `--endpoint-memory-mb`).

use hearth_api::endpoints::{Flavor, FlavorResources, GPU_TYPE_CPU, REGION_LOCAL};

use crate::config::EndpointArgs;

const MIB: u64 = 1 << 20;
/// Working memory of a replica beyond its weights and KV cache (activations,
/// logits, its threads' stacks).
const REPLICA_OVERHEAD: u64 = 64 * MIB;

/// The host's resources that endpoints may reserve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    /// Bytes of memory.
    pub memory: u64,
    /// Threads.
    pub threads: usize,
    /// Cores the host has (the flavors are sized from them).
    pub cores: usize,
    /// The GPU endpoints run on (`gpu_type` of its flavors); `None`: the CPU.
    pub gpu: Option<String>,
}

impl Capacity {
    /// From the flags, defaulting to 80% of the memory available now (the
    /// GPUs' together, on GPUs) and every core. `devices` are where
    /// replicas may run (all of one kind).
    pub fn from_args(args: &EndpointArgs, devices: &[hearth_engine::Device]) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let gpu_memory = devices
            .iter()
            .map(|d| hearth_engine::device::memory_info(d).map(|(free, _)| free as u64))
            .sum::<Option<u64>>();
        let device = &devices[0];
        let gpu = (!device.is_cpu()).then(|| {
            gpu_type(
                &hearth_engine::device::product_name(device)
                    .unwrap_or_else(|| hearth_engine::device::describe(device)),
            )
        });
        let memory = match args.endpoint_memory_mb {
            Some(mb) => mb.saturating_mul(MIB),
            None => gpu_memory
                .or_else(available_memory)
                .map_or(4 << 30, |m| m / 10 * 8),
        };
        Self {
            memory,
            threads: args.endpoint_threads.unwrap_or(cores),
            cores,
            gpu,
        }
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes (Linux); `None` elsewhere.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// What deploying one replica of a model takes, before the flavor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelFootprint {
    /// Bytes of the weights as loaded (an adapter merged into them turns
    /// its layers into Q8_0: counted as twice the file).
    pub weights: u64,
    /// Bytes of KV cache one sequence of the full context needs (the
    /// least a replica's pool holds).
    pub min_kv: u64,
    /// An encoder: no KV cache; `max_active` bounds its queue.
    pub encoder: bool,
}

/// What one replica of a flavor reserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Need {
    pub memory: u64,
    pub threads: usize,
}

impl Need {
    pub fn times(self, n: u64) -> Self {
        Self {
            memory: self.memory * n,
            threads: self.threads * n as usize,
        }
    }

    pub fn plus(self, other: Self) -> Self {
        Self {
            memory: self.memory + other.memory,
            threads: self.threads + other.threads,
        }
    }
}

/// (name, share of the cores in quarters, KV cache in MiB, sequences)
const SIZES: [(&str, usize, u64, u32); 3] = [
    ("small", 1, 128, 8),
    ("medium", 2, 256, 16),
    ("large", 4, 512, 32),
];

/// On a GPU: (name, KV cache in MiB, sequences); one host thread each.
const GPU_SIZES: [(&str, u64, u32); 3] = [
    ("small", 2048, 16),
    ("medium", 8192, 64),
    ("large", 32768, 128),
];

/// `gpu_type` from a product name: `NVIDIA H100 80GB HBM3` ->
/// `nvidia-h100-80gb-hbm3`.
pub fn gpu_type(product: &str) -> String {
    product
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect::<Vec<_>>()
        .join("-")
}

/// The flavors of a model on this host: those whose reservation fits the
/// capacity at all.
pub fn flavors(capacity: &Capacity, model: &ModelFootprint) -> Vec<Flavor> {
    if let Some(gpu) = &capacity.gpu {
        return GPU_SIZES
            .iter()
            .map(|&(name, kv_mb, max_active)| Flavor {
                flavor_name: format!("gpu-{name}"),
                gpu_type: Some(gpu.clone()),
                gpu_count: 1,
                regions: vec![REGION_LOCAL.to_string()],
                resources: resources(1, kv_mb, max_active, model),
            })
            .filter(|f| f.resources.memory_mb * MIB <= capacity.memory && capacity.threads >= 1)
            .collect();
    }
    let mut out: Vec<Flavor> = Vec::new();
    for (name, quarters, kv_mb, max_active) in SIZES {
        let threads = (capacity.cores * quarters / 4).max(1);
        if let Some(same) = out
            .iter_mut()
            .find(|f| f.resources.threads as usize == threads)
        {
            // Fewer cores than sizes: the larger size of equal threads wins.
            same.flavor_name = format!("{GPU_TYPE_CPU}-{name}");
            same.resources = resources(threads, kv_mb, max_active, model);
            continue;
        }
        out.push(Flavor {
            flavor_name: format!("{GPU_TYPE_CPU}-{name}"),
            gpu_type: Some(GPU_TYPE_CPU.to_string()),
            gpu_count: 0,
            regions: vec![REGION_LOCAL.to_string()],
            resources: resources(threads, kv_mb, max_active, model),
        });
    }
    out.retain(|f| {
        (f.resources.threads as usize) <= capacity.threads
            && f.resources.memory_mb * MIB <= capacity.memory
    });
    out
}

fn resources(
    threads: usize,
    kv_mb: u64,
    max_active: u32,
    model: &ModelFootprint,
) -> FlavorResources {
    let kv = if model.encoder {
        0
    } else {
        (kv_mb * MIB).max(model.min_kv)
    };
    let memory = model.weights + kv + REPLICA_OVERHEAD;
    FlavorResources {
        threads: threads as u32,
        kv_cache_mb: kv.div_ceil(MIB),
        max_active,
        memory_mb: memory.div_ceil(MIB),
    }
}

/// What one replica of `flavor` reserves.
pub fn need(flavor: &Flavor) -> Need {
    Need {
        memory: flavor.resources.memory_mb * MIB,
        threads: flavor.resources.threads as usize,
    }
}

/// Why `wanted` does not fit beside `reserved`, or `None` when it does.
pub fn shortfall(capacity: &Capacity, reserved: Need, wanted: Need) -> Option<String> {
    let total = reserved.plus(wanted);
    let mut missing = Vec::new();
    if total.memory > capacity.memory {
        missing.push(format!(
            "{} MiB of memory more (it needs {} MiB; {} MiB of the {} MiB set aside for endpoints are reserved)",
            (total.memory - capacity.memory).div_ceil(MIB),
            wanted.memory.div_ceil(MIB),
            reserved.memory.div_ceil(MIB),
            capacity.memory / MIB,
        ));
    }
    if total.threads > capacity.threads {
        missing.push(format!(
            "{} threads more (it needs {}; {} of the {} set aside for endpoints are reserved)",
            total.threads - capacity.threads,
            wanted.threads,
            reserved.threads,
            capacity.threads,
        ));
    }
    (!missing.is_empty()).then(|| missing.join(" and "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(cores: usize, memory_mb: u64) -> Capacity {
        Capacity {
            memory: memory_mb * MIB,
            threads: cores,
            cores,
            gpu: None,
        }
    }

    const SMALL_MODEL: ModelFootprint = ModelFootprint {
        weights: 100 * MIB,
        min_kv: 200 * MIB,
        encoder: false,
    };

    #[test]
    fn flavors_follow_the_cores() {
        let names = |c: &Capacity| -> Vec<(String, u32)> {
            flavors(c, &SMALL_MODEL)
                .into_iter()
                .map(|f| (f.flavor_name, f.resources.threads))
                .collect()
        };
        assert_eq!(
            names(&cap(16, 1 << 20)),
            [
                ("cpu-small".into(), 4),
                ("cpu-medium".into(), 8),
                ("cpu-large".into(), 16)
            ]
        );
        // Two cores: a quarter and a half are both one thread.
        assert_eq!(
            names(&cap(2, 1 << 20)),
            [("cpu-medium".into(), 1), ("cpu-large".into(), 2)]
        );
    }

    #[test]
    fn a_flavor_holds_at_least_one_full_context_and_counts_everything() {
        let f = &flavors(&cap(16, 1 << 20), &SMALL_MODEL)[0];
        // 128 MiB asked, 200 MiB needed for one context.
        assert_eq!(f.resources.kv_cache_mb, 200);
        assert_eq!(f.resources.memory_mb, 100 + 200 + 64);
        assert_eq!(f.gpu_type.as_deref(), Some("cpu"));
        assert_eq!(f.regions, ["local"]);
    }

    #[test]
    fn flavors_that_cannot_fit_are_not_offered() {
        // 400 MiB: only the small flavor (364 MiB) fits.
        let fl = flavors(&cap(16, 400), &SMALL_MODEL);
        assert_eq!(fl.len(), 1);
        assert_eq!(fl[0].flavor_name, "cpu-small");
        let fl = flavors(
            &Capacity {
                threads: 8,
                ..cap(16, 1 << 20)
            },
            &SMALL_MODEL,
        );
        assert_eq!(fl.last().unwrap().flavor_name, "cpu-medium");
    }

    #[test]
    fn a_gpu_host_offers_gpu_flavors_within_its_memory() {
        assert_eq!(gpu_type("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
        let c = Capacity {
            gpu: Some(gpu_type("NVIDIA H200")),
            ..cap(16, 12 * 1024)
        };
        let fl = flavors(&c, &SMALL_MODEL);
        let names: Vec<&str> = fl.iter().map(|f| f.flavor_name.as_str()).collect();
        // 12 GiB: small (2 GiB of cache) and medium (8 GiB) fit, large not.
        assert_eq!(names, ["gpu-small", "gpu-medium"]);
        let f = &fl[1];
        assert_eq!(f.gpu_type.as_deref(), Some("nvidia-h200"));
        assert_eq!(f.gpu_count, 1);
        assert_eq!(f.resources.threads, 1);
        assert_eq!(f.resources.kv_cache_mb, 8192);
        assert_eq!(f.resources.memory_mb, 100 + 8192 + 64);
    }

    #[test]
    fn shortfall_names_what_is_missing() {
        let c = cap(4, 1000);
        let one = Need {
            memory: 400 * MIB,
            threads: 2,
        };
        assert_eq!(shortfall(&c, Need::default(), one), None);
        assert_eq!(shortfall(&c, one, one), None);
        let why = shortfall(&c, one.times(2), one).unwrap();
        assert!(why.contains("200 MiB of memory more"), "{why}");
        assert!(why.contains("2 threads more"), "{why}");
    }
}
