//! The local cache in Hugging Face's layout (`models--owner--name/` with
//! `blobs/`, `snapshots/COMMIT/` links and `refs/main`): finding a model
//! without the network, listing, removing.

use crate::choose::{choose, Choice};
use crate::error::{HubError, Result};
use crate::name::{ModelName, Pick};
use crate::remote::RemoteFile;
use crate::settings::Settings;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A model in the cache.
#[derive(Debug, Clone)]
pub struct LocalModel {
    /// The name that loads it (`REPO` or `REPO:FILE`).
    pub name: String,
    /// A GGUF file or a snapshot directory.
    pub path: PathBuf,
    /// Bytes on disk.
    pub size: u64,
}

/// The commit `refs/main` points at.
fn main_commit(repo_dir: &Path) -> Option<String> {
    std::fs::read_to_string(repo_dir.join("refs").join("main"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Files of a snapshot (paths relative to it), following links.
fn snapshot_files(snapshot: &Path) -> Vec<RemoteFile> {
    let mut out = Vec::new();
    let mut stack = vec![snapshot.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => stack.push(path),
                Ok(m) => out.push(RemoteFile {
                    name: relative(snapshot, &path),
                    size: m.len(),
                    sha256: None,
                }),
                Err(_) => {}
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn relative(base: &Path, path: &Path) -> String {
    path.strip_prefix(base)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// Where `name` lies in the cache, without the network.
pub fn resolve(settings: &Settings, name: &ModelName) -> Result<PathBuf> {
    let repo_dir = settings.repo_dir(&name.repo);
    let commit = main_commit(&repo_dir).ok_or_else(|| HubError::Offline(name.to_string()))?;
    let snapshot = repo_dir.join("snapshots").join(commit);
    let files = snapshot_files(&snapshot);
    match choose(name, &files).map_err(|_| HubError::Offline(name.to_string()))? {
        Choice::Gguf(f) => Ok(snapshot.join(f.name)),
        Choice::Directory { .. } => Ok(snapshot),
    }
}

/// Every model in the cache, by repository then name.
pub fn list(settings: &Settings) -> Vec<LocalModel> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(&settings.cache) else {
        return out;
    };
    let mut repos: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("models--"))
        })
        .collect();
    repos.sort();
    for repo_dir in repos {
        let folder = repo_dir.file_name().unwrap_or_default().to_string_lossy();
        let repo = folder["models--".len()..].replacen("--", "/", 1);
        let Some(commit) = main_commit(&repo_dir) else {
            continue;
        };
        let snapshot = repo_dir.join("snapshots").join(commit);
        let files = snapshot_files(&snapshot);
        let is_weight = |f: &RemoteFile| f.name.ends_with(".safetensors");
        if files.iter().any(|f| f.name == "config.json") && files.iter().any(is_weight) {
            out.push(LocalModel {
                name: repo.clone(),
                path: snapshot.clone(),
                size: files.iter().map(|f| f.size).sum(),
            });
        }
        for f in files.iter().filter(|f| f.name.ends_with(".gguf")) {
            out.push(LocalModel {
                name: format!("{repo}:{}", f.name),
                path: snapshot.join(&f.name),
                size: f.size,
            });
        }
    }
    out
}

/// Removes `name` from the cache: the whole repository for `REPO`, one
/// file (its links and its blob) for `REPO:FILE` or `REPO:QUANT`. Returns
/// the bytes freed.
pub fn remove(settings: &Settings, name: &ModelName) -> Result<u64> {
    let repo_dir = settings.repo_dir(&name.repo);
    if !repo_dir.exists() {
        return Err(HubError::NotFound(format!(
            "{} is not in the cache ({})",
            name.repo,
            settings.cache.display()
        )));
    }
    if name.pick == Pick::Default {
        let freed = disk_usage(&repo_dir.join("blobs"));
        std::fs::remove_dir_all(&repo_dir).map_err(|e| HubError::io(&repo_dir, e))?;
        return Ok(freed);
    }
    let link = resolve(settings, name)
        .map_err(|_| HubError::NotFound(format!("{name} is not in the cache")))?;
    let blob = std::fs::canonicalize(&link).map_err(|e| HubError::io(&link, e))?;
    let freed = std::fs::metadata(&blob).map_or(0, |m| m.len());
    // Every snapshot's link to this blob goes with it: none may dangle.
    let mut links = BTreeSet::new();
    for snapshot in std::fs::read_dir(repo_dir.join("snapshots"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for f in snapshot_files(&snapshot.path()) {
            let path = snapshot.path().join(&f.name);
            if std::fs::canonicalize(&path).is_ok_and(|p| p == blob) {
                links.insert(path);
            }
        }
    }
    for path in links.iter().chain(std::iter::once(&blob)) {
        std::fs::remove_file(path).map_err(|e| HubError::io(path, e))?;
    }
    Ok(freed)
}

fn disk_usage(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}
