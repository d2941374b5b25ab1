use super::*;
use proptest::prelude::*;

fn sampled(temperature: f32, top_k: Option<usize>, top_p: f32, min_p: f32) -> Draw {
    Draw {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: 7,
    }
}

/// The rule read literally: every token's key, weight and larger-keyed
/// mass computed from scratch, every kept token's noise drawn.
fn by_the_book(draw: &Draw, position: u64, row: &[f32]) -> u32 {
    let top = argmax(row);
    if draw.is_greedy() || !clean(row[top as usize]).is_finite() {
        return top;
    }
    let t = draw.temperature as f64;
    let s = |i: usize| clean(row[i]) as f64 / t;
    let w = |i: usize| float::exp(s(i) - s(top as usize));
    let mut keys: Vec<u64> = (0..row.len()).map(|i| key(row[i], i as u32)).collect();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    let k = draw.top_k.unwrap_or(usize::MAX).min(row.len());
    let floor = keys[k - 1];
    let kept: Vec<usize> = (0..row.len())
        .filter(|&i| key(row[i], i as u32) >= floor && w(i) >= draw.min_p as f64)
        .collect();
    let mass = |above: u64| {
        lanes::sum(
            kept.iter()
                .filter(|&&j| key(row[j], j as u32) > above)
                .map(|&j| (j as u32, w(j))),
        )
    };
    let z = lanes::sum(kept.iter().map(|&j| (j as u32, w(j))));
    let target = draw.top_p as f64 * z;
    let nucleus = kept
        .iter()
        .filter(|&&i| draw.top_p >= 1.0 || mass(key(row[i], i as u32)) < target);
    let mut best = (f64::NEG_INFINITY, u32::MAX);
    for &i in nucleus {
        let score = s(i) + gumbel(draw.seed, position, i as u32);
        if score > best.0 || (score == best.0 && (i as u32) < best.1) {
            best = (score, i as u32);
        }
    }
    best.1
}

#[test]
fn greedy_is_argmax_with_lowest_id_on_ties() {
    assert_eq!(pick(&Draw::greedy(), 0, &[0.5, 2.0, 2.0, -1.0]), 1);
    assert_eq!(argmax(&[f32::NAN, -1.0, f32::NAN]), 1);
    assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
    assert_eq!(argmax(&[-0.0, 0.0]), 1, "+0 is above -0 in the order");
}

#[test]
fn top_k_one_and_tiny_top_p_are_greedy() {
    let logits = [0.1, 0.3, 3.0, 0.2];
    for pos in 0..50 {
        assert_eq!(pick(&sampled(1.0, Some(1), 1.0, 0.0), pos, &logits), 2);
        assert_eq!(pick(&sampled(1.0, None, 1e-6, 0.0), pos, &logits), 2);
    }
}

#[test]
fn min_p_drops_unlikely_tokens() {
    let logits = [5.0, 4.9, -10.0, -10.0];
    for pos in 0..200 {
        assert!(pick(&sampled(1.0, None, 1.0, 0.5), pos, &logits) < 2);
    }
}

#[test]
fn an_infinite_top_or_an_all_minus_infinity_row_is_greedy() {
    let d = sampled(1.0, None, 0.9, 0.0);
    assert_eq!(pick(&d, 3, &[1.0, f32::INFINITY, f32::INFINITY]), 1);
    assert_eq!(pick(&d, 3, &[f32::NEG_INFINITY; 4]), 0);
    // Masked tokens are never drawn.
    let masked = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0, f32::NAN];
    for pos in 0..200 {
        assert!([1, 3].contains(&pick(&d, pos, &masked)));
    }
}

#[test]
fn the_largest_noise_stays_under_the_bound() {
    let u_max = (((1u64 << 52) - 1) as f64 + 0.5) / (1u64 << 52) as f64;
    assert!(u_max < 1.0);
    let g = -float::ln(-float::ln(u_max));
    assert!(g < GUMBEL_BOUND - 1.0, "{g}");
}

#[test]
fn draws_follow_the_distribution() {
    // p = softmax([0, ln 3]) = (0.25, 0.75)
    let logits = [0.0, 3f32.ln()];
    let d = sampled(1.0, None, 1.0, 0.0);
    let ones = (0..4000).filter(|&p| pick(&d, p, &logits) == 1).count();
    assert!((2800..3200).contains(&ones), "{ones}");
}

#[test]
fn extreme_temperatures_are_greedy_or_flat() {
    let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.5).collect();
    let cold = sampled(1e-30, None, 1.0, 0.0);
    for pos in 0..100 {
        assert_eq!(pick(&cold, pos, &logits), argmax(&logits));
    }
    let hot = sampled(f32::MAX, None, 1.0, 0.0);
    let distinct: std::collections::HashSet<u32> =
        (0..500).map(|p| pick(&hot, p, &logits)).collect();
    assert!(distinct.len() > 40, "{}", distinct.len());
}

/// Logits with many ties, some masked, some NaN.
fn rows() -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(
        prop_oneof![
            8 => -30f32..30.0,
            2 => (-4i32..4).prop_map(|i| i as f32),
            1 => Just(f32::NEG_INFINITY),
            1 => Just(f32::NAN),
        ],
        2..2600,
    )
}

proptest! {
    #[test]
    fn the_pick_is_the_rule_read_literally(
        row in rows(),
        position in 0u64..100_000,
        t in prop_oneof![0.05f32..3.0, Just(1e-20f32), Just(1e20f32)],
        top_k in proptest::option::of(1usize..700),
        top_p in prop_oneof![0.01f32..1.0, Just(1.0f32)],
        min_p in prop_oneof![Just(0f32), 0f32..0.3],
    ) {
        let d = Draw { temperature: t, top_k, top_p, min_p, seed: position ^ 0xABCD };
        prop_assert_eq!(pick(&d, position, &row), by_the_book(&d, position, &row));
    }
}

/// A draw is a function of (seed, position, row): the same key gives the
/// same draw whatever was drawn before, and another seed or position
/// draws otherwise.
#[test]
fn a_draw_depends_only_on_its_key_and_row() {
    let logits: Vec<f32> = (0..32).map(|i| (i * 37 % 11) as f32 * 0.3).collect();
    let d = |seed| Draw {
        seed,
        ..sampled(1.0, None, 1.0, 0.0)
    };
    let forward: Vec<u32> = (0..500).map(|p| pick(&d(7), p, &logits)).collect();
    let backward: Vec<u32> = (0..500).rev().map(|p| pick(&d(7), p, &logits)).collect();
    assert_eq!(forward, backward.into_iter().rev().collect::<Vec<_>>());
    let differ = (0..500)
        .filter(|&p| pick(&d(8), p, &logits) != forward[p as usize])
        .count();
    assert!(
        differ > 100,
        "another seed changed only {differ} of 500 draws"
    );
}
