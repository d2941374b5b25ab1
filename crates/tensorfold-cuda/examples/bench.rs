//! Speed of the CUDA forward on random-weight models of real shapes, built in
//! memory (no file to carry): decode tokens/s against the bandwidth bound,
//! prefill tokens/s, and aggregate tokens/s of batched streams.
//!
//! `cargo run --release --features cuda --example bench -- [smollm2|llama8b]... [decode] [depth] [fma] [profile] [grids]`
//! (`decode` stops after the decode cell; `depth` adds decode after 2k and
//! 8k positions; `fma` measures the f32
//! multiply-add matmuls beside the tensor-core ones; `profile` prints device
//! time by kernel for decode and for a prefill chunk; `grids` compares
//! decode and 16 streams under several few-row grids; `tiles` prefill
//! under each many-row tile). Built with
//! `--features stock`, every cell is also measured on candle's own quantized
//! CUDA path (candle-transformers' quantized Llama, which switches kernels
//! by row count) over the same weights, and the ratio is printed.

use std::time::Instant;
use tensorfold_cuda::{measure_copy_bandwidth, CudaKv, CudaModel, FewRowGrid, MatmulKernels};
use tensorfold_models::{Arch, Block, Format, Logits, Model, ModelConfig, RopeStyle, Seq};
use tensorfold_quant::Matrix;

struct Shape {
    name: &'static str,
    format: Format,
    config: ModelConfig,
}

fn shapes() -> Vec<Shape> {
    let llama = |vocab, h, ff, layers, heads, kv, hd, theta, tied| ModelConfig {
        arch: Arch::Llama,
        vocab_size: vocab,
        hidden_size: h,
        intermediate_size: ff,
        layers,
        heads,
        kv_heads: kv,
        head_dim: hd,
        rms_eps: 1e-5,
        rope_theta: theta,
        rope_style: RopeStyle::Interleaved,
        max_positions: 16384,
        tied_embeddings: tied,
        qkv_bias: false,
        qk_norm: false,
        plan: Default::default(),
    };
    vec![
        // SmolLM2-135M: 576 inputs per row is not a multiple of 256, so the
        // k-quants cannot store it; Q4_1 is the registry file's format.
        Shape {
            name: "smollm2",
            format: Format::Q4_1,
            config: llama(49152, 576, 1536, 30, 9, 3, 64, 100000.0, true),
        },
        Shape {
            name: "llama8b",
            format: Format::Q4K,
            config: llama(128256, 4096, 14336, 32, 32, 8, 128, 500000.0, false),
        },
    ]
}

/// Random GGUF blocks with sane scales, filled on every core.
fn random_matrix(format: Format, rows: usize, cols: usize, seed: u64) -> Matrix {
    let bytes = format.matrix_bytes(rows, cols);
    let mut buf = vec![0u8; bytes];
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let chunk = bytes.div_ceil(threads).next_multiple_of(8);
    std::thread::scope(|s| {
        for (i, part) in buf.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut x = seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                for w in part.chunks_mut(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let b = x.to_le_bytes();
                    w.copy_from_slice(&b[..w.len()]);
                }
            });
        }
    });
    let scale = 1.0 / (cols as f32).sqrt();
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let bb = format.block_bytes();
    for blk in buf.chunks_exact_mut(bb) {
        match format {
            // d, dmin: weights d*sc*q - dmin*m with sc, m < 64 and q < 16.
            Format::Q4K => {
                blk[0..2].copy_from_slice(&f16(scale / 200.0));
                blk[2..4].copy_from_slice(&f16(scale / 400.0));
            }
            // d, m: d*q + m, centred.
            Format::Q4_1 => {
                blk[0..2].copy_from_slice(&f16(scale / 4.0));
                blk[2..4].copy_from_slice(&f16(-scale * 2.0));
            }
            _ => unimplemented!("bench formats"),
        }
    }
    Matrix::from_bytes(format, rows, cols, &buf).expect("valid blocks")
}

