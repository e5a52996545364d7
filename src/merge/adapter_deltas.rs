//! The adapter as the merge folds it in: scale·B·A per adapted base weight, read from a PEFT
//! folder and checked against its adapter_config.json (rank, target modules) and against the
//! model (every pair must find its weight, of a shape it fits).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{bail, Context};
use candle_core::{safetensors::MmapedSafetensors, DType, Device, Tensor};

use crate::peft_adapter::{read_adapter_config, ADAPTER_CONFIG, ADAPTER_WEIGHTS};

/// Tensor `name` of `shard`, plus scale·B·A (in f32) where the adapter has a pair for it; and
/// whether it had.
pub(super) fn merged_tensor(
    st: &MmapedSafetensors,
    shard: &Path,
    name: &str,
    deltas: &mut AdapterDeltas,
) -> anyhow::Result<(Tensor, bool)> {
    let w = st.load(name, &Device::Cpu).with_context(|| format!("{}: {name}", shard.display()))?;
    match deltas.take(name, &w)? {
        Some(delta) => Ok(((w.to_dtype(DType::F32)? + delta)?, true)),
        None => Ok((w, false)),
    }
}

/// An adapter's A and B per base weight name, and its scale.
pub(super) struct AdapterDeltas {
    /// `model.layers.0.self_attn.q_proj.weight` → (A, B), f32.
    pub(super) pairs: HashMap<String, (Tensor, Tensor)>,
    used: HashSet<String>,
    pub(super) scale: f64,
}

impl AdapterDeltas {
    /// No adapter: every weight as the base has it.
    pub(super) fn none() -> Self {
        Self { pairs: HashMap::new(), used: HashSet::new(), scale: 0.0 }
    }

    pub(super) fn load(dir: &Path) -> anyhow::Result<Self> {
        let config = read_adapter_config(dir)?;
        let spec = config.to_spec(&dir.join(ADAPTER_CONFIG))?;
        let file = dir.join(ADAPTER_WEIGHTS);
        let tensors = candle_core::safetensors::load(&file, &Device::Cpu)
            .with_context(|| format!("reading {}", file.display()))?;
        let mut halves: HashMap<String, (Option<Tensor>, Option<Tensor>)> = HashMap::new();
        for (key, t) in tensors {
            let Some((module, half)) = split_key(&key) else {
                bail!("{}: {key} is not a LoRA A or B weight", file.display());
            };
            let entry = halves.entry(format!("{module}.weight")).or_default();
            match half {
                'A' => entry.0 = Some(t.to_dtype(DType::F32)?),
                _ => entry.1 = Some(t.to_dtype(DType::F32)?),
            }
        }
        let mut pairs = HashMap::new();
        for (name, pair) in halves {
            match pair {
                (Some(a), Some(b)) => pairs.insert(name, (a, b)),
                _ => bail!("{}: {name} has only one of lora_A and lora_B", file.display()),
            };
        }
        for (name, (a, _)) in &pairs {
            agrees_with_config(name, a, &spec, dir)?;
        }
        Ok(Self { pairs, used: HashSet::new(), scale: spec.scale() })
    }

    /// scale · B·A for base weight `name` (f32), checked against the weight's shape.
    pub(super) fn take(&mut self, name: &str, w: &Tensor) -> anyhow::Result<Option<Tensor>> {
        let Some((a, b)) = self.pairs.get(name) else { return Ok(None) };
        let (out, inp) = w.dims2().with_context(|| format!("{name}: an adapted weight must be 2-D"))?;
        if a.dim(1)? != inp || b.dim(0)? != out || a.dim(0)? != b.dim(1)? {
            bail!(
                "the adapter does not fit {name} [{out}, {inp}]: lora_A {:?}, lora_B {:?} (another model's adapter?)",
                a.dims(),
                b.dims()
            );
        }
        self.used.insert(name.to_string());
        Ok(Some((b.matmul(a)? * self.scale)?))
    }

    pub(super) fn ensure_all_used(&self, dir: &Path) -> anyhow::Result<()> {
        let mut unused: Vec<&String> = self.pairs.keys().filter(|k| !self.used.contains(*k)).collect();
        unused.sort();
        match unused.first() {
            Some(name) => bail!(
                "{}: {} adapter weight(s) match no weight of the model, first {name} (another model's adapter?)",
                dir.display(),
                unused.len()
            ),
            None => Ok(()),
        }
    }
}

/// The pair of base weight `name` has the config's rank and targets one of its modules: the scale
/// comes from the config's r, so a mismatch would merge a wrongly scaled delta.
fn agrees_with_config(
    name: &str,
    a: &Tensor,
    spec: &crate::model::LoraSpec,
    dir: &Path,
) -> anyhow::Result<()> {
    let config = dir.join(ADAPTER_CONFIG);
    let module = name.trim_end_matches(".weight").rsplit('.').next().unwrap_or(name);
    if !spec.target_modules.iter().any(|m| m == module) {
        bail!(
            "{}: {name} is adapted but {} lists target_modules {:?}",
            dir.join(ADAPTER_WEIGHTS).display(),
            config.display(),
            spec.target_modules
        );
    }
    if a.dim(0)? != spec.r {
        bail!(
            "{}: lora_A of {name} has rank {} ({:?}) but {} says r = {}",
            dir.join(ADAPTER_WEIGHTS).display(),
            a.dim(0)?,
            a.dims(),
            config.display(),
            spec.r
        );
    }
    Ok(())
}

/// `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` (or `.lora_A.default.weight`)
/// → (`model.layers.0.self_attn.q_proj`, 'A').
fn split_key(key: &str) -> Option<(&str, char)> {
    let key = key.strip_prefix("base_model.model.")?;
    for (suffix, half) in [
        (".lora_A.weight", 'A'),
        (".lora_B.weight", 'B'),
        (".lora_A.default.weight", 'A'),
        (".lora_B.default.weight", 'B'),
    ] {
        if let Some(module) = key.strip_suffix(suffix) {
            return Some((module, half));
        }
    }
    None
}
