//! A tensor that an op keeps beside its inputs (block tables, parameters,
//! norm weights, RoPE rows), read in place by the op's CUDA launch.

use std::ops::Deref;

use candle_core::cuda_backend::cudarc::driver::CudaView;
use candle_core::cuda_backend::CudaDType;
use candle_core::{Result, Storage, Tensor};

/// `t`'s storage, held (read-locked) for as long as the launch reads it.
pub(crate) struct Table<G> {
    storage: G,
    start: usize,
    what: &'static str,
}

/// `t` for a launch; `what` names it in the error when it is not on a GPU.
pub(crate) fn table<'a>(
    t: &'a Tensor,
    what: &'static str,
) -> Table<impl Deref<Target = Storage> + 'a> {
    let (storage, layout) = t.storage_and_layout();
    Table {
        start: layout.start_offset(),
        storage,
        what,
    }
}

impl<G: Deref<Target = Storage>> Table<G> {
    /// The tensor's elements from its first, as `T`.
    pub(crate) fn view<T: CudaDType>(&self) -> Result<CudaView<'_, T>> {
        match &*self.storage {
            Storage::Cuda(s) => Ok(s.as_cuda_slice::<T>()?.slice(self.start..)),
            _ => candle_core::bail!("{} not on the GPU", self.what),
        }
    }
}
