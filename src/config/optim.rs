//! The `[optim]` table: which optimizer (`name`) and its settings. One flat table, as users
//! write it, read into `OptimSection`; `adafactor()` and `adamw()` hand each optimizer its own
//! settings with the defaults filled in, and `validate` refuses a key that belongs to another
//! optimizer than the one named, by name.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which optimizer trains the adapters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OptimName {
    /// Factored second moments (no first moment by default): the least state.
    #[default]
    Adafactor,
    /// `torch.optim.AdamW`: two f32 moments per parameter.
    Adamw,
    /// `bitsandbytes.optim.AdamW8bit`: both moments in 8 bits with an f32 absmax per block of 256.
    Adamw8bit,
}

impl OptimName {
    pub fn as_str(self) -> &'static str {
        match self {
            OptimName::Adafactor => "adafactor",
            OptimName::Adamw => "adamw",
            OptimName::Adamw8bit => "adamw8bit",
        }
    }
}

/// Adafactor. `flavor = "torch"` follows `torch.optim.Adafactor`, `"hf"` follows
/// `transformers.optimization.Adafactor` (relative step, parameter scaling, beta1).
#[derive(Debug, Clone, Serialize, Deserialize)]
// `default` lets a section name only the keys it changes; unknown keys are still errors.
#[serde(deny_unknown_fields, default)]
pub struct AdafactorSection {
    pub flavor: AdafactorFlavor,
    /// Exponent of the second-moment decay schedule: beta2_t = 1 - t^decay_rate.
    pub decay_rate: f64,
    /// Regularizer added to squared gradients (hf: eps[0]; torch: eps1, `None` = dtype eps).
    pub eps1: Option<f64>,
    /// Lower bound of the parameter RMS used for relative steps (hf: eps[1]; torch: eps2).
    pub eps2: f64,
    /// Update clipping threshold (hf: clip_threshold; torch: d).
    pub clip_threshold: f64,
    /// First moment; off by default, which is what saves Adam's memory.
    pub beta1: Option<f64>,
    /// hf only: lr = min(1e-2, 1/sqrt(t)) scaled by the parameter RMS.
    pub relative_step: bool,
    pub scale_parameter: bool,
    pub warmup_init: bool,
}

/// Which Adafactor's rules `optim.flavor` follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AdafactorFlavor {
    /// `torch.optim.Adafactor`: the step scaled by each parameter's RMS.
    Torch,
    /// `transformers.optimization.Adafactor`, with an absolute learning rate by default.
    Hf,
}

impl Default for AdafactorSection {
    fn default() -> Self {
        // transformers' Adafactor with an absolute learning rate (relative_step and
        // scale_parameter off), HF's advice for fine-tuning. torch.optim.Adafactor always scales
        // the step by the parameter's RMS, so a zero-initialised lora_B barely moves
        // (eps2 · lr per step): it is kept as `flavor = "torch"` for like-for-like comparisons.
        Self {
            flavor: AdafactorFlavor::Hf,
            decay_rate: -0.8,
            eps1: None,
            eps2: 1e-3,
            clip_threshold: 1.0,
            beta1: None,
            relative_step: false,
            scale_parameter: false,
            warmup_init: false,
        }
    }
}

/// AdamW's settings, Hugging Face TrainingArguments' defaults (`adam_beta1`, `adam_beta2`,
/// `adam_epsilon`); the weight decay is `train.weight_decay`, as TrainingArguments' is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamwSection {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
}

impl Default for AdamwSection {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.999, eps: 1e-8 }
    }
}

