//! Where the target model runs: the CPU, an NVIDIA GPU when the crate is
//! built with the `cuda` feature, or an Apple GPU (Metal) on macOS. Both offer the scheduler the same
//! [`Forward`] and keep the row invariant, so on either device drafted,
//! batched and serial replies are the same bytes. The two devices' bits
//! differ from each other (different kernels): each device's serial decode
//! is its own reference. A draft model runs beside the target: on its
//! CUDA GPU when the target is there, else on the CPU ([`PlacedModel`]).
//! Context drafters stay on the CPU; drafters only propose.

use crate::EngineError;
use std::str::FromStr;
use std::sync::Arc;
use tensorfold_kv::{Cache, KvCache};
use tensorfold_models::{Forward, ForwardError, Model, Seq};
use tensorfold_sampling::{Draw, SeqRows};
use tensorfold_scheduler::PickingForward;

/// The device asked for (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// A GPU when one can be used and holds the model's formats, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
    Metal,
}

impl FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<BackendChoice, String> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            "cpu" => Ok(BackendChoice::Cpu),
            "cuda" => Ok(BackendChoice::Cuda),
            "metal" => Ok(BackendChoice::Metal),
            other => Err(format!(
                "unknown backend {other:?} (expected auto, cpu, cuda or metal)"
            )),
        }
    }
}

/// Whether a CUDA GPU can be used by this build (the `cuda` feature and a
/// driver that reports a GPU).
pub fn cuda_available() -> bool {
    tensorfold_cuda::available()
}

/// The device that holds the target's weights for the forward.
pub(crate) enum Device {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(Box<tensorfold_cuda::CudaModel>),
    #[cfg(target_os = "macos")]
    Metal(Box<tensorfold_metal::MetalModel>),
}

