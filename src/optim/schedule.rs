//! Learning-rate schedules: linear warmup, then cosine / linear decay or a constant, matching
//! transformers' `get_{cosine,linear,constant}_schedule_with_warmup` float for float.

use std::f64::consts::PI;

use crate::config::Schedule;

/// transformers' default: half a cosine period, from the peak down to zero.
const NUM_CYCLES: f64 = 0.5;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    kind: Schedule,
    base_lr: f64,
    warmup_steps: usize,
    total_steps: usize,
}

impl LrSchedule {
    /// `total_steps` is the number of optimizer steps of the run (ignored by `Constant`).
    pub fn new(kind: Schedule, base_lr: f64, warmup_steps: usize, total_steps: usize) -> Self {
        Self { kind, base_lr, warmup_steps, total_steps }
    }

    /// The lr of the optimizer step taken after `step` steps, as HF's `LambdaLR` gives it when the
    /// scheduler is stepped after every optimizer step: step 0 of a warmup uses lr 0.
    pub fn lr_at(&self, step: usize) -> f64 {
        self.base_lr * self.factor(step)
    }

    fn factor(&self, step: usize) -> f64 {
        let (step_f, warmup, total) = (step as f64, self.warmup_steps, self.total_steps);
        if step < warmup {
            return step_f / warmup.max(1) as f64;
        }
        // max(1, total - warmup) in Python ints; saturating_sub + max(1) is the same for usize.
        let decay_len = total.saturating_sub(warmup).max(1) as f64;
        match self.kind {
            Schedule::Constant => 1.0,
            Schedule::Linear => ((total as f64 - step_f) / decay_len).max(0.0),
            Schedule::Cosine => {
                let progress = (step - warmup) as f64 / decay_len;
                // Same operation order as transformers, so the floats agree bit for bit.
                (0.5 * (1.0 + (PI * NUM_CYCLES * 2.0 * progress).cos())).max(0.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_transformers_golden() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/schedule.json");
        let golden: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = golden["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 15);
        for case in cases {
            let kind: Schedule = serde_json::from_value(case["kind"].clone()).unwrap();
            let get = |k: &str| case[k].as_u64().unwrap() as usize;
            let s = LrSchedule::new(
                kind,
                case["base_lr"].as_f64().unwrap(),
                get("warmup_steps"),
                get("total_steps"),
            );
            for (step, want) in case["lrs"].as_array().unwrap().iter().enumerate() {
                let (got, want) = (s.lr_at(step), want.as_f64().unwrap());
                assert!((got - want).abs() <= 1e-15 * want.abs(), "{case:?} step {step}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn warmup_peaks_at_base_lr_and_cosine_ends_at_zero() {
        let s = LrSchedule::new(Schedule::Cosine, 1e-3, 10, 110);
        assert_eq!(s.lr_at(0), 0.0);
        assert_eq!(s.lr_at(5), 5e-4);
        assert_eq!(s.lr_at(10), 1e-3);
        assert!((s.lr_at(60) - 5e-4).abs() < 1e-18);
        assert!(s.lr_at(110).abs() < 1e-18);
    }
}
