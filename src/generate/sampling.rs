//! Choosing the next token from one row of logits: the penalties, temperature and truncations of
//! `SamplingParams`, in the order transformers and vLLM apply them, drawn with the sequence's own
//! seeded RNG, with the chosen token's raw and processed log-probs for GRPO and `logprobs`.

use std::collections::HashMap;

use anyhow::{bail, ensure};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// How a sequence's next token is chosen. The neutral values (`Default`) leave the model's
/// distribution as it is: temperature 1, no truncation, no penalty.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits; 0 is greedy (argmax, ties to the lowest id).
    pub temperature: f64,
    /// Keeps the `k` most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Keeps the smallest set of most likely tokens whose probability reaches `top_p` (1: all).
    pub top_p: f64,
    /// Keeps the tokens whose probability is at least `min_p` times the most likely one's (0: all).
    pub min_p: f64,
    /// transformers' repetition penalty over prompt and generated tokens (1: none).
    pub repetition_penalty: f64,
    /// OpenAI's presence penalty: subtracted once from each generated token's logit.
    pub presence_penalty: f64,
    /// OpenAI's frequency penalty: subtracted once per occurrence of a generated token.
    pub frequency_penalty: f64,
    /// Seeds the sequence's own RNG.
    pub seed: u64,
    /// How many of the most likely raw log-probs to return per token (`None`: none).
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: temperature 0, everything else neutral.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    /// An error naming the first field out of its range (the ranges OpenAI and vLLM accept).
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature must be a finite number >= 0, got {}",
            self.temperature
        );
        ensure!(self.top_k != Some(0), "top_k must be at least 1 (leave it unset for all tokens)");
        ensure!(self.top_p > 0.0 && self.top_p <= 1.0, "top_p must be in (0, 1], got {}", self.top_p);
        ensure!((0.0..=1.0).contains(&self.min_p), "min_p must be in [0, 1], got {}", self.min_p);
        ensure!(
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "repetition_penalty must be a finite number > 0, got {}",
            self.repetition_penalty
        );
        ensure!(
            (-2.0..=2.0).contains(&self.presence_penalty),
            "presence_penalty must be in [-2, 2], got {}",
            self.presence_penalty
        );
        ensure!(
            (-2.0..=2.0).contains(&self.frequency_penalty),
            "frequency_penalty must be in [-2, 2], got {}",
            self.frequency_penalty
        );
        Ok(())
    }
}

/// One chosen token and what GRPO and `logprobs` need of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// log_softmax of the unprocessed logits at `token`: the model's own log-prob.
    pub raw_logprob: f64,
    /// The log-prob of `token` under the distribution it was drawn from (0 when greedy).
    pub sampling_logprob: f64,
    /// The `logprobs` most likely tokens under the raw distribution, most likely first (ties to
    /// the lowest id).
    pub top_logprobs: Vec<(u32, f64)>,
}

impl Sampled {
    /// A plain greedy choice (`Sampler::plain_greedy`): the argmax and its raw log-prob.
    pub fn greedy(token: u32, raw_logprob: f64) -> Self {
        Self { token, raw_logprob, sampling_logprob: 0.0, top_logprobs: Vec::new() }
    }
}

/// The processed distribution of one step: token ids and their probabilities (summing to 1),
/// the tokens the truncations dropped left out. Greedy is the argmax with probability 1.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    pub tokens: Vec<u32>,
    pub probs: Vec<f64>,
}

