//! Picking tokens where the logits are: `kernels/cuda/sampling.cu` runs the
//! rule of `tensorfold-sampling` (greedy and the keyed draw) for each row,
//! one block per row, and gives the same token as the CPU for the same row.
//! Only the picked ids cross to the host, through a pinned buffer that is
//! reused from round to round.

use crate::launch::Launch;
use crate::pinned::pinned;
use crate::{CudaError, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PinnedHostSlice,
};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;
use tensorfold_sampling::Draw;

static SAMPLING_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sampling.fatbin"));

/// Threads of the kernel's block: the rule's summation lanes.
const LANES: u32 = tensorfold_sampling::lanes::LANES as u32;

/// Words of one row's draw as the kernel reads it (`TfDraw`).
const DRAW_WORDS: usize = 6;

/// One logits row for the device to pick: which row of the call's logits,
/// the absolute position the token is for, and the request's draw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowDraw {
    pub row: usize,
    pub position: u64,
    pub draw: Draw,
}

impl RowDraw {
    fn words(&self) -> [u64; DRAW_WORDS] {
        let d = &self.draw;
        let top_k = d.top_k.map_or(u64::MAX, |k| k as u64);
        [
            self.row as u64,
            self.position,
            d.seed,
            top_k,
            d.temperature.to_bits() as u64 | (d.top_p.to_bits() as u64) << 32,
            d.min_p.to_bits() as u64,
        ]
    }
}

/// The kernel, loaded once per model.
pub(crate) struct SampleKernel {
    function: CudaFunction,
    _module: Arc<CudaModule>,
}

/// Buffers of the picks, grown to the most rows seen and reused.
#[derive(Default)]
pub(crate) struct PickBufs {
    cap: usize,
    draws: Option<CudaSlice<u64>>,
    ids: Option<CudaSlice<u32>>,
    host_draws: Option<PinnedHostSlice<u64>>,
    host_ids: Option<PinnedHostSlice<u32>>,
}

impl PickBufs {
    fn ensure(&mut self, stream: &Arc<CudaStream>, rows: usize) -> Result<()> {
        if rows <= self.cap && self.ids.is_some() {
            return Ok(());
        }
        let cap = rows.max(2 * self.cap).max(16);
        let ctx = stream.context();
        self.draws = Some(stream.alloc_zeros(cap * DRAW_WORDS)?);
        self.ids = Some(stream.alloc_zeros(cap)?);
        self.host_draws = Some(pinned(ctx, cap * DRAW_WORDS)?);
        self.host_ids = Some(pinned(ctx, cap)?);
        self.cap = cap;
        Ok(())
    }
}

impl SampleKernel {
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<SampleKernel> {
        let module = ctx.load_module(Ptx::from_binary(SAMPLING_BIN.to_vec()))?;
        Ok(SampleKernel {
            function: module.load_function("sample_rows")?,
            _module: module,
        })
    }

    /// Picks each of `draws` from the rows of `vocab` logits at device
    /// address `logits` (queued after the work already on `stream`), and
    /// returns the tokens in the order of `draws`.
    ///
    /// # Safety
    /// `logits` must hold at least `row + 1` rows of `vocab` floats for
    /// every draw's `row`, written by work queued on `stream`.
    pub(crate) unsafe fn pick(
        &self,
        stream: &Arc<CudaStream>,
        bufs: &mut PickBufs,
        logits: u64,
        vocab: usize,
        draws: &[RowDraw],
    ) -> Result<Vec<u32>> {
        if draws.is_empty() {
            return Ok(Vec::new());
        }
        bufs.ensure(stream, draws.len())?;
        let n = draws.len();
        let (Some(dev_draws), Some(ids), Some(host_draws), Some(host_ids)) = (
            bufs.draws.as_mut(),
            bufs.ids.as_mut(),
            bufs.host_draws.as_mut(),
            bufs.host_ids.as_mut(),
        ) else {
            unreachable!("ensured above");
        };
        // The previous call ended with the stream synchronized, so no copy
        // reads this buffer now (the buffer's own event is not recorded:
        // event tracking is off on these contexts).
        let staged = host_draws.as_mut_slice()?;
        for (d, words) in draws.iter().zip(staged.chunks_exact_mut(DRAW_WORDS)) {
            words.copy_from_slice(&d.words());
        }
        stream.memcpy_htod(host_draws, dev_draws)?;
        let (vocab_i, draws_p, ids_p) = (
            vocab as i32,
            dev_draws.device_ptr(stream).0,
            ids.device_ptr(stream).0,
        );
        let mut launch = Launch::new(&self.function);
        launch.arg(&logits).arg(&vocab_i).arg(&draws_p).arg(&ids_p);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (LANES, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `sample_rows` in sampling.cu; the caller vouches
        // for the logits rows, `draws_p` holds `n` draws and `ids_p` room
        // for `n` ids. The kernel waits for the work queued before it.
        unsafe { launch.launch(stream, cfg, false) }?;
        stream.memcpy_dtoh(&ids.slice(..n), host_ids)?;
        // The copy is asynchronous into pinned memory: wait for it.
        stream.synchronize()?;
        Ok(host_ids.as_slice()?[..n].to_vec())
    }
}

/// The device sampler alone, on logits given by the host: what checks it
/// against the CPU rule, row for row.
pub struct DevicePicker {
    stream: Arc<CudaStream>,
    kernel: SampleKernel,
    bufs: PickBufs,
    rows: Option<CudaSlice<f32>>,
}

impl DevicePicker {
    /// The sampler on GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<DevicePicker> {
        if !crate::driver_present() {
            return Err(CudaError::Driver(
                "the CUDA driver library (libcuda.so.1) is not installed".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: every launch and copy of the picker goes to its one
        // stream, in order, so no cross-stream events are needed.
        unsafe { ctx.disable_event_tracking() };
        Ok(DevicePicker {
            stream: ctx.new_stream()?,
            kernel: SampleKernel::load(&ctx)?,
            bufs: PickBufs::default(),
            rows: None,
        })
    }

    /// Picks `draws` from `logits`, rows of `vocab` floats.
    pub fn pick(&mut self, logits: &[f32], vocab: usize, draws: &[RowDraw]) -> Result<Vec<u32>> {
        let rows = logits.len() / vocab.max(1);
        if vocab == 0 || logits.len() != rows * vocab {
            return Err(CudaError::Invalid(format!(
                "{} logits are not rows of {vocab}",
                logits.len()
            )));
        }
        if let Some(d) = draws.iter().find(|d| d.row >= rows) {
            return Err(CudaError::Invalid(format!("row {} of {rows} rows", d.row)));
        }
        if self.rows.as_ref().is_none_or(|r| r.len() < logits.len()) {
            self.rows = Some(self.stream.alloc_zeros(logits.len())?);
        }
        let dev = self.rows.as_mut().expect("allocated above");
        self.stream.memcpy_htod(logits, dev)?;
        let ptr = dev.device_ptr(&self.stream).0;
        // SAFETY: `dev` holds `rows` rows of `vocab` floats, copied on this
        // stream, and every draw's row is below `rows`.
        unsafe {
            self.kernel
                .pick(&self.stream, &mut self.bufs, ptr, vocab, draws)
        }
    }
}
