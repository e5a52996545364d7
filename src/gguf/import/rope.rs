//! RoPE of an imported model as transformers' `rope_parameters`: llama.cpp's `rope.scaling.*`
//! keys, and for Llama 3.x the `rope_freqs` tensor its converter writes instead of keys.
//!
//! transformers 5.17's GGUF loader reads neither (only gpt-oss gets its scaling back), so a
//! Llama 3.1 it loads from GGUF runs with plain RoPE; llama.cpp divides each frequency by
//! `rope_freqs[i]`. The importer writes the `llama3` parameters that give llama.cpp's
//! frequencies.

use crate::gguf::format::metadata::Metadata;
use crate::gguf::format::rope_freqs::{llama3_factor, LLAMA3_ORIGINAL_CONTEXT};
use anyhow::{bail, Result};
use serde_json::{json, Map, Value as Json};
use std::f64::consts::PI;

/// `rope_parameters` from `<arch>.rope.scaling.*`: `{"rope_type": "default"}` without scaling,
/// `linear` with its factor, `yarn` with factor and original context; `rope_theta` is added by
/// the caller.
pub(super) fn from_metadata(meta: &Metadata, prefix: &str) -> Result<Map<String, Json>> {
    let key = |name: &str| format!("{prefix}.rope.scaling.{name}");
    let mut p = Map::new();
    match meta.opt_string(&key("type"))? {
        None | Some("none") => {
            p.insert("rope_type".into(), json!("default"));
        }
        Some("linear") => {
            p.insert("rope_type".into(), json!("linear"));
            p.insert("factor".into(), json!(meta.float(&key("factor"))?));
        }
        Some("yarn") => {
            p.insert("rope_type".into(), json!("yarn"));
            p.insert("factor".into(), json!(meta.float(&key("factor"))?));
            let original = meta.uint(&key("original_context_length"))?;
            p.insert("original_max_position_embeddings".into(), json!(original));
            for (gguf, hf) in [("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")] {
                if let Some(v) = meta.opt_float(&key(gguf))? {
                    p.insert(hf.into(), json!(v));
                }
            }
        }
        Some(other) => bail!(
            "{}: GGUF key `{}` is {other:?}; lora-ft imports \"none\", \"linear\" and \"yarn\" \
             (and Llama 3's `rope_freqs` tensor)",
            meta.file.display(),
            key("type")
        ),
    }
    Ok(p)
}

/// The `llama3` parameters whose frequencies are llama.cpp's `base^(-2i/d) / factors[i]`.
///
/// llama.cpp's converter computes `factors[i]` = 1 for wavelengths under
/// `original / high_freq_factor`, `factor` over `original / low_freq_factor`, and
/// `1 / ((1 - s) / factor + s)` between, with `s = (original / wavelength - low) / (high - low)`:
/// linear in `x = original / wavelength`, so two or more in-between entries give `low` and
/// `high` exactly (for a fixed `original`, which only scales all three). With fewer, the
/// converter's defaults (1, 4) are taken. Either way the factors are recomputed and must match.
pub(in crate::gguf) fn llama3_from_factors(
    meta: &Metadata,
    prefix: &str,
    factors: &[f32],
    theta: f64,
    head_dim: u64,
) -> Result<Option<Map<String, Json>>> {
    let file = meta.file.display();
    if factors.len() as u64 * 2 != head_dim {
        bail!("{file}: tensor `rope_freqs.weight` has {} entries for head_dim {head_dim}", factors.len());
    }
    let factor = factors.iter().copied().fold(1.0f32, f32::max);
    if factors.iter().all(|&r| r == 1.0) {
        return Ok(None);
    }
    let original = meta
        .opt_uint(&format!("{prefix}.rope.scaling.original_context_length"))?
        .unwrap_or(LLAMA3_ORIGINAL_CONTEXT);
    let old = original as f64;
    let freqs: Vec<f64> =
        (0..factors.len()).map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)).collect();
    let big = f64::from(factor);
    // (x, s) of every in-between entry
    let points: Vec<(f64, f64)> = factors
        .iter()
        .zip(&freqs)
        .filter(|(&r, _)| r != 1.0 && r != factor)
        .map(|(&r, &f)| (old * f / (2.0 * PI), (1.0 / f64::from(r) - 1.0 / big) / (1.0 - 1.0 / big)))
        .collect();
    let (low, high) = if points.len() >= 2 {
        let n = points.len() as f64;
        let (mx, ms) =
            (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
        let cov: f64 = points.iter().map(|(x, s)| (x - mx) * (s - ms)).sum();
        let var: f64 = points.iter().map(|(_, s)| (s - ms) * (s - ms)).sum();
        let span = cov / var; // x = low + s * (high - low)
        let low = mx - span * ms;
        (snap(low), snap(low + span))
    } else {
        (1.0, 4.0)
    };
    for (i, (&r, &f)) in factors.iter().zip(&freqs).enumerate() {
        let want = llama3_factor(f, big, low, high, old);
        if (want - f64::from(r)).abs() > 1e-5 * want {
            bail!(
                "{file}: tensor `rope_freqs.weight` does not follow Llama 3's RoPE scaling \
                 (factor {big}, low_freq_factor {low}, high_freq_factor {high}, original context \
                 {original}): entry {i} is {r}, the formula gives {want}"
            );
        }
    }
    let mut p = Map::new();
    p.insert("rope_type".into(), json!("llama3"));
    p.insert("factor".into(), json!(big));
    p.insert("low_freq_factor".into(), json!(low));
    p.insert("high_freq_factor".into(), json!(high));
    p.insert("original_max_position_embeddings".into(), json!(original));
    Ok(Some(p))
}

