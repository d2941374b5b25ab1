//! The decoder forward on an NVIDIA GPU, with kernels that keep the row
//! invariant: a row's logits never depend on what else is in the call.
//!
//! Matmuls fix each output element's reduction order from the weight shape
//! alone (`kernels/cuda/matmul.cu`), attention reduces keys in blocks of 64
//! counted from position 0, norms and rotary embeddings are per row. So GPU
//! logits are bitwise equal whether a position is decoded alone, verified
//! among drafts, prefilled in a chunk of any size or batched with other
//! sequences. GPU bits are not CPU bits (different kernels); the GPU serial
//! decode is the reference for GPU drafting.
//!
//! Everything device-side is behind the `cuda` feature. Without it the crate
//! builds no CUDA code and needs no toolkit; [`available`] says `false`.
//!
//! ```ignore
//! let gpu = tensorfold_cuda::CudaModel::upload(&bundle.model, 0)?;
//! let mut cache = gpu.new_cache();
//! let logits = gpu.forward(&ids, &mut cache, tensorfold_models::Logits::Last)?;
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(feature = "cuda")]
mod attention;
#[cfg(feature = "cuda")]
mod attention_f32;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod kernels;
#[cfg(feature = "cuda")]
mod kv;
#[cfg(feature = "cuda")]
mod launch;
#[cfg(feature = "cuda")]
mod matmul;
#[cfg(feature = "cuda")]
mod pinned;
#[cfg(feature = "cuda")]
mod sampling;

#[cfg(feature = "cuda")]
pub use device::{measure_copy_bandwidth, CudaModel, KernelTime};
#[cfg(feature = "cuda")]
pub use kv::CudaKv;
#[cfg(feature = "cuda")]
pub use matmul::{FewRowGrid, MatmulKernels};
#[cfg(feature = "cuda")]
pub use sampling::{DevicePicker, RowDraw};
pub use tensorfold_sampling::{Draw, SeqRows};

/// Whether attention runs on the tensor cores (queries, keys, weights and
/// values rounded to f16) for heads `head_dim` wide; other widths take f32
/// kernels, which widen the cached f16 keys and values.
#[cfg(feature = "cuda")]
pub fn attention_on_tensor_cores(head_dim: usize) -> bool {
    attention::kernels(head_dim).is_some()
}

/// What the device-side modules return.
#[cfg(feature = "cuda")]
type Result<T> = std::result::Result<T, CudaError>;

/// Errors of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The driver refused a call (no device, out of memory, bad launch).
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// The model uses something these kernels do not run.
    #[error("not supported on CUDA: {0}")]
    Unsupported(String),
    /// A caller's input is out of range.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// The crate was built without the `cuda` feature.
    #[error("built without CUDA support (enable the `cuda` feature)")]
    NotBuilt,
}

#[cfg(feature = "cuda")]
impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e.to_string())
    }
}

/// Whether a CUDA device can be used: the feature is built and the driver
/// reports at least one GPU.
pub fn available() -> bool {
    #[cfg(feature = "cuda")]
    {
        // A missing driver library panics inside cudarc: look for it first,
        // and keep the panic from escaping should it come anyway.
        driver_present()
            && std::panic::catch_unwind(|| {
                cudarc::driver::CudaContext::device_count().is_ok_and(|n| n > 0)
            })
            .unwrap_or(false)
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// Whether the driver library (libcuda) can be loaded.
#[cfg(feature = "cuda")]
pub(crate) fn driver_present() -> bool {
    // The stock comparison links libcuda (candle does); a binary that runs
    // has it.
    #[cfg(feature = "stock")]
    {
        true
    }
    #[cfg(not(feature = "stock"))]
    {
        // SAFETY: only tries to open the library by its names.
        unsafe { cudarc::driver::sys::is_culib_present() }
    }
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    #[test]
    fn without_the_feature_no_device_is_offered() {
        assert!(!super::available());
    }
}
