//! One sequence's keys and values on the device ([`CudaKv`]): f16 bits,
//! layer-major, grown by copying and rolled back by truncation.

use crate::launch::ptr;
use crate::Result;
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;

/// Bytes of one cached key or value element: f16 bits.
pub(crate) const KV_BYTES: usize = 2;

/// One sequence's keys and values on the device, as f16 bits: the forward
/// rounds them to nearest once, when it writes them (`qkv_post`), which is
/// the rounding the tensor-core attention gives its inputs, so it reads
/// them as they are. Layer `l`'s keys for position `p` sit at
/// `(l * cap + p) * width`; growing copies what is held into a larger
/// allocation. Truncation only shortens the length, so a rolled-back cache
/// is bitwise the cache that never saw the dropped positions.
pub struct CudaKv {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) layers: usize,
    pub(crate) width: usize,
    pub(crate) cap: usize,
    pub(crate) len: usize,
    pub(crate) kv: Option<(CudaSlice<u16>, CudaSlice<u16>)>,
}

impl CudaKv {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions that fit before the next growth.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Drops every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Bytes held by stored positions (keys and values, all layers).
    pub fn bytes(&self) -> usize {
        self.len * self.bytes_per_position()
    }

    /// Bytes allocated on the device.
    pub fn allocated_bytes(&self) -> usize {
        self.cap * self.bytes_per_position()
    }

    /// Bytes one position takes: keys and values of every layer.
    pub(crate) fn bytes_per_position(&self) -> usize {
        self.layers * self.width * 2 * KV_BYTES
    }

    pub(crate) fn ptrs(&self) -> (u64, u64) {
        match &self.kv {
            Some((k, v)) => (ptr(k, &self.stream), ptr(v, &self.stream)),
            None => (0, 0),
        }
    }

    /// A cache holding this one's first `len` positions, with room for
    /// `capacity`: a retained prefix handed to a new sequence.
    pub fn clone_prefix(&self, len: usize, capacity: usize) -> Result<CudaKv> {
        let mut c = self.empty();
        c.resize(capacity.max(len))?;
        c.len = len.min(self.len);
        self.copy_held(&mut c)?;
        Ok(c)
    }

    /// An empty cache of the same shape on the same stream.
    pub(crate) fn empty(&self) -> CudaKv {
        CudaKv {
            stream: self.stream.clone(),
            layers: self.layers,
            width: self.width,
            cap: 0,
            len: 0,
            kv: None,
        }
    }

    /// Releases room beyond the stored positions (a cache kept for reuse).
    pub fn shrink_to_fit(&mut self) -> Result<()> {
        self.resize(self.len)
    }

    /// Makes room for `need` positions, growing in steps of
    /// [`tensorfold_kv::GROWTH`] (never by doubling: the memory budget
    /// reserves a stream's whole cache plus one step).
    pub(crate) fn reserve(&mut self, need: usize) -> Result<()> {
        if need <= self.cap {
            return Ok(());
        }
        self.resize(need.max(self.cap + tensorfold_kv::GROWTH))
    }

    /// Moves the held positions into an allocation of `positions` (rounded
    /// up to the growth step); `0` frees it.
    pub(crate) fn resize(&mut self, positions: usize) -> Result<()> {
        let cap = positions.next_multiple_of(tensorfold_kv::GROWTH);
        if cap == self.cap {
            return Ok(());
        }
        let mut next = CudaKv {
            cap,
            len: self.len.min(cap),
            ..self.empty()
        };
        if cap > 0 {
            let n = self.layers * cap * self.width;
            next.kv = Some((
                self.stream.alloc_zeros::<u16>(n)?,
                self.stream.alloc_zeros::<u16>(n)?,
            ));
        }
        self.copy_held(&mut next)?;
        *self = next;
        Ok(())
    }

    /// Copies this cache's first `dst.len` positions of every layer into `dst`.
    pub(crate) fn copy_held(&self, dst: &mut CudaKv) -> Result<()> {
        let positions = dst.len;
        let (Some((ok, ov)), Some((k, v))) = (&self.kv, &mut dst.kv) else {
            return Ok(());
        };
        let (w, st) = (self.width, &self.stream);
        let held = positions * w;
        for l in 0..self.layers {
            let (from, to) = (l * self.cap * w, l * dst.cap * w);
            st.memcpy_dtod(
                &ok.slice(from..from + held),
                &mut k.slice_mut(to..to + held),
            )?;
            st.memcpy_dtod(
                &ov.slice(from..from + held),
                &mut v.slice_mut(to..to + held),
            )?;
        }
        Ok(())
    }
}

impl tensorfold_kv::Cache for CudaKv {
    fn len(&self) -> usize {
        self.len
    }
    fn truncate(&mut self, len: usize) {
        CudaKv::truncate(self, len)
    }
    fn allocated_bytes(&self) -> usize {
        CudaKv::allocated_bytes(self)
    }
}
