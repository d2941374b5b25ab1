//! The fast subset of the exactness suite (`cargo xtask exact` runs it all).

#[test]
fn drafted_replies_equal_serial_replies() {
    let outcomes = tensorfold_tests::exact::run(false, &mut |_| {});
    let bad: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.identical)
        .map(|o| o.case.as_str())
        .collect();
    assert!(outcomes.len() >= 48, "suite ran {} cases", outcomes.len());
    assert!(bad.is_empty(), "drafted differs from serial: {bad:?}");
}
