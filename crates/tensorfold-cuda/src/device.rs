//! The model on the device and its forward: weights, scratch buffers,
//! captured graphs and every launch of a forward.

mod experts;

use crate::attention;
use crate::attention_f32::{
    attention_shared, attention_tile, split_attention, split_shared, ATTENTION_ROWS, NARROW_HEADS,
    SPLIT_WARPS, STAGE_KEYS_FROM,
};
use crate::kernels::{device_picks_from_env, Kernels, TcAttention};
use crate::kv::CudaKv;
use crate::launch::{opt_ptr, ptr, Launch};
use crate::matmul::{
    few_kernel, few_shared, fmt_code, many_blocks, many_shared, many_tile_name, many_tile_named,
    pick_many_tile, tile_for, FewRowGrid, Kind, MatmulKernels, FEW_SHARED_MAX, FEW_TILES,
    FEW_WARPS, FORMATS, MANY_TILES, MANY_WARPS, MM_WARPS, SEGMENT, TILES, WEIGHT_PAD,
};
use crate::pinned::pinned;
use crate::sampling::{PickBufs, RowDraw, SampleKernel};
use crate::{CudaError, Result};
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice,
};
use experts::{DevExperts, ExpertScratch};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tensorfold_models::{rotary_angle, Activation, Logits, Model, ModelConfig, RopeStyle, Seq};
use tensorfold_quant::{Encoding, Format, Matrix, Storage};
use tensorfold_sampling::{Draw, SeqRows};

/// How a product lands in its output (`TF_OUT_*` in tensor.cu).
#[derive(Clone, Copy)]
enum Out {
    /// Stored.
    Set,
    /// Added to what is there (the residual stream).
    Add,
    /// The weight rows are gate and up interleaved (`GateUp::Gated`); the
    /// output is silu(gate) * up, with its f16 copy at the address unless
    /// that is 0. Tensor-core kernels only.
    Gated(u64),
}

impl Out {
    fn mode(self) -> i32 {
        match self {
            Out::Set => 0,
            Out::Add => 1,
            Out::Gated(_) => 2,
        }
    }
    fn y16(self) -> u64 {
        match self {
            Out::Gated(y16) => y16,
            _ => 0,
        }
    }
}

/// A weight matrix in device memory, bytes exactly as GGUF stores them.
struct DevMatrix {
    code: usize,
    rows: usize,
    cols: usize,
    data: CudaSlice<u8>,
}

/// Several matrices over the same input whose outputs sit side by side in
/// one buffer (q | k | v, gate | up). Matrices of one format are fused
/// into a single one at upload; the split never changes an element's bits.
struct Linear {
    parts: Vec<(DevMatrix, usize)>,
    width: usize,
}

/// The feed-forward block's gate and up projections.
enum GateUp {
    /// One tensor-core matrix whose 16-row blocks hold 8 gate rows, then
    /// the 8 up rows of the same columns: its product lands as
    /// silu(gate) * up (`Out::Gated`).
    Gated(DevMatrix),
    /// gate | up side by side, then `gated_mul`.
    Split(Linear),
}

/// A block's feed-forward part.
enum Mlp {
    Dense { gate_up: GateUp, down: DevMatrix },
    Experts(DevExperts),
}

struct DevBlock {
    attn_norm: CudaSlice<f32>,
    qkv: Linear,
    q_bias: Option<CudaSlice<f32>>,
    k_bias: Option<CudaSlice<f32>>,
    v_bias: Option<CudaSlice<f32>>,
    q_norm: Option<CudaSlice<f32>>,
    k_norm: Option<CudaSlice<f32>>,
    o: DevMatrix,
    ffn_norm: CudaSlice<f32>,
    mlp: Mlp,
    /// Norms of the attention output and of the MLP output before each is
    /// added to the residual (Gemma).
    post_attn_norm: Option<CudaSlice<f32>>,
    post_ffn_norm: Option<CudaSlice<f32>>,
}

/// Buffers reused across forwards, grown to the largest call seen.
#[derive(Default)]
struct Scratch {
    rows: usize,
    picked: usize,
    meta: usize,
    bufs: Option<Bufs>,
    rope_len: usize,
    /// Cosines and sines of every position: of the model's rotary base,
    /// and of the sliding layers' own base where the plan has one.
    rope: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    local_rope: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    graphs: Graphs,
    picks: PickBufs,
    /// The split attention's partials (`attention::partial_floats`), for
    /// [`attention::SPLIT_ROWS`] rows over `partial_blocks` key blocks.
    partials: Option<CudaSlice<f32>>,
    partial_blocks: usize,
}

struct Bufs {
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    q: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    gu: CudaSlice<f32>,
    act: CudaSlice<f32>,
    /// An attention or MLP output on its way to a post norm.
    proj: CudaSlice<f32>,
    picked: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    meta: CudaSlice<u64>,
    /// Where the host writes the table before it is copied to `meta`.
    host_meta: PinnedHostSlice<u64>,
    /// The tensor-core kernels' f16 copies of the matmul inputs
    /// (`tf_store_h16`), for widths that are a multiple of 32.
    xn16: Option<CudaSlice<u32>>,
    attn16: Option<CudaSlice<u32>>,
    act16: Option<CudaSlice<u32>>,
    picked16: Option<CudaSlice<u32>>,
}

/// Device addresses and sizes of one forward: everything its launches take.
struct Plan {
    m: usize,
    seqs: usize,
    picks: usize,
    /// Blocks sharing each attention tile's key blocks (1: fused; see
    /// `attention::splits`), where their partials go (0: fused) and the key
    /// blocks each slot has room for there.
    attention_splits: usize,
    partials: u64,
    partial_blocks: usize,
    tokens: u64,
    pos: u64,
    seq: u64,
    k_base: u64,
    v_base: u64,
    cap: u64,
    pick: u64,
    cos: u64,
    sin: u64,
    /// The sliding layers' tables (the global ones where they share them).
    local_cos: u64,
    local_sin: u64,
    x: u64,
    xn: u64,
    qkv: u64,
    q: u64,
    attn: u64,
    gu: u64,
    act: u64,
    proj: u64,
    picked: u64,
    logits: u64,
    /// f16 copies of matmul inputs (0: none, the width is not a multiple
    /// of 32).
    xn16: u64,
    attn16: u64,
    act16: u64,
    picked16: u64,
}

impl Plan {
    /// The per-row table of every kernel that reads or writes the caches,
    /// in their argument order: positions, sequences, key and value bases,
    /// capacities.
    fn cache_args<'a>(&'a self, lb: &mut Launch<'a>) {
        lb.arg(&self.pos)
            .arg(&self.seq)
            .arg(&self.k_base)
            .arg(&self.v_base)
            .arg(&self.cap);
    }
}

/// Forwards of at most this many rows run as captured graphs.
const GRAPH_MAX_ROWS: usize = 64;
/// Distinct shapes kept as graphs.
const GRAPH_SLOTS: usize = 256;

