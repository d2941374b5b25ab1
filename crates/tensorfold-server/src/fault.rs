//! Fault injection for tests of the worker's isolation (feature
//! `fault-injection`, off by default): only code linked against this crate
//! can trigger it, never a request.

use std::sync::atomic::{AtomicUsize, Ordering};

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Makes the next `count` text deltas panic, each inside its round (in
/// the middle of handing a stream its text).
pub fn panic_in_next_rounds(count: usize) {
    PANICS.store(count, Ordering::SeqCst);
}

/// Panics when a fault is armed (called from inside a round).
pub(crate) fn maybe_panic() {
    let armed = PANICS
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if armed {
        panic!("injected fault inside a round");
    }
}
