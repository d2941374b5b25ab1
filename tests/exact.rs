//! The fast subset of the exactness suite (`cargo xtask exact` runs it all):
//! drafted against serial, and batched streams against each served alone.

#[test]
fn drafted_replies_equal_serial_replies() {
    let report =
        tensorfold_tests::exact::run(false, tensorfold_engine::BackendChoice::Cpu, &mut |_| {});
    assert!(report.skipped.is_empty(), "skipped: {:?}", report.skipped);
    let outcomes = report.outcomes;
    let bad: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.identical)
        .map(|o| o.case.as_str())
        .collect();
    assert!(outcomes.len() >= 48, "suite ran {} cases", outcomes.len());
    assert!(bad.is_empty(), "drafted differs from serial: {bad:?}");
}
