//! Keeps the thread pool's workers awake for the length of one forward.
//!
//! A forward is a chain of short parallel steps (a decode token of a small
//! model is over a hundred matmuls of a fraction of a millisecond each),
//! with a little serial work between them. An idle rayon worker sleeps
//! after a few dozen rounds of looking for work, and waking it again costs
//! more than many of those steps take, on a virtual machine above all. So
//! while a forward runs, every other worker sits in a job that keeps taking
//! the pool's pending work and spins when there is none: the split of each
//! step starts at once on every core, as a spin-waiting pool's would. The
//! spinning ends with the forward, so an idle engine burns nothing.
//!
//! Which thread runs which part of a step never changes a result: every
//! parallel step writes disjoint outputs in an order fixed by shape.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// Whether this thread is running a forward's own work: a helper job
    /// that lands here (taken from this thread's queue while it waits
    /// inside a parallel step) must not spin, since the forward it would
    /// wait for, or one that waits for this one, runs on this very thread.
    static RUNS_A_FORWARD: Cell<bool> = const { Cell::new(false) };
}

/// Runs `work` on a pool thread while the pool's other workers stay awake
/// to take its parallel steps, and returns its result.
pub(crate) fn with_awake_workers<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let helpers = rayon::current_num_threads().saturating_sub(1);
    let done = AtomicBool::new(false);
    let done = &done;
    rayon::scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(move |_| {
                if RUNS_A_FORWARD.get() {
                    return;
                }
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        // Set on the way out even if `work` panics: the scope waits for
        // its helpers before it passes the panic on.
        let _finish = Finish {
            outer: RUNS_A_FORWARD.replace(true),
            done,
        };
        work()
    })
}

/// Ends a forward's helpers and restores its thread's flag when dropped.
struct Finish<'a> {
    outer: bool,
    done: &'a AtomicBool,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        RUNS_A_FORWARD.set(self.outer);
        self.done.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Parallel steps inside the forward run, finish and give the serial
    /// result, and the call returns (the helpers stop).
    #[test]
    fn parallel_steps_finish_and_the_helpers_stop() {
        for _ in 0..50 {
            let sum = with_awake_workers(|| {
                (0..20)
                    .map(|step| (0..1000u64).into_par_iter().map(|i| i * step).sum::<u64>())
                    .sum::<u64>()
            });
            assert_eq!(sum, (0..20u64).sum::<u64>() * (0..1000u64).sum::<u64>());
        }
    }

    /// A forward that panics passes the panic on instead of leaving its
    /// helpers spinning.
    #[test]
    fn a_panicking_forward_panics_and_the_pool_goes_on() {
        let caught = std::panic::catch_unwind(|| {
            with_awake_workers(|| {
                let _ = (0..100u64).into_par_iter().sum::<u64>();
                panic!("a bug");
            })
        });
        assert!(caught.is_err());
        assert_eq!(
            with_awake_workers(|| (0..100u64).into_par_iter().sum::<u64>()),
            4950
        );
    }

    /// Forwards started at once from several threads all finish: a pool
    /// busy with one forward's helpers does not starve another.
    #[test]
    fn concurrent_forwards_all_finish() {
        let sums: Vec<u64> = (0..6u64)
            .into_par_iter()
            .map(|k| {
                with_awake_workers(|| (0..10_000u64).into_par_iter().map(|i| i % (k + 2)).sum())
            })
            .collect();
        for (k, sum) in sums.into_iter().enumerate() {
            let want: u64 = (0..10_000u64).map(|i| i % (k as u64 + 2)).sum();
            assert_eq!(sum, want);
        }
        let from_outside: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3u64)
                .map(|k| {
                    s.spawn(move || {
                        with_awake_workers(|| (0..5000u64).into_par_iter().map(|i| i ^ k).sum())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (k, sum) in from_outside.into_iter().enumerate() {
            assert_eq!(sum, (0..5000u64).map(|i| i ^ k as u64).sum::<u64>());
        }
    }
}
