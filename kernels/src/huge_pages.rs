//! A global allocator that asks Linux for transparent huge pages (2 MiB)
//! under large allocations: model weights, KV cache pools and big scratch
//! buffers.
//!
//! A decode step streams every weight once from memory. With 4 KiB pages
//! that is one TLB miss and page walk per 4 KiB read; with 2 MiB pages one
//! per 2 MiB, and the same two threads read memory about an eighth faster
//! on the machines measured (`benches/README.md`, `benches/HISTORY.md`). Most distributions set
//! transparent huge pages to `madvise`, where only regions marked
//! `MADV_HUGEPAGE` get them; this allocator marks the 2 MiB-aligned
//! interior of every allocation of at least [`HUGE_MIN_BYTES`] before it is
//! first written, so its pages are faulted in huge.
//!
//! Everything else is the system allocator's: the mark is advice, and
//! where the kernel has no huge pages (or `enabled` is `never`, or another
//! OS) `madvise` fails or is not called and nothing changes. Set
//! `HEARTH_HUGE_PAGES=0` to leave every allocation unmarked.
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: hearth_kernels::HugePageAlloc = hearth_kernels::HugePageAlloc;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

/// Allocations of at least this many bytes are marked.
const HUGE_MIN_BYTES: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// The system allocator, with large allocations marked for huge pages.
pub struct HugePageAlloc;

/// 0: not yet read; 1: on; 2: off (`HEARTH_HUGE_PAGES=0`).
static ENABLED: AtomicU8 = AtomicU8::new(0);

fn enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            // `var_os` allocates, but only small blocks, which return
            // from `advise` before asking here again.
            let on = !crate::set_to_zero("HEARTH_HUGE_PAGES");
            ENABLED.store(if on { 1 } else { 2 }, Ordering::Relaxed);
            on
        }
    }
}

#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
/// The whole 2 MiB pages inside `[ptr, ptr + size)`, as (start, length).
fn huge_interior(ptr: usize, size: usize) -> Option<(usize, usize)> {
    let start = ptr.checked_add(HUGE_PAGE - 1)? & !(HUGE_PAGE - 1);
    let end = ptr.checked_add(size)? & !(HUGE_PAGE - 1);
    (end > start).then(|| (start, end - start))
}

/// Marks the huge-page interior of a fresh allocation (advice only; a
/// failure leaves ordinary pages).
fn advise(ptr: *mut u8, size: usize) {
    if ptr.is_null() || size < HUGE_MIN_BYTES || !enabled() {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Some((start, len)) = huge_interior(ptr as usize, size) {
        // SAFETY: the range lies inside an allocation this process owns;
        // MADV_HUGEPAGE changes no contents and no protection.
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
}

// SAFETY: every call is forwarded to `System` with the same arguments; the
// only addition is advice on memory the returned block owns.
unsafe impl GlobalAlloc for HugePageAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        advise(p, new_size);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interior_is_whole_aligned_pages_inside_the_block() {
        let mb2 = HUGE_PAGE;
        assert_eq!(huge_interior(0, 3 * mb2), Some((0, 3 * mb2)));
        assert_eq!(huge_interior(16, 3 * mb2), Some((mb2, 2 * mb2)));
        assert_eq!(huge_interior(mb2 - 1, mb2 + 1), Some((mb2, mb2)));
        assert_eq!(huge_interior(4096, 2 * mb2), Some((mb2, mb2)));
        assert_eq!(huge_interior(4096, mb2), None);
        assert_eq!(huge_interior(4096, 3 * mb2), Some((mb2, 2 * mb2)));
        assert_eq!(huge_interior(usize::MAX - 10, 100), None);
    }

    #[test]
    fn large_blocks_stay_usable_after_advice() {
        // Written end to end and read back through the advised allocator.
        let layout = Layout::from_size_align(HUGE_MIN_BYTES * 3, 64).unwrap();
        let a = HugePageAlloc;
        unsafe {
            let p = a.alloc_zeroed(layout);
            assert!(!p.is_null());
            let s = std::slice::from_raw_parts_mut(p, layout.size());
            assert!(s.iter().all(|&b| b == 0));
            for (i, b) in s.iter_mut().enumerate() {
                *b = i as u8;
            }
            let p = a.realloc(p, layout, layout.size() * 2);
            let s = std::slice::from_raw_parts(p, layout.size());
            assert!(s.iter().enumerate().all(|(i, &b)| b == i as u8));
            a.dealloc(p, Layout::from_size_align(layout.size() * 2, 64).unwrap());
        }
    }

    /// The `AnonHugePages` of the mapping holding `addr`, in kB.
    #[cfg(target_os = "linux")]
    fn anon_huge_kb(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = head.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = (lo..hi).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    return kb.trim().trim_end_matches("kB").trim().parse().ok();
                }
            }
        }
        None
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_blocks_are_faulted_in_huge_where_the_kernel_offers_them() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !thp.contains("[madvise]") && !thp.contains("[always]") {
            eprintln!("transparent huge pages are off here ({thp:?}); skipped");
            return;
        }
        let size = 4 * HUGE_MIN_BYTES;
        let layout = Layout::from_size_align(size, 64).unwrap();
        let a = HugePageAlloc;
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            std::ptr::write_bytes(p, 1, size);
            let kb = anon_huge_kb(p as usize + size / 2).expect("the block's mapping in smaps");
            a.dealloc(p, layout);
            assert!(
                kb >= 2048,
                "{kb} kB of huge pages under a {size}-byte block"
            );
        }
    }
}
