//! The PEFT adapter format: `adapter_model.safetensors` (keys like
//! `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`, A `[r, in]`, B `[out, r]`)
//! and `adapter_config.json`, so `PeftModel.from_pretrained` loads what lora-ft trains and
//! lora-ft loads what PEFT trains.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context};
use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::config::ALL_TARGET_MODULES;
use crate::durable::{self, write_dir_atomic};
use crate::model::{add_lora_to, lora_params_of, CausalLm, DecoderLayer, LoraSpec};

pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

/// The fields of PEFT's `LoraConfig` that lora-ft reads and writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeftLoraConfig {
    pub peft_type: String,
    pub task_type: Option<String>,
    pub r: usize,
    pub lora_alpha: f64,
    #[serde(default)]
    pub lora_dropout: f64,
    pub target_modules: TargetModules,
    #[serde(default = "bias_none")]
    pub bias: String,
    #[serde(default)]
    pub use_rslora: bool,
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    #[serde(default)]
    pub inference_mode: bool,
    #[serde(default)]
    pub fan_in_fan_out: bool,
    #[serde(default)]
    pub use_dora: bool,
}

/// PEFT writes `target_modules` as a list (or a set, serialized as a list), sometimes a regex string.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    List(Vec<String>),
    Pattern(String),
}

fn bias_none() -> String {
    "none".into()
}

impl PeftLoraConfig {
    pub fn from_spec(spec: &LoraSpec, base_model: &str) -> Self {
        Self {
            peft_type: "LORA".into(),
            task_type: Some("CAUSAL_LM".into()),
            r: spec.r,
            lora_alpha: spec.alpha,
            lora_dropout: spec.dropout,
            target_modules: TargetModules::List(spec.target_modules.clone()),
            bias: "none".into(),
            use_rslora: spec.rslora,
            base_model_name_or_path: Some(base_model.into()),
            inference_mode: true,
            fan_in_fan_out: false,
            use_dora: false,
        }
    }

    pub(crate) fn to_spec(&self, file: &Path) -> anyhow::Result<LoraSpec> {
        let bad = |what: &str| anyhow::anyhow!("{}: {what} is not supported by lora-ft", file.display());
        if self.peft_type != "LORA" {
            return Err(bad(&format!("peft_type {:?}", self.peft_type)));
        }
        if self.bias != "none" {
            return Err(bad(&format!("bias {:?}", self.bias)));
        }
        if self.use_dora || self.fan_in_fan_out {
            return Err(bad("use_dora / fan_in_fan_out"));
        }
        let target_modules = match &self.target_modules {
            TargetModules::List(l) => l.clone(),
            TargetModules::Pattern(p) => return Err(bad(&format!("target_modules pattern {p:?}"))),
        };
        if let Some(m) = target_modules.iter().find(|m| !ALL_TARGET_MODULES.contains(&m.as_str())) {
            return Err(bad(&format!("target module {m:?} (Llama/Mistral have {ALL_TARGET_MODULES:?})")));
        }
        if self.r == 0 {
            return Err(bad("r = 0 (a rank of at least 1)"));
        }
        Ok(LoraSpec {
            r: self.r,
            alpha: self.lora_alpha,
            dropout: self.lora_dropout,
            target_modules,
            rslora: self.use_rslora,
        })
    }
}

/// Writes the model's adapters to `dir` (created if needed) whole or not at all: a crash or a
/// full disk leaves the previous adapter there, never half of a new one.
pub fn save_adapter(model: &CausalLm, spec: &LoraSpec, base_model: &str, dir: &Path) -> anyhow::Result<()> {
    write_dir_atomic(dir, |tmp| write_adapter_files(model, spec, base_model, tmp))
}

/// The two files of a PEFT adapter, into an existing folder (a checkpoint's, or `save_adapter`'s
/// temporary one, which fsyncs them).
pub fn write_adapter_files(
    model: &CausalLm,
    spec: &LoraSpec,
    base_model: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    let tensors: HashMap<String, Tensor> =
        model.lora_params().into_iter().map(|(name, var)| (name, var.as_tensor().clone())).collect();
    durable::write_safetensors(&tensors, &dir.join(ADAPTER_WEIGHTS))?;
    let config = serde_json::to_string_pretty(&PeftLoraConfig::from_spec(spec, base_model))?;
    durable::write(&dir.join(ADAPTER_CONFIG), config.as_bytes())
}

pub fn read_adapter_config(dir: &Path) -> anyhow::Result<PeftLoraConfig> {
    let file = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a PEFT LoRA config", file.display()))
}

/// The settings of the adapter in `dir` (its adapter_config.json), checked as loading checks them.
pub fn read_adapter_spec(dir: &Path) -> anyhow::Result<LoraSpec> {
    read_adapter_config(dir)?.to_spec(&dir.join(ADAPTER_CONFIG))
}

/// Adds the adapter in `dir` (PEFT layout) to the model and returns its settings. Every tensor
/// the model expects must be in the file with the right shape, and nothing else may be.
pub fn load_adapter(model: &mut CausalLm, dir: &Path) -> anyhow::Result<LoraSpec> {
    let spec = read_adapter_spec(dir)?;
    model.add_lora(&spec, 0)?;
    set_adapter_values(model, dir)?;
    Ok(spec)
}

