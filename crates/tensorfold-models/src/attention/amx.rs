//! The tile unit (AMX) of recent x86 CPUs for attention's integer sums:
//! `tdpbssd` multiplies a 16×64-byte tile by a 64×16 one (four bytes a
//! column group) into 16×16 exact i32 sums. Rust has no stable intrinsics
//! for it, so each instruction is a line of inline assembly.
//!
//! Linux hands the tile state to a process only on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); [`available`] asks once. A thread
//! loads the tile shapes before use ([`Tiles::configure`]) and releases
//! them after ([`Drop`]).

use super::integer::ScoreSums;
use super::quantize::{QueryTile, WeightTile, ROWS};
use std::arch::asm;
use std::marker::PhantomData;
use tensorfold_kv::block::{HeadBlock, KEY_GROUP, KEY_TILE_DIMS, VALUE_GROUP};
use tensorfold_kv::BLOCK;

/// Bytes of one tile row (and of a whole tile's row group).
const ROW_BYTES: usize = 64;

/// Whether the CPU has the tile unit with 8-bit products and Linux grants
/// it to this process (asked once).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        // `cpuid` leaf 7 is asked for only where the CPU has it.
        let has_tiles = std::arch::x86_64::__cpuid(0).eax >= 7 && {
            let leaf = std::arch::x86_64::__cpuid_count(7, 0);
            // AMX-TILE (bit 24) and AMX-INT8 (bit 25).
            leaf.edx & (1 << 24) != 0 && leaf.edx & (1 << 25) != 0
        };
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call with integer arguments; it changes
        // only which register state this process may use.
        has_tiles
            && unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            } == 0
    })
}

/// Palette 1, eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

impl Config {
    fn all_full() -> Config {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(ROW_BYTES as u16).to_le_bytes());
            c[48 + t] = ROWS as u8;
        }
        Config(c)
    }
}

/// This thread's tiles, configured: made by [`Tiles::configure`], released
/// when dropped. Not `Send`: the configuration belongs to the thread.
pub(crate) struct Tiles(PhantomData<*const ()>);

impl Tiles {
    /// Loads the tile shapes on this thread.
    ///
    /// # Safety
    /// [`available`] returned true.
    pub unsafe fn configure() -> Tiles {
        let config = Config::all_full();
        // SAFETY: the CPU has the tile unit and the process may use it (the
        // caller's promise); the configuration is 64 readable bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly)) };
        Tiles(PhantomData)
    }

