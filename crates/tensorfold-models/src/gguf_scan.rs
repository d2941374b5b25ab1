//! A bounds-checked walk over a GGUF header's metadata before candle reads
//! it: finds `general.alignment` and refuses one that is not a power of
//! two (candle divides by it), and any length that runs past the file.

use crate::error::{ModelError, Result};
use std::io::{Read, Seek, SeekFrom};

/// What the header's metadata says about the layout of tensor data.
pub(crate) struct Layout {
    /// `general.alignment`, 32 when absent.
    pub alignment: u64,
}

const DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays nest at most this deep (GGUF writers nest one level).
const MAX_DEPTH: usize = 4;

struct Scanner<'r, R> {
    reader: &'r mut R,
    /// Bytes left in the file after the current position.
    remaining: u64,
    /// Version 1 writes 32-bit counts and lengths, later versions 64-bit.
    wide: bool,
}

fn malformed(what: impl std::fmt::Display) -> ModelError {
    ModelError::Malformed(format!("header: {what}"))
}

impl<R: Read + Seek> Scanner<'_, R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        if (N as u64) > self.remaining {
            return Err(malformed("truncated"));
        }
        let mut buf = [0u8; N];
        self.reader
            .read_exact(&mut buf)
            .map_err(|e| malformed(format!("truncated: {e}")))?;
        self.remaining -= N as u64;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn length(&mut self) -> Result<u64> {
        if self.wide {
            self.u64()
        } else {
            self.u32().map(u64::from)
        }
    }

    fn skip(&mut self, n: u64) -> Result<()> {
        if n > self.remaining {
            return Err(malformed(format!(
                "a length of {n} bytes runs past the end of the file"
            )));
        }
        let step = i64::try_from(n).map_err(|_| malformed("length too large"))?;
        self.reader
            .seek(SeekFrom::Current(step))
            .map_err(malformed)?;
        self.remaining -= n;
        Ok(())
    }

    fn string(&mut self) -> Result<String> {
        let len = self.length()?;
        if len > self.remaining || len > 1 << 20 {
            return Err(malformed(format!("a key of {len} bytes")));
        }
        let mut buf = vec![0u8; len as usize];
        self.reader
            .read_exact(&mut buf)
            .map_err(|e| malformed(format!("truncated: {e}")))?;
        self.remaining -= len;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// The bytes of one value of `kind` on disk when fixed.
    fn fixed_size(kind: u32) -> Option<u64> {
        match kind {
            0 | 1 | 7 => Some(1),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        }
    }

    /// Reads an integer value of `kind`, or skips any other value.
    fn value(&mut self, kind: u32, depth: usize) -> Result<Option<i128>> {
        let int = match kind {
            0 => i128::from(self.bytes::<1>()?[0]),
            1 => i128::from(self.bytes::<1>()?[0] as i8),
            2 => i128::from(u16::from_le_bytes(self.bytes()?)),
            3 => i128::from(i16::from_le_bytes(self.bytes()?)),
            4 => i128::from(self.u32()?),
            5 => i128::from(self.u32()? as i32),
            10 => i128::from(self.u64()?),
            11 => i128::from(self.u64()? as i64),
            6 | 7 | 12 => {
                self.skip(Self::fixed_size(kind).unwrap_or(0))?;
                return Ok(None);
            }
            8 => {
                let len = self.length()?;
                self.skip(len)?;
                return Ok(None);
            }
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(malformed("arrays nest too deep"));
                }
                let element = self.u32()?;
                let len = self.length()?;
                match Self::fixed_size(element) {
                    Some(size) => self.skip(len.saturating_mul(size))?,
                    None => {
                        // Every string or array element takes at least 4 bytes.
                        if len.saturating_mul(4) > self.remaining {
                            return Err(malformed(format!(
                                "an array of {len} elements runs past the end of the file"
                            )));
                        }
                        for _ in 0..len {
                            self.value(element, depth + 1)?;
                        }
                    }
                }
                return Ok(None);
            }
            other => return Err(malformed(format!("unknown value type {other}"))),
        };
        Ok(Some(int))
    }
}

/// Walks the metadata of the GGUF file `reader` is at the start of, and
/// leaves `reader` where it started.
pub(crate) fn scan<R: Read + Seek>(reader: &mut R) -> Result<Layout> {
    let start = reader.stream_position().map_err(malformed)?;
    let end = reader.seek(SeekFrom::End(0)).map_err(malformed)?;
    reader.seek(SeekFrom::Start(start)).map_err(malformed)?;
    let mut scanner = Scanner {
        reader,
        remaining: end.saturating_sub(start),
        wide: true,
    };
    let magic = scanner.bytes::<4>()?;
    if &magic != b"GGUF" {
        return Err(malformed("no GGUF magic"));
    }
    let version = scanner.u32()?;
    if !(1..=3).contains(&version) {
        return Err(malformed(format!("version {version} is not 1, 2 or 3")));
    }
    scanner.wide = version > 1;
    let _tensors = scanner.length()?;
    let entries = scanner.length()?;
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..entries {
        let key = scanner.string()?;
        let kind = scanner.u32()?;
        let value = scanner.value(kind, 0)?;
        if key == "general.alignment" {
            // candle reads the alignment only from types of 32 bits or less.
            let value = value.filter(|_| !matches!(kind, 10 | 11));
            alignment = value
                .and_then(|v| u64::try_from(v).ok())
                .filter(|v| v.is_power_of_two() && *v <= 1 << 30)
                .ok_or_else(|| {
                    malformed(format!(
                        "general.alignment must be a power of two, is {}",
                        value.map_or("not an integer".into(), |v| v.to_string())
                    ))
                })?;
        }
    }
    scanner
        .reader
        .seek(SeekFrom::Start(start))
        .map_err(malformed)?;
    Ok(Layout { alignment })
}