/// A fitted value to the nearest thousandth when it is that close (the factors are stored in
/// f32, so a fit of 1 comes back as 0.9999999…).
fn snap(v: f64) -> f64 {
    let r = (v * 1000.0).round() / 1000.0;
    if (v - r).abs() <= 1e-5 * r.abs().max(1.0) {
        r
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;

    fn factors(theta: f64, dim: usize, factor: f64, low: f64, high: f64, old: f64) -> Vec<f32> {
        (0..dim / 2)
            .map(|i| {
                let f = 1.0 / theta.powf(2.0 * i as f64 / dim as f64) as f32;
                llama3_factor(f64::from(f), factor, low, high, old) as f32
            })
            .collect()
    }

    /// Llama 3.1 8B's values come back exactly from its 64 factors; other low/high too.
    #[test]
    fn llama3_parameters_are_recovered_from_rope_freqs() {
        let map = HashMap::new();
        let meta = Metadata { file: Path::new("x.gguf"), map: &map };
        for (low, high) in [(1.0, 4.0), (2.0, 8.0), (0.5, 3.0)] {
            let r = factors(500000.0, 128, 8.0, low, high, 8192.0);
            let p = llama3_from_factors(&meta, "llama", &r, 500000.0, 128).unwrap().unwrap();
            assert_eq!(p["factor"], json!(8.0));
            assert_eq!(p["low_freq_factor"], json!(low), "{p:?}");
            assert_eq!(p["high_freq_factor"], json!(high), "{p:?}");
            assert_eq!(p["original_max_position_embeddings"], json!(8192));
        }
        // all ones: no scaling
        assert!(llama3_from_factors(&meta, "llama", &[1.0; 64], 500000.0, 128).unwrap().is_none());
        // factors of another rule are refused, naming the tensor
        let mut r = factors(500000.0, 128, 8.0, 1.0, 4.0, 8192.0);
        r[40] *= 1.01;
        let err = llama3_from_factors(&meta, "llama", &r, 500000.0, 128).unwrap_err().to_string();
        assert!(err.contains("x.gguf: tensor `rope_freqs.weight` does not follow"), "{err}");
        let err = llama3_from_factors(&meta, "llama", &r[..10], 500000.0, 128).unwrap_err().to_string();
        assert!(err.contains("10 entries for head_dim 128"), "{err}");
    }

    /// `rope.scaling.*` keys → rope parameters; an unknown type and a missing factor are named.
    #[test]
    fn scaling_keys_are_read_and_unknown_ones_named() {
        use candle_core::quantized::gguf_file::Value;
        let read = |pairs: &[(&str, Value)]| {
            let map: HashMap<String, Value> = pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
            let meta = Metadata { file: Path::new("m.gguf"), map: &map };
            from_metadata(&meta, "qwen2").map(Json::Object).map_err(|e| e.to_string())
        };
        assert_eq!(read(&[]).unwrap(), json!({"rope_type": "default"}));
        let t = |s: &str| Value::String(s.into());
        let linear =
            [("qwen2.rope.scaling.type", t("linear")), ("qwen2.rope.scaling.factor", Value::F32(8.0))];
        assert_eq!(read(&linear).unwrap(), json!({"rope_type": "linear", "factor": 8.0}));
        let yarn = [
            ("qwen2.rope.scaling.type", t("yarn")),
            ("qwen2.rope.scaling.factor", Value::F32(4.0)),
            ("qwen2.rope.scaling.original_context_length", Value::U32(32768)),
        ];
        assert_eq!(
            read(&yarn).unwrap(),
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
        );
        assert_eq!(
            read(&yarn[..2]).unwrap_err(),
            "m.gguf: GGUF key `qwen2.rope.scaling.original_context_length` is missing"
        );
        let err = read(&[("qwen2.rope.scaling.type", t("longrope"))]).unwrap_err();
        assert!(
            err.starts_with("m.gguf: GGUF key `qwen2.rope.scaling.type` is \"longrope\"; lora-ft imports"),
            "{err}"
        );
    }
}