    #[inline(always)]
    fn zero<const T: u8>(&self) {
        // SAFETY: tiles are configured on this thread (`self` exists).
        unsafe { asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) };
    }

    /// Tile `T` takes 16 rows of 64 bytes from `p`, `stride` bytes apart.
    ///
    /// # Safety
    /// Those 16 rows are readable.
    #[inline(always)]
    unsafe fn load<const T: u8>(&self, p: *const i8, stride: usize) {
        // SAFETY: tiles are configured; the rows are readable (caller).
        unsafe {
            asm!("tileloadd tmm{t}, [{p} + {s} * 1]", t = const T, p = in(reg) p, s = in(reg) stride,
                options(nostack, readonly))
        };
    }

    /// Tile `T`'s 16 rows of 16 i32 go to `p`, `stride` bytes apart.
    ///
    /// # Safety
    /// Those 16 rows are writable.
    #[inline(always)]
    unsafe fn store<const T: u8>(&self, p: *mut i32, stride: usize) {
        // SAFETY: tiles are configured; the rows are writable (caller).
        unsafe {
            asm!("tilestored [{p} + {s} * 1], tmm{t}", t = const T, p = in(reg) p, s = in(reg) stride,
                options(nostack))
        };
    }

    /// Tile `C` += tile `A` × tile `B`, signed bytes, exact i32 sums.
    #[inline(always)]
    fn dot<const C: u8, const A: u8, const B: u8>(&self) {
        // SAFETY: tiles are configured on this thread.
        unsafe {
            asm!("tdpbssd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                options(nostack, nomem))
        };
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: tiles were configured on this thread.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// [`super::integer::scores_portable`] on the tile unit. `cross` is room
/// for the cross terms.
pub(crate) fn scores(
    tiles: &Tiles,
    queries: &QueryTile,
    head: &HeadBlock,
    out: &mut ScoreSums,
    cross: &mut ScoreSums,
) {
    let kd = queries.key_dim;
    assert!(kd == head.key_dim && kd.is_multiple_of(KEY_TILE_DIMS));
    assert!(queries.high.len() >= ROWS * kd && head.key_high.len() >= BLOCK * kd);
    let steps = kd / KEY_TILE_DIMS;
    let row_bytes = BLOCK * size_of::<i32>();
    // SAFETY (loads and stores): a query tile step reads 16 rows of 64 bytes
    // at column `64·step` of rows `kd` apart, within `ROWS·kd` bytes; a key
    // tile reads 16 rows of 64 bytes from row group `group·kd/4 + 16·step`,
    // within `BLOCK·kd` bytes; a result tile writes 16 rows of 16 i32 at
    // column `16·group` of rows `BLOCK` i32 apart, within `ScoreSums`.
    unsafe {
        for group in 0..BLOCK / KEY_GROUP {
            tiles.zero::<0>();
            tiles.zero::<1>();
            for step in 0..steps {
                if group == 0 || steps > 1 {
                    tiles.load::<2>(queries.high.as_ptr().add(step * KEY_TILE_DIMS), kd);
                    tiles.load::<3>(queries.low.as_ptr().add(step * KEY_TILE_DIMS), kd);
                }
                let at = (group * (kd / 4) + step * ROWS) * ROW_BYTES;
                tiles.load::<4>(head.key_high.as_ptr().add(at), ROW_BYTES);
                tiles.load::<5>(head.key_low.as_ptr().add(at), ROW_BYTES);
                tiles.dot::<0, 2, 4>();
                tiles.dot::<1, 2, 5>();
                tiles.dot::<1, 3, 4>();
            }
            tiles.store::<0>(out[0].as_mut_ptr().add(group * KEY_GROUP), row_bytes);
            tiles.store::<1>(cross[0].as_mut_ptr().add(group * KEY_GROUP), row_bytes);
        }
    }
    for (row, cross) in out.iter_mut().zip(cross.iter()) {
        for (s, c) in row.iter_mut().zip(cross) {
            *s = 256 * *s + c;
        }
    }
}

/// [`super::integer::values_portable`] on the tile unit. `low` is room for
/// the low parts' sums (`ROWS * value_dim`).
pub(crate) fn values(
    tiles: &Tiles,
    weights: &WeightTile,
    head: &HeadBlock,
    out: &mut [i32],
    low: &mut [i32],
) {
    let vd = head.value_dim;
    assert!(out.len() == ROWS * vd && low.len() == ROWS * vd && head.values.len() >= BLOCK * vd);
    let row_bytes = vd * size_of::<i32>();
    // SAFETY (loads and stores): the weight tiles are 16 rows of 64 bytes;
    // a value tile is the 16 rows of 64 bytes of dimension group `group`,
    // within `BLOCK·vd` bytes; a result tile writes 16 rows of 16 i32 at
    // column `16·group` of rows `vd` i32 apart, within `ROWS·vd`.
    unsafe {
        tiles.load::<2>(weights.high.as_ptr().cast(), BLOCK);
        tiles.load::<3>(weights.low.as_ptr().cast(), BLOCK);
        for group in 0..vd / VALUE_GROUP {
            tiles.zero::<0>();
            tiles.zero::<1>();
            tiles.load::<4>(
                head.values.as_ptr().add(group * (BLOCK / 4) * ROW_BYTES),
                ROW_BYTES,
            );
            tiles.dot::<0, 2, 4>();
            tiles.dot::<1, 3, 4>();
            tiles.store::<0>(out.as_mut_ptr().add(group * VALUE_GROUP), row_bytes);
            tiles.store::<1>(low.as_mut_ptr().add(group * VALUE_GROUP), row_bytes);
        }
    }
    for (o, l) in out.iter_mut().zip(low.iter()) {
        *o = 256 * *o + l;
    }
}
