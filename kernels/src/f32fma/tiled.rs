//! [`TiledRows`]: activation rows regrouped by the f32 kernel's tiles.

use rayon::prelude::*;

use super::MR;

/// `rows` activation rows of `k` values regrouped by tiles of
/// [`TiledRows::TILE_ROWS`] rows, the layout [`super::F32Matrix`] reads
/// (and can write): tile `t` at `t * tile_len`, values `8 b..8 b + 8` of
/// its row `i` at `(6 b + i) * 8`, so a tile's broadcasts read one stream.
/// A layer whose output feeds another's input can keep it in this form and
/// skip the regrouping.
#[derive(Debug, Clone, Default)]
pub struct TiledRows {
    pub(crate) data: Vec<f32>,
    rows: usize,
    k: usize,
}

impl TiledRows {
    /// Rows per tile.
    pub const TILE_ROWS: usize = MR;

    /// No rows.
    pub fn new() -> Self {
        Self::default()
    }

    /// No rows, on `data`'s allocation.
    pub(super) fn from_buffer(data: Vec<f32>) -> Self {
        Self {
            data,
            rows: 0,
            k: 0,
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Floats the buffer holds room for.
    pub fn capacity(&self) -> usize {
        self.data.capacity()
    }

    /// Floats from one tile to the next.
    pub(crate) fn tile_len(&self) -> usize {
        tile_len(self.k)
    }

    /// Shapes the buffer for `rows` rows of `k` (keeping its allocation);
    /// the values are unspecified until written.
    pub fn reshape(&mut self, rows: usize, k: usize) {
        // Zeroing only touches new capacity; the values are written by the
        // caller.
        self.data.resize(rows.div_ceil(MR) * tile_len(k), 0.0);
        (self.rows, self.k) = (rows, k);
    }

    /// The rows of `x` (row major, rows of `k`) regrouped, across the
    /// rayon pool.
    ///
    /// # Panics
    /// If `x` is not whole rows of `k`.
    pub fn pack(&mut self, x: &[f32], k: usize) {
        assert!(k > 0 && x.len().is_multiple_of(k), "x is not rows of {k}");
        self.reshape(x.len() / k, k);
        self.tiles_mut()
            .zip(x.par_chunks(MR * k))
            .for_each(|(mut tile, rows)| {
                for (i, row) in rows.chunks(k).enumerate() {
                    tile.set_row(i, row);
                }
            });
    }

    /// The tiles for writing, in order, across the rayon pool (tile `t`
    /// holds rows `t * TILE_ROWS..`).
    pub fn tiles_mut(&mut self) -> impl IndexedParallelIterator<Item = TileMut<'_>> {
        let (rows, k, len) = (self.rows, self.k, self.tile_len());
        self.data[..rows.div_ceil(MR) * len]
            .par_chunks_mut(len)
            .enumerate()
            .map(move |(t, data)| TileMut {
                data,
                rows: MR.min(rows - t * MR),
                k,
            })
    }

    /// The rows back in row-major order.
    pub fn to_rows(&self) -> Vec<f32> {
        let (k, len) = (self.k, self.tile_len());
        let mut x = vec![0f32; self.rows * k];
        for (r, row) in x.chunks_mut(k.max(1)).enumerate() {
            let tile = &self.data[r / MR * len..][..len];
            for (c, v) in row.iter_mut().enumerate() {
                *v = tile[(MR * (c / 8) + r % MR) * 8 + c % 8];
            }
        }
        x
    }

    /// Where each value lies in [`TiledRows::as_mut_ptr`]'s buffer.
    pub fn index(&self) -> TiledIndex {
        TiledIndex {
            rows: self.rows,
            k: self.k,
            tile_len: self.tile_len(),
        }
    }

    /// The buffer, for writers that place values by [`TiledRows::offset`]
    /// from several threads.
    pub fn as_mut_ptr(&mut self) -> *mut f32 {
        self.data.as_mut_ptr()
    }
}

/// The layout of a [`TiledRows`], for writers that place values from
/// several threads through its pointer.
#[derive(Debug, Clone, Copy)]
pub struct TiledIndex {
    rows: usize,
    k: usize,
    tile_len: usize,
}

impl TiledIndex {
    /// Offset of value `c` of row `r`; from a multiple of 8, the next
    /// values up to the following multiple of 8 (or `k`) follow it.
    ///
    /// # Panics
    /// If `(r, c)` is outside the rows.
    #[inline]
    pub fn offset(&self, r: usize, c: usize) -> usize {
        assert!(
            r < self.rows && c < self.k,
            "({r}, {c}) outside [{}, {}]",
            self.rows,
            self.k
        );
        r / MR * self.tile_len + (MR * (c / 8) + r % MR) * 8 + c % 8
    }
}

/// Floats per tile for rows of `k`.
pub(crate) fn tile_len(k: usize) -> usize {
    MR * k.next_multiple_of(8)
}

/// One tile of a [`TiledRows`], for writing its rows.
pub struct TileMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    k: usize,
}

impl TileMut<'_> {
    /// Rows of this tile (the last may have fewer than
    /// [`TiledRows::TILE_ROWS`]).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Writes row `i` of the tile.
    ///
    /// # Panics
    /// If `i` is not a row of the tile or `row` is not `k` long.
    #[inline]
    pub fn set_row(&mut self, i: usize, row: &[f32]) {
        assert!(
            i < self.rows && row.len() == self.k,
            "row {i} of {}",
            self.rows
        );
        // Whole arrays of 8: moves of one register, not `memcpy` calls of a
        // run-time length.
        let mut eights = row.chunks_exact(8);
        for (b, eight) in eights.by_ref().enumerate() {
            let at = (MR * b + i) * 8;
            let to: &mut [f32; 8] = (&mut self.data[at..at + 8]).try_into().unwrap();
            *to = eight.try_into().unwrap();
        }
        let rest = eights.remainder();
        if !rest.is_empty() {
            let at = (MR * (self.k / 8) + i) * 8;
            self.data[at..at + rest.len()].copy_from_slice(rest);
        }
    }
}