/// One sequence's sampler: its parameters and its own RNG, so that its tokens do not depend on
/// the other sequences of a batch.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    /// A sampler seeded with `params.seed`; the parameters are validated.
    pub fn new(params: SamplingParams) -> anyhow::Result<Self> {
        params.validate()?;
        let rng = StdRng::seed_from_u64(params.seed);
        Ok(Self { params, rng })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether the choice is the plain argmax with nothing else asked of the row (greedy, no
    /// penalty, no top log-probs): then the raw log-prob of the argmax is all a `Sampled` holds,
    /// and the device can give both without the row's logits coming to the host.
    pub fn plain_greedy(&self) -> bool {
        let p = &self.params;
        p.temperature == 0.0
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
            && p.logprobs.is_none()
    }

    /// Chooses the next token from `logits` (one row, f32 as the model gives them) after
    /// `prompt` and the sequence's `generated` tokens so far.
    pub fn sample(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> anyhow::Result<Sampled> {
        let lse = log_sum_exp(logits)?;
        let dist = self.distribution(logits, prompt, generated)?;
        let token = if dist.tokens.len() == 1 {
            dist.tokens[0]
        } else {
            let u: f64 = self.rng.random();
            pick(&dist, u)
        };
        let index = dist.tokens.iter().position(|&t| t == token).unwrap_or(0);
        Ok(Sampled {
            token,
            raw_logprob: f64::from(logits[token as usize]) - lse,
            sampling_logprob: dist.probs[index].ln(),
            top_logprobs: self.params.logprobs.map(|n| top_n(logits, lse, n)).unwrap_or_default(),
        })
    }

    /// The distribution `sample` draws from: penalties, then temperature, top-k, top-p, min-p.
    pub fn distribution(
        &self,
        logits: &[f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> anyhow::Result<Distribution> {
        log_sum_exp(logits)?;
        let p = &self.params;
        let mut x: Vec<f64> = logits.iter().map(|&v| f64::from(v)).collect();
        penalize(&mut x, p, prompt, generated);
        if p.temperature == 0.0 {
            return Ok(Distribution { tokens: vec![argmax(&x)?], probs: vec![1.0] });
        }
        x.iter_mut().for_each(|v| *v /= p.temperature);
        let mut tokens: Vec<u32> =
            (0..x.len() as u32).filter(|&t| x[t as usize] > f64::NEG_INFINITY).collect();
        ensure!(!tokens.is_empty(), "every token's logit is -inf after the penalties");
        // most likely first, ties to the lowest id; top-k selects its k, then sorts them alone
        let by_logit = |a: &u32, b: &u32| x[*b as usize].total_cmp(&x[*a as usize]).then(a.cmp(b));
        if let Some(k) = p.top_k.filter(|&k| k < tokens.len()) {
            tokens.select_nth_unstable_by(k - 1, by_logit);
            tokens.truncate(k);
            tokens.sort_unstable_by(by_logit);
        }
        let max = tokens.iter().map(|&t| x[t as usize]).fold(f64::NEG_INFINITY, f64::max);
        if p.top_p < 1.0 || p.min_p > 0.0 {
            // the top-p and min-p cuts keep a prefix of the sorted tokens: sort the 256 most
            // likely, four times more while the prefix is not found among them
            let z: f64 = tokens.iter().map(|&t| (x[t as usize] - max).exp()).sum();
            let mut m = tokens.len().min(256);
            loop {
                if m < tokens.len() {
                    tokens.select_nth_unstable_by(m - 1, by_logit);
                }
                tokens[..m].sort_unstable_by(by_logit);
                if let Some(keep) = kept_prefix(&tokens[..m], &x, max, z, p) {
                    tokens.truncate(keep);
                    break;
                }
                if m == tokens.len() {
                    break;
                }
                m = tokens.len().min(m * 4);
            }
        }
        let mut probs: Vec<f64> = tokens.iter().map(|&t| (x[t as usize] - max).exp()).collect();
        normalize(&mut probs);
        Ok(Distribution { tokens, probs })
    }
}

/// How many of the most likely tokens (`sorted`, the most likely of all first) top-p and min-p
/// keep, at least one; `None` when both cuts fall past `sorted`. Top-p keeps a token while the
/// probabilities before it (normalized by `z`) fall short of `top_p`; min-p keeps the tokens at
/// least `min_p` times as likely as the first.
fn kept_prefix(sorted: &[u32], x: &[f64], max: f64, z: f64, p: &SamplingParams) -> Option<usize> {
    let mut before = 0.0;
    for (j, &t) in sorted.iter().enumerate() {
        let e = (x[t as usize] - max).exp();
        if j > 0 && ((p.top_p < 1.0 && before >= p.top_p) || e < p.min_p) {
            return Some(j);
        }
        before += e / z;
    }
    (p.top_p < 1.0 && before >= p.top_p).then_some(sorted.len())
}

/// The repetition penalty over prompt and generated tokens (transformers'
/// `RepetitionPenaltyLogitsProcessor`: positive logits divided, negative multiplied), then the
/// presence and frequency penalties over generated tokens (OpenAI, vLLM).
fn penalize(x: &mut [f64], p: &SamplingParams, prompt: &[u32], generated: &[u32]) {
    if p.repetition_penalty != 1.0 {
        let mut seen = vec![false; x.len()];
        for &t in prompt.iter().chain(generated) {
            let Some(v) = x.get_mut(t as usize) else { continue };
            if !std::mem::replace(&mut seen[t as usize], true) {
                *v = if *v > 0.0 { *v / p.repetition_penalty } else { *v * p.repetition_penalty };
            }
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut counts: HashMap<u32, usize> = HashMap::new();
        generated.iter().for_each(|&t| *counts.entry(t).or_default() += 1);
        for (t, c) in counts {
            if let Some(v) = x.get_mut(t as usize) {
                *v -= p.presence_penalty + p.frequency_penalty * c as f64;
            }
        }
    }
}

/// The log of the sum of exp(logits), in f64; an error for an empty row, a NaN or +inf logit,
/// or a row of -inf.
pub fn log_sum_exp(logits: &[f32]) -> anyhow::Result<f64> {
    if let Some(i) = logits.iter().position(|v| v.is_nan() || *v == f32::INFINITY) {
        bail!("the logits are not finite: token {i} has {}", logits[i]);
    }
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    ensure!(max > f32::NEG_INFINITY, "the logits row is empty or all -inf");
    let max = f64::from(max);
    let sum: f64 = logits.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    Ok(max + sum.ln())
}

/// The first index of the largest value (NaN refused).
fn argmax(x: &[f64]) -> anyhow::Result<u32> {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        ensure!(!v.is_nan(), "the penalized logit of token {i} is NaN");
        if *v > x[best] {
            best = i;
        }
    }
    Ok(best as u32)
}

fn normalize(probs: &mut [f64]) {
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|q| *q /= sum);
}

/// The token where the cumulative probability first passes `u` in [0, 1) (the last one should
/// rounding leave the sum short of `u`).
fn pick(dist: &Distribution, u: f64) -> u32 {
    let mut cum = 0.0;
    for (&t, &q) in dist.tokens.iter().zip(&dist.probs) {
        cum += q;
        if u < cum {
            return t;
        }
    }
    *dist.tokens.last().expect("a distribution holds at least one token")
}

/// The `n` largest raw log-probs, most likely first, ties to the lowest id.
fn top_n(logits: &[f32], lse: f64, n: usize) -> Vec<(u32, f64)> {
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    let n = n.min(ids.len());
    if n == 0 {
        return Vec::new();
    }
    if n < ids.len() {
        ids.select_nth_unstable_by(n - 1, by_logit);
        ids.truncate(n);
    }
    ids.sort_unstable_by(by_logit);
    ids.into_iter().map(|t| (t, f64::from(logits[t as usize]) - lse)).collect()
}