/// `[optim]` as written: `name` and every optimizer's keys, each absent unless given. A key of
/// another optimizer than the one named is an error naming it, and a checkpoint resumes only
/// under the optimizer that wrote it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OptimSection {
    /// The optimizer.
    pub name: OptimName,
    // Adafactor
    /// Adafactor only: whose Adafactor to follow [default: "hf"].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flavor: Option<AdafactorFlavor>,
    /// Adafactor only: the second moment decays as beta2_t = 1 - t^decay_rate; negative
    /// [default: -0.8].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay_rate: Option<f64>,
    /// Adafactor only: the regularizer of the squared gradient [default: 1e-30 with "hf", the
    /// dtype's epsilon with "torch"].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eps1: Option<f64>,
    /// Adafactor only: the lower bound of the parameter RMS used for relative steps
    /// [default: 1e-3].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eps2: Option<f64>,
    /// Adafactor only: the update clipping threshold (torch's d; at least 1 there)
    /// [default: 1.0].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_threshold: Option<f64>,
    /// Adafactor "hf" only: lr = min(1e-2, 1/sqrt(t)), scaled by the parameter RMS
    /// [default: false].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relative_step: Option<bool>,
    /// Adafactor "hf" only: scale the step by the parameter's RMS [default: false].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_parameter: Option<bool>,
    /// Adafactor "hf" only, with `relative_step`: warm the relative step up [default: false].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_init: Option<bool>,
    // both: Adafactor's optional first moment (hf), AdamW's beta1
    /// Adafactor "hf": a first moment with this decay (omitted: none, Adafactor's memory
    /// saving); AdamW: the first moment's decay [default: 0.9].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beta1: Option<f64>,
    // AdamW
    /// AdamW only: the second moment's decay [default: 0.999].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beta2: Option<f64>,
    /// AdamW only: torch's spelling of `[beta1, beta2]`; give one spelling or the other.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub betas: Option<[f64; 2]>,
    /// AdamW only: added to the second moment's root [default: 1e-8].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eps: Option<f64>,
    /// Refused with a pointer to `train.weight_decay` (one weight decay for every optimizer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
}

impl OptimSection {
    /// Adafactor with `section`'s settings.
    pub fn adafactor(section: &AdafactorSection) -> Self {
        let s = section.clone();
        Self {
            name: OptimName::Adafactor,
            flavor: Some(s.flavor),
            decay_rate: Some(s.decay_rate),
            eps1: s.eps1,
            eps2: Some(s.eps2),
            clip_threshold: Some(s.clip_threshold),
            relative_step: Some(s.relative_step),
            scale_parameter: Some(s.scale_parameter),
            warmup_init: Some(s.warmup_init),
            beta1: s.beta1,
            ..Default::default()
        }
    }

    /// AdamW (`name` Adamw or Adamw8bit) with `section`'s settings.
    pub fn adamw(name: OptimName, section: &AdamwSection) -> Self {
        Self {
            name,
            beta1: Some(section.beta1),
            beta2: Some(section.beta2),
            eps: Some(section.eps),
            ..Default::default()
        }
    }

    /// Adafactor's settings, defaults where a key is absent.
    pub fn adafactor_section(&self) -> AdafactorSection {
        let d = AdafactorSection::default();
        AdafactorSection {
            flavor: self.flavor.unwrap_or(d.flavor),
            decay_rate: self.decay_rate.unwrap_or(d.decay_rate),
            eps1: self.eps1.or(d.eps1),
            eps2: self.eps2.unwrap_or(d.eps2),
            clip_threshold: self.clip_threshold.unwrap_or(d.clip_threshold),
            beta1: self.beta1.or(d.beta1),
            relative_step: self.relative_step.unwrap_or(d.relative_step),
            scale_parameter: self.scale_parameter.unwrap_or(d.scale_parameter),
            warmup_init: self.warmup_init.unwrap_or(d.warmup_init),
        }
    }

    /// AdamW's settings, defaults where a key is absent (`betas` or `beta1`/`beta2`).
    pub fn adamw_section(&self) -> AdamwSection {
        let d = AdamwSection::default();
        let [b1, b2] = self.betas.unwrap_or([self.beta1.unwrap_or(d.beta1), self.beta2.unwrap_or(d.beta2)]);
        AdamwSection { beta1: b1, beta2: b2, eps: self.eps.unwrap_or(d.eps) }
    }

