//! [`align_frame!`]: a kernel's stack frame aligned to 64 bytes.
//!
//! A `#[target_feature]` kernel that runs out of its 16 vector registers
//! spills some of them to its stack frame. LLVM realigns that frame for
//! the spills only when something else in the function asks for it; when
//! nothing does, it spills 256-bit registers with unaligned moves into a
//! frame aligned to 16 bytes. A 32-byte slot at 48 mod 64 then crosses a
//! cache line (at 4080 mod 4096, a page) on every store and every reload,
//! and which slots do depends on the callers' frames: the same AVX-VNNI
//! prefill loop ran the 8B Q4_K_M prompt step at 20-21 or 27-28 tokens/s
//! depending on unrelated code elsewhere in the binary
//! (`benches/README.md`, `benches/HISTORY.md`). One 64-byte-aligned local makes LLVM realign the
//! frame (`and rsp, -64`), after which every spill slot is aligned.

/// Aligns the enclosing function's stack frame to 64 bytes, so that its
/// vector spills never cross a cache line (see the module docs). Put it at
/// the top of the `#[target_feature]` function whose loops spill (the
/// kernels they inline are compiled into its frame).
#[macro_export]
macro_rules! align_frame {
    () => {
        #[repr(C, align(64))]
        struct Align64([u8; 64]);
        let anchor = Align64([0; 64]);
        // Kept: without a use LLVM drops the local and the realignment.
        ::std::hint::black_box(&anchor);
    };
}
