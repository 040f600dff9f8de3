//! glibc malloc settings for the server process.
//!
//! glibc maps blocks above a threshold on their own and raises that
//! threshold (up to 32 MiB) each time such a block is freed, so after the
//! first large frees, multi-megabyte blocks come from the heap, and once
//! freed they stay resident in its free lists. Loading makes and drops many
//! such blocks (an encoder's f32 weight copies, replaced by bf16 ones).
//! With the threshold held at 1 MiB while models load, dropping them
//! returns the memory: measured with both default models and 16 streams,
//! 535 MiB resident at most instead of 579 MiB, with the same throughput
//! within the noise (`benches/README.md`, `benches/HISTORY.md`).
//!
//! The heap's trim threshold is another matter. Each thread's arena gives
//! back the free memory at its top past that threshold (`madvise`), and a
//! step's buffers below the mmap threshold are made and dropped on the
//! compute threads every step. At 2 MiB (twice the mmap threshold, as
//! glibc's adaptive rule keeps it), 16 streams on the default chat model
//! faulted 650,000-920,000 pages back in over 64 requests, and the page
//! faults, zeroing and unmapping took about a tenth of the compute
//! threads' time. At 64 MiB: 70,000-172,000 faults and 1.12-1.31x the
//! tokens per second in four of five alternated pairs (the fifth 0.96x,
//! within the noise), 483-486 MiB resident at most instead of 475-480
//! (`benches/README.md`, `benches/HISTORY.md`). What an arena keeps is at most what its thread's
//! steps used, and the next steps reuse it.
//!
//! Once the models are loaded, the mmap threshold goes up to 32 MiB (the
//! ceiling of glibc's own adaptive rule; [`after_loading`]). A prompt
//! chunk's buffers are megabytes (a 512-token chunk of a 1B model: 4 MiB
//! per hidden-state copy, 16 MiB per feed-forward half), and mapped on
//! their own each was faulted in and zeroed afresh in every layer of every
//! step: a 512-token prefill of the 1B shapes through the engine took
//! about 95,000 page faults with the 1 MiB threshold, and with 32 MiB it
//! was 1.04-1.07x faster in five of six alternated pairs (Q3_K_M, Q4_K_M;
//! `benches/README.md`, `benches/HISTORY.md`). From the heap they are reused step after step.
//! On the default chat model (buffers of a few MiB at most) the server's
//! page faults at 16 streams fell from 52,000-150,000 to about 15,000 per
//! 64 requests, its speed the same within the noise, its peak resident
//! memory 505 MiB instead of 498-502. Models loaded later (dedicated
//! endpoints, adapters) allocate under the same 32 MiB rule, as under
//! glibc's default.

/// Blocks from this size up are mapped on their own while models load
/// (1 MiB).
const MMAP_THRESHOLD: i32 = 1 << 20;
/// ... and once they are loaded (32 MiB).
const SERVING_MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory at the top of an arena kept for reuse (64 MiB).
const TRIM_THRESHOLD: i32 = 64 << 20;

/// Holds the mmap threshold at 1 MiB and the heap's trim threshold at 64
/// MiB (see the module docs); call before the models load.
pub fn hold_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters, both within the
    // ranges glibc accepts on 64-bit targets.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Raises the mmap threshold to 32 MiB once the models are loaded, so that
/// the steps' multi-megabyte buffers come from the heap and are reused
/// instead of being mapped and zeroed afresh (see the module docs).
pub fn after_loading() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: as in `hold_thresholds`; 32 MiB is glibc's own ceiling for
    // the threshold on 64-bit targets.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, SERVING_MMAP_THRESHOLD);
    }
}
