//! glibc malloc settings for the server process.
//!
//! glibc maps blocks above a threshold on their own and raises that
//! threshold (up to 32 MiB) each time such a block is freed, so after the
//! first large frees, multi-megabyte blocks come from the heap, and once
//! freed they stay resident in its free lists. Loading makes and drops many
//! such blocks (an encoder's f32 weight copies, replaced by bf16 ones), and
//! so do steps and batches. With the threshold held at 1 MiB, dropping them
//! returns the memory: measured with both default models and 16 streams,
//! 535 MiB resident at most instead of 579 MiB, with the same throughput
//! within the noise (`benches/README.md`).

/// Holds the mmap threshold at 1 MiB and the heap's trim threshold at
/// twice that (as glibc's adaptive rule would keep them); call before the
/// models load.
pub fn hold_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters, both within the
    // ranges glibc accepts on 64-bit targets.
    unsafe {
        const MMAP_THRESHOLD: i32 = 1 << 20;
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD);
    }
}
