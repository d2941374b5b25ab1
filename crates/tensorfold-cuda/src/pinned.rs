//! Page-locked host buffers: copies to and from them need no staging
//! through a driver buffer, so the stream need not stop for them.

use crate::CudaError;
use cudarc::driver::{CudaContext, DeviceRepr, PinnedHostSlice};
use std::sync::Arc;

/// `len` elements of page-locked host memory on `ctx`, for plain integers
/// the host fills or reads back.
pub(crate) fn pinned<T: DeviceRepr>(
    ctx: &Arc<CudaContext>,
    len: usize,
) -> Result<PinnedHostSlice<T>, CudaError> {
    // SAFETY: the buffers hold plain integers, valid whatever their bits;
    // every element is written before it is read. Flags 0: cached memory,
    // which the host reads back quickly (write-combined memory is not).
    Ok(unsafe { ctx.alloc_pinned_with_flags::<T>(len, 0) }?)
}
