//! Which device models run on: `--device cpu|cuda[:N]|metal[:N]|auto`.
//!
//! `auto` (the default) takes the first CUDA device when the binary was
//! built with the `cuda` feature and the driver reports one, the first
//! Metal device with the `metal` feature, and the CPU otherwise. Asking for
//! a backend the binary was built without is an error that says how to
//! build it, never a silent fallback to the CPU.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

/// A device as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
    Metal(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        let (kind, ordinal) = match s.split_once(':') {
            Some((kind, n)) => {
                let n = n
                    .parse::<usize>()
                    .map_err(|_| format!("device ordinal `{n}` is not a number"))?;
                (kind, Some(n))
            }
            None => (s.as_str(), None),
        };
        match (kind, ordinal) {
            ("auto", None) => Ok(Self::Auto),
            ("cpu", None) => Ok(Self::Cpu),
            ("cuda" | "gpu", n) => Ok(Self::Cuda(n.unwrap_or(0))),
            ("metal", n) => Ok(Self::Metal(n.unwrap_or(0))),
            ("auto" | "cpu", Some(_)) => Err(format!("`{kind}` takes no ordinal")),
            _ => Err(format!(
                "unknown device `{s}`: expected cpu, cuda, cuda:N, metal, metal:N or auto"
            )),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
            Self::Metal(n) => write!(f, "metal:{n}"),
        }
    }
}

impl DeviceSpec {
    /// The device named by environment variable `var` (`cpu` when unset),
    /// opened; panics with the variable's name on a bad value (for tests
    /// and benches).
    pub fn open_from_env(var: &str) -> Device {
        let spec: Self = std::env::var(var)
            .unwrap_or_else(|_| "cpu".into())
            .parse()
            .unwrap_or_else(|e| panic!("{var}: {e}"));
        spec.open().unwrap_or_else(|e| panic!("{var}: {e:#}"))
    }

    /// True when this names `device` (same backend and ordinal).
    fn names(self, device: &Device) -> bool {
        use candle_core::DeviceLocation as L;
        match (self, device.location()) {
            (Self::Cpu, L::Cpu) => true,
            (Self::Cuda(n), L::Cuda { gpu_id }) | (Self::Metal(n), L::Metal { gpu_id }) => {
                n == gpu_id
            }
            _ => false,
        }
    }

    /// Opens the device.
    pub fn open(self) -> anyhow::Result<Device> {
        match self {
            Self::Cpu => Ok(Device::Cpu),
            Self::Auto => Ok(auto()),
            Self::Cuda(n) => cuda(n),
            Self::Metal(n) => metal(n),
        }
    }
}

#[cfg(feature = "cuda")]
fn auto() -> Device {
    if cuda_device_count() > 0 {
        match Device::new_cuda(0) {
            Ok(d) => return d,
            Err(e) => tracing::warn!(error = %e, "CUDA device 0 did not open; using the CPU"),
        }
    }
    Device::Cpu
}

#[cfg(all(feature = "metal", not(feature = "cuda")))]
fn auto() -> Device {
    match Device::new_metal(0) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "Metal device 0 did not open; using the CPU");
            Device::Cpu
        }
    }
}

#[cfg(not(any(feature = "cuda", feature = "metal")))]
fn auto() -> Device {
    Device::Cpu
}

