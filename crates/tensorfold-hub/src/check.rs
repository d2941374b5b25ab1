//! The supported-format check before any weight is fetched: the headers are
//! read with range requests and laid into sparse stand-in files (the header
//! bytes at the start, the file's true length, holes elsewhere), then
//! `tensorfold_models::inspect` — `tensorfold info` itself — judges them.

use crate::error::{HubError, Result};
use crate::remote::{Remote, RemoteFile};
use std::fs::File;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use tensorfold_models::ModelInfo;

/// The first read of a GGUF header; doubled until the header parses.
const FIRST_READ: u64 = 1 << 20;
/// A header larger than this is refused rather than read.
const MAX_HEADER: u64 = 512 << 20;

/// A scratch folder removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tensorfold-hub-check-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| HubError::io(&dir, e))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `header` at the start of a sparse file of `size` bytes.
fn stand_in(path: &Path, header: &[u8], size: u64) -> Result<()> {
    let mut f = File::create(path).map_err(|e| HubError::io(path, e))?;
    f.write_all(header).map_err(|e| HubError::io(path, e))?;
    f.set_len(size.max(header.len() as u64))
        .map_err(|e| HubError::io(path, e))
}

/// Reads a remote GGUF file's header and checks it as `info` would.
pub fn gguf(remote: &Remote, repo: &str, commit: &str, file: &RemoteFile) -> Result<ModelInfo> {
    let mut len = FIRST_READ.min(file.size);
    let header = loop {
        let bytes = remote.read_range(repo, commit, &file.name, 0, len)?;
        let complete =
            candle_core::quantized::gguf_file::Content::read(&mut Cursor::new(&bytes)).is_ok();
        if complete || len >= file.size {
            break bytes;
        }
        if len >= MAX_HEADER {
            return Err(HubError::Choice(format!(
                "{}: no readable GGUF header in its first {} MiB",
                file.name,
                MAX_HEADER >> 20
            )));
        }
        len = (len * 2).min(file.size);
    };
    let scratch = Scratch::new()?;
    let path = scratch.0.join("model.gguf");
    stand_in(&path, &header, file.size)?;
    Ok(tensorfold_models::inspect(&path)?)
}

/// Checks a safetensors directory: `config.json` (already fetched, at
/// `config`) and each weight file's header, read remotely.
pub fn directory(
    remote: &Remote,
    repo: &str,
    commit: &str,
    config: &Path,
    weights: &[&RemoteFile],
) -> Result<ModelInfo> {
    let scratch = Scratch::new()?;
    let target = scratch.0.join("config.json");
    std::fs::copy(config, &target).map_err(|e| HubError::io(config, e))?;
    for file in weights {
        let prefix = remote.read_range(repo, commit, &file.name, 0, 8)?;
        let header_len = u64::from_le_bytes(prefix.as_slice().try_into().map_err(|_| {
            HubError::Choice(format!("{}: shorter than a safetensors header", file.name))
        })?);
        if header_len > MAX_HEADER || 8 + header_len > file.size {
            return Err(HubError::Choice(format!(
                "{}: not a safetensors file (header of {header_len} bytes)",
                file.name
            )));
        }
        let header = remote.read_range(repo, commit, &file.name, 0, 8 + header_len)?;
        let name = Path::new(&file.name)
            .file_name()
            .map_or_else(|| file.name.clone(), |n| n.to_string_lossy().into_owned());
        stand_in(&scratch.0.join(name), &header, file.size)?;
    }
    Ok(tensorfold_models::inspect(&scratch.0)?)
}
