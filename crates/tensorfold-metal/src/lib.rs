//! The decoder forward on candle devices: Apple GPUs through candle's Metal
//! device on macOS, and candle's CPU device everywhere (how it is tested).
//!
//! The row invariant holds by construction: every row runs on its own,
//! position after position, through the same single-row operations as serial
//! decode (1-row matmuls against the weights, attention over keys `0..=pos`
//! of its own sequence), so a row's logits never depend on the rest of the
//! call. Each device's serial decode is its own reference; its bits are not
//! the CPU backend's. Weights are dequantized to f32 on upload.
//!
//! ```no_run
//! let bundle = tensorfold_models::load("model.gguf".as_ref()).unwrap();
//! let gpu = tensorfold_metal::MetalModel::upload(&bundle.model).unwrap();
//! let mut cache = gpu.new_cache();
//! let logits = gpu.forward(&[1, 2, 3], &mut cache, tensorfold_models::Logits::Last).unwrap();
//! ```

mod forward;

pub use forward::{MetalKv, MetalModel};

/// Errors of the Metal backend.
#[derive(Debug, thiserror::Error)]
pub enum MetalError {
    /// candle or the device refused an operation.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The platform has no Metal device.
    #[error("Metal needs macOS with an Apple GPU")]
    NoDevice,
    /// The model's plan has parts this forward does not run.
    #[error("not supported on Metal: {0}; run it on the CPU")]
    Unsupported(String),
}

pub type Result<T> = std::result::Result<T, MetalError>;

/// Whether a Metal device can be used here.
pub fn available() -> bool {
    #[cfg(target_os = "macos")]
    {
        candle_core::Device::new_metal(0).is_ok()
    }
    #[cfg(not(target_os = "macos"))]
    {
        false
    }
}
