//! A counting wrapper around the system allocator, switched on only by `--scenario profile`
//! (until then each allocation pays one relaxed load of a flag that never changes).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static REALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// Allocations (`alloc` + `alloc_zeroed`), reallocations, bytes asked for (both) so far.
#[derive(Clone, Copy, Default)]
pub struct Counts {
    pub allocs: u64,
    pub reallocs: u64,
    pub bytes: u64,
}

pub fn start() {
    ON.store(true, Ordering::Relaxed);
}

pub fn now() -> Counts {
    Counts {
        allocs: ALLOCS.load(Ordering::Relaxed),
        reallocs: REALLOCS.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
    }
}

fn count(n: &AtomicU64, size: usize) {
    if ON.load(Ordering::Relaxed) {
        n.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`; the counters have no effect on it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(&ALLOCS, layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(&ALLOCS, layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(&REALLOCS, new_size);
        System.realloc(ptr, layout, new_size)
    }
}
