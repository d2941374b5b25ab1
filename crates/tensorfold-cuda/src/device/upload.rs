//! Weights to the device: each matrix's GGUF bytes as stored (widened to
//! f32 where the kernels read no other form), fused where one input feeds
//! several, and the model's scratch, sampler and kernels set up.

use super::experts::{DevExperts, ExpertScratch};
use super::{CudaModel, DevBlock, DevMatrix, GateUp, Linear, Mlp, Scratch};
use crate::kernels::{device_picks_from_env, Kernels};
use crate::matmul::{
    few_shared, fmt_code, MatmulKernels, FEW_SHARED_MAX, FEW_WARPS, SEGMENT, WEIGHT_PAD,
};
use crate::sampling::SampleKernel;
use crate::{CudaError, Result};
use cudarc::driver::{CudaContext, CudaSlice};
use std::borrow::Cow;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use tensorfold_models::{Activation, Model};
use tensorfold_quant::{Encoding, Format, Matrix, Storage};

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
}