    /// The first key given that `name` does not take, as `optim.<key>`.
    fn foreign_key(&self) -> Option<&'static str> {
        let adafactor_only = [
            (self.flavor.is_some(), "optim.flavor"),
            (self.decay_rate.is_some(), "optim.decay_rate"),
            (self.eps1.is_some(), "optim.eps1"),
            (self.eps2.is_some(), "optim.eps2"),
            (self.clip_threshold.is_some(), "optim.clip_threshold"),
            (self.relative_step.is_some(), "optim.relative_step"),
            (self.scale_parameter.is_some(), "optim.scale_parameter"),
            (self.warmup_init.is_some(), "optim.warmup_init"),
        ];
        let adamw_only = [
            (self.beta2.is_some(), "optim.beta2"),
            (self.betas.is_some(), "optim.betas"),
            (self.eps.is_some(), "optim.eps"),
        ];
        let foreign: &[(bool, &'static str)] =
            if self.name == OptimName::Adafactor { &adamw_only } else { &adafactor_only };
        foreign.iter().find(|(set, _)| *set).map(|(_, key)| *key)
    }

    /// Checks the table; errors name the key.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.weight_decay.is_some() {
            return Err((
                "optim.weight_decay",
                "weight decay is train.weight_decay (one setting for every optimizer, as in TrainingArguments)".into(),
            ));
        }
        let name = self.name.as_str();
        if let Some(key) = self.foreign_key() {
            let (whose, takes) = if self.name == OptimName::Adafactor {
                ("an AdamW setting", "optim.name = \"adafactor\" takes flavor, decay_rate, eps1, eps2, clip_threshold, beta1, relative_step, scale_parameter, warmup_init")
            } else {
                ("an Adafactor setting", "AdamW takes betas (or beta1, beta2) and eps")
            };
            return Err((key, format!("is {whose}, and optim.name = \"{name}\": {takes}")));
        }
        match self.name {
            OptimName::Adafactor => validate_adafactor(&self.adafactor_section()),
            OptimName::Adamw | OptimName::Adamw8bit => {
                if self.betas.is_some() && (self.beta1.is_some() || self.beta2.is_some()) {
                    return Err(("optim.betas", "give betas or beta1/beta2, not both".into()));
                }
                let a = self.adamw_section();
                let beta_key =
                    if self.betas.is_some() { ["optim.betas"; 2] } else { ["optim.beta1", "optim.beta2"] };
                check((0.0..1.0).contains(&a.beta1), beta_key[0], "beta1 must be in [0, 1)")?;
                check((0.0..1.0).contains(&a.beta2), beta_key[1], "beta2 must be in [0, 1)")?;
                check(a.eps > 0.0 && a.eps.is_finite(), "optim.eps", "must be a positive number")
            }
        }
    }
}

fn validate_adafactor(o: &AdafactorSection) -> Result<(), (&'static str, String)> {
    check(o.decay_rate < 0.0, "optim.decay_rate", "must be negative (beta2_t = 1 - t^decay_rate)")?;
    check(o.clip_threshold > 0.0, "optim.clip_threshold", "must be positive")?;
    if let Some(b) = o.beta1 {
        check((0.0..1.0).contains(&b), "optim.beta1", "must be in [0, 1)")?;
    }
    check(
        o.flavor == AdafactorFlavor::Hf || !(o.relative_step || o.scale_parameter || o.warmup_init),
        "optim.flavor",
        "relative_step, scale_parameter and warmup_init need flavor = \"hf\"",
    )?;
    let torch = o.flavor == AdafactorFlavor::Torch;
    check(
        !(torch && o.beta1.is_some()),
        "optim.beta1",
        "torch.optim.Adafactor has no beta1: use flavor = \"hf\"",
    )?;
    check(
        !torch || o.clip_threshold >= 1.0,
        "optim.clip_threshold",
        "must be >= 1 with flavor = \"torch\" (its d)",
    )?;
    check(!o.warmup_init || o.relative_step, "optim.warmup_init", "needs relative_step = true")
}

fn check(ok: bool, key: &'static str, message: &str) -> Result<(), (&'static str, String)> {
    if ok {
        Ok(())
    } else {
        Err((key, message.to_string()))
    }
}
