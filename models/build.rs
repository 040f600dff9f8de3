//! With the `cuda` feature: compiles the paged-attention kernel
//! (`src/paged/paged_decode.cu`), the layer ops (`src/layer_ops.cu`) and
//! the token picks (`src/pick.cu`) to PTX with CUDA's `nvcc`, for the
//! modules of the same names to load at run time. `nvcc` comes from
//! `$CUDA_HOME/bin` (set by `scripts/cuda-env`) or the `PATH`; the PTX
//! targets `CUDA_COMPUTE_CAP` (default 75) and is JIT-compiled by the
//! driver for the GPU it runs on (that GPU's or any later architecture).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/paged/paged_decode.cu");
    println!("cargo:rerun-if-changed=src/layer_ops.cu");
    println!("cargo:rerun-if-changed=src/pick.cu");
    println!("cargo:rerun-if-changed=src/round_run.cuh");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let nvcc = std::env::var_os("CUDA_HOME")
        .map(|home| PathBuf::from(home).join("bin").join("nvcc"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "75".into());
    let cap: String = cap.chars().filter(char::is_ascii_digit).collect();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    for (source, ptx) in [
        ("src/paged/paged_decode.cu", "paged_decode.ptx"),
        ("src/layer_ops.cu", "layer_ops.ptx"),
        ("src/pick.cu", "pick.ptx"),
    ] {
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17", &format!("-arch=compute_{cap}"), "-o"])
            .arg(out_dir.join(ptx))
            .arg(source)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "running {} (the cuda feature needs CUDA's compiler: `eval \"$(scripts/cuda-env)\"`): {e}",
                    nvcc.display()
                )
            });
        assert!(status.success(), "nvcc failed on {source}");
    }
}
