//! Kernel launches that may overlap the kernel before them in the stream
//! (programmatic dependent launch, sm_90): every kernel waits for its
//! predecessor itself before touching what that one reads or writes
//! (`tf_wait_prior` in `kernels/cuda/common.cuh`), so an early start only
//! hides the launch and lets the matmuls copy weights meanwhile.

use crate::CudaError;
use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig};
use std::ffi::c_void;
use std::marker::PhantomData;

/// A kernel and its arguments, borrowed until the launch.
pub(crate) struct Launch<'a> {
    kernel: &'a CudaFunction,
    args: Vec<*mut c_void>,
    borrowed: PhantomData<&'a ()>,
}

impl<'a> Launch<'a> {
    pub(crate) fn new(kernel: &'a CudaFunction) -> Launch<'a> {
        Launch {
            kernel,
            args: Vec::new(),
            borrowed: PhantomData,
        }
    }

    /// Appends the kernel's next parameter.
    pub(crate) fn arg<T: DeviceRepr>(&mut self, value: &'a T) -> &mut Launch<'a> {
        self.args.push(value as *const T as *mut c_void);
        self
    }

    /// Launches on `stream`, allowed to start before the previous kernel
    /// ends when `early`.
    ///
    /// # Safety
    /// The arguments must be the kernel's parameters, in order and of their
    /// types, and every buffer they address must be valid for what the
    /// kernel does with it under `cfg`.
    pub(crate) unsafe fn launch(
        &mut self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        early: bool,
    ) -> Result<(), CudaError> {
        // SAFETY: a zeroed attribute is a valid plain C value; its id and
        // value are set before use.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: early as u32,
        };
        stream.context().bind_to_thread()?;
        // SAFETY: the caller vouches for the arguments; `config`, `attr`
        // and the argument pointers outlive the call, which copies them.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.kernel.cu_function(),
                self.args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()?;
        Ok(())
    }
}

/// The device address of `s`, for a kernel argument.
pub(crate) fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    // Event tracking is off and one stream does all the work, so the guard
    // has nothing to record.
    s.device_ptr(stream).0
}

/// The device address of `s`, or 0 (null) for none.
pub(crate) fn opt_ptr<T>(s: &Option<CudaSlice<T>>, stream: &CudaStream) -> u64 {
    s.as_ref().map_or(0, |s| ptr(s, stream))
}
