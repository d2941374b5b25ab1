//! Compiles `kernels/cuda/*.cu` for sm_90 (machine code plus PTX, in one
//! fatbin, so the H200 loads it without a JIT step and later GPUs can still
//! JIT the PTX) when the `cuda` feature is on. Without the feature nothing runs, so builds without a CUDA toolkit
//! are unaffected.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let kernels = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../kernels/cuda");
    println!("cargo:rerun-if-changed={}", kernels.display());
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let nvcc = std::env::var("CUDA_HOME")
        .map(|h| PathBuf::from(h).join("bin/nvcc"))
        .unwrap_or_else(|_| PathBuf::from("nvcc"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    for name in [
        "matmul",
        "tensor",
        "ops",
        "attention",
        "experts",
        "sampling",
    ] {
        let src = kernels.join(format!("{name}.cu"));
        let ptx = out.join(format!("{name}.fatbin"));
        // Full-precision division, square root and denormals, and no
        // contraction beyond the explicit intrinsics: the kernels' bits
        // must not hinge on compiler choices.
        let status = Command::new(&nvcc)
            .args([
                "--fatbin",
                "-O3",
                "-std=c++17",
                "--fmad=false",
                "-prec-div=true",
            ])
            .args(["-prec-sqrt=true", "-ftz=false"])
            .arg(format!(
                "-gencode=arch=compute_{cap},code=[sm_{cap},compute_{cap}]"
            ))
            .arg("-I")
            .arg(&kernels)
            .arg(&src)
            .arg("-o")
            .arg(&ptx)
            .status()
            .unwrap_or_else(|e| panic!("running {}: {e}", nvcc.display()));
        assert!(status.success(), "nvcc failed on {}", src.display());
    }
}