/// CUDA devices the driver reports (0 without a driver or a GPU).
#[cfg(feature = "cuda")]
pub fn cuda_device_count() -> usize {
    use candle_core::cuda::cudarc::driver::CudaContext;
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

#[cfg(not(feature = "cuda"))]
pub fn cuda_device_count() -> usize {
    0
}

#[cfg(feature = "cuda")]
fn cuda(n: usize) -> anyhow::Result<Device> {
    let count = cuda_device_count();
    if n >= count {
        anyhow::bail!("no CUDA device {n}: the driver reports {count}");
    }
    Ok(Device::new_cuda(n)?)
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: usize) -> anyhow::Result<Device> {
    anyhow::bail!(
        "this binary was built without CUDA; build it with `cargo build --release --features cuda` (see the README's \"GPU hosts\")"
    )
}

#[cfg(feature = "metal")]
fn metal(n: usize) -> anyhow::Result<Device> {
    Ok(Device::new_metal(n)?)
}

#[cfg(not(feature = "metal"))]
fn metal(_: usize) -> anyhow::Result<Device> {
    anyhow::bail!("this binary was built without Metal; build it on macOS with `--features metal`")
}

/// The devices dedicated-endpoint replicas may run on: those `listed`
/// (`--endpoint-devices`), or else every GPU of the server's kind (each
/// CUDA device the driver reports), or the server's device alone (the CPU,
/// Metal). The server's own device is reused, not opened again. A list
/// must not mix the CPU with GPUs: flavors are either CPU or GPU flavors.
pub fn endpoint_devices(server: &Device, listed: &[DeviceSpec]) -> anyhow::Result<Vec<Device>> {
    let devices: Vec<Device> = if listed.is_empty() {
        match server.location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => (0..cuda_device_count())
                .map(|n| {
                    if n == gpu_id {
                        Ok(server.clone())
                    } else {
                        cuda(n)
                    }
                })
                .collect::<anyhow::Result<_>>()?,
            _ => vec![server.clone()],
        }
    } else {
        listed
            .iter()
            .map(|spec| match spec {
                DeviceSpec::Auto => Ok(server.clone()),
                s if s.names(server) => Ok(server.clone()),
                s => s.open(),
            })
            .collect::<anyhow::Result<_>>()?
    };
    if devices.is_empty() {
        return Ok(vec![server.clone()]);
    }
    if devices.iter().any(Device::is_cpu) && devices.iter().any(|d| !d.is_cpu()) {
        anyhow::bail!("--endpoint-devices mixes the CPU with GPUs; list one kind");
    }
    Ok(devices)
}

/// Where the next replica goes: the device with the most free memory
/// (the first of equals, and the first where none reports its memory).
pub fn most_free(devices: &[Device]) -> Device {
    let free: Vec<Option<usize>> = devices
        .iter()
        .map(|d| memory_info(d).map(|(free, _)| free))
        .collect();
    devices[index_of_most_free(&free)].clone()
}

fn index_of_most_free(free: &[Option<usize>]) -> usize {
    let mut best = 0;
    for (i, f) in free.iter().enumerate() {
        if f.unwrap_or(0) > free[best].unwrap_or(0) {
            best = i;
        }
    }
    best
}

/// Free and total memory of `device` in bytes, where the backend reports
/// them (CUDA); `None` on the CPU and Metal.
pub fn memory_info(device: &Device) -> Option<(usize, usize)> {
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        return match cuda.cuda_stream().context().mem_get_info() {
            Ok(info) => Some(info),
            Err(e) => {
                tracing::warn!("cannot read the GPU's free memory: {e}");
                None
            }
        };
    }
    let _ = device;
    None
}

/// The GPU's product name as its driver reports it (`NVIDIA H100 80GB
/// HBM3`); `None` on the CPU and where the backend does not say.
pub fn product_name(device: &Device) -> Option<String> {
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        return cuda.cuda_stream().context().name().ok();
    }
    let _ = device;
    None
}

