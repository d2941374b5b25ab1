//! `tensorfold pull`, `ls`, `rm`, and `run` with a hub name, against a
//! local server speaking the hub's file API (through HF_ENDPOINT).

#[path = "../../tensorfold-hub/tests/hub_server/mod.rs"]
mod hub_server;

use hub_server::{HubFile, HubServer, HubState};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tensorfold_models::synth::{write_gguf, SynthSpec};
use tensorfold_models::{Arch, Format};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("cli-hub")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn tensorfold(endpoint: &str, home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .args(args)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", home)
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_TOKEN")
        .env("TENSORFOLD_MODELS", home.join("no-models"))
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn pull_ls_run_rm_by_name() {
    let dir = scratch("cycle");
    let gguf = dir.join("tiny.gguf");
    write_gguf(&gguf, &SynthSpec::tiny(Arch::Qwen2, Format::Q8_0, 5)).unwrap();
    let mut state = HubState::default();
    let files = state.repos.entry("test/Tiny-GGUF".into()).or_default();
    files.insert(
        "tiny-q8_0.gguf".into(),
        HubFile::lfs(std::fs::read(&gguf).unwrap()),
    );
    let server = HubServer::start(state);
    let home = dir.join("hf");

    let out = tensorfold(&server.endpoint, &home, &["pull", "test/Tiny-GGUF:Q8_0"]);
    assert!(out.status.success(), "{}", text(&out));
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        path.starts_with(
            home.join("hub/models--test--Tiny-GGUF/snapshots")
                .to_str()
                .unwrap()
        ),
        "{path}"
    );
    // Not a terminal: plain progress lines, then the verified end.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tiny-q8_0.gguf: done") && err.contains("sha256 verified"),
        "{err}"
    );

    let out = tensorfold(&server.endpoint, &home, &["ls"]);
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    let row = listing
        .lines()
        .find(|l| l.starts_with("test/Tiny-GGUF:tiny-q8_0.gguf"))
        .unwrap_or_else(|| panic!("{listing}"));
    assert!(
        row.contains("GGUF Q8_0") && row.contains("qwen2") && row.contains("KiB"),
        "{row}"
    );

    // Served from the cache: the hub is not asked again for the file.
    let before = server.requests("tiny-q8_0.gguf").len();
    let out = tensorfold(
        &server.endpoint,
        &home,
        &[
            "run",
            "test/Tiny-GGUF:Q8_0",
            "--prompt",
            "hi",
            "--max-tokens",
            "3",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(server.requests("tiny-q8_0.gguf").len(), before);

    let out = tensorfold(&server.endpoint, &home, &["rm", "test/Tiny-GGUF"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!home.join("hub/models--test--Tiny-GGUF").exists());
    let out = tensorfold(&server.endpoint, &home, &["rm", "test/Tiny-GGUF"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not in the cache"),
        "{}",
        text(&out)
    );
}

#[test]
fn an_unsupported_model_is_refused_before_download() {
    let dir = scratch("refuse");
    let gguf = dir.join("tiny.gguf");
    write_gguf(&gguf, &SynthSpec::tiny(Arch::Llama, Format::Q8_0, 5)).unwrap();
    let mut bytes = std::fs::read(&gguf).unwrap();
    // general.architecture "llama" becomes "bloom", a family TensorFold lacks.
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(5).position(|w| w == b"llama") {
        bytes[at + i..at + i + 5].copy_from_slice(b"bloom");
        at += i + 5;
    }
    let mut state = HubState::default();
    let files = state.repos.entry("test/bloom".into()).or_default();
    files.insert("bloom.gguf".into(), HubFile::lfs(bytes));
    let server = HubServer::start(state);
    let home = dir.join("hf");
    let out = tensorfold(&server.endpoint, &home, &["pull", "test/bloom"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("architecture 'bloom' is not supported"),
        "{err}"
    );
    assert!(
        !err.contains("bloom.gguf: started"),
        "no download began: {err}"
    );
}
