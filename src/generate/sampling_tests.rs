//! The sampler against hand-computed distributions, its draws against the distribution they come
//! from, and its log-probs against log_softmax in f64.

use rand::{rngs::StdRng, Rng, SeedableRng};

use super::sampling::{log_sum_exp, Distribution, Sampler, SamplingParams};

fn sampler(params: SamplingParams) -> Sampler {
    Sampler::new(params).unwrap()
}

/// f32 logits whose softmax is `probs` (which sum to 1).
fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

fn dist(params: SamplingParams, logits: &[f32]) -> Distribution {
    sampler(params).distribution(logits, &[], &[]).unwrap()
}

fn assert_probs(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        // the logits are f32: a probability is off by a few f32 roundings at most
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

fn random_logits(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

#[test]
fn temperature_zero_and_top_k_one_are_argmax_ties_to_the_lowest_id() {
    let tied = [1.0f32, 3.0, 3.0, 2.0];
    let mut greedy = sampler(SamplingParams::greedy());
    let s = greedy.sample(&tied, &[], &[]).unwrap();
    assert_eq!((s.token, s.sampling_logprob), (1, 0.0));
    for seed in 0..20 {
        let logits = random_logits(500, seed, 10.0);
        let argmax = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b }) as u32;
        let top1 = SamplingParams { temperature: 0.7, top_k: Some(1), seed, ..Default::default() };
        assert_eq!(sampler(top1).sample(&logits, &[], &[]).unwrap().token, argmax);
        assert_eq!(sampler(SamplingParams::greedy()).sample(&logits, &[], &[]).unwrap().token, argmax);
    }
    let top1 = SamplingParams { top_k: Some(1), ..Default::default() };
    assert_eq!(sampler(top1).sample(&tied, &[], &[]).unwrap().token, 1);
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    let logits = logits_of(&[0.1, 0.2, 0.5, 0.2]);
    let top_p = |p: f64| dist(SamplingParams { top_p: p, ..Default::default() }, &logits);
    let d = top_p(0.45);
    assert_eq!(d.tokens, [2]);
    assert_probs(&d.probs, &[1.0]);
    // 0.5 falls short of 0.6: the next token, of the tied two the lower id, is kept
    let d = top_p(0.6);
    assert_eq!(d.tokens, [2, 1]);
    assert_probs(&d.probs, &[5.0 / 7.0, 2.0 / 7.0]);
    let d = top_p(0.75);
    assert_eq!(d.tokens, [2, 1, 3]);
    assert_probs(&d.probs, &[5.0 / 9.0, 2.0 / 9.0, 2.0 / 9.0]);
    assert_eq!(top_p(0.95).tokens, [2, 1, 3, 0]);
    // p = 1 truncates nothing
    let d = top_p(1.0);
    assert_eq!(d.tokens, [0, 1, 2, 3]);
    assert_probs(&d.probs, &[0.1, 0.2, 0.5, 0.2]);
    // all tied: the first id alone reaches 0.25 - the nucleus of p = 0.2 is token 0
    assert_eq!(dist(SamplingParams { top_p: 0.2, ..Default::default() }, &[0.0; 4]).tokens, [0]);
}

#[test]
fn top_k_then_top_p_renormalizes_the_kept_tokens_first() {
    // top_k = 2 keeps 0.5 and 0.2, renormalized to 5/7 and 2/7: 5/7 alone reaches top_p = 0.7
    // (unrenormalized, 0.5 would fall short and keep token 1 too)
    let logits = logits_of(&[0.1, 0.2, 0.5, 0.2]);
    let d = dist(SamplingParams { top_k: Some(2), top_p: 0.7, ..Default::default() }, &logits);
    assert_eq!(d.tokens, [2]);
    let d = dist(SamplingParams { top_k: Some(2), top_p: 0.75, ..Default::default() }, &logits);
    assert_eq!(d.tokens, [2, 1]);
    assert_probs(&d.probs, &[5.0 / 7.0, 2.0 / 7.0]);
}