/// A short name of `device` for logs and `/metrics`: `cpu`, `cuda:0`.
pub fn describe(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".to_string(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// KV pool bytes for a model on `device` whose weights are loaded:
/// `explicit` (`--kv-cache-mb`) when given; on a device that reports its
/// memory (CUDA), what keeps the device's use within `fraction` of its
/// memory (`--gpu-memory-fraction`, vLLM's `--gpu-memory-utilization`):
/// `fraction * total - (total - free)`, at least 0; else `None` (the
/// engine's CPU default).
pub fn kv_cache_bytes(device: &Device, explicit: Option<usize>, fraction: f64) -> Option<usize> {
    if explicit.is_some() {
        return explicit;
    }
    let (free, total) = memory_info(device)?;
    Some(kv_budget(free, total, fraction))
}

fn kv_budget(free: usize, total: usize, fraction: f64) -> usize {
    let budget = total as f64 * fraction.clamp(0.0, 1.0);
    let used = total.saturating_sub(free) as f64;
    (budget - used).max(0.0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replica_goes_where_most_memory_is_free() {
        assert_eq!(index_of_most_free(&[Some(5), Some(9), Some(9)]), 1);
        assert_eq!(index_of_most_free(&[Some(5), None, Some(2)]), 0);
        assert_eq!(index_of_most_free(&[None, None]), 0);
        assert_eq!(index_of_most_free(&[None, Some(1)]), 1);
    }

    #[test]
    fn endpoint_devices_default_to_the_servers_and_refuse_mixes() {
        let cpu = Device::Cpu;
        let all = endpoint_devices(&cpu, &[]).unwrap();
        assert_eq!(all.len(), 1);
        assert!(all[0].is_cpu());
        let listed = endpoint_devices(&cpu, &[DeviceSpec::Cpu, DeviceSpec::Auto]).unwrap();
        assert!(listed.iter().all(Device::is_cpu));
        assert!(DeviceSpec::Cpu.names(&cpu));
        assert!(!DeviceSpec::Cuda(0).names(&cpu));
        // Without a GPU (or without the feature) a listed GPU cannot open.
        if cuda_device_count() == 0 {
            let e = endpoint_devices(&cpu, &[DeviceSpec::Cuda(0)]).unwrap_err();
            assert!(e.to_string().contains("CUDA"), "{e}");
        }
        assert_eq!(most_free(&all).location(), cpu.location());
    }

    #[test]
    fn parses_every_form() {
        for (s, want) in [
            ("auto", DeviceSpec::Auto),
            ("cpu", DeviceSpec::Cpu),
            ("CPU", DeviceSpec::Cpu),
            ("cuda", DeviceSpec::Cuda(0)),
            ("cuda:3", DeviceSpec::Cuda(3)),
            ("gpu:1", DeviceSpec::Cuda(1)),
            ("metal", DeviceSpec::Metal(0)),
        ] {
            assert_eq!(s.parse::<DeviceSpec>().unwrap(), want, "{s}");
        }
        for bad in ["tpu", "cuda:x", "cpu:0", "", "cuda:-1"] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
        assert_eq!(DeviceSpec::Cuda(2).to_string(), "cuda:2");
        assert_eq!(
            "cuda:2".parse::<DeviceSpec>().unwrap().to_string(),
            "cuda:2"
        );
    }

    #[test]
    fn cpu_opens_and_reports_no_memory() {
        let d = DeviceSpec::Cpu.open().unwrap();
        assert!(d.is_cpu());
        assert_eq!(describe(&d), "cpu");
        assert_eq!(memory_info(&d), None);
        assert_eq!(kv_cache_bytes(&d, None, 0.9), None);
        assert_eq!(kv_cache_bytes(&d, Some(5), 0.9), Some(5));
    }

    #[test]
    fn kv_budget_keeps_use_within_the_fraction() {
        let gib = 1usize << 30;
        // 80 GiB card, 20 GiB in use (weights): 0.9 * 80 - 20 = 52 GiB.
        assert_eq!(kv_budget(60 * gib, 80 * gib, 0.9), 52 * gib);
        // Already past the fraction: nothing.
        assert_eq!(kv_budget(4 * gib, 80 * gib, 0.9), 0);
        assert_eq!(kv_budget(80 * gib, 80 * gib, 1.5), 80 * gib);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_build_it() {
        let e = DeviceSpec::Cuda(0).open().unwrap_err().to_string();
        assert!(e.contains("--features cuda"), "{e}");
        assert!(DeviceSpec::Auto.open().unwrap().is_cpu());
        assert_eq!(cuda_device_count(), 0);
    }
}