/// Graphs by (rows, sequences, picked rows, attention splits). Cleared
/// whenever a buffer they point into is reallocated.
type Graphs = HashMap<(usize, usize, usize, usize), GraphSlot>;

enum GraphSlot {
    /// Run directly once; the next forward of this shape is captured.
    SeenOnce,
    Ready(Graph),
    /// The driver would not capture it.
    Refused,
}

/// A captured graph that may move between threads with its model.
struct Graph(CudaGraph);

// SAFETY: a graph is launched only while its model's scratch lock is held,
// on the model's stream, and cudarc binds the context to the calling thread
// before every launch; CUDA allows an executable graph to be launched from
// any thread of its context.
unsafe impl Send for Graph {}

/// Room for the f16 copy (`tf_store_h16`) of `rows` inputs `width` wide,
/// which only widths that are a multiple of 32 have.
fn half_words(
    stream: &Arc<CudaStream>,
    rows: usize,
    width: usize,
) -> Result<Option<CudaSlice<u32>>> {
    Ok(match width.is_multiple_of(32) {
        true => Some(stream.alloc_zeros(rows * width / 2)?),
        false => None,
    })
}

/// A decoder whose weights live on one GPU.
pub struct CudaModel {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    k: Kernels,
    config: ModelConfig,
    embed: DevMatrix,
    head: Option<DevMatrix>,
    blocks: Vec<DevBlock>,
    norm: CudaSlice<f32>,
    weight_bytes: usize,
    bytes_per_token: usize,
    scratch: Mutex<Scratch>,
    /// The buffers of the mixture-of-experts blocks.
    experts: Mutex<ExpertScratch>,
    /// Picks tokens from the logits rows (`sampling.cu`).
    sampler: SampleKernel,
    /// Whether draws are picked on the device (see `device_picks_from_env`).
    device_picks: bool,
    /// While on, every launch is followed by a timing event (and graphs
    /// are not used); see [`CudaModel::start_profile`].
    profiling: AtomicBool,
    /// Events of the profiled stretch: `None` marks a forward's start.
    marks: Mutex<Vec<(Option<String>, CudaEvent)>>,
}

/// Device time of one kind of launch over a profiled stretch.
#[derive(Clone, Debug)]
pub struct KernelTime {
    /// The kernel, with the format and shape for matmuls.
    pub kernel: String,
    pub launches: usize,
    pub ms: f64,
}

/// `m` as the kernels read it: GGUF and float formats as stored; MLX affine
/// groups, and float rows whose width is not a multiple of 32, widened to
/// f32 on the host (exactly the values the CPU decodes), since the unit
/// kernels read neither.
fn on_device(m: &Matrix) -> Result<Cow<'_, Matrix>> {
    match m.format() {
        Encoding::Plain(Format::F32) => return Ok(Cow::Borrowed(m)),
        Encoding::Plain(_) if m.cols().is_multiple_of(32) => return Ok(Cow::Borrowed(m)),
        _ => {}
    }
    let (rows, cols) = (m.rows(), m.cols());
    let mut dense = vec![0f32; rows * cols];
    for (r, row) in dense.chunks_exact_mut(cols).enumerate() {
        m.row_f32(r, row);
    }
    Matrix::from_f32(Format::F32, rows, cols, &dense)
        .map(Cow::Owned)
        .map_err(|e| CudaError::Invalid(e.to_string()))
}

/// The raw bytes of a matrix as GGUF lays them out.
fn matrix_bytes(m: &Matrix) -> Vec<u8> {
    match m.storage() {
        Storage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Storage::Ggml(b) => b.as_bytes().to_vec(),
        // `on_device` widens affine weights before their bytes are asked for.
        Storage::Affine(a) => a.packed_le_bytes(),
    }
}

fn padded(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes.resize(bytes.len() + WEIGHT_PAD, 0);
    bytes
}

impl CudaModel {
    /// Copies `model`'s weights to GPU `ordinal`, with the matmul kernels
    /// `TENSORFOLD_CUDA_MATMUL` names (see [`MatmulKernels::from_env`]).
    pub fn upload(model: &Model, ordinal: usize) -> Result<CudaModel> {
        CudaModel::upload_with(model, ordinal, MatmulKernels::from_env())
    }

