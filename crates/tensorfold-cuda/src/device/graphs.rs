//! Captured graphs: a forward's launches recorded once per shape and
//! replayed, since its launches depend on the shape and buffers alone.

use super::{CudaModel, Plan};
use crate::Result;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// Forwards of at most this many rows run as captured graphs.
const GRAPH_MAX_ROWS: usize = 64;

/// Distinct shapes kept as graphs.
const GRAPH_SLOTS: usize = 256;

/// Graphs by (rows, sequences, picked rows, attention splits). Cleared
/// whenever a buffer they point into is reallocated.
pub(super) type Graphs = HashMap<(usize, usize, usize, usize), GraphSlot>;

pub(super) enum GraphSlot {
    /// Run directly once; the next forward of this shape is captured.
    SeenOnce,
    Ready(Graph),
    /// The driver would not capture it.
    Refused,
}

/// A captured graph that may move between threads with its model.
pub(super) struct Graph(CudaGraph);

// SAFETY: a graph is launched only while its model's scratch lock is held,
// on the model's stream, and cudarc binds the context to the calling thread
// before every launch; CUDA allows an executable graph to be launched from
// any thread of its context.
unsafe impl Send for Graph {}

impl CudaModel {
    /// Replays the graph captured for this plan's shape, capturing it the
    /// second time a shape comes (a one-off shape is not worth the capture);
    /// shapes with many rows, where kernel time dwarfs launch time, and
    /// devices that refuse capture run the launches directly.
    pub(super) fn run(&self, graphs: &mut Graphs, plan: &Plan) -> Result<()> {
        // A mixture waits for its routing on the host: no graph holds that.
        let routed = self.config.plan.experts.is_some();
        if routed || plan.m > GRAPH_MAX_ROWS || self.profiling.load(Ordering::Relaxed) {
            return self.enqueue(plan);
        }
        let key = (plan.m, plan.seqs, plan.picks, plan.attention_splits);
        let Some(slot) = graphs.get_mut(&key) else {
            if graphs.len() < GRAPH_SLOTS {
                graphs.insert(key, GraphSlot::SeenOnce);
            }
            return self.enqueue(plan);
        };
        match slot {
            GraphSlot::Ready(g) => Ok(g.0.launch()?),
            GraphSlot::Refused => self.enqueue(plan),
            GraphSlot::SeenOnce => match self.capture(plan)? {
                Some(g) => {
                    g.launch()?;
                    *slot = GraphSlot::Ready(Graph(g));
                    Ok(())
                }
                None => {
                    *slot = GraphSlot::Refused;
                    self.enqueue(plan)
                }
            },
        }
    }

    /// Records `plan`'s launches as a graph without running them; `None`
    /// when the driver will not capture.
    pub(super) fn capture(&self, plan: &Plan) -> Result<Option<CudaGraph>> {
        if self
            .stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .is_err()
        {
            return Ok(None);
        }
        let queued = self.enqueue(plan);
        // End the capture whatever happened, so the stream is usable again.
        let graph = self.stream.end_capture(CUgraphInstantiate_flags(0));
        queued?;
        Ok(graph.ok().flatten())
    }
}
