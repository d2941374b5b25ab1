//! Sets `tensorfold_simd` when the target has AVX2 and FMA (the workspace
//! enables both for x86-64), selecting the intrinsic kernels.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tensorfold_simd)");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let has = |f: &str| features.split(',').any(|x| x == f);
    if arch == "x86_64" && has("avx2") && has("fma") {
        println!("cargo::rustc-cfg=tensorfold_simd");
    }
}
