//! The model on the device and its forward: the types of its weights and
//! buffers, and a round's plan (`forward_batch_picked`). Uploading,
//! buffers, the launches, graphs and profiling each have a room in
//! `device/`, every one an `impl CudaModel` over these types.

mod enqueue;
mod experts;
mod graphs;
mod launches;
mod profile;
mod scratch;
mod upload;

use crate::attention;
use crate::kernels::Kernels;
use crate::kv::CudaKv;
use crate::launch::{opt_ptr, ptr, Launch};
use crate::matmul::{many_tile_named, FewRowGrid};
use crate::sampling::{PickBufs, RowDraw, SampleKernel};
use crate::{CudaError, Result};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};
use experts::{DevExperts, ExpertScratch};
use graphs::Graphs;
pub use profile::KernelTime;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use tensorfold_models::{Logits, ModelConfig, Seq};
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

impl CudaModel {
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