/// Copies of the model's layers carrying the adapter in `dir` instead of any the model has (the
/// base weights shared, not copied): one adapter of several served over one base. Checked as
/// `load_adapter` checks.
pub fn adapter_layers(model: &CausalLm, dir: &Path) -> anyhow::Result<(LoraSpec, Vec<DecoderLayer>)> {
    let spec = read_adapter_spec(dir)?;
    let mut layers = model.layers.clone();
    for proj in layers.iter_mut().flat_map(|l| l.proj.iter_mut()) {
        proj.lora = None;
    }
    add_lora_to(&mut layers, &spec, 0, model.device())?;
    set_values(lora_params_of(&layers), dir, model.device())?;
    Ok((spec, layers))
}

/// Copies the adapter weights in `dir` into the model's existing adapters (their `Var`s stay the
/// ones an optimizer holds): a resumed run's path.
pub fn set_adapter_values(model: &CausalLm, dir: &Path) -> anyhow::Result<()> {
    set_values(model.lora_params(), dir, model.device())
}

/// Sets each named adapter tensor from `dir`'s weights file: every one must be there with its
/// shape, and nothing else may be.
fn set_values(params: Vec<(String, Var)>, dir: &Path, device: &Device) -> anyhow::Result<()> {
    let file = dir.join(ADAPTER_WEIGHTS);
    let mut tensors = candle_core::safetensors::load(&file, device)
        .with_context(|| format!("reading {}", file.display()))?;
    for (name, var) in params {
        let t = tensors
            .remove(&name)
            .or_else(|| tensors.remove(&name.replace(".weight", ".default.weight")))
            .with_context(|| format!("{}: missing tensor {name}", file.display()))?;
        if t.dims() != var.dims() {
            bail!("{}: {name} has shape {:?}, the model needs {:?}", file.display(), t.dims(), var.dims());
        }
        var.set(&t.to_dtype(var.dtype())?)?;
    }
    if let Some(extra) = tensors.keys().next() {
        bail!("{}: unexpected tensor {extra} (not a LoRA weight of this model)", file.display());
    }
    Ok(())
}

/// `lora-ft export CHECKPOINT OUTDIR`: copies a checkpoint's adapter into a standalone PEFT folder.
pub fn export_checkpoint(checkpoint: &Path, out_dir: &Path) -> anyhow::Result<()> {
    read_adapter_config(checkpoint)?;
    let weights = checkpoint.join(ADAPTER_WEIGHTS);
    if !weights.exists() {
        bail!("{} has no {ADAPTER_WEIGHTS}: is it a lora-ft checkpoint?", checkpoint.display());
    }
    write_dir_atomic(out_dir, |tmp| {
        for name in [ADAPTER_WEIGHTS, ADAPTER_CONFIG] {
            let from = checkpoint.join(name);
            let bytes = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
            durable::write(&tmp.join(name), &bytes)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Quantization;
    use candle_core::{DType, Device};

    fn tiny_llama() -> CausalLm {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
        let (config, weights) = crate::hub::local_weights(&dir).unwrap();
        CausalLm::load(&config, &weights, DType::F32, Quantization::None, &Device::Cpu).unwrap()
    }

    /// An adapter whose rank or targets do not match its weights (or the model) is refused with
    /// the file, the tensor and both shapes; the model's own adapter loads.
    #[test]
    fn an_adapter_of_another_rank_or_targets_says_which_tensor() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama/adapter");
        assert!(load_adapter(&mut tiny_llama(), &src).is_ok());
        let dir = std::env::temp_dir().join(format!("lora-ft-bad-adapter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(src.join(ADAPTER_WEIGHTS), dir.join(ADAPTER_WEIGHTS)).unwrap();
        let config = std::fs::read_to_string(src.join(ADAPTER_CONFIG)).unwrap();

        std::fs::write(dir.join(ADAPTER_CONFIG), config.replace("\"r\": 4", "\"r\": 8")).unwrap();
        let err = format!("{:#}", load_adapter(&mut tiny_llama(), &dir).unwrap_err());
        assert!(
            err.contains(ADAPTER_WEIGHTS) && err.contains("lora_A") && err.contains("has shape"),
            "{err}"
        );

        let fewer = config.replace("\"v_proj\"", "\"q_proj\"");
        std::fs::write(dir.join(ADAPTER_CONFIG), fewer).unwrap();
        let err = format!("{:#}", load_adapter(&mut tiny_llama(), &dir).unwrap_err());
        assert!(err.contains("unexpected tensor") && err.contains("v_proj"), "{err}");

        // a GPT-2 adapter's module, a rank of 0: refused before any tensor is read
        let config_file = dir.join(ADAPTER_CONFIG).display().to_string();
        for (from, to, what) in
            [("\"v_proj\"", "\"c_attn\"", "target module \"c_attn\""), ("\"r\": 4", "\"r\": 0", "r = 0")]
        {
            std::fs::write(dir.join(ADAPTER_CONFIG), config.replace(from, to)).unwrap();
            let err = format!("{:#}", load_adapter(&mut tiny_llama(), &dir).unwrap_err());
            assert!(err.starts_with(&format!("{config_file}: {what}")), "{err}");
        }
        std::fs::remove_dir_all(&dir).ok();
        let err = format!("{:#}", load_adapter(&mut tiny_llama(), &dir).unwrap_err());
        assert!(err.contains(&format!("reading {config_file}: ")) && err.contains("No such file"), "{err}");
    }
}
