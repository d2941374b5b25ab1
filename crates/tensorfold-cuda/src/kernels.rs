//! The kernels of one device, loaded from the fatbins built from
//! `kernels/cuda`, and the switches that choose among them.

use crate::attention;
use crate::attention_f32::{attention_shared, ATTENTION_WARPS, NARROW_HEADS};
use crate::matmul::{
    few_kernel, forced_many_tile, many_from_env, many_shared, many_tile_name, staged_tile,
    FewRowGrid, MatmulKernels, FEW_SHARED_MAX, FEW_TILES, FORMATS, MANY_TILES, MANY_WARPS, TILES,
};
use crate::Result;
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

pub(crate) static MATMUL_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/matmul.fatbin"));
pub(crate) static TENSOR_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tensor.fatbin"));
pub(crate) static OPS_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ops.fatbin"));
pub(crate) static ATTENTION_BIN: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/attention.fatbin"));
pub(crate) static EXPERTS_BIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/experts.fatbin"));

/// `TENSORFOLD_CUDA_EARLY_LAUNCH=0` keeps every kernel from starting before
/// the previous one ends; anything else (or nothing) lets them, on GPUs
/// that can (compute capability 9 and later). Bits do not change with it.
pub(crate) fn early_launch_from_env() -> bool {
    std::env::var("TENSORFOLD_CUDA_EARLY_LAUNCH").as_deref() != Ok("0")
}

/// `TENSORFOLD_CUDA_PICKS=0` sends every logits row to the host, which
/// picks by the same rule (for comparison; tokens do not change); anything
/// else (or nothing) picks the rows of sequences with a draw on the GPU.
pub(crate) fn device_picks_from_env() -> bool {
    std::env::var("TENSORFOLD_CUDA_PICKS").as_deref() != Ok("0")
}

/// `TENSORFOLD_CUDA_ATTENTION_SPLIT=0` keeps attention in its fused form
/// for every call (for comparison; bits do not change with it); anything
/// else (or nothing) splits few rows over long contexts across blocks.
pub(crate) fn attention_split_from_env() -> bool {
    std::env::var("TENSORFOLD_CUDA_ATTENTION_SPLIT").as_deref() != Ok("0")
}

pub(crate) struct Kernels {
    pub(crate) _modules: [Arc<CudaModule>; 5],
    /// The device's streaming multiprocessors.
    pub(crate) multiprocessors: usize,
    pub(crate) few_grid: FewRowGrid,
    /// Whether kernels may launch before the previous one ends
    /// (programmatic dependent launch; see `launch.rs`).
    pub(crate) early: bool,
    /// Whether attention may take its split form (`attention::splits`).
    pub(crate) split_attention: bool,
    /// `[format][tile]`.
    pub(crate) matmul: Vec<Vec<CudaFunction>>,
    /// f32 rows of any width (not a multiple of 32).
    pub(crate) matmul_any: CudaFunction,
    /// Index in `TILES` of the tile for many rows.
    pub(crate) staged: usize,
    /// `[format]`: tensor-core kernels for the quantized formats, when
    /// they multiply them.
    pub(crate) tensor: Vec<Option<TensorKernels>>,
    /// The many-row tile every call takes (an index in `MANY_TILES`), when
    /// `TENSORFOLD_CUDA_TILE` names one; else each call picks its own.
    pub(crate) forced_many: Option<usize>,
    /// Rows from which a call takes the many-row kernel.
    pub(crate) many_from: usize,
    pub(crate) embed: CudaFunction,
    pub(crate) rmsnorm: CudaFunction,
    pub(crate) qkv_post: CudaFunction,
    /// `attention` for head dimensions up to 256 and `attention_128`
    /// (fewer registers) up to 128.
    pub(crate) attention: CudaFunction,
    pub(crate) attention_128: CudaFunction,
    /// `attention_split` for head dimensions up to 256 and
    /// `attention_split_128` up to 128, likewise.
    pub(crate) attention_split: CudaFunction,
    pub(crate) attention_split_128: CudaFunction,
    /// The tensor-core attention, which its head dimensions take instead
    /// of the ones above.
    pub(crate) attention_tc: Vec<TcAttention>,
    /// `act(gate) * up`, SiLU or GELU.
    pub(crate) gated_mul: CudaFunction,
    /// The norms after attention and after the MLP, added to the residual.
    pub(crate) rmsnorm_add: CudaFunction,
    /// Final logits soft-capped.
    pub(crate) softcap: CudaFunction,
    /// A mixture of experts' steps around its matmuls (`experts.cu`).
    pub(crate) gather_rows: CudaFunction,
    pub(crate) scatter_weighted: CudaFunction,
    pub(crate) add_slots: CudaFunction,
}

