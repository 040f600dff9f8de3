//! Single-sequence key/value cache: a private [`KvPool`] that grows on
//! demand, with a block table that is simply `0, 1, 2, ...`.
//!
//! This is what [`crate::CausalLM::forward`] uses (tests, tools, one-off
//! runs). The engine instead shares one fixed pool between all sequences and
//! hands the model block tables through [`crate::CausalLM::forward_paged`];
//! both paths run the same attention op.
//!
//! The model writes a chunk's keys and values and only then advances
//! `len()`; a forward pass that fails half way leaves `len()` unchanged, and
//! the stale entries past `len()` are overwritten by the next chunk.

use candle_core::{DType, Result};

use crate::paged::{KvPool, BLOCK_SIZE};

/// Blocks allocated on first use.
const MIN_BLOCKS: usize = 4;

/// Keys and values of every layer for one sequence.
pub struct KvCache {
    pub(crate) pool: KvPool,
    /// `0..pool.num_blocks()`, kept as a table for the paged op.
    pub(crate) blocks: Vec<u32>,
    len: usize,
    max_len: usize,
}

impl KvCache {
    /// An empty cache; no memory is allocated until the first chunk.
    pub fn new(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        dtype: DType,
    ) -> Result<Self> {
        Ok(Self {
            pool: KvPool::new(num_layers, num_kv_heads, head_dim, 0, dtype)?,
            blocks: Vec::new(),
            len: 0,
            max_len,
        })
    }

    /// An empty cache whose keys and values live as tensors on `device`
    /// (see [`KvPool::on_device`]).
    pub fn on_device(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        dtype: DType,
        device: &candle_core::Device,
    ) -> Result<Self> {
        Ok(Self {
            pool: KvPool::on_device(num_layers, num_kv_heads, head_dim, 0, dtype, device)?,
            blocks: Vec::new(),
            len: 0,
            max_len,
        })
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

    /// Tokens that fit without growing.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * BLOCK_SIZE
    }

    /// Most tokens this cache will ever hold (the model's context length).
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Storage dtype of the keys and values.
    pub fn dtype(&self) -> DType {
        self.pool.dtype()
    }

    pub fn num_layers(&self) -> usize {
        self.pool.num_layers()
    }

    /// Bytes held by the key/value buffers.
    pub fn size_in_bytes(&self) -> usize {
        self.pool.size_in_bytes()
    }

    /// Makes room for `extra` more tokens, doubling the block count as needed.
    pub(crate) fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed > self.max_len {
            candle_core::bail!(
                "sequence of {needed} tokens exceeds the context length {}",
                self.max_len
            )
        }
        if needed <= self.capacity() {
            return Ok(());
        }
        let want = needed.div_ceil(BLOCK_SIZE);
        let max_blocks = self.max_len.div_ceil(BLOCK_SIZE);
        let blocks = want
            .max(2 * self.blocks.len())
            .max(MIN_BLOCKS)
            .min(max_blocks);
        self.pool.grow(blocks)?;
        self.blocks = (0..blocks as u32).collect();
        Ok(())
    }

    /// Marks `n` more tokens as cached, after every layer has written them.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
