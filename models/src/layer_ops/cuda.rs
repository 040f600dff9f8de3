//! The launches of `layer_ops.cu`'s kernels.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Tensor};

use super::{AddRmsNorm, Rotate, Rows, SwiGlu};
use crate::cuda_table::table;

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/layer_ops.ptx"));
const MODULE: &str = "hearth_layer_ops";
const THREADS: u32 = 256;

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(THREADS).max(1), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn int(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| candle_core::Error::Msg(format!("{n} past a kernel's i32")))
}

pub(super) fn add_rms_norm(
    op: &AddRmsNorm<'_>,
    (s1, x): (&CudaStorage, Rows),
    (s2, h): (&CudaStorage, Rows),
) -> Result<CudaStorage> {
    let dev = s1.device().clone();
    let xs = s1.as_cuda_slice::<f32>()?.slice(x.start..);
    let hs = s2.as_cuda_slice::<f32>()?.slice(h.start..);
    // SAFETY: the kernel writes every element.
    let out = unsafe { dev.alloc::<f32>(2 * x.rows * x.cols)? };
    let weight = table(op.weight, "add-rms-norm: weight");
    let w = weight.view::<f32>()?;
    let func = dev.get_or_load_custom_func("hearth_add_rms_norm", MODULE, PTX)?;
    let mut b = func.builder();
    let (xst, hst, rows, cols) = (int(x.stride)?, int(h.stride)?, int(x.rows)?, int(x.cols)?);
    b.arg(&xs);
    b.arg(&xst);
    b.arg(&hs);
    b.arg(&hst);
    b.arg(&w);
    b.arg(&out);
    b.arg(&rows);
    b.arg(&cols);
    b.arg(&op.eps);
    let round = i32::from(op.round);
    b.arg(&round);
    let cfg = LaunchConfig {
        grid_dim: (x.rows as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: arguments as the kernel declares them; `shapes` checked
    // the rows, columns and weight length.
    unsafe { b.launch(cfg) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

pub(super) fn swiglu(
    op: &SwiGlu,
    (s1, g): (&CudaStorage, Rows),
    (s2, u): (&CudaStorage, Rows),
) -> Result<CudaStorage> {
    let dev = s1.device().clone();
    let gs = s1.as_cuda_slice::<f32>()?.slice(g.start..);
    let us = s2.as_cuda_slice::<f32>()?.slice(u.start..);
    let n = g.rows * g.cols;
    // SAFETY: the kernel writes every element.
    let out = unsafe { dev.alloc::<f32>(n)? };
    let func = dev.get_or_load_custom_func("hearth_swiglu", MODULE, PTX)?;
    let mut b = func.builder();
    let (gst, ust, rows, cols) = (int(g.stride)?, int(u.stride)?, int(g.rows)?, int(g.cols)?);
    b.arg(&gs);
    b.arg(&gst);
    b.arg(&us);
    b.arg(&ust);
    b.arg(&out);
    b.arg(&rows);
    b.arg(&cols);
    let round = i32::from(op.round);
    b.arg(&round);
    // SAFETY: arguments as the kernel declares them.
    unsafe { b.launch(grid(n)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// The rotation's kernel over `x` into `dst` (rows `dst_row`, or in order
/// when it is 0).
#[allow(clippy::too_many_arguments)]
fn launch_rotate<T: CudaDType + DeviceRepr>(
    op: &Rotate<'_>,
    dev: &CudaDevice,
    suffix: &str,
    (s, x): (&CudaStorage, Rows),
    dst: &mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<'_, T>,
    dst_width: usize,
    head_dim: usize,
) -> Result<()> {
    let xs = s.as_cuda_slice::<f32>()?.slice(x.start..);
    let func = dev.get_or_load_custom_func(&format!("hearth_rotate_rows_{suffix}"), MODULE, PTX)?;
    let (xst, width, tokens) = (int(x.stride)?, int(dst_width)?, int(x.rows)?);
    let (heads, d, mode) = (int(op.heads)?, int(head_dim)?, op.mode());
    let n = x.rows * op.heads * head_dim / 2;
    // The tables (cos, sin, rows) are borrowed by `op`: alive through the
    // launch.
    let (cos, sin) = match &op.rope {
        Some(r) => (address(Some(r.cos))?, address(Some(r.sin))?),
        None => (0, 0),
    };
    let rows = address(op.rows)?;
    let mut b = func.builder();
    b.arg(&xs);
    b.arg(&xst);
    b.arg(&cos);
    b.arg(&sin);
    b.arg(&rows);
    b.arg(dst);
    b.arg(&width);
    b.arg(&tokens);
    b.arg(&heads);
    b.arg(&d);
    b.arg(&mode);
    // SAFETY: arguments as the kernel declares them; `head_dim` checked the
    // shapes of `x` and the tables, `pool_width` the destination's.
    unsafe { b.launch(grid(n)) }.w()?;
    Ok(())
}

/// The device address of a table's first element (f32 or u32), or 0.
fn address(t: Option<&Tensor>) -> Result<u64> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let Some(t) = t else { return Ok(0) };
    let stream = t.device().as_cuda_device()?.cuda_stream();
    let tab = table(t, "rotate: a table");
    Ok(match t.dtype() {
        candle_core::DType::F32 => tab.view::<f32>()?.device_ptr(&stream).0,
        candle_core::DType::U32 => tab.view::<u32>()?.device_ptr(&stream).0,
        other => candle_core::bail!("rotate: a table of {other:?}"),
    })
}

pub(super) fn rotate_new(
    op: &Rotate<'_>,
    (s, x): (&CudaStorage, Rows),
    d: usize,
) -> Result<CudaStorage> {
    let dev = s.device().clone();
    // SAFETY: the kernel writes every element.
    let mut out = unsafe { dev.alloc::<f32>(x.rows * x.cols)? };
    launch_rotate(op, &dev, "f32", (s, x), &mut out.slice_mut(..), x.cols, d)?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

pub(super) fn write<T: CudaDType + DeviceRepr>(
    op: &Rotate<'_>,
    suffix: &str,
    (dst, l): (&mut CudaStorage, &Layout),
    (s, x): (&CudaStorage, Rows),
    width: usize,
    d: usize,
) -> Result<()> {
    let dev = dst.device().clone();
    let mut view = dst.as_cuda_slice_mut::<T>()?.slice_mut(l.start_offset()..);
    launch_rotate(op, &dev, suffix, (s, x), &mut view, width, d)
}

pub(super) fn round_q8((s, start): (&CudaStorage, usize), runs: usize) -> Result<CudaStorage> {
    let dev = s.device().clone();
    let xs = s.as_cuda_slice::<f32>()?.slice(start..);
    // SAFETY: the kernel writes every element.
    let out = unsafe { dev.alloc::<f32>(runs * 32)? };
    let func = dev.get_or_load_custom_func("hearth_round_q8", MODULE, PTX)?;
    let mut b = func.builder();
    let n = int(runs)?;
    b.arg(&xs);
    b.arg(&out);
    b.arg(&n);
    // Eight runs (warps) per block of 256 threads.
    let cfg = LaunchConfig {
        grid_dim: ((runs as u32).div_ceil(THREADS / 32).max(1), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: arguments as the kernel declares them; `runs` checked the
    // input's length.
    unsafe { b.launch(cfg) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}