/// `attention_tc_<hd>` and `attention_fold_<hd>` (its split form's fold).
pub(crate) struct TcAttention {
    pub(crate) head_dim: usize,
    pub(crate) attend: CudaFunction,
    pub(crate) fold: CudaFunction,
}

impl Kernels {
    pub(crate) fn load(ctx: &Arc<CudaContext>, path: MatmulKernels) -> Result<Kernels> {
        let mm = ctx.load_module(Ptx::from_binary(MATMUL_BIN.to_vec()))?;
        let tc = ctx.load_module(Ptx::from_binary(TENSOR_BIN.to_vec()))?;
        let multiprocessors =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let mut tensor = Vec::new();
        for (format, name) in FORMATS {
            if path == MatmulKernels::Fma || format.block_elems() == 1 {
                tensor.push(None);
                continue;
            }
            let mut few = Vec::new();
            for tiles in FEW_TILES {
                let f = tc.load_function(&format!("tc_{name}_{}", few_kernel(tiles)))?;
                f.set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    FEW_SHARED_MAX as i32,
                )?;
                few.push(f);
            }
            let mut many = Vec::new();
            let mut resident = Vec::new();
            for (i, (c, n)) in MANY_TILES.into_iter().enumerate() {
                let f = tc.load_function(&format!("tc_{name}_{}", many_tile_name(i)))?;
                let shared = many_shared(format, c, n);
                f.set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared as i32,
                )?;
                let per_multiprocessor = f.occupancy_max_active_blocks_per_multiprocessor(
                    (MANY_WARPS * 32) as u32,
                    shared,
                    None,
                )? as usize;
                resident.push(per_multiprocessor * multiprocessors);
                many.push(f);
            }
            tensor.push(Some(TensorKernels {
                few,
                many,
                resident,
            }));
        }
        let ops = ctx.load_module(Ptx::from_binary(OPS_BIN.to_vec()))?;
        let mut matmul = Vec::new();
        for (_, name) in FORMATS {
            let mut per = Vec::new();
            for t in TILES {
                let f = mm.load_function(&t.kernel(name))?;
                if t.staged {
                    f.set_attribute(
                        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        t.shared_bytes() as i32,
                    )?;
                }
                per.push(f);
            }
            matmul.push(per);
        }
        // An `attention` kernel for head dimensions up to `max_hd`, allowed
        // the shared memory of its largest block.
        let attention = |name: &str, max_hd: usize| -> Result<CudaFunction> {
            let f = ops.load_function(name)?;
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                attention_shared(max_hd, ATTENTION_WARPS) as i32,
            )?;
            Ok(f)
        };
        let att = ctx.load_module(Ptx::from_binary(ATTENTION_BIN.to_vec()))?;
        let mut attention_tc = Vec::new();
        for hd in attention::HEAD_DIMS {
            let (attend, fold) = attention::kernels(hd).expect("a listed head dimension");
            let attend = att.load_function(&attend)?;
            attend.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                attention::shared(hd) as i32,
            )?;
            attention_tc.push(TcAttention {
                head_dim: hd,
                attend,
                fold: att.load_function(&fold)?,
            });
        }
        let experts = ctx.load_module(Ptx::from_binary(EXPERTS_BIN.to_vec()))?;
        let major =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        Ok(Kernels {
            multiprocessors,
            few_grid: FewRowGrid::from_env(),
            early: major >= 9 && early_launch_from_env(),
            split_attention: attention_split_from_env(),
            matmul,
            matmul_any: mm.load_function("mm_f32_any")?,
            staged: staged_tile(),
            tensor,
            forced_many: forced_many_tile(),
            many_from: many_from_env(),
            embed: ops.load_function("embed")?,
            rmsnorm: ops.load_function("rmsnorm")?,
            qkv_post: ops.load_function("qkv_post")?,
            attention: attention("attention", 256)?,
            attention_128: attention("attention_128", NARROW_HEADS)?,
            attention_split: ops.load_function("attention_split")?,
            attention_split_128: ops.load_function("attention_split_128")?,
            attention_tc,
            gated_mul: ops.load_function("gated_mul")?,
            rmsnorm_add: ops.load_function("rmsnorm_add")?,
            softcap: ops.load_function("softcap")?,
            gather_rows: experts.load_function("gather_rows")?,
            scatter_weighted: experts.load_function("scatter_weighted")?,
            add_slots: experts.load_function("add_slots")?,
            _modules: [mm, tc, ops, att, experts],
        })
    }
}

/// The tensor-core kernels of one format.
pub(crate) struct TensorKernels {
    /// By `FEW_TILES`.
    pub(crate) few: Vec<CudaFunction>,
    /// By `MANY_TILES`.
    pub(crate) many: Vec<CudaFunction>,
    /// Blocks of each `many` kernel the device holds at once.
    pub(crate) resident: Vec<usize>,
}