impl Device {
    /// Opens the device `choice` names for `model`. `Auto` takes CUDA GPU 0
    /// when the driver reports one and the model's formats run there, else
    /// the Metal device on macOS, else the CPU.
    pub(crate) fn open(choice: BackendChoice, model: &Model) -> Result<Device, EngineError> {
        match choice {
            BackendChoice::Cpu => Ok(Device::Cpu),
            BackendChoice::Metal => Device::metal(model),
            BackendChoice::Auto if !tensorfold_cuda::available() => {
                #[cfg(target_os = "macos")]
                if tensorfold_metal::available() {
                    return Device::metal(model);
                }
                Ok(Device::Cpu)
            }
            BackendChoice::Auto => match Device::cuda(model) {
                Err(EngineError::Backend(e)) if e.starts_with("not supported") => Ok(Device::Cpu),
                other => other,
            },
            BackendChoice::Cuda => Device::cuda(model),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda(model: &Model) -> Result<Device, EngineError> {
        tensorfold_cuda::CudaModel::upload(model, 0)
            .map(|m| Device::Cuda(Box::new(m)))
            .map_err(|e| EngineError::Backend(e.to_string()))
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda(_model: &Model) -> Result<Device, EngineError> {
        Err(EngineError::Backend(
            tensorfold_cuda::CudaError::NotBuilt.to_string(),
        ))
    }

    #[cfg(target_os = "macos")]
    fn metal(model: &Model) -> Result<Device, EngineError> {
        tensorfold_metal::MetalModel::upload(model)
            .map(|m| Device::Metal(Box::new(m)))
            .map_err(|e| EngineError::Backend(e.to_string()))
    }

    #[cfg(not(target_os = "macos"))]
    fn metal(_model: &Model) -> Result<Device, EngineError> {
        Err(EngineError::Backend(
            "Metal needs macOS with an Apple GPU".into(),
        ))
    }

    /// Where a draft model runs beside a target on this device: the same
    /// CUDA GPU when its weights upload there, so drafting moves no logits
    /// across the bus; the CPU otherwise (beside a Metal or CPU target,
    /// and after a refused upload, with a warning: the CPU drafts any model,
    /// and a draft only proposes, so where it runs never changes a reply).
    pub(crate) fn for_draft(&self, draft: &Model) -> Device {
        match self {
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => Device::cuda(draft).unwrap_or_else(|e| {
                tracing::warn!("the draft model runs on the CPU: {e}");
                Device::Cpu
            }),
            _ => {
                let _ = draft;
                Device::Cpu
            }
        }
    }

    /// `cpu`, `cuda:0 (device name)` or `metal`.
    pub(crate) fn name(&self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            #[cfg(target_os = "macos")]
            Device::Metal(_) => "metal".into(),
            #[cfg(feature = "cuda")]
            Device::Cuda(m) => format!(
                "cuda:0 ({})",
                m.device_name().unwrap_or_else(|_| "unknown GPU".into())
            ),
        }
    }

    /// Total bytes of the device's own memory and bytes in use now, for a
    /// GPU; `None` on the CPU (the process's memory is the budget there).
    pub(crate) fn device_memory(&self) -> Option<Result<(usize, usize), EngineError>> {
        match self {
            Device::Cpu => None,
            // Unified memory: the process's budget is the GPU's.
            #[cfg(target_os = "macos")]
            Device::Metal(_) => None,
            #[cfg(feature = "cuda")]
            Device::Cuda(m) => Some(
                m.device_memory()
                    .map(|(free, total)| (total, total - free))
                    .map_err(|e| EngineError::Backend(e.to_string())),
            ),
        }
    }

    /// Whether this is a GPU: a round of hundreds of rows costs it a few
    /// times one of a few rows (the weights are read once either way).
    pub(crate) fn is_gpu(&self) -> bool {
        !matches!(self, Device::Cpu)
    }

    /// Bytes a cache of `model` on this device takes per position: the
    /// memory budget's share of a position. The CUDA cache stores f16;
    /// the others are counted at f32, the most any device stores.
    pub(crate) fn cache_bytes_per_position(&self, model: &Model) -> usize {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(m) = self {
            return m.cache_bytes_per_position();
        }
        model.config.kv_shape().bytes_per_position()
    }

    /// An empty cache for one sequence: it allocates nothing until it
    /// grows, so it cannot fail.
    pub(crate) fn empty_cache(&self, model: &Model) -> DeviceCache {
        match self {
            Device::Cpu => DeviceCache::Cpu(KvCache::new(model.config.kv_shape())),
            #[cfg(feature = "cuda")]
            Device::Cuda(m) => DeviceCache::Cuda(m.new_cache()),
            #[cfg(target_os = "macos")]
            Device::Metal(m) => DeviceCache::Metal(m.new_cache()),
        }
    }

    /// An empty cache for one sequence, with room for `positions`.
    pub(crate) fn new_cache(
        &self,
        model: &Model,
        positions: usize,
    ) -> Result<DeviceCache, EngineError> {
        match self {
            Device::Cpu => Ok(DeviceCache::Cpu(KvCache::with_capacity(
                model.config.kv_shape(),
                positions,
            ))),
            #[cfg(feature = "cuda")]
            Device::Cuda(m) => m
                .cache_with_capacity(positions)
                .map(DeviceCache::Cuda)
                .map_err(|e| EngineError::Backend(e.to_string())),
            #[cfg(target_os = "macos")]
            Device::Metal(m) => Ok(DeviceCache::Metal(m.new_cache())),
        }
    }
}

/// One sequence's keys and values, on the device of its engine.
pub enum DeviceCache {
    Cpu(KvCache),
    #[cfg(feature = "cuda")]
    Cuda(tensorfold_cuda::CudaKv),
    #[cfg(target_os = "macos")]
    Metal(tensorfold_metal::MetalKv),
}

impl Cache for DeviceCache {
    fn len(&self) -> usize {
        match self {
            DeviceCache::Cpu(c) => c.len(),
            #[cfg(feature = "cuda")]
            DeviceCache::Cuda(c) => c.len(),
            #[cfg(target_os = "macos")]
            DeviceCache::Metal(c) => c.len(),
        }
    }

    fn truncate(&mut self, len: usize) {
        match self {
            DeviceCache::Cpu(c) => c.truncate(len),
            #[cfg(feature = "cuda")]
            DeviceCache::Cuda(c) => c.truncate(len),
            #[cfg(target_os = "macos")]
            DeviceCache::Metal(c) => c.truncate(len),
        }
    }

    fn allocated_bytes(&self) -> usize {
        match self {
            DeviceCache::Cpu(c) => c.allocated_bytes(),
            #[cfg(feature = "cuda")]
            DeviceCache::Cuda(c) => c.allocated_bytes(),
            #[cfg(target_os = "macos")]
            DeviceCache::Metal(c) => c.bytes(),
        }
    }
}

impl DeviceCache {
    /// A copy of the first `len` positions with room for `capacity`;
    /// `None` when the device cannot hold it now (the prompt then prefills).
    pub(crate) fn clone_prefix(&self, len: usize, capacity: usize) -> Option<DeviceCache> {
        match self {
            DeviceCache::Cpu(c) => Some(DeviceCache::Cpu(c.clone_prefix(len, capacity))),
            #[cfg(feature = "cuda")]
            DeviceCache::Cuda(c) => c.clone_prefix(len, capacity).ok().map(DeviceCache::Cuda),
            #[cfg(target_os = "macos")]
            DeviceCache::Metal(c) => Some(DeviceCache::Metal(c.clone_prefix(len))),
        }
    }

    /// Releases room beyond the stored positions.
    pub(crate) fn shrink_to_fit(&mut self) {
        match self {
            DeviceCache::Cpu(c) => c.shrink_to_fit(),
            #[cfg(feature = "cuda")]
            DeviceCache::Cuda(c) => {
                // A refused reallocation keeps the larger cache, still valid.
                let _ = c.shrink_to_fit();
            }
            // Tensors hold exactly the stored positions.
            #[cfg(target_os = "macos")]
            DeviceCache::Metal(_) => {}
        }
    }
}

/// A model's forward on its device: the target's, or a placed draft's.
pub(crate) struct Target<'a> {
    pub model: &'a Model,
    pub device: &'a Device,
}

/// A model and the device it runs on, owned together: what a draft model
/// is once the engine has placed it beside the target (see
/// [`Device::for_draft`]). Every request's drafter holds an `Arc` of it
/// with its own cache on that device, and drives the same [`Forward`] as
/// the target through [`PlacedModel::forward`].
pub(crate) struct PlacedModel {
    /// The weights as loaded on the host: kept so the model can be placed
    /// again when the target moves.
    pub model: Arc<Model>,
    pub device: Device,
}

impl PlacedModel {
    /// `model` on the device that suits a target on `target`.
    pub(crate) fn beside(model: Arc<Model>, target: &Device) -> PlacedModel {
        let device = target.for_draft(&model);
        PlacedModel { model, device }
    }

