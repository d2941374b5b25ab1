//! `tensorfold pull`, `ls` and `rm`, and hub names wherever a model path goes.

use crate::cli::{LsArgs, PullArgs, RmArgs};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use tensorfold_hub::{Hub, ModelName};

/// A model argument as a local path: an existing file or directory as it
/// is; a hub name (`owner/name[:FILE|:QUANT]`) pulled into the cache first.
/// Also returns the hub name, a fitting model id for the server.
pub fn resolve(model: &Path) -> Result<(PathBuf, Option<String>)> {
    let text = model.to_string_lossy();
    // A missing file under an existing folder, or named like a model file
    // (without `:FILE`), is a mistyped path, not a hub name.
    let path_like = model
        .parent()
        .is_some_and(|p| p.is_dir() && p != Path::new(""))
        || (!text.contains(':') && (text.ends_with(".gguf") || text.ends_with(".safetensors")));
    if model.exists() || path_like {
        return Ok((model.to_path_buf(), None));
    }
    match ModelName::parse(&text) {
        Some(name) => {
            let path = Hub::from_env()
                .pull(&name)
                .with_context(|| format!("getting {name} from the hub"))?;
            Ok((path, Some(name.to_string())))
        }
        // Not a name either: the loader's own error says the path is missing.
        None => Ok((model.to_path_buf(), None)),
    }
}

pub fn pull(args: PullArgs) -> Result<()> {
    let hub = Hub::from_env();
    for text in &args.models {
        let name = parse(text)?;
        let path = hub.pull(&name).with_context(|| format!("pulling {name}"))?;
        println!("{}", path.display());
    }
    Ok(())
}

fn parse(text: &str) -> Result<ModelName> {
    ModelName::parse(text).with_context(|| {
        format!("`{text}` is not a hub name (owner/name, owner/name:FILE or owner/name:QUANT)")
    })
}

/// One row of `tensorfold ls`.
struct Row {
    name: String,
    size: u64,
    format: String,
    arch: String,
}

fn row(name: String, path: &Path, size: u64) -> Row {
    let (format, arch) = match tensorfold_models::inspect(path) {
        Ok(info) => {
            // The format of most weight bytes' tensors: the quant type a user names.
            let main = info
                .formats
                .iter()
                .filter(|(f, _)| f.as_str() != "F32" || info.formats.len() == 1)
                .max_by_key(|(_, n)| **n)
                .map_or("?", |(f, _)| f.as_str());
            let layout = if info.layout == "gguf" {
                "GGUF"
            } else {
                "safetensors"
            };
            (
                format!("{layout} {main}"),
                info.config.arch.name().to_string(),
            )
        }
        Err(e) => (format!("unsupported: {e}"), "-".into()),
    };
    Row {
        name,
        size,
        format,
        arch,
    }
}

fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// Models in the models folder: GGUF files and directories with a config.json.
fn models_folder(dir: &Path) -> Vec<(String, PathBuf, u64)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let size = if path.is_dir() && path.join("config.json").exists() {
            std::fs::read_dir(&path)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        } else if path.extension().is_some_and(|x| x == "gguf") {
            entry.metadata().map_or(0, |m| m.len())
        } else {
            continue;
        };
        out.push((path.display().to_string(), path, size));
    }
    out.sort();
    out
}

pub fn ls(args: LsArgs) -> Result<()> {
    let hub = Hub::from_env();
    let mut rows: Vec<Row> = hub
        .list()
        .into_iter()
        .map(|m| row(m.name, &m.path, m.size))
        .collect();
    rows.extend(
        models_folder(&tensorfold_registry::models_dir())
            .into_iter()
            .map(|(name, path, size)| row(name, &path, size)),
    );
    if args.json {
        let json: Vec<_> = rows
            .iter()
            .map(|r| serde_json::json!({"name": r.name, "size": r.size, "format": r.format, "architecture": r.arch}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    println!("{:width$}  {:>10}  {:<16}  ARCH", "NAME", "SIZE", "FORMAT");
    for r in &rows {
        println!(
            "{:width$}  {:>10}  {:<16}  {}",
            r.name,
            human(r.size),
            r.format,
            r.arch
        );
    }
    if rows.is_empty() {
        eprintln!(
            "no models in {} or {}",
            hub.settings().cache.display(),
            tensorfold_registry::models_dir().display()
        );
    }
    Ok(())
}

pub fn rm(args: RmArgs) -> Result<()> {
    let hub = Hub::from_env();
    for text in &args.models {
        let name = parse(text)?;
        let freed = hub
            .remove(&name)
            .with_context(|| format!("removing {name}"))?;
        eprintln!("removed {name} ({})", human(freed));
    }
    Ok(())
}