fn random_model(shape: &Shape) -> Model {
    let c = shape.config.clone();
    let f = shape.format;
    let (h, qw, kvw, ff) = (
        c.hidden_size,
        c.q_width(),
        c.kv_width(),
        c.intermediate_size,
    );
    let mut seed = 1;
    let mut m = |rows, cols| {
        seed += 1;
        random_matrix(f, rows, cols, seed)
    };
    let ones = |n| vec![1.0f32; n];
    let blocks = (0..c.layers)
        .map(|_| Block {
            attn_norm: ones(h),
            q: m(qw, h),
            k: m(kvw, h),
            v: m(kvw, h),
            o: m(h, qw),
            q_bias: None,
            k_bias: None,
            v_bias: None,
            q_norm: None,
            k_norm: None,
            ffn_norm: ones(h),
            gate: m(ff, h),
            up: m(ff, h),
            down: m(h, ff),
            experts: None,
            post_attn_norm: None,
            post_ffn_norm: None,
        })
        .collect();
    let embed = m(c.vocab_size, h);
    let lm_head = (!c.tied_embeddings).then(|| m(c.vocab_size, h));
    Model {
        norm: ones(h),
        config: c,
        embed,
        blocks,
        lm_head,
    }
}

fn prefill(g: &CudaModel, kv: &mut CudaKv, toks: &[u32], chunk: usize) {
    let n = toks.len();
    for (i, c) in toks.chunks(chunk).enumerate() {
        let last = (i + 1) * chunk >= n;
        let want = if last { Logits::Last } else { Logits::None };
        g.forward(c, kv, want).unwrap();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let bw = measure_copy_bandwidth(0, 1 << 30).unwrap();
    println!("copy bandwidth (read + write): {:.0} GB/s", bw / 1e9);
    for shape in shapes() {
        let named = args.iter().any(|a| shapes().iter().any(|s| s.name == a));
        if named && !flag(shape.name) {
            continue;
        }
        let t = Instant::now();
        let model = random_model(&shape);
        let built = t.elapsed();
        let vocab = shape.config.vocab_size as u32;
        let toks: Vec<u32> = (0..8192u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let mut kinds = vec![MatmulKernels::TensorCores];
        if flag("fma") {
            kinds.push(MatmulKernels::Fma);
        }
        let mut all = Vec::new();
        for kernels in kinds {
            let t = Instant::now();
            let mut g = CudaModel::upload_with(&model, 0, kernels).unwrap();
            println!(
                "\n{} ({}, {:?} matmuls, {:.2} GB weights, {:.2} GB read per token): built {:.1?}, uploaded {:.1?}",
                shape.name,
                shape.format,
                kernels,
                g.weight_bytes() as f64 / 1e9,
                g.bytes_per_token() as f64 / 1e9,
                built,
                t.elapsed()
            );
            all.push(cells(&g, &toks, bw, flag("decode")));
            if flag("depth") {
                for depth in [2048, 8192] {
                    let rate = decode_at(&g, &toks, depth);
                    println!(
                        "decode at depth {depth}: {rate:.1} tok/s ({:.3} ms/token)",
                        1e3 / rate
                    );
                }
            }
            if flag("profile") {
                profile(&g, &toks);
            }
            if flag("rows") && kernels == MatmulKernels::TensorCores {
                rows_sweep(&mut g, &toks);
            }
            if flag("tiles") && kernels == MatmulKernels::TensorCores {
                tile_sweep(&mut g, &toks);
            }
            if flag("grids") && kernels == MatmulKernels::TensorCores {
                grid_sweep(&mut g, &toks);
            }
        }
        if let [tc, fma] = &all[..] {
            println!(
                "tensor cores / fma: decode {:.2}x, prefill 2048 {:.2}x, 8192 {:.2}x, 16 streams {:.2}x",
                tc.decode / fma.decode,
                tc.prefill[0] / fma.prefill[0],
                tc.prefill[1] / fma.prefill[1],
                tc.streams / fma.streams
            );
        }
        #[cfg(feature = "stock")]
        if !flag("decode") {
            let ours = &all[0];
            let stock_gguf = stock::gguf_bytes(&shape, &model);
            drop(model);
            let stock = stock::cells(&stock_gguf, &toks).expect("stock candle cells");
            let r = |a: f64, b: f64| a / b;
            println!(
                "stock candle: decode {:.1} tok/s, prefill 2048 {:.0} tok/s, 16 streams {:.1} tok/s (no 8k: its rotary table holds 4096 positions)",
                stock.decode, stock.prefill[0], stock.streams
            );
            println!(
                "row-invariant / stock: decode {:.2}x, prefill 2048 {:.2}x, 16 streams {:.2}x",
                r(ours.decode, stock.decode),
                r(ours.prefill[0], stock.prefill[0]),
                r(ours.streams, stock.streams)
            );
        }
    }
}

/// Rows per prefill forward in the prefill cells: `TENSORFOLD_BENCH_CHUNK`,
/// else the engine's 256.
fn prefill_chunk() -> usize {
    std::env::var("TENSORFOLD_BENCH_CHUNK")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256)
}

/// Decode tokens/s: a 128-token prompt, then one token per forward.
fn decode(g: &CudaModel, toks: &[u32]) -> f64 {
    let mut kv = g.new_cache();
    prefill(g, &mut kv, &toks[..128], 256);
    for t in &toks[128..136] {
        g.forward(&[*t], &mut kv, Logits::Last).unwrap();
    }
    let n = 128;
    let t = Instant::now();
    for t in &toks[136..136 + n] {
        g.forward(&[*t], &mut kv, Logits::Last).unwrap();
    }
    n as f64 / t.elapsed().as_secs_f64()
}

/// Decode tokens/s after a `depth`-token prompt.
fn decode_at(g: &CudaModel, toks: &[u32], depth: usize) -> f64 {
    let mut kv = g.new_cache();
    prefill(g, &mut kv, &toks[..depth - 64], 256);
    for t in &toks[depth - 64..depth - 56] {
        g.forward(&[*t], &mut kv, Logits::Last).unwrap();
    }
    let t = Instant::now();
    for t in &toks[depth - 56..depth] {
        g.forward(&[*t], &mut kv, Logits::Last).unwrap();
    }
    56.0 / t.elapsed().as_secs_f64()
}

/// Decode, an 8-row call, prefill at 2k and 8k and 16 streams on `g`
/// (only decode when `decode_only`).
fn cells(g: &CudaModel, toks: &[u32], bw: f64, decode_only: bool) -> Cells {
    let mut ours = Cells {
        decode: decode(g, toks),
        ..Cells::default()
    };
    let bound = bw / g.bytes_per_token() as f64;
    println!(
        "decode: {:.1} tok/s ({:.3} ms/token); bandwidth bound {:.1} tok/s; {:.0}% of bound",
        ours.decode,
        1e3 / ours.decode,
        bound,
        100.0 * ours.decode / bound
    );
    if decode_only {
        return ours;
    }

    // Verification-sized calls: 8 rows per forward, after the decode
    // cell's 264 positions.
    let mut kv = g.new_cache();
    prefill(g, &mut kv, &toks[..264], 256);
    let t = Instant::now();
    let reps = 32;
    for i in 0..reps {
        g.forward(&toks[i * 8..i * 8 + 8], &mut kv, Logits::All)
            .unwrap();
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "8-row forward: {:.3} ms ({:.1} rows/s)",
        1e3 * s / reps as f64,
        (8 * reps) as f64 / s
    );

    // Prefill at 2k and 8k, in the engine's 256-row chunks.
    for len in [2048usize, 8192] {
        let mut kv = g.new_cache();
        prefill(g, &mut kv, &toks[..256], 256);
        let mut kv = g.new_cache();
        let t = Instant::now();
        prefill(g, &mut kv, &toks[..len], prefill_chunk());
        let s = t.elapsed().as_secs_f64();
        ours.prefill.push(len as f64 / s);
        println!("prefill {len}: {:.0} tok/s ({:.2} s)", len as f64 / s, s);
    }

    ours.streams = streams(g, toks);
    println!(
        "16 streams: {:.1} tok/s aggregate ({:.3} ms per round)",
        ours.streams,
        16e3 / ours.streams
    );
    ours
}

/// Aggregate tokens/s of 16 streams, one token each per forward, after
/// 128-token prompts.
fn streams(g: &CudaModel, toks: &[u32]) -> f64 {
    let streams = 16;
    let mut caches: Vec<CudaKv> = (0..streams).map(|_| g.new_cache()).collect();
    for (i, kv) in caches.iter_mut().enumerate() {
        prefill(g, kv, &toks[i * 128..(i + 1) * 128], 256);
    }
    let rounds = 64;
    let mut step = |r: usize| {
        let next: Vec<u32> = (0..streams).map(|i| toks[(r * 31 + i) % 8192]).collect();
        stream_round(g, &mut caches, &next);
    };
    step(0);
    let t = Instant::now();
    for r in 1..=rounds {
        step(r);
    }
    (streams * rounds) as f64 / t.elapsed().as_secs_f64()
}

/// Decode and 16 streams under each few-row grid, in alternating passes,
/// as ratios to a block per weight block.
fn grid_sweep(g: &mut CudaModel, toks: &[u32]) {
    let grids = [
        FewRowGrid::PerWeightBlock,
        FewRowGrid::Waves(1),
        FewRowGrid::Waves(2),
        FewRowGrid::Waves(4),
    ];
    let mut best = vec![(0.0f64, 0.0f64); grids.len()];
    for _pass in 0..2 {
        for (i, grid) in grids.iter().enumerate() {
            g.set_few_row_grid(*grid);
            let (d, s) = (decode(g, toks), streams(g, toks));
            best[i] = (best[i].0.max(d), best[i].1.max(s));
        }
    }
    g.set_few_row_grid(FewRowGrid::from_env());
    for (grid, (d, s)) in grids.iter().zip(&best) {
        println!(
            "few-row grid {grid:?}: decode {d:.1} tok/s ({:.3}x), 16 streams {s:.1} tok/s ({:.3}x)",
            d / best[0].0,
            s / best[0].1
        );
    }
}

/// Prefill tokens/s at 2k and 8k in 256-row chunks and at 2k in 512-row
/// chunks under each many-row tile (the picked ones, then each forced), in
/// alternating passes; the median of three a cell.
fn tile_sweep(g: &mut CudaModel, toks: &[u32]) {
    let tiles = [None, Some("m2x4"), Some("m1x4")];
    let cells = [(2048usize, 256usize), (8192, 256), (2048, 512)];
    let mut rates = vec![vec![Vec::new(); cells.len()]; tiles.len()];
    for _pass in 0..3 {
        for (i, tile) in tiles.iter().enumerate() {
            g.set_many_tile(*tile).unwrap();
            for (c, &(len, chunk)) in cells.iter().enumerate() {
                let mut kv = g.new_cache();
                let t = Instant::now();
                prefill(g, &mut kv, &toks[..len], chunk);
                rates[i][c].push(len as f64 / t.elapsed().as_secs_f64());
            }
        }
    }
    g.set_many_tile(None).unwrap();
    for (tile, per) in tiles.iter().zip(&mut rates) {
        let mut line = format!("tile {:>8}:", tile.unwrap_or("picked"));
        for ((len, chunk), r) in cells.iter().zip(per.iter_mut()) {
            r.sort_by(f64::total_cmp);
            line += &format!("  prefill {len} by {chunk} {:.0} tok/s", r[1]);
        }
        println!("{line}");
    }
}

/// Milliseconds of one forward of `m` rows (the last row's logits), after
/// a 264-token prompt, with the many-row kernel from 33 rows and with the
/// few-row kernel for all: where to switch.
fn rows_sweep(g: &mut CudaModel, toks: &[u32]) {
    let default = g.many_from();
    for m in [16, 24, 32, 40, 48, 64, 96, 128, 192, 256] {
        let mut line = format!("{m:>4} rows:");
        for (kind, many_from) in [("many", 33), ("few", usize::MAX)] {
            g.set_many_from(many_from);
            let mut times = Vec::new();
            for rep in 0..7 {
                let mut kv = g.new_cache();
                prefill(g, &mut kv, &toks[..264], 256);
                let t = Instant::now();
                g.forward(&toks[264 + rep..264 + rep + m], &mut kv, Logits::Last)
                    .unwrap();
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            times.sort_by(f64::total_cmp);
            line += &format!("  {kind} {:.3} ms", times[3]);
        }
        println!("{line}");
    }
    g.set_many_from(default);
}

/// One forward of every stream in `caches`, stream i taking `next[i]`.
fn stream_round(g: &CudaModel, caches: &mut [CudaKv], next: &[u32]) {
    let mut seqs: Vec<Seq<'_, CudaKv>> = caches
        .iter_mut()
        .zip(next)
        .map(|(kv, t)| Seq {
            tokens: std::slice::from_ref(t),
            cache: kv,
            logits: Logits::Last,
        })
        .collect();
    g.forward_batch(&mut seqs).unwrap();
}

/// Device time by kernel of 16 decode steps after a 128-token prompt, of
/// one round of 16 streams after 128-token prompts, and of one 256-row
/// prefill chunk at position 1792.
fn profile(g: &CudaModel, toks: &[u32]) {
    let show = |what: &str, times: Vec<tensorfold_cuda::KernelTime>| {
        let total: f64 = times.iter().map(|t| t.ms).sum();
        println!("profile of {what}: {total:.3} ms of kernels");
        for t in times.iter().take(12) {
            println!(
                "  {:>8.3} ms {:>5.1}% {:>6} launches  {}",
                t.ms,
                100.0 * t.ms / total,
                t.launches,
                t.kernel
            );
        }
    };
    // 16 decode steps after a short prompt, then at depth (the split attention).
    for depth in [128, 8176] {
        let mut kv = g.new_cache();
        prefill(g, &mut kv, &toks[..depth], 256);
        g.start_profile();
        for t in &toks[depth..depth + 16] {
            g.forward(&[*t], &mut kv, Logits::Last).unwrap();
        }
        show(
            &format!("16 decode steps at {depth}"),
            g.finish_profile().unwrap(),
        );
    }
    let mut caches: Vec<CudaKv> = (0..16).map(|_| g.new_cache()).collect();
    for (i, kv) in caches.iter_mut().enumerate() {
        prefill(g, kv, &toks[i * 128..(i + 1) * 128], 256);
    }
    g.start_profile();
    stream_round(g, &mut caches, &toks[4096..4112]);
    show("a round of 16 streams", g.finish_profile().unwrap());
    let mut kv = g.new_cache();
    prefill(g, &mut kv, &toks[..1792], 256);
    g.start_profile();
    g.forward(&toks[1792..2048], &mut kv, Logits::Last).unwrap();
    show(
        "a 256-row prefill chunk at 1792",
        g.finish_profile().unwrap(),
    );
}

/// Tokens/s of the cells, for the stock comparison.
#[derive(Default)]
struct Cells {
    decode: f64,
    /// At 2048 tokens, then 8192 (ours only).
    prefill: Vec<f64>,
    streams: f64,
}

/// The same cells on candle's stock quantized CUDA path.
#[cfg(feature = "stock")]
mod stock {
    use super::{Cells, Shape};
    use candle_core::quantized::{ggml_file::qtensor_from_ggml, gguf_file, GgmlDType, QTensor};
    use candle_core::{Device, Result, Tensor};
    use candle_transformers::models::quantized_llama::ModelWeights;
    use std::time::Instant;
    use tensorfold_models::{Format, Model};
    use tensorfold_quant::{Matrix, Storage};

    fn dtype(f: Format) -> GgmlDType {
        match f {
            Format::Q4_1 => GgmlDType::Q4_1,
            Format::Q4K => GgmlDType::Q4K,
            other => unimplemented!("stock cells for {other}"),
        }
    }

    /// `model` written as a llama GGUF in memory: the very same blocks.
    pub fn gguf_bytes(shape: &Shape, model: &Model) -> Vec<u8> {
        let cpu = Device::Cpu;
        let q = |m: &Matrix| -> QTensor {
            let Storage::Ggml(b) = m.storage() else {
                unreachable!("bench weights are GGUF blocks")
            };
            qtensor_from_ggml(
                dtype(shape.format),
                b.as_bytes(),
                vec![m.rows(), m.cols()],
                &cpu,
            )
            .expect("blocks")
        };
        let f32s = |v: &[f32]| -> QTensor {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            qtensor_from_ggml(GgmlDType::F32, &bytes, vec![v.len()], &cpu).expect("norm")
        };
        let mut tensors: Vec<(String, QTensor)> = vec![
            ("token_embd.weight".into(), q(&model.embed)),
            ("output_norm.weight".into(), f32s(&model.norm)),
        ];
        if let Some(head) = &model.lm_head {
            tensors.push(("output.weight".into(), q(head)));
        }
        for (i, b) in model.blocks.iter().enumerate() {
            for (name, m) in [
                ("attn_q", &b.q),
                ("attn_k", &b.k),
                ("attn_v", &b.v),
                ("attn_output", &b.o),
                ("ffn_gate", &b.gate),
                ("ffn_up", &b.up),
                ("ffn_down", &b.down),
            ] {
                tensors.push((format!("blk.{i}.{name}.weight"), q(m)));
            }
            tensors.push((format!("blk.{i}.attn_norm.weight"), f32s(&b.attn_norm)));
            tensors.push((format!("blk.{i}.ffn_norm.weight"), f32s(&b.ffn_norm)));
        }
        let c = &shape.config;
        use gguf_file::Value as V;
        let metadata = [
            ("general.architecture", V::String("llama".into())),
            ("llama.attention.head_count", V::U32(c.heads as u32)),
            ("llama.attention.head_count_kv", V::U32(c.kv_heads as u32)),
            ("llama.block_count", V::U32(c.layers as u32)),
            ("llama.embedding_length", V::U32(c.hidden_size as u32)),
            ("llama.rope.dimension_count", V::U32(c.head_dim as u32)),
            ("llama.attention.layer_norm_rms_epsilon", V::F32(c.rms_eps)),
            ("llama.rope.freq_base", V::F32(c.rope_theta as f32)),
        ];
        let md: Vec<(&str, &V)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut out = std::io::Cursor::new(Vec::new());
        gguf_file::write(&mut out, &md, &ts).expect("gguf in memory");
        out.into_inner()
    }

    fn load(gguf: &[u8], device: &Device) -> Result<ModelWeights> {
        let mut r = std::io::Cursor::new(gguf);
        let content = gguf_file::Content::read(&mut r)?;
        ModelWeights::from_gguf(content, &mut r, device)
    }

    fn ids(toks: &[u32], rows: usize, device: &Device) -> Result<Tensor> {
        let n = toks.len() / rows;
        Tensor::from_slice(toks, (rows, n), device)
    }

    /// Prefills `toks` in 256-token chunks.
    fn prefill(m: &mut ModelWeights, toks: &[u32], device: &Device) -> Result<Tensor> {
        let mut out = None;
        for (i, chunk) in toks.chunks(256).enumerate() {
            out = Some(m.forward(&ids(chunk, 1, device)?, i * 256)?);
        }
        Ok(out.expect("a prompt"))
    }

    pub fn cells(gguf: &[u8], toks: &[u32]) -> Result<Cells> {
        let device = Device::new_cuda(0)?;
        let mut cells = Cells::default();
        let mut m = load(gguf, &device)?;
        let sync = |d: &Device| d.synchronize();

        // Decode: 128-token prompt, then one token per forward.
        prefill(&mut m, &toks[..128], &device)?;
        for (i, t) in toks[128..136].iter().enumerate() {
            m.forward(&ids(&[*t], 1, &device)?, 128 + i)?;
        }
        sync(&device)?;
        let n = 128;
        let t = Instant::now();
        for (i, tok) in toks[136..136 + n].iter().enumerate() {
            m.forward(&ids(&[*tok], 1, &device)?, 136 + i)?;
        }
        sync(&device)?;
        cells.decode = n as f64 / t.elapsed().as_secs_f64();

        // Prefill at 2k; candle-transformers' rotary table holds 4096
        // positions, so there is no 8k cell.
        let len = 2048;
        m.clear_kv_cache();
        prefill(&mut m, &toks[..256], &device)?;
        m.clear_kv_cache();
        sync(&device)?;
        let t = Instant::now();
        prefill(&mut m, &toks[..len], &device)?;
        sync(&device)?;
        cells.prefill.push(len as f64 / t.elapsed().as_secs_f64());

        // 16 streams as one batch of 16 rows, after 128-token prompts fed
        // one position at a time (its output head takes contiguous rows only).
        let streams = 16;
        m.clear_kv_cache();
        for p in 0..128 {
            let column: Vec<u32> = (0..streams).map(|i| toks[i * 128 + p]).collect();
            m.forward(&ids(&column, streams, &device)?, p)?;
        }
        let rounds = 64;
        let step = |m: &mut ModelWeights, r: usize| -> Result<Tensor> {
            let next: Vec<u32> = (0..streams).map(|i| toks[(r * 31 + i) % 8192]).collect();
            m.forward(&ids(&next, streams, &device)?, 128 + r)
        };
        step(&mut m, 0)?;
        sync(&device)?;
        let t = Instant::now();
        for r in 1..=rounds {
            step(&mut m, r)?;
        }
        sync(&device)?;
        cells.streams = (streams * rounds) as f64 / t.elapsed().as_secs_f64();
        Ok(cells)
    }
}