    pub(crate) fn forward(&self) -> Target<'_> {
        Target {
            model: &self.model,
            device: &self.device,
        }
    }

    /// Bytes a cache of this model takes per position on its device.
    pub(crate) fn cache_bytes_per_position(&self) -> usize {
        self.device.cache_bytes_per_position(&self.model)
    }

    pub(crate) fn empty_cache(&self) -> DeviceCache {
        self.device.empty_cache(&self.model)
    }
}

impl Forward for Target<'_> {
    type Cache = DeviceCache;

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn forward_batch(
        &self,
        seqs: &mut [Seq<'_, DeviceCache>],
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        match self.device {
            Device::Cpu => Forward::forward_batch(
                self.model,
                &mut on_device(seqs, |c| match c {
                    DeviceCache::Cpu(c) => Some(c),
                    #[cfg(any(feature = "cuda", target_os = "macos"))]
                    _ => None,
                })?,
            ),
            #[cfg(feature = "cuda")]
            Device::Cuda(gpu) => Forward::forward_batch(
                &**gpu,
                &mut on_device(seqs, |c| match c {
                    DeviceCache::Cuda(c) => Some(c),
                    _ => None,
                })?,
            ),
            #[cfg(target_os = "macos")]
            Device::Metal(gpu) => Forward::forward_batch(
                &**gpu,
                &mut on_device(seqs, |c| match c {
                    DeviceCache::Metal(c) => Some(c),
                    _ => None,
                })?,
            ),
        }
    }
}

/// A CUDA GPU picks the rows of sequences with a draw itself; the other
/// devices hand every row to the host, which picks by the same rule.
impl PickingForward for Target<'_> {
    fn forward_picked(
        &self,
        seqs: &mut [Seq<'_, DeviceCache>],
        draws: &[Option<Draw>],
    ) -> Result<Vec<SeqRows>, ForwardError> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(gpu) = self.device {
            let mut seqs = on_device(seqs, |c| match c {
                DeviceCache::Cuda(c) => Some(c),
                _ => None,
            })?;
            return gpu
                .forward_batch_picked(&mut seqs, draws)
                .map_err(|e| ForwardError(e.to_string()));
        }
        let _ = draws;
        Ok(self
            .forward_batch(seqs)?
            .into_iter()
            .map(SeqRows::Logits)
            .collect())
    }
}

/// The batch with each cache as its device's own type; `cache` answers
/// `None` for a cache that belongs to another device.
fn on_device<'a, C>(
    seqs: &'a mut [Seq<'_, DeviceCache>],
    cache: impl Fn(&'a mut DeviceCache) -> Option<&'a mut C>,
) -> Result<Vec<Seq<'a, C>>, ForwardError> {
    seqs.iter_mut()
        .map(|s| {
            Ok(Seq {
                tokens: s.tokens,
                logits: s.logits,
                cache: cache(&mut *s.cache)
                    .ok_or_else(|| ForwardError("a cache from another device".into()))?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorfold_models::synth::{self, SynthSpec};
    use tensorfold_models::{Arch, Format};

    #[test]
    fn backends_parse_and_unknown_ones_are_named() {
        for (s, b) in [
            ("auto", BackendChoice::Auto),
            ("cpu", BackendChoice::Cpu),
            ("cuda", BackendChoice::Cuda),
            ("metal", BackendChoice::Metal),
        ] {
            assert_eq!(s.parse::<BackendChoice>(), Ok(b));
        }
        assert!("gpu".parse::<BackendChoice>().unwrap_err().contains("gpu"));
    }

    #[test]
    fn a_device_that_is_not_there_is_refused_and_the_cpu_stays() {
        let path = std::env::temp_dir().join(format!("backend-{}.gguf", std::process::id()));
        synth::write_gguf(&path, &SynthSpec::tiny(Arch::Llama, Format::Q8_0, 3)).unwrap();
        let mut engine = crate::Engine::load(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let window = engine.window();
        assert_eq!(engine.set_backend(BackendChoice::Cpu).unwrap(), "cpu");
        if !cuda_available() {
            let e = engine.set_backend(BackendChoice::Cuda).unwrap_err();
            assert!(matches!(e, EngineError::Backend(_)), "{e}");
            assert_eq!(engine.set_backend(BackendChoice::Auto).unwrap(), "cpu");
        }
        if !cfg!(target_os = "macos") {
            assert!(engine.set_backend(BackendChoice::Metal).is_err());
        }
        assert_eq!(
            (engine.backend(), engine.window()),
            ("cpu".to_string(), window)
        );
    }
}
