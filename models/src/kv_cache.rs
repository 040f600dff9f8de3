//! Per-sequence key/value cache for decoder models.
//!
//! One [`KvCache`] belongs to one sequence. For every layer it keeps a key and
//! a value buffer of shape `[num_kv_heads, capacity, head_dim]`; new entries
//! are written in place with `slice_set` and read back as a `narrow` view, so a
//! decode step copies only its own token. When a chunk does not fit, every
//! buffer is reallocated at twice the capacity (at most `max_len`), which keeps
//! the total copying linear in the sequence length.
//!
//! The model writes a chunk into all layers through [`KvCache::append`] and
//! only then calls [`KvCache::advance`]; a forward pass that fails half way
//! leaves `len()` unchanged, and the stale entries past `len()` are simply
//! overwritten by the next chunk.

use candle_core::{DType, Device, Result, Tensor};

/// Smallest capacity allocated on first use (tokens).
const MIN_CAPACITY: usize = 64;

/// Keys and values of every layer for one sequence.
pub struct KvCache {
    /// Per layer `(keys, values)`, each `[num_kv_heads, capacity, head_dim]`;
    /// `None` until the first chunk arrives.
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
    capacity: usize,
    max_len: usize,
    num_kv_heads: usize,
    head_dim: usize,
    dtype: DType,
    device: Device,
}

impl KvCache {
    /// An empty cache; no memory is allocated until the first chunk.
    pub fn new(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        dtype: DType,
        device: &Device,
    ) -> Self {
        Self {
            layers: (0..num_layers).map(|_| None).collect(),
            len: 0,
            capacity: 0,
            max_len,
            num_kv_heads,
            head_dim,
            dtype,
            device: device.clone(),
        }
    }

    /// Number of tokens cached (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every cached token; the buffers are kept for reuse.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Keeps only the first `len` tokens (no-op if `len >= self.len()`).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Tokens that fit without reallocating.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Most tokens this cache will ever hold (the model's context length).
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Storage dtype of the keys and values.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Bytes held by the key/value buffers.
    pub fn size_in_bytes(&self) -> usize {
        let per_layer = 2 * self.num_kv_heads * self.capacity * self.head_dim;
        self.layers.iter().flatten().count() * per_layer * self.dtype.size_in_bytes()
    }

    /// Makes room for `extra` more tokens, growing every layer's buffers.
    pub(crate) fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed > self.max_len {
            candle_core::bail!(
                "sequence of {needed} tokens exceeds the context length {}",
                self.max_len
            )
        }
        if needed <= self.capacity && self.layers.iter().all(Option::is_some) {
            return Ok(());
        }
        let new_cap = needed
            .max(2 * self.capacity)
            .max(MIN_CAPACITY)
            .min(self.max_len);
        let shape = (self.num_kv_heads, new_cap, self.head_dim);
        for layer in self.layers.iter_mut() {
            let (k, v) = (
                Tensor::zeros(shape, self.dtype, &self.device)?,
                Tensor::zeros(shape, self.dtype, &self.device)?,
            );
            if let Some((old_k, old_v)) = layer.take() {
                if self.len > 0 {
                    k.slice_set(&old_k.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                    v.slice_set(&old_v.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                }
            }
            *layer = Some((k, v));
        }
        self.capacity = new_cap;
        Ok(())
    }

    /// Writes `k`, `v` (`[num_kv_heads, n, head_dim]`) of layer `layer` at
    /// positions `len()..len()+n` and returns views of all `len()+n` cached
    /// keys and values. Call [`KvCache::reserve`] first.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let n = k.dim(1)?;
        let Some((kb, vb)) = self.layers.get(layer).and_then(Option::as_ref) else {
            candle_core::bail!("kv cache has no buffers for layer {layer}")
        };
        if self.len + n > self.capacity {
            candle_core::bail!("kv cache append past its capacity, reserve first")
        }
        kb.slice_set(&k.to_dtype(self.dtype)?.contiguous()?, 1, self.len)?;
        vb.slice_set(&v.to_dtype(self.dtype)?.contiguous()?, 1, self.len)?;
        let total = self.len + n;
        Ok((kb.narrow(1, 0, total)?, vb.narrow(1, 0, total)?))
    }

    /// Marks `n` more tokens as cached, after every layer has appended them.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
