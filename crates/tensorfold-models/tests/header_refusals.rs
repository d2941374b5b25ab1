//! `inspect` (what `info` and `load` run first) refuses, from the header
//! alone, a file its plan cannot run: the architecture and the tensors
//! missing or left unused are named.

use candle_core::quantized::gguf_file::{self, Value};
use std::path::{Path, PathBuf};
use tensorfold_models::synth::{write_gguf, SynthSpec};
use tensorfold_models::{inspect, Arch, Format};

fn path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tf-refusals-{}-{name}.gguf", std::process::id()))
}

/// Copies a GGUF file, its metadata edited by `edit`.
fn rewrite(src: &Path, dst: &Path, edit: impl Fn(&mut Vec<(String, Value)>)) {
    let mut file = std::fs::File::open(src).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut meta: Vec<(String, Value)> = content.metadata.clone().into_iter().collect();
    edit(&mut meta);
    let tensors: Vec<(String, _)> = content
        .tensor_infos
        .keys()
        .map(|name| {
            let t = content
                .tensor(&mut file, name, &candle_core::Device::Cpu)
                .unwrap();
            (name.clone(), t)
        })
        .collect();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, _)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::fs::File::create(dst).unwrap();
    gguf_file::write(&mut out, &meta_refs, &tensor_refs).unwrap();
}

fn refusal(path: &Path) -> String {
    match inspect(path) {
        Ok(_) => panic!("{} passed inspect", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_mixtral_file_passes_and_without_its_expert_count_is_refused_by_its_tensors() {
    let mixtral = path("mixtral");
    write_gguf(&mixtral, &SynthSpec::tiny(Arch::Mixtral, Format::Q8_0, 3)).unwrap();
    assert_eq!(inspect(&mixtral).unwrap().config.arch, Arch::Mixtral);

    let bare = path("mixtral-bare");
    rewrite(&mixtral, &bare, |m| {
        m.retain(|(k, _)| !k.starts_with("llama.expert"))
    });
    let err = refusal(&bare);
    assert!(err.contains("architecture 'llama'"), "{err}");
    assert!(err.contains("lacks blk.0.ffn_down.weight"), "{err}");
    assert!(err.contains("ffn_down_exps.weight"), "{err}");
}

#[test]
fn experts_in_a_family_without_routing_are_refused_by_name() {
    let qwen3 = path("qwen3");
    write_gguf(&qwen3, &SynthSpec::tiny(Arch::Qwen3, Format::Q8_0, 3)).unwrap();
    let with_experts = path("qwen3-experts");
    rewrite(&qwen3, &with_experts, |m| {
        m.push(("qwen3.expert_count".into(), Value::U32(8)));
    });
    let err = refusal(&with_experts);
    assert!(err.contains("architecture 'qwen3' with 8 experts"), "{err}");
}

#[test]
fn a_tensor_the_forward_would_not_use_is_refused() {
    let llama = path("llama");
    write_gguf(&llama, &SynthSpec::tiny(Arch::Llama, Format::F32, 3)).unwrap();
    // Llama 3.1's rope frequency factors: running without them would be wrong.
    let mut file = std::fs::File::open(&llama).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut tensors: Vec<(String, _)> = content
        .tensor_infos
        .keys()
        .map(|n| {
            let t = content
                .tensor(&mut file, n, &candle_core::Device::Cpu)
                .unwrap();
            (n.clone(), t)
        })
        .collect();
    let ones = candle_core::Tensor::new(&[1f32; 8][..], &candle_core::Device::Cpu).unwrap();
    let factors =
        candle_core::quantized::QTensor::quantize(&ones, candle_core::quantized::GgmlDType::F32)
            .unwrap();
    tensors.push(("rope_freqs.weight".into(), factors));
    let meta: Vec<(&str, &Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let refs: Vec<(&str, _)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let extra = path("llama-rope-freqs");
    gguf_file::write(&mut std::fs::File::create(&extra).unwrap(), &meta, &refs).unwrap();
    let err = refusal(&extra);
    assert!(err.contains("would not use: rope_freqs.weight"), "{err}");
}
