//! Dynamic loss scaling for f16 compute, as `torch.amp.GradScaler`: the loss gradient is
//! multiplied by `scale` so small f16 gradients do not flush to zero; gradients are unscaled
//! before clipping; a step whose gradients overflowed (inf/nan) is skipped and the scale halved;
//! after `growth_interval` clean steps in a row the scale doubles.

/// torch's defaults: init_scale 2^16, growth_interval 2000, factors 2 and 0.5.
pub const INIT_SCALE: f64 = 65536.0;
pub const GROWTH_INTERVAL: usize = 2000;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossScaler {
    /// Off for f32/bf16: the scale stays 1 (a non-finite step is still skipped and counted).
    enabled: bool,
    scale: f64,
    growth_interval: usize,
    clean_steps: usize,
    /// Steps skipped because of inf/nan gradients, over the whole run.
    pub skipped: usize,
}

impl LossScaler {
    pub fn new(enabled: bool, growth_interval: usize) -> Self {
        let scale = if enabled { INIT_SCALE } else { 1.0 };
        Self { enabled, scale, growth_interval: growth_interval.max(1), clean_steps: 0, skipped: 0 }
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Records a step's outcome given whether its unscaled gradients were all finite; returns
    /// whether the optimizer may apply the step.
    pub fn update(&mut self, grads_finite: bool) -> bool {
        if !grads_finite {
            self.skipped += 1;
            self.clean_steps = 0;
            if self.enabled {
                self.scale *= 0.5;
            }
            return false;
        }
        if self.enabled {
            self.clean_steps += 1;
            if self.clean_steps == self.growth_interval {
                self.scale *= 2.0;
                self.clean_steps = 0;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scales torch produces for the same outcomes (`torch._amp_update_scale_`, growth 2,
    /// backoff 0.5, interval 3), checked when this test was written.
    #[test]
    fn follows_grad_scaler() {
        let mut s = LossScaler::new(true, 3);
        let outcomes = [true, false, true, true, true, true, false, false, true];
        let expected = [65536.0, 32768.0, 32768.0, 32768.0, 65536.0, 65536.0, 32768.0, 16384.0, 16384.0];
        for (finite, want) in outcomes.iter().zip(expected) {
            assert_eq!(s.update(*finite), *finite);
            assert_eq!(s.scale(), want);
        }
        assert_eq!(s.skipped, 3);
    }

    #[test]
    fn disabled_keeps_scale_one_but_skips_non_finite_steps() {
        let mut s = LossScaler::new(false, 1);
        assert!(s.update(true) && s.update(true));
        assert!(!s.update(false));
        assert_eq!((s.scale(), s.skipped), (1.0, 1));
    }
}