#[test]
fn min_p_keeps_tokens_at_least_min_p_times_the_most_likely() {
    let logits = logits_of(&[0.1, 0.2, 0.5, 0.2]);
    let min_p = |m: f64| dist(SamplingParams { min_p: m, ..Default::default() }, &logits);
    // threshold 0.15: the 0.1 goes
    let d = min_p(0.3);
    assert_eq!(d.tokens, [2, 1, 3]);
    assert_probs(&d.probs, &[5.0 / 9.0, 2.0 / 9.0, 2.0 / 9.0]);
    assert_eq!(min_p(0.15).tokens, [2, 1, 3, 0]);
    assert_eq!(min_p(0.5).tokens, [2]);
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits_once_per_token() {
    let logits = [2.0f32, -2.0, 1.0, 0.5];
    let params = SamplingParams { repetition_penalty: 2.0, ..Default::default() };
    // token 0 from the prompt, token 1 generated twice: penalized once each
    let d = sampler(params).distribution(&logits, &[0], &[1, 1]).unwrap();
    let want = softmax(&[1.0, -4.0, 1.0, 0.5]);
    assert_eq!(d.tokens, [0, 1, 2, 3]);
    assert_probs(&d.probs, &want);
}

#[test]
fn presence_and_frequency_penalties_count_generated_tokens() {
    let logits = [1.0f32, 1.0, 1.0, 1.0];
    let params = SamplingParams { presence_penalty: 0.5, frequency_penalty: 0.25, ..Default::default() };
    // the prompt's tokens are not penalized; token 2 twice, token 3 once
    let d = sampler(params).distribution(&logits, &[0, 1], &[2, 3, 2]).unwrap();
    assert_probs(&d.probs, &softmax(&[1.0, 1.0, 0.0, 0.25]));
}

fn softmax(x: &[f64]) -> Vec<f64> {
    let sum: f64 = x.iter().map(|v| v.exp()).sum();
    x.iter().map(|v| v.exp() / sum).collect()
}

#[test]
fn processed_distributions_sum_to_one() {
    let logits = random_logits(2000, 3, 8.0);
    let variants = [
        SamplingParams::default(),
        SamplingParams { temperature: 0.3, top_k: Some(50), ..Default::default() },
        SamplingParams { temperature: 1.7, top_p: 0.9, ..Default::default() },
        SamplingParams { min_p: 0.05, repetition_penalty: 1.3, ..Default::default() },
        SamplingParams {
            top_k: Some(200),
            top_p: 0.8,
            min_p: 0.1,
            frequency_penalty: 1.0,
            ..Default::default()
        },
    ];
    for params in variants {
        let d = sampler(params.clone()).distribution(&logits, &[5, 6], &[7, 7, 8]).unwrap();
        let sum: f64 = d.probs.iter().sum();
        assert!((sum - 1.0).abs() < 1e-12, "{params:?}: {sum}");
        assert!(d.probs.iter().all(|&q| q > 0.0), "{params:?}");
    }
}

/// Each token's share of many seeded draws is within 5 standard deviations
/// (sqrt(p (1 - p) / n)) of its probability, and truncated tokens are never drawn.
#[test]
fn draws_follow_the_processed_distribution() {
    let logits = logits_of(&[0.05, 0.3, 0.15, 0.4, 0.1]);
    let params = SamplingParams { temperature: 0.8, top_k: Some(4), seed: 11, ..Default::default() };
    let mut s = sampler(params);
    let d = s.distribution(&logits, &[], &[]).unwrap();
    let n = 40_000;
    let mut counts = [0usize; 5];
    for _ in 0..n {
        counts[s.sample(&logits, &[], &[]).unwrap().token as usize] += 1;
    }
    assert_eq!(counts[0], 0, "top_k = 4 drops token 0");
    for (&t, &p) in d.tokens.iter().zip(&d.probs) {
        let share = counts[t as usize] as f64 / n as f64;
        let sigma = (p * (1.0 - p) / n as f64).sqrt();
        assert!((share - p).abs() < 5.0 * sigma, "token {t}: {share} vs {p}");
    }
}

#[test]
fn a_seed_fixes_the_tokens() {
    let logits = random_logits(100, 1, 2.0);
    let draws = |seed: u64| {
        let mut s = sampler(SamplingParams { seed, top_p: 0.95, ..Default::default() });
        (0..64).map(|_| s.sample(&logits, &[], &[]).unwrap().token).collect::<Vec<_>>()
    };
    assert_eq!(draws(7), draws(7));
    assert_ne!(draws(7), draws(8));
}

/// The raw log-probs are log_softmax in f64 of the unprocessed logits, whatever the processing:
/// the reference sums exp directly (the logits are small enough), and n terms summed in f64 are
/// off by n·ε relatively, so the log by about n·ε.
#[test]
fn raw_log_probs_are_log_softmax_of_the_unprocessed_logits() {
    let logits = random_logits(5000, 9, 30.0);
    let lse = logits.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
    let tol = 5000.0 * f64::EPSILON * 4.0 + lse.abs() * f64::EPSILON * 4.0;
    assert!((log_sum_exp(&logits).unwrap() - lse).abs() < tol);
    let params = SamplingParams {
        temperature: 0.6,
        top_k: Some(40),
        repetition_penalty: 1.5,
        seed: 2,
        logprobs: Some(5),
        ..Default::default()
    };
    let mut s = sampler(params);
    for _ in 0..20 {
        let out = s.sample(&logits, &[1, 2, 3], &[4]).unwrap();
        assert!((out.raw_logprob - (f64::from(logits[out.token as usize]) - lse)).abs() < tol);
        let d = s.distribution(&logits, &[1, 2, 3], &[4]).unwrap();
        let at = d.tokens.iter().position(|&t| t == out.token).unwrap();
        assert!((out.sampling_logprob - d.probs[at].ln()).abs() < 1e-12);
        let mut order: Vec<u32> = (0..5000).collect();
        order.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]));
        assert_eq!(out.top_logprobs.iter().map(|t| t.0).collect::<Vec<_>>(), order[..5]);
        for (t, lp) in &out.top_logprobs {
            assert!((lp - (f64::from(logits[*t as usize]) - lse)).abs() < tol);
        }
    }
}

