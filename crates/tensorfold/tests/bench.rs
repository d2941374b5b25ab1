//! `tensorfold bench` as the peer harness runs it: one JSON line a cell,
//! named as llama-bench names them, and a cell past the window reported
//! without losing the others.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensorfold"))
}

/// A two-layer random model of SmolLM2's shape (32k window), one file a
/// test (tests run in parallel).
fn model(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    let out = bin()
        .args([
            "synth", "--shape", "smollm2", "--quant", "Q4_1", "--layers", "2",
        ])
        .arg("--out")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn cells(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect()
}

#[test]
fn every_cell_is_one_json_line_named_as_llama_bench_names_it() {
    let out = bin()
        .arg("bench")
        .arg(model("cells"))
        .args(["-p", "64,128", "-n", "8", "-d", "0,32", "-r", "2"])
        .args(["--backend", "cpu"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cells = cells(&out);
    let names: Vec<&str> = cells.iter().map(|c| c["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["pp64", "pp128", "tg8", "tg8@d32"]);
    for cell in &cells {
        let rate = cell["tokens_per_s"].as_f64().unwrap();
        assert!(rate.is_finite() && rate > 0.0, "{cell}");
        assert_eq!(cell["samples_tokens_per_s"].as_array().unwrap().len(), 2);
        assert_eq!(cell["backend"], "cpu");
    }
    assert_eq!(cells[3]["n_depth"], 32);
    assert_eq!(cells[3]["n_gen"], 8);
}

#[test]
fn a_cell_past_the_window_fails_alone() {
    let out = bin()
        .arg("bench")
        .arg(model("window"))
        .args(["-p", "40000,32", "-n", "4", "-r", "1", "--backend", "cpu"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a failed cell fails the command");
    let cells = cells(&out);
    assert_eq!(cells.len(), 3, "{cells:?}");
    assert_eq!(cells[0]["test"], "pp40000");
    assert!(cells[0]["error"]
        .as_str()
        .unwrap()
        .contains("the context window is 32768"));
    assert_eq!(cells[1]["test"], "pp32");
    assert!(cells[1]["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(cells[2]["test"], "tg4");
}
