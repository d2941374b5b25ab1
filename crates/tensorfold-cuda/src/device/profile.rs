//! Device time by kind of launch: while a profile runs, every launch is
//! followed by a timing event and graphs are not used.

use super::CudaModel;
use crate::Result;
use cudarc::driver::sys::CUevent_flags;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// Device time of one kind of launch over a profiled stretch.
#[derive(Clone, Debug)]
pub struct KernelTime {
    /// The kernel, with the format and shape for matmuls.
    pub kernel: String,
    pub launches: usize,
    pub ms: f64,
}

impl CudaModel {
    /// Starts timing every launch (forwards then run without graphs, so
    /// expect them to be somewhat slower than unprofiled ones).
    pub fn start_profile(&self) {
        self.marks.lock().expect("marks lock").clear();
        self.profiling.store(true, Ordering::Relaxed);
    }

    /// Ends the profile: device time per kind of launch since
    /// [`CudaModel::start_profile`], longest first.
    pub fn finish_profile(&self) -> Result<Vec<KernelTime>> {
        self.profiling.store(false, Ordering::Relaxed);
        self.stream.synchronize()?;
        let marks = std::mem::take(&mut *self.marks.lock().expect("marks lock"));
        let mut by: HashMap<String, (usize, f64)> = HashMap::new();
        for pair in marks.windows(2) {
            if let Some(kernel) = &pair[1].0 {
                let e = by.entry(kernel.clone()).or_default();
                e.0 += 1;
                e.1 += pair[0].1.elapsed_ms(&pair[1].1)? as f64;
            }
        }
        let mut times: Vec<KernelTime> = by
            .into_iter()
            .map(|(kernel, (launches, ms))| KernelTime {
                kernel,
                launches,
                ms,
            })
            .collect();
        times.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        Ok(times)
    }

    pub(super) fn record(&self, label: Option<String>) -> Result<()> {
        let event = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        self.marks.lock().expect("marks lock").push((label, event));
        Ok(())
    }

    /// Marks the start of a forward while profiling.
    pub(super) fn mark_start(&self) -> Result<()> {
        if self.profiling.load(Ordering::Relaxed) {
            self.record(None)?;
        }
        Ok(())
    }

    /// Marks the end of the launch just queued while profiling.
    pub(super) fn mark(&self, label: impl FnOnce() -> String) -> Result<()> {
        if self.profiling.load(Ordering::Relaxed) {
            self.record(Some(label()))?;
        }
        Ok(())
    }
}