#[test]
fn at_temperature_one_untruncated_the_sampling_log_prob_is_the_raw_one() {
    let logits = random_logits(300, 4, 5.0);
    let mut s = sampler(SamplingParams { seed: 3, ..Default::default() });
    for _ in 0..10 {
        let out = s.sample(&logits, &[], &[]).unwrap();
        assert!((out.raw_logprob - out.sampling_logprob).abs() < 1e-12);
    }
}

#[test]
fn nan_and_infinite_logits_are_errors() {
    let mut s = sampler(SamplingParams::default());
    let err = s.sample(&[0.0, f32::NAN], &[], &[]).unwrap_err().to_string();
    assert!(err.contains("token 1"), "{err}");
    assert!(s.sample(&[f32::INFINITY, 0.0], &[], &[]).is_err());
    assert!(s.sample(&[f32::NEG_INFINITY; 3], &[], &[]).is_err());
    assert!(s.sample(&[], &[], &[]).is_err());
    // a -inf logit is a token of probability 0, never drawn
    let mut s = sampler(SamplingParams { seed: 1, ..Default::default() });
    for _ in 0..50 {
        assert_eq!(s.sample(&[f32::NEG_INFINITY, 0.0], &[], &[]).unwrap().token, 1);
    }
}

#[test]
fn invalid_params_are_errors_naming_the_field() {
    let bad = [
        (SamplingParams { temperature: -0.1, ..Default::default() }, "temperature"),
        (SamplingParams { temperature: f64::NAN, ..Default::default() }, "temperature"),
        (SamplingParams { top_k: Some(0), ..Default::default() }, "top_k"),
        (SamplingParams { top_p: 0.0, ..Default::default() }, "top_p must be in (0, 1]"),
        (SamplingParams { top_p: 1.5, ..Default::default() }, "top_p"),
        (SamplingParams { min_p: -0.5, ..Default::default() }, "min_p"),
        (SamplingParams { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty"),
        (SamplingParams { presence_penalty: 2.5, ..Default::default() }, "presence_penalty"),
        (SamplingParams { frequency_penalty: -3.0, ..Default::default() }, "frequency_penalty"),
    ];
    for (params, field) in bad {
        let err = Sampler::new(params).unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    assert!(SamplingParams::default().validate().is_ok());
}

/// Greedy picks what candle's `LogitsProcessor` (the sampler before this one) picks, ties
/// included, so greedy replies are unchanged.
#[test]
fn greedy_picks_what_candles_argmax_picks() {
    use candle_core::{Device, Tensor};
    use candle_transformers::generation::{LogitsProcessor, Sampling};
    let mut candle = LogitsProcessor::from_sampling(0, Sampling::ArgMax);
    for seed in 0..50 {
        // rounded to a few values, so that rows hold ties
        let logits: Vec<f32> = random_logits(64, seed, 4.0).iter().map(|v| v.round()).collect();
        let want = candle.sample(&Tensor::new(logits.as_slice(), &Device::Cpu).unwrap()).unwrap();
        let got = sampler(SamplingParams::greedy()).sample(&logits, &[], &[]).unwrap().token;
        assert_eq!(got, want, "{logits:?}");
    }
}

/// The truncations against a plain reference (every token sorted, the cuts one after the other)
/// on a large vocabulary, where the kept tokens run past the first ones the sampler sorts.
#[test]
fn truncations_match_a_full_sort_on_a_large_vocabulary() {
    let logits = random_logits(50_000, 21, 3.0);
    let cuts = [
        (None, 0.999, 0.0),
        (None, 0.9, 0.0),
        (None, 1.0, 0.02),
        (Some(3000), 0.95, 0.01),
        (Some(40), 0.5, 0.0),
        (Some(700), 1.0, 0.0),
        (None, 0.3, 0.5),
    ];
    for (top_k, top_p, min_p) in cuts {
        let params = SamplingParams { temperature: 0.9, top_k, top_p, min_p, ..Default::default() };
        let d = dist(params.clone(), &logits);
        let (tokens, probs) = reference(&logits, &params);
        assert!(tokens.len() > 1, "{params:?}");
        assert_eq!(d.tokens, tokens, "{params:?}");
        for (a, b) in d.probs.iter().zip(&probs) {
            assert!((a - b).abs() < 1e-12, "{params:?}: {a} vs {b}");
        }
    }
}

/// Temperature, top-k, top-p and min-p as transformers' warpers apply them, on a full sort.
fn reference(logits: &[f32], p: &SamplingParams) -> (Vec<u32>, Vec<f64>) {
    let x: Vec<f64> = logits.iter().map(|&v| f64::from(v) / p.temperature).collect();
    let mut order: Vec<u32> = (0..x.len() as u32).collect();
    order.sort_by(|a, b| x[*b as usize].total_cmp(&x[*a as usize]).then(a.cmp(b)));
    order.truncate(p.top_k.unwrap_or(order.len()));
    let probs = |order: &[u32]| {
        let top = x[order[0] as usize];
        softmax(&order.iter().map(|&t| x[t as usize] - top).collect::<Vec<_>>())
    };
    if p.top_p < 1.0 {
        let q = probs(&order);
        let (mut before, mut keep) = (0.0, 0);
        while keep < q.len() && (keep == 0 || before < p.top_p) {
            before += q[keep];
            keep += 1;
        }
        order.truncate(keep);
    }
    let q = probs(&order);
    let keep = q.iter().take_while(|&&v| v >= p.min_p * q[0]).count().max(1);
    order.truncate(keep);
    let q = probs(&order);
    (order, q)
}