    /// Copies `model`'s weights to GPU `ordinal`, multiplying its quantized
    /// matrices with `kernels`.
    pub fn upload_with(model: &Model, ordinal: usize, kernels: MatmulKernels) -> Result<CudaModel> {
        let c = model.config.clone();
        // The one combination these kernels leave out: a mixture's slots
        // are added to the residual as they are summed.
        if c.plan.experts.is_some() && c.plan.post_norms {
            return Err(CudaError::Unsupported(format!(
                "mixture of experts with post-MLP norms ({}); run it on the CPU",
                c.arch.name()
            )));
        }
        if c.head_dim > 256 || !c.head_dim.is_multiple_of(4) {
            return Err(CudaError::Unsupported(format!(
                "head_dim {} (at most 256, a multiple of 4)",
                c.head_dim
            )));
        }
        if !crate::driver_present() {
            return Err(CudaError::Driver(
                "the CUDA driver library (libcuda.so.1) is not installed".into(),
            ));
        }
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal)).map_err(|_| {
            CudaError::Driver("the CUDA driver library could not be loaded".into())
        })??;
        // SAFETY: every launch and copy of this model goes to its one stream,
        // in order, so no cross-stream events are needed.
        unsafe { ctx.disable_event_tracking() };
        // Graph capture needs a stream of its own (not the legacy default).
        let stream = ctx.new_stream()?;
        let k = Kernels::load(&ctx, kernels)?;
        let sampler = SampleKernel::load(&ctx)?;
        // The few-row kernel keeps one partial sum per segment of a row
        // (and Q8_0 has the widest segment copies).
        let expert_ff = c.plan.experts.map_or(0, |e| e.ff);
        let inputs = c
            .hidden_size
            .max(c.intermediate_size)
            .max(expert_ff)
            .max(c.q_width());
        let segments = inputs.div_ceil(SEGMENT);
        if k.tensor.iter().any(Option::is_some)
            && few_shared(Format::Q8_0, segments, FEW_WARPS, 1) > FEW_SHARED_MAX
        {
            return Err(CudaError::Unsupported(format!(
                "rows of {inputs} inputs on tensor cores \
                 (TENSORFOLD_CUDA_MATMUL=fma has no limit)"
            )));
        }

        let vec = |v: &[f32]| -> Result<CudaSlice<f32>> { Ok(stream.clone_htod(v)?) };
        let opt = |v: &Option<Vec<f32>>| -> Result<Option<CudaSlice<f32>>> {
            v.as_deref().map(vec).transpose()
        };
        let mat = |m: &Matrix| -> Result<DevMatrix> {
            let m = &*on_device(m)?;
            let code = fmt_code(m.format())?;
            Ok(DevMatrix {
                code,
                rows: m.rows(),
                cols: m.cols(),
                data: stream.clone_htod(&padded(matrix_bytes(m)))?,
            })
        };
        let linear = |ms: &[&Matrix]| -> Result<Linear> {
            let owned = ms
                .iter()
                .map(|m| on_device(m))
                .collect::<Result<Vec<_>>>()?;
            let ms: Vec<&Matrix> = owned.iter().map(|m| &**m).collect();
            let width = ms.iter().map(|m| m.rows()).sum();
            let same = ms.windows(2).all(|w| w[0].format() == w[1].format());
            if same {
                let mut bytes = Vec::new();
                for m in &ms {
                    bytes.extend_from_slice(&matrix_bytes(m));
                }
                let code = fmt_code(ms[0].format())?;
                let fused = DevMatrix {
                    code,
                    rows: width,
                    cols: ms[0].cols(),
                    data: stream.clone_htod(&padded(bytes))?,
                };
                return Ok(Linear {
                    parts: vec![(fused, 0)],
                    width,
                });
            }
            let mut parts = Vec::new();
            let mut off = 0;
            for m in &ms {
                parts.push((mat(m)?, off));
                off += m.rows();
            }
            Ok(Linear { parts, width })
        };
        // gate | up, interleaved by 8 rows where the tensor cores multiply
        // them as one matrix, so that the SiLU runs in the product's store.
        let silu = c.plan.activation == Activation::Silu;
        let gate_up = |gate: &Matrix, up: &Matrix| -> Result<GateUp> {
            let (g, u) = (on_device(gate)?, on_device(up)?);
            let (ff, code) = (g.rows(), fmt_code(g.format())?);
            if !silu
                || g.format() != u.format()
                || u.rows() != ff
                || !ff.is_multiple_of(8)
                || k.tensor[code].is_none()
            {
                return linear(&[gate, up]).map(GateUp::Split);
            }
            let (gb, ub) = (matrix_bytes(&g), matrix_bytes(&u));
            let rb = gb.len() / ff;
            let mut bytes = Vec::with_capacity(gb.len() + ub.len());
            for b in (0..ff).step_by(8) {
                bytes.extend_from_slice(&gb[b * rb..(b + 8) * rb]);
                bytes.extend_from_slice(&ub[b * rb..(b + 8) * rb]);
            }
            Ok(GateUp::Gated(DevMatrix {
                code,
                rows: 2 * ff,
                cols: g.cols(),
                data: stream.clone_htod(&padded(bytes))?,
            }))
        };

        let mut blocks = Vec::with_capacity(model.blocks.len());
        for b in &model.blocks {
            blocks.push(DevBlock {
                attn_norm: vec(&b.attn_norm)?,
                qkv: linear(&[&b.q, &b.k, &b.v])?,
                q_bias: opt(&b.q_bias)?,
                k_bias: opt(&b.k_bias)?,
                v_bias: opt(&b.v_bias)?,
                q_norm: opt(&b.q_norm)?,
                k_norm: opt(&b.k_norm)?,
                o: mat(&b.o)?,
                ffn_norm: vec(&b.ffn_norm)?,
                mlp: match &b.experts {
                    Some(e) => Mlp::Experts(DevExperts {
                        router: mat(&e.router)?,
                        gate_up: (e.gate.iter().zip(&e.up))
                            .map(|(g, u)| linear(&[g, u]))
                            .collect::<Result<_>>()?,
                        down: e.down.iter().map(mat).collect::<Result<_>>()?,
                    }),
                    None => Mlp::Dense {
                        gate_up: gate_up(&b.gate, &b.up)?,
                        down: mat(&b.down)?,
                    },
                },
                post_attn_norm: opt(&b.post_attn_norm)?,
                post_ffn_norm: opt(&b.post_ffn_norm)?,
            });
        }
        let embed = mat(&model.embed)?;
        let head = model.lm_head.as_ref().map(mat).transpose()?;
        let norm = vec(&model.norm)?;
        stream.synchronize()?;
        Ok(CudaModel {
            weight_bytes: model.weight_bytes(),
            bytes_per_token: model.bytes_per_token(),
            ctx,
            stream,
            k,
            config: c,
            embed,
            head,
            blocks,
            norm,
            scratch: Mutex::new(Scratch::default()),
            experts: Mutex::new(ExpertScratch::default()),
            sampler,
            device_picks: device_picks_from_env(),
            profiling: AtomicBool::new(false),
            marks: Mutex::new(Vec::new()),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device's name, as the driver reports it.
    pub fn device_name(&self) -> Result<String> {
        Ok(self.ctx.name()?)
    }

    /// Bytes the weights take (as on the host).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Weight bytes read to decode one token.
    pub fn bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }

    /// An empty cache for one sequence on this model's device.
    pub fn new_cache(&self) -> CudaKv {
        CudaKv {
            stream: self.stream.clone(),
            layers: self.config.layers,
            width: self.config.kv_width(),
            cap: 0,
            len: 0,
            kv: None,
        }
    }

    /// Bytes a cache of this model takes per position (keys and values of
    /// every layer, f16): what the memory budget reserves.
    pub fn cache_bytes_per_position(&self) -> usize {
        self.new_cache().bytes_per_position()
    }

    /// An empty cache with room for `positions` before it grows.
    pub fn cache_with_capacity(&self, positions: usize) -> Result<CudaKv> {
        let mut c = self.new_cache();
        c.resize(positions)?;
        Ok(c)
    }

    /// Free and total bytes of this model's GPU, as the driver reports them.
    pub fn device_memory(&self) -> Result<(usize, usize)> {
        self.ctx.bind_to_thread()?;
        Ok(cudarc::driver::result::mem_get_info()?)
    }

    /// Sets how many blocks few-row matmuls launch (see [`FewRowGrid`]);
    /// the logits keep their bits.
    pub fn set_few_row_grid(&mut self, grid: FewRowGrid) {
        self.k.few_grid = grid;
        self.forget_graphs();
    }

    /// Drops the captured graphs: they hold the launches of the kernel
    /// choices before a switch changed them.
    fn forget_graphs(&mut self) {
        self.scratch.get_mut().expect("scratch lock").graphs.clear();
    }

    /// The rows from which matmuls take the many-row kernel.
    pub fn many_from(&self) -> usize {
        self.k.many_from
    }

    /// Sets the rows from which matmuls take the many-row kernel (the
    /// few-row kernel covers more rows in several block rows); the logits
    /// keep their bits.
    pub fn set_many_from(&mut self, rows: usize) {
        self.k.many_from = rows;
        self.forget_graphs();
    }

    /// Makes every many-row matmul take the tensor-core tile `name`
    /// (`m2x4`, `m1x4` or `m2x2`, as `TENSORFOLD_CUDA_TILE` does), or, with
    /// `None`, lets each call pick; the logits keep their bits. An unknown
    /// name is an error.
    pub fn set_many_tile(&mut self, name: Option<&str>) -> Result<()> {
        self.k.forced_many = match name {
            None => None,
            Some(n) => Some(
                many_tile_named(n)
                    .ok_or_else(|| CudaError::Invalid(format!("no many-row tile {n}")))?,
            ),
        };
        self.forget_graphs();
        Ok(())
    }

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

    fn record(&self, label: Option<String>) -> Result<()> {
        let event = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        self.marks.lock().expect("marks lock").push((label, event));
        Ok(())
    }

    /// Marks the start of a forward while profiling.
    fn mark_start(&self) -> Result<()> {
        if self.profiling.load(Ordering::Relaxed) {
            self.record(None)?;
        }
        Ok(())
    }

    /// Marks the end of the launch just queued while profiling.
    fn mark(&self, label: impl FnOnce() -> String) -> Result<()> {
        if self.profiling.load(Ordering::Relaxed) {
            self.record(Some(label()))?;
        }
        Ok(())
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// Runs `tokens` at positions `cache.len()..`, appending their keys and
    /// values to `cache`, and returns the requested logits row after row.
    pub fn forward(&self, tokens: &[u32], cache: &mut CudaKv, want: Logits) -> Result<Vec<f32>> {
        let mut seqs = [Seq {
            tokens,
            cache,
            logits: want,
        }];
        Ok(self.forward_batch(&mut seqs)?.pop().unwrap_or_default())
    }

    /// `x` is the input in f32 and `x16` the same as the tensor-core
    /// kernels take it (`tf_store_h16`; 0 where the width is not a multiple
    /// of 32, which those kernels never multiply).
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        w: &DevMatrix,
        x: u64,
        x16: u64,
        y: u64,
        m: usize,
        ldy: usize,
        out: Out,
    ) -> Result<()> {
        let (f, cfg, kind) = if let Some(tc) = &self.k.tensor[w.code] {
            let segments = w.cols.div_ceil(SEGMENT);
            if m < self.k.many_from {
                let warps = segments.min(FEW_WARPS);
                let format = FORMATS[w.code].0;
                // The fewest tiles that hold every row, among those whose
                // partial sums fit (one always does, checked at upload);
                // else the most that fit, over several block rows.
                let fits = |t: &usize| {
                    few_shared(format, segments, warps, FEW_TILES[*t]) <= FEW_SHARED_MAX
                };
                let t = (0..FEW_TILES.len())
                    .filter(fits)
                    .find(|&t| FEW_TILES[t] * 8 >= m)
                    .or_else(|| (0..FEW_TILES.len()).rev().find(fits))
                    .unwrap_or(0);
                let tiles = FEW_TILES[t];
                let shared = few_shared(format, segments, warps, tiles);
                let mut blocks = w.rows.div_ceil(16);
                let most = match self.k.few_grid {
                    FewRowGrid::PerWeightBlock => blocks,
                    FewRowGrid::Waves(waves) => {
                        let resident = tc.few[t].occupancy_max_active_blocks_per_multiprocessor(
                            32 * warps as u32,
                            shared,
                            None,
                        )? as usize;
                        waves * resident * self.k.multiprocessors
                    }
                    FewRowGrid::Blocks(n) => n,
                };
                // As many weight blocks for every block as balances them.
                blocks = blocks.div_ceil(blocks.div_ceil(most.max(1)));
                let cfg = LaunchConfig {
                    grid_dim: (blocks as u32, m.div_ceil(8 * tiles) as u32, 1),
                    block_dim: (32 * warps as u32, 1, 1),
                    shared_mem_bytes: shared as u32,
                };
                (&tc.few[t], cfg, Kind::Few(tiles))
            } else {
                let tile = self
                    .k
                    .forced_many
                    .unwrap_or_else(|| pick_many_tile(m, w.rows, &tc.resident));
                let (c, n) = MANY_TILES[tile];
                let (x, y) = many_blocks((c, n), m, w.rows);
                let cfg = LaunchConfig {
                    grid_dim: (x as u32, y as u32, 1),
                    block_dim: ((MANY_WARPS * 32) as u32, 1, 1),
                    shared_mem_bytes: many_shared(FORMATS[w.code].0, c, n) as u32,
                };
                (&tc.many[tile], cfg, Kind::Many(tile))
            }
        } else if w.cols.is_multiple_of(32) {
            let t = tile_for(m, w.rows, self.k.staged);
            let tile = TILES[t];
            let cfg = LaunchConfig {
                grid_dim: (
                    w.rows.div_ceil(MM_WARPS * tile.cols) as u32,
                    m.div_ceil(tile.rows) as u32,
                    1,
                ),
                block_dim: ((MM_WARPS * 32) as u32, 1, 1),
                shared_mem_bytes: tile.shared_bytes() as u32,
            };
            (&self.k.matmul[w.code][t], cfg, Kind::Tile(t))
        } else {
            // Only f32 rows come this narrow (`on_device`).
            let cfg = LaunchConfig {
                grid_dim: (w.rows.div_ceil(MM_WARPS) as u32, m as u32, 1),
                block_dim: ((MM_WARPS * 32) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            (&self.k.matmul_any, cfg, Kind::Any)
        };
        let wp = ptr(&w.data, &self.stream);
        let (mi, n, k, ld, mode) = (
            m as i32,
            w.rows as i32,
            w.cols as i32,
            ldy as i32,
            out.mode(),
        );
        let tensor = matches!(kind, Kind::Few(_) | Kind::Many(_));
        debug_assert!(
            !tensor || x16 != 0,
            "tensor-core input without its f16 copy"
        );
        if !tensor && matches!(out, Out::Gated(_)) {
            return Err(CudaError::Invalid(
                "a gated product needs the tensor-core kernels".into(),
            ));
        }
        let input = if tensor { x16 } else { x };
        let y16 = out.y16();
        let mut b = Launch::new(f);
        b.arg(&wp).arg(&input).arg(&y);
        if tensor {
            b.arg(&y16);
        }
        b.arg(&mi).arg(&n).arg(&k).arg(&ld).arg(&mode);
        // SAFETY: the arguments match `mm_*` in matmul.cu and `tc_*` in
        // tensor.cu (the few-row kernel's shared memory holds every
        // segment's partial sums of its tiles, checked above, with one tile
        // always fitting, checked at upload); `w` holds
        // `rows` rows of `cols` inputs, `x` holds `m * cols` floats (`x16`,
        // for the tensor cores, `m * cols / 2` words) and `y` at least
        // `m * ldy` with `ldy >= rows` (gated: `ldy >= rows / 2`, the
        // rows interleaved as `GateUp::Gated` says, and `y16`, unless 0,
        // `m * ldy / 2` words), all on this stream.
        unsafe { b.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| {
            let kernel = match kind {
                Kind::Few(tiles) => format!("tensor {}", few_kernel(tiles)),
                Kind::Many(tile) => format!("tensor {}", many_tile_name(tile)),
                Kind::Tile(t) => TILES[t].kernel("fma"),
                Kind::Any => "fma any".to_string(),
            };
            let format = FORMATS[w.code].1;
            let gated = if matches!(out, Out::Gated(_)) {
                " + silu"
            } else {
                ""
            };
            format!("matmul {format} {kernel} {}x{}{gated}", w.rows, w.cols)
        })
    }

    /// Attention of every row of `p` over its sequence's keys of `layer`,
    /// from `p.q` into `p.attn` (and `p.attn16`): on the tensor cores for
    /// the head dimensions they serve, else in f32.
    fn attention(&self, p: &Plan, layer: i32) -> Result<()> {
        let c = &self.config;
        let m = p.m;
        let (heads, kv_heads, hd) = (c.heads as i32, c.kv_heads as i32, c.head_dim as i32);
        let plan = &c.plan;
        let scale = 1.0 / (plan.query_scale_dim.unwrap_or(c.head_dim) as f32).sqrt();
        // The f32 kernels' window (0: none) and score cap (0: none); the
        // tensor-core ones serve models with neither (`tc_attention`).
        let window = plan
            .sliding_window
            .filter(|w| w.applies_to(layer as usize))
            .map_or(0, |w| w.size as i32);
        let softcap = plan.attn_softcap.unwrap_or(0.0);
        let (q, attn, attn16) = (p.q, p.attn, p.attn16);
        let group = c.heads / c.kv_heads;
        let tc = self.tc_attention();
        let split = split_attention(m, p.seqs);
        let k = &self.k;
        let (kernel, name) = match (tc, split, c.head_dim <= NARROW_HEADS) {
            (Some(f), _, _) if p.attention_splits > 1 => (&f.attend, "attention tc split"),
            (Some(f), _, _) => (&f.attend, "attention tc"),
            (None, true, true) => (&k.attention_split_128, "attention split"),
            (None, true, false) => (&k.attention_split, "attention split"),
            (None, false, true) => (&k.attention_128, "attention"),
            (None, false, false) => (&k.attention, "attention"),
        };
        let (rows, hb) = match tc {
            Some(_) => attention::tile(m, p.seqs, group),
            None => attention_tile(m, group),
        };
        // Staging pays once several rows share the key blocks.
        let stage = (m >= STAGE_KEYS_FROM) as i32;
        let (mi, rows_i, hb_i) = (m as i32, rows as i32, hb as i32);
        // Every attention kernel takes these first.
        let mut lb = Launch::new(kernel);
        lb.arg(&q).arg(&heads).arg(&kv_heads).arg(&hd).arg(&scale);
        p.cache_args(&mut lb);
        lb.arg(&layer).arg(&attn).arg(&attn16);
        let blocks = (m.div_ceil(rows) as u32, (c.heads / hb) as u32, 1);
        let part_blocks = p.partial_blocks as i32;
        // The fused form's null partials.
        let fused = 0u64;
        let cfg = match (tc, split) {
            (Some(_), _) if p.attention_splits > 1 => {
                lb.arg(&mi)
                    .arg(&rows_i)
                    .arg(&hb_i)
                    .arg(&p.partials)
                    .arg(&part_blocks);
                LaunchConfig {
                    grid_dim: (blocks.0, blocks.1, p.attention_splits as u32),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: attention::split_shared(c.head_dim) as u32,
                }
            }
            (Some(_), _) => {
                lb.arg(&mi)
                    .arg(&rows_i)
                    .arg(&hb_i)
                    .arg(&fused)
                    .arg(&part_blocks);
                LaunchConfig {
                    grid_dim: blocks,
                    block_dim: (32 * attention::warps(c.head_dim) as u32, 1, 1),
                    shared_mem_bytes: attention::shared(c.head_dim) as u32,
                }
            }
            (None, true) => {
                lb.arg(&window).arg(&softcap);
                LaunchConfig {
                    grid_dim: (m as u32, c.heads as u32, 1),
                    block_dim: (32 * SPLIT_WARPS as u32, 1, 1),
                    shared_mem_bytes: split_shared(c.head_dim) as u32,
                }
            }
            (None, false) => {
                lb.arg(&mi)
                    .arg(&rows_i)
                    .arg(&hb_i)
                    .arg(&stage)
                    .arg(&window)
                    .arg(&softcap);
                let warps = rows.div_ceil(ATTENTION_ROWS) * hb;
                LaunchConfig {
                    grid_dim: blocks,
                    block_dim: (32 * warps as u32, 1, 1),
                    shared_mem_bytes: attention_shared(c.head_dim, warps) as u32,
                }
            }
        };
        // SAFETY: matches `attention_tc_<hd>` in attention.cu (for this
        // head dimension), `attention` or `attention_split` in ops.cu;
        // keys 0..=pos of each row were written by this or an earlier
        // forward; a tensor-core tile's rows times heads are at most 16 and
        // its heads divide the group (`attention::tile`); `attention` has
        // at most ATTENTION_WARPS warps; the shared memory is what the
        // attributes set at load allow (`attention_split` and a split
        // tensor-core block stay under the default 48 KB); in the split
        // form `partials` holds `partial_blocks` key blocks for each of the
        // call's at most SPLIT_ROWS rows (`forward_batch_picked`).
        unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| name.into())?;
        match tc {
            Some(f) if p.attention_splits > 1 => self.fold_attention(f, p),
            _ => Ok(()),
        }
    }

    /// The tensor-core attention for this model's head dimension, if any
    /// (and if the model's attention has no sliding window and no score
    /// cap, which only the f32 kernels apply).
    fn tc_attention(&self) -> Option<&TcAttention> {
        let plan = &self.config.plan;
        if plan.sliding_window.is_some() || plan.attn_softcap.is_some() {
            return None;
        }
        self.k
            .attention_tc
            .iter()
            .find(|f| f.head_dim == self.config.head_dim)
    }

    /// Folds the split attention's partials of every (row, head) in block
    /// order into `p.attn` (and `p.attn16`).
    fn fold_attention(&self, f: &TcAttention, p: &Plan) -> Result<()> {
        let c = &self.config;
        let heads = c.heads as i32;
        let part_blocks = p.partial_blocks as i32;
        let mut lb = Launch::new(&f.fold);
        lb.arg(&p.partials)
            .arg(&part_blocks)
            .arg(&heads)
            .arg(&p.pos)
            .arg(&p.attn)
            .arg(&p.attn16);
        let cfg = LaunchConfig {
            grid_dim: (p.m as u32, c.heads as u32, 1),
            block_dim: (c.head_dim as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `attention_fold_<hd>` in attention.cu for this
        // head dimension; the split attention just wrote, on this stream,
        // the partials of every key block each row reads, within the
        // `partial_blocks` a slot has room for; `attn` has `m * heads *
        // head_dim` floats (`attn16`, unless 0, half as many words).
        unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| "attention fold".into())
    }

    fn linear(&self, l: &Linear, x: u64, x16: u64, y: u64, m: usize) -> Result<()> {
        for (w, off) in &l.parts {
            self.matmul(w, x, x16, y + (*off * 4) as u64, m, l.width, Out::Set)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn rmsnorm(
        &self,
        x: u64,
        idx: u64,
        w: u64,
        out: u64,
        out16: u64,
        rows: usize,
        h: usize,
    ) -> Result<()> {
        let (hi, eps) = (h as i32, self.config.rms_eps);
        let mut b = Launch::new(&self.k.rmsnorm);
        b.arg(&x)
            .arg(&idx)
            .arg(&w)
            .arg(&out)
            .arg(&out16)
            .arg(&hi)
            .arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `rmsnorm` in ops.cu; `x` has `h` floats per row
        // (and every `idx` entry is a row of it), `out` has `rows * h`,
        // `out16` (unless 0) `rows * h / 2` words with `h` a multiple of 32;
        // `x`, `w` and `out` start allocations, so rows of a multiple of 4
        // are 16-byte aligned for the kernel's float4 path.
        unsafe { b.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| "rmsnorm".into())
    }

    fn ensure_scratch(&self, s: &mut Scratch, m: usize, picked: usize, meta: usize) -> Result<()> {
        if s.bufs.is_some() && m <= s.rows && picked <= s.picked && meta <= s.meta {
            return Ok(());
        }
        let c = &self.config;
        let (rows, pick, meta) = (m.max(s.rows), picked.max(s.picked).max(1), meta.max(s.meta));
        let (h, qw, kvw, ff) = (
            c.hidden_size,
            c.q_width(),
            c.kv_width(),
            c.intermediate_size,
        );
        let st = &self.stream;
        let half_words = |rows, width| half_words(st, rows, width);
        s.graphs.clear();
        s.bufs = None;
        s.bufs = Some(Bufs {
            x: st.alloc_zeros(rows * h)?,
            xn: st.alloc_zeros(rows * h)?,
            qkv: st.alloc_zeros(rows * (qw + 2 * kvw))?,
            q: st.alloc_zeros(rows * qw)?,
            attn: st.alloc_zeros(rows * qw)?,
            gu: st.alloc_zeros(rows * 2 * ff)?,
            act: st.alloc_zeros(rows * ff)?,
            proj: st.alloc_zeros(if c.plan.post_norms { rows * h } else { 1 })?,
            picked: st.alloc_zeros(pick * h)?,
            logits: st.alloc_zeros(pick * c.vocab_size)?,
            meta: st.alloc_zeros(meta)?,
            host_meta: pinned(&self.ctx, meta)?,
            xn16: half_words(rows, h)?,
            attn16: half_words(rows, qw)?,
            act16: half_words(rows, ff)?,
            picked16: half_words(pick, h)?,
        });
        (s.rows, s.picked, s.meta) = (rows, pick, meta);
        Ok(())
    }

    /// Blocks sharing each tensor-core attention tile of a call of `m` rows
    /// of `seqs` sequences reading at most `positions` keys: 1 is the
    /// fused form.
    fn attention_splits(&self, m: usize, seqs: usize, positions: usize) -> usize {
        if !self.k.split_attention || self.tc_attention().is_none() {
            return 1;
        }
        let c = &self.config;
        let (rows, heads) = attention::tile(m, seqs, c.heads / c.kv_heads);
        let tiles = m.div_ceil(rows) * (c.heads / heads);
        attention::splits(
            m,
            tiles,
            attention::key_blocks(positions),
            self.k.multiprocessors,
        )
    }

    /// Room for the split attention's partials over `key_blocks` key blocks.
    fn ensure_partials(&self, s: &mut Scratch, key_blocks: usize) -> Result<()> {
        if s.partials.is_some() && key_blocks <= s.partial_blocks {
            return Ok(());
        }
        let c = &self.config;
        let blocks = key_blocks.next_power_of_two().max(2 * s.partial_blocks);
        s.graphs.clear();
        s.partials = None;
        s.partials = Some(self.stream.alloc_zeros(attention::partial_floats(
            attention::SPLIT_ROWS,
            c.heads,
            blocks,
            c.head_dim,
        ))?);
        s.partial_blocks = blocks;
        Ok(())
    }

    /// Cosine and sine tables for positions `0..len`, computed in f64 from
    /// the position alone exactly as the CPU forward does.
    fn ensure_rope(&self, s: &mut Scratch, need: usize) -> Result<()> {
        if s.rope.is_some() && need <= s.rope_len {
            return Ok(());
        }
        let c = &self.config;
        let len = need.max(2 * s.rope_len).max(c.max_positions.min(1 << 15));
        let table = |theta: f64| -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
            let half = c.head_dim / 2;
            let (mut cos, mut sin) = (
                Vec::with_capacity(len * half),
                Vec::with_capacity(len * half),
            );
            for pos in 0..len {
                for i in 0..half {
                    let angle = rotary_angle(theta, c.head_dim, i, pos);
                    cos.push(angle.cos() as f32);
                    sin.push(angle.sin() as f32);
                }
            }
            Ok((self.stream.clone_htod(&cos)?, self.stream.clone_htod(&sin)?))
        };
        s.graphs.clear();
        s.rope = Some(table(c.rope_theta)?);
        s.local_rope = c.plan.local_rope_theta.map(table).transpose()?;
        s.rope_len = len;
        Ok(())
    }

    /// Replays the graph captured for this plan's shape, capturing it the
    /// second time a shape comes (a one-off shape is not worth the capture);
    /// shapes with many rows, where kernel time dwarfs launch time, and
    /// devices that refuse capture run the launches directly.
    fn run(&self, graphs: &mut Graphs, plan: &Plan) -> Result<()> {
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
    fn capture(&self, plan: &Plan) -> Result<Option<CudaGraph>> {
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

    /// Queues the whole forward of `plan`: embedding, every layer, and the
    /// head over the picked rows. Its launches depend on the plan's shape
    /// and buffers only (positions, tokens and caches are read from `meta`
    /// on the device), which is what lets a captured graph be replayed.
    fn enqueue(&self, p: &Plan) -> Result<()> {
        let c = &self.config;
        let st = &self.stream;
        let (h, ff, vocab) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let m = p.m;
        let (x, xn, qkv, q, attn, gu, act) = (p.x, p.xn, p.qkv, p.q, p.attn, p.gu, p.act);
        let (xn16, attn16, act16) = (p.xn16, p.attn16, p.act16);
        let (cos, sin) = (p.cos, p.sin);
        let tokens_p = p.tokens;
        self.mark_start()?;
        {
            let (code, wp, hk) = (self.embed.code as i32, ptr(&self.embed.data, st), h as i32);
            let scale = match c.plan.embed_scale {
                true => (h as f32).sqrt(),
                false => 1.0,
            };
            let mut b = Launch::new(&self.k.embed);
            b.arg(&code)
                .arg(&wp)
                .arg(&tokens_p)
                .arg(&x)
                .arg(&hk)
                .arg(&scale);
            let cfg = LaunchConfig {
                grid_dim: (m as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: matches `embed` in ops.cu; tokens were checked against
            // the vocabulary, `x` holds `m * h` floats.
            unsafe { b.launch(&self.stream, cfg, self.k.early) }?;
            self.mark(|| "embed".into())?;
        }

        let (heads, kv_heads, hd) = (c.heads as i32, c.kv_heads as i32, c.head_dim as i32);
        let eps = c.rms_eps;
        let interleaved = (c.rope_style == RopeStyle::Interleaved) as i32;
        for (l, b) in self.blocks.iter().enumerate() {
            let layer = l as i32;
            let sliding = c.plan.sliding_window.is_some_and(|w| w.applies_to(l));
            let (cos, sin) = match sliding {
                true => (p.local_cos, p.local_sin),
                false => (cos, sin),
            };
            self.rmsnorm(x, 0, ptr(&b.attn_norm, st), xn, xn16, m, h)?;
            self.linear(&b.qkv, xn, xn16, qkv, m)?;
            {
                let (qb, kb, vb) = (
                    opt_ptr(&b.q_bias, st),
                    opt_ptr(&b.k_bias, st),
                    opt_ptr(&b.v_bias, st),
                );
                let (qn, kn) = (opt_ptr(&b.q_norm, st), opt_ptr(&b.k_norm, st));
                let mut lb = Launch::new(&self.k.qkv_post);
                lb.arg(&qkv)
                    .arg(&heads)
                    .arg(&kv_heads)
                    .arg(&hd)
                    .arg(&qb)
                    .arg(&kb)
                    .arg(&vb)
                    .arg(&qn)
                    .arg(&kn)
                    .arg(&eps)
                    .arg(&cos)
                    .arg(&sin)
                    .arg(&interleaved);
                p.cache_args(&mut lb);
                lb.arg(&layer).arg(&q);
                let cfg = LaunchConfig {
                    grid_dim: (m as u32, (c.heads + 2 * c.kv_heads) as u32, 1),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: matches `qkv_post` in ops.cu; every row's position
                // is below its cache's capacity (reserved above) and the
                // rope tables cover it.
                unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
                self.mark(|| "qkv_post".into())?;
            }
            self.attention(p, layer)?;
            self.residual_add(&b.post_attn_norm, p, m, |out, mode| {
                self.matmul(&b.o, attn, attn16, out, m, h, mode)
            })?;
            self.rmsnorm(x, 0, ptr(&b.ffn_norm, st), xn, xn16, m, h)?;
            match &b.mlp {
                Mlp::Experts(e) => self.mixture(e, xn, xn16, x, m)?,
                Mlp::Dense { gate_up, down } => {
                    match gate_up {
                        GateUp::Gated(w) => {
                            self.matmul(w, xn, xn16, act, m, ff, Out::Gated(act16))?
                        }
                        GateUp::Split(l) => {
                            self.linear(l, xn, xn16, gu, m)?;
                            self.gated_mul(gu, act, act16, m, ff)?;
                        }
                    }
                    self.residual_add(&b.post_ffn_norm, p, m, |out, mode| {
                        self.matmul(down, act, act16, out, m, h, mode)
                    })?;
                }
            }
        }

        if p.picks > 0 {
            self.rmsnorm(
                x,
                p.pick,
                ptr(&self.norm, st),
                p.picked,
                p.picked16,
                p.picks,
                h,
            )?;
            let head = self.head.as_ref().unwrap_or(&self.embed);
            self.matmul(
                head,
                p.picked,
                p.picked16,
                p.logits,
                p.picks,
                vocab,
                Out::Set,
            )?;
            if let Some(cap) = c.plan.final_softcap {
                let n = (p.picks * vocab) as i64;
                let mut lb = Launch::new(&self.k.softcap);
                lb.arg(&p.logits).arg(&n).arg(&cap);
                let cfg = LaunchConfig {
                    grid_dim: ((n as usize).div_ceil(256) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: matches `softcap` in ops.cu; `logits` holds the
                // picked rows' `n` logits.
                unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
                self.mark(|| "softcap".into())?;
            }
        }
        Ok(())
    }

    /// `act = f(gate) * up` from `gu` (gate | up, `ff` each, `m` rows),
    /// SiLU or GELU as the plan says, with its f16 copy in `act16` unless 0.
    fn gated_mul(&self, gu: u64, act: u64, act16: u64, m: usize, ff: usize) -> Result<()> {
        let (mi, fi) = (m as i32, ff as i32);
        let gelu = (self.config.plan.activation == Activation::GeluTanh) as i32;
        let mut lb = Launch::new(&self.k.gated_mul);
        lb.arg(&gu)
            .arg(&act)
            .arg(&act16)
            .arg(&mi)
            .arg(&fi)
            .arg(&gelu);
        let cfg = LaunchConfig {
            grid_dim: ((m * ff).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `gated_mul`; `gu` holds `m * 2ff`, `act` `m * ff`,
        // `act16` (unless 0) `m * ff / 2` words with `ff` a multiple of 32.
        unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| "gated_mul".into())
    }

    /// Adds a product to the residual `p.x`: `product(out, mode)` writes it
    /// straight there, or, with a post norm, to `p.proj`, whose norm is
    /// then added.
    fn residual_add(
        &self,
        post_norm: &Option<CudaSlice<f32>>,
        p: &Plan,
        m: usize,
        product: impl FnOnce(u64, Out) -> Result<()>,
    ) -> Result<()> {
        let Some(norm) = post_norm else {
            return product(p.x, Out::Add);
        };
        product(p.proj, Out::Set)?;
        let (h, eps) = (self.config.hidden_size as i32, self.config.rms_eps);
        let w = ptr(norm, &self.stream);
        let mut lb = Launch::new(&self.k.rmsnorm_add);
        lb.arg(&p.x).arg(&p.proj).arg(&w).arg(&h).arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (m as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `rmsnorm_add` in ops.cu; `x` and `proj` (sized
        // when the plan has post norms) hold `m` rows of `h`, `w` `h`.
        unsafe { lb.launch(&self.stream, cfg, self.k.early) }?;
        self.mark(|| "rmsnorm_add".into())
    }

    /// Runs several sequences in one forward: their rows share every matmul
    /// and each attends only to its own cache. Each sequence's logits are
    /// bitwise those it would get alone, in any chunking. Returns each
    /// sequence's requested logits rows, shaped like
    /// [`Model::forward_batch`]'s.
    pub fn forward_batch(&self, seqs: &mut [Seq<'_, CudaKv>]) -> Result<Vec<Vec<f32>>> {
        let rows = self.forward_batch_picked(seqs, &[])?;
        Ok(rows
            .into_iter()
            .map(|r| match r {
                SeqRows::Logits(l) => l,
                SeqRows::Picks(_) => unreachable!("no sequence had a draw"),
            })
            .collect())
    }

    /// [`CudaModel::forward_batch`], where each sequence `i` with a draw
    /// (`draws[i]`; missing entries count as none) has the token of each
    /// requested row picked on the device by the rule of
    /// `tensorfold-sampling`, at the position that row predicts (its own
    /// plus one): only those ids cross to the host. The picks are the
    /// tokens the CPU rule picks from the same rows.
    pub fn forward_batch_picked(
        &self,
        seqs: &mut [Seq<'_, CudaKv>],
        draws: &[Option<Draw>],
    ) -> Result<Vec<SeqRows>> {
        let draws = if self.device_picks { draws } else { &[] };
        let c = &self.config;
        let m: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if m == 0 {
            return Ok(vec![SeqRows::Logits(Vec::new()); seqs.len()]);
        }
        let vocab = c.vocab_size;
        let ns = seqs.len();
        let mut max_pos = 0;
        for s in seqs.iter_mut() {
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(CudaError::Invalid(format!(
                    "token {t} outside the vocabulary of {vocab}"
                )));
            }
            let need = s.cache.len + s.tokens.len();
            s.cache.reserve(need)?;
            max_pos = max_pos.max(need);
        }

        // One upload of everything the kernels index by row or sequence.
        let mut meta: Vec<u64> = Vec::with_capacity(3 * m + 3 * ns + m);
        for s in seqs.iter() {
            meta.extend(s.tokens.iter().map(|&t| t as u64));
        }
        for s in seqs.iter() {
            meta.extend((s.cache.len..s.cache.len + s.tokens.len()).map(|p| p as u64));
        }
        for (i, s) in seqs.iter().enumerate() {
            meta.extend(std::iter::repeat_n(i as u64, s.tokens.len()));
        }
        let mut counts = Vec::with_capacity(ns);
        let mut row = 0;
        let mut picks = Vec::new();
        let mut row_draws = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            let want = s.logits.rows(s.tokens.len());
            counts.push(want.len());
            if let Some(Some(draw)) = draws.get(i) {
                row_draws.extend(want.clone().map(|r| RowDraw {
                    row: picks.len() + r - want.start,
                    position: (s.cache.len + r + 1) as u64,
                    draw: *draw,
                }));
            }
            picks.extend(want.map(|r| (row + r) as u64));
            row += s.tokens.len();
        }
        for s in seqs.iter() {
            meta.push(s.cache.ptrs().0);
        }
        for s in seqs.iter() {
            meta.push(s.cache.ptrs().1);
        }
        for s in seqs.iter() {
            meta.push(s.cache.cap as u64);
        }
        let n = picks.len();
        meta.extend(picks);

        let mut guard = self.scratch.lock().expect("scratch lock");
        let sc = &mut *guard;
        self.ensure_scratch(sc, m, n, meta.len())?;
        self.ensure_rope(sc, max_pos)?;
        let attention_splits = self.attention_splits(m, ns, max_pos);
        if attention_splits > 1 {
            self.ensure_partials(sc, attention::key_blocks(max_pos))?;
        }
        let st = &self.stream;
        let bufs = sc.bufs.as_mut().expect("scratch");
        // Every forward ends with the stream synchronized, so the previous
        // copy out of the staging buffer is done.
        bufs.host_meta.as_mut_slice()?[..meta.len()].copy_from_slice(&meta);
        st.memcpy_htod(&bufs.host_meta, &mut bufs.meta)?;
        let (cos, sin) = sc.rope.as_ref().expect("rope");
        let (local_cos, local_sin) = match &sc.local_rope {
            Some((cos, sin)) => (cos, sin),
            None => (cos, sin),
        };
        let bufs = sc.bufs.as_ref().expect("scratch");
        let mp = ptr(&bufs.meta, st);
        let kb = mp + 24 * m as u64;
        let plan = Plan {
            m,
            seqs: ns,
            picks: n,
            attention_splits,
            partials: match (attention_splits, &sc.partials) {
                (2.., Some(partials)) => ptr(partials, st),
                _ => 0,
            },
            partial_blocks: sc.partial_blocks,
            tokens: mp,
            pos: mp + 8 * m as u64,
            seq: mp + 16 * m as u64,
            k_base: kb,
            v_base: kb + 8 * ns as u64,
            cap: kb + 16 * ns as u64,
            pick: kb + 24 * ns as u64,
            cos: ptr(cos, st),
            sin: ptr(sin, st),
            local_cos: ptr(local_cos, st),
            local_sin: ptr(local_sin, st),
            x: ptr(&bufs.x, st),
            xn: ptr(&bufs.xn, st),
            qkv: ptr(&bufs.qkv, st),
            q: ptr(&bufs.q, st),
            attn: ptr(&bufs.attn, st),
            gu: ptr(&bufs.gu, st),
            act: ptr(&bufs.act, st),
            proj: ptr(&bufs.proj, st),
            picked: ptr(&bufs.picked, st),
            logits: ptr(&bufs.logits, st),
            xn16: opt_ptr(&bufs.xn16, st),
            attn16: opt_ptr(&bufs.attn16, st),
            act16: opt_ptr(&bufs.act16, st),
            picked16: opt_ptr(&bufs.picked16, st),
        };
        self.run(&mut sc.graphs, &plan)?;

        // SAFETY: the head wrote `n` rows of `vocab` logits on this stream,
        // and every draw's row is one of them.
        let mut picked = unsafe {
            self.sampler
                .pick(st, &mut sc.picks, plan.logits, vocab, &row_draws)
        }?
        .into_iter();
        let bufs = sc.bufs.as_ref().expect("scratch");
        let mut out = Vec::with_capacity(ns);
        let mut first = 0;
        for (i, &k) in counts.iter().enumerate() {
            if let Some(Some(_)) = draws.get(i) {
                out.push(SeqRows::Picks(picked.by_ref().take(k).collect()));
            } else {
                let mut host = vec![0f32; k * vocab];
                if k > 0 {
                    let rows = bufs.logits.slice(first * vocab..(first + k) * vocab);
                    st.memcpy_dtoh(&rows, &mut host)?;
                }
                out.push(SeqRows::Logits(host));
            }
            first += k;
        }
        st.synchronize()?;
        drop(guard);
        for s in seqs.iter_mut() {
            s.cache.len += s.tokens.len();
        }
        Ok(out)
    }
}

impl tensorfold_models::Forward for CudaModel {
    type Cache = CudaKv;
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn forward_batch(
        &self,
        seqs: &mut [Seq<'_, CudaKv>],
    ) -> std::result::Result<Vec<Vec<f32>>, tensorfold_models::ForwardError> {
        CudaModel::forward_batch(self, seqs)
            .map_err(|e| tensorfold_models::ForwardError(e.to_string()))
    }
}

/// Device-to-device copy bandwidth of GPU `ordinal` in bytes per second,
/// counting bytes read and written, over copies of `bytes` bytes.
pub fn measure_copy_bandwidth(ordinal: usize, bytes: usize) -> Result<f64> {
    let ctx = CudaContext::new(ordinal)?;
    let st = ctx.default_stream();
    let a = st.alloc_zeros::<u8>(bytes)?;
    let mut b = st.alloc_zeros::<u8>(bytes)?;
    st.memcpy_dtod(&a, &mut b)?;
    st.synchronize()?;
    let reps = 10;
    let t = std::time::Instant::now();
    for _ in 0..reps {
        st.memcpy_dtod(&a, &mut b)?;
    }
    st.synchronize()?;
    Ok((2 * bytes * reps) as f64 / t.elapsed().as_secs_f64())
}
