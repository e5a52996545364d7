//! `lora-ft export-gguf`: the base model with the adapter folded in (as `merge` folds it, kept in
//! f32 until quantized) written as one GGUF file for llama.cpp. The file is written as
//! `OUT.partial` beside `OUT` and renamed when whole: a bad adapter, a full disk or an
//! interrupted run leaves no `.gguf` behind.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use candle_core::safetensors::MmapedSafetensors;

use super::adapter_deltas::{merged_tensor, AdapterDeltas};
use super::disk_full::not_created;
use crate::durable;
use crate::gguf::export::{FileType, GgufModel, Planned};
use crate::gguf::format::writer::{GgufWriter, TensorInfo};
use candle_core::quantized::gguf_file::Value;

/// What an export wrote.
#[derive(Debug)]
pub struct GgufSummary {
    pub tensors: usize,
    pub merged_projections: usize,
    pub bytes: u64,
    /// The Ollama Modelfile written beside the GGUF file (`gguf/export/modelfile.rs`).
    pub modelfile: PathBuf,
    /// What the user should know about the Modelfile (no TEMPLATE, a FROM to fill in).
    pub warnings: Vec<String>,
}

/// Writes the model `source` (folder or Hub id) with the adapter in `adapter_dir` merged (none:
/// the base) to the GGUF file `out`, its 2-D weights in `file_type`.
pub fn export_gguf(
    source: &str,
    revision: &str,
    adapter_dir: Option<&Path>,
    out: &Path,
    file_type: FileType,
) -> anyhow::Result<GgufSummary> {
    check_out_folder(out)?;
    let (config, weights) = crate::hub::config_and_weights(source, revision)?;
    let model = GgufModel::read(&config, file_type)?;
    let mut deltas = match adapter_dir {
        Some(dir) => AdapterDeltas::load(dir)?,
        None => AdapterDeltas::none(),
    };
    let mut shards = Vec::with_capacity(weights.len());
    let mut plan = Vec::new();
    for (index, shard) in weights.iter().enumerate() {
        // SAFETY: read-only maps of files nobody writes while we read them.
        let st = unsafe { MmapedSafetensors::new(shard) }
            .with_context(|| format!("opening {}", shard.display()))?;
        let mut names: Vec<(String, Vec<usize>)> =
            st.tensors().into_iter().map(|(name, view)| (name, view.shape().to_vec())).collect();
        names.sort();
        for (name, shape) in names {
            let planned = model.plan(&name, &shape).with_context(|| format!("{}", shard.display()))?;
            plan.extend(planned.map(|planned| (index, name, planned)));
        }
        shards.push(st);
    }
    let mut infos: Vec<_> = plan.iter_mut().map(|(_, _, planned)| &mut planned.info).collect();
    model.choose_types(&mut infos)?;
    let metadata = model.metadata(&model_name(source))?;

    let extras = model.extra_tensors()?;
    let infos = extras.iter().map(|(info, _)| info.clone());
    let infos = infos.chain(plan.iter().map(|(_, _, planned)| planned.info.clone())).collect();
    let (written, bytes) = write_gguf(out, &metadata, infos, |writer, partial| {
        for (info, data) in &extras {
            writer.write_tensor(&info.name, data).with_context(|| durable::Writing(partial.to_path_buf()))?;
        }
        let mut merged = 0;
        for (index, hf_name, planned) in &plan {
            let (tensor, adapted) = merged_tensor(&shards[*index], &weights[*index], hf_name, &mut deltas)?;
            merged += usize::from(adapted);
            write_tensor(writer, &model, planned, &tensor, partial)?;
        }
        if let Some(dir) = adapter_dir {
            deltas.ensure_all_used(dir)?;
        }
        Ok(merged)
    })?;
    let (modelfile, warnings) = write_modelfile(out, &config, None)?;
    Ok(GgufSummary {
        tensors: plan.len() + extras.len(),
        merged_projections: written,
        bytes,
        modelfile,
        warnings,
    })
}

/// Writes a GGUF file of `metadata` and `infos` to `out`: `tensors` writes each tensor's data in
/// order into `OUT.partial`, which is synced and renamed to `out` when whole, and removed on any
/// error (nothing already at `out` is touched then). Returns what `tensors` returned and the
/// file's size.
fn write_gguf<T>(
    out: &Path,
    metadata: &[(String, Value)],
    infos: Vec<TensorInfo>,
    tensors: impl FnOnce(&mut GgufWriter<BufWriter<std::fs::File>>, &Path) -> anyhow::Result<T>,
) -> anyhow::Result<(T, u64)> {
    let partial = partial_of(out)?;
    let done = (|| -> anyhow::Result<T> {
        let file = std::fs::File::create(&partial).with_context(|| durable::Writing(partial.clone()))?;
        let mut writer = GgufWriter::header(BufWriter::new(file), metadata, infos)
            .with_context(|| durable::Writing(partial.clone()))?;
        let done = tensors(&mut writer, &partial)?;
        let file = writer.finish()?.into_inner().map_err(|e| e.into_error());
        file.and_then(|f| f.sync_all()).with_context(|| durable::Writing(partial.clone()))?;
        Ok(done)
    })()
    .inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })
    .map_err(|e| not_created(e, out))?;
    std::fs::rename(&partial, out)
        .with_context(|| format!("renaming {} to {}", partial.display(), out.display()))?;
    durable::as_created(out)?;
    let bytes = std::fs::metadata(out).with_context(|| format!("reading {}", out.display()))?.len();
    Ok((done, bytes))
}

/// `OUT`'s folder exists (the file is written beside it, then renamed).
fn check_out_folder(out: &Path) -> anyhow::Result<()> {
    let folder = match out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !folder.is_dir() {
        bail!("{}: the folder {} does not exist", out.display(), folder.display());
    }
    Ok(())
}

/// `OUT.partial`, where the file is written before the rename.
fn partial_of(out: &Path) -> anyhow::Result<PathBuf> {
    let file_name = out.file_name().with_context(|| format!("{}: not a file name", out.display()))?;
    let mut partial_name = file_name.to_os_string();
    partial_name.push(".partial");
    Ok(out.with_file_name(partial_name))
}

/// `export-gguf --adapter-only`: the adapter alone as a llama.cpp LoRA file (`general.type =
/// adapter`, `adapter.type = lora`, `adapter.lora.alpha`), for `llama-cli --lora` and Ollama's
/// `ADAPTER` over a GGUF of the base: each adapted weight's `lora_a` and `lora_b` (f32) under
/// its llama.cpp name, B's rows permuted for Q/K. llama.cpp scales by alpha / r, so the alpha
/// written is the adapter's scale times r (rsLoRA's alpha/√r included).
pub fn export_adapter_gguf(
    source: &str,
    revision: &str,
    adapter_dir: &Path,
    out: &Path,
    base_gguf: Option<&Path>,
) -> anyhow::Result<GgufSummary> {
    check_out_folder(out)?;
    if let Some(base) = base_gguf.filter(|base| !base.is_file()) {
        bail!("--base-gguf {}: no such file", base.display());
    }
    let (config, weights) = crate::hub::config_and_weights(source, revision)?;
    let model = GgufModel::read(&config, FileType::F16)?;
    let deltas = AdapterDeltas::load(adapter_dir)?;
    let mut shapes = std::collections::HashMap::new();
    for shard in &weights {
        // SAFETY: read-only maps of files nobody writes while we read them.
        let st = unsafe { MmapedSafetensors::new(shard) }
            .with_context(|| format!("opening {}", shard.display()))?;
        shapes.extend(st.tensors().into_iter().map(|(name, view)| (name, view.shape().to_vec())));
    }
    let mut names: Vec<&String> = deltas.pairs.keys().collect();
    names.sort();
    let mut tensors = Vec::new();
    let mut rank = 0;
    for name in names {
        let shape = shapes.get(name).with_context(|| {
            format!("{}: the adapter adapts {name}, which the model does not have", adapter_dir.display())
        })?;
        let planned =
            model.plan(name, shape)?.with_context(|| format!("{name}: not a weight llama.cpp has"))?;
        let (a, b) = &deltas.pairs[name];
        rank = a.dim(0)?;
        tensors.extend(model.lora_halves(&planned, a, b)?);
    }
    anyhow::ensure!(!tensors.is_empty(), "{}: the adapter has no LoRA weights", adapter_dir.display());
    let alpha = (deltas.scale * rank as f64) as f32;
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(model.family().gguf.written_as.into())),
        ("general.type".into(), Value::String("adapter".into())),
        ("general.name".into(), Value::String(model_name(&adapter_dir.display().to_string()))),
        ("adapter.type".into(), Value::String("lora".into())),
        ("adapter.lora.alpha".into(), Value::F32(alpha)),
    ];
    let infos = tensors.iter().map(|(info, _)| info.clone()).collect();
    let ((), bytes) = write_gguf(out, &metadata, infos, |writer, partial| {
        for (info, data) in &tensors {
            writer.write_tensor(&info.name, data).with_context(|| durable::Writing(partial.to_path_buf()))?;
        }
        Ok(())
    })?;
    let (modelfile, warnings) = write_modelfile(out, &config, Some(base_gguf))?;
    Ok(GgufSummary { tensors: tensors.len(), merged_projections: 0, bytes, modelfile, warnings })
}

fn write_tensor<W: Write>(
    writer: &mut GgufWriter<W>,
    model: &GgufModel,
    planned: &Planned,
    tensor: &candle_core::Tensor,
    partial: &Path,
) -> anyhow::Result<()> {
    let data = model.data(planned, tensor)?;
    writer.write_tensor(&planned.info.name, &data).with_context(|| durable::Writing(partial.to_path_buf()))
}

/// Writes `OUT.Modelfile` beside `out` for the model of `config` (its folder's chat template):
/// `FROM ./OUT.gguf`, or for an adapter file (`base` is `Some`) `FROM` the base's GGUF (made
/// absolute; without one, a `./BASE.gguf` to replace, with a warning) and `ADAPTER ./OUT.gguf`.
fn write_modelfile(
    out: &Path,
    config: &Path,
    base: Option<Option<&Path>>,
) -> anyhow::Result<(PathBuf, Vec<String>)> {
    use crate::gguf::export::modelfile;
    let own = format!("./{}", out.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
    let mut warnings = Vec::new();
    let (from, adapter) = match base {
        None => (own, None),
        Some(Some(base)) => {
            let base =
                std::fs::canonicalize(base).with_context(|| format!("--base-gguf {}", base.display()))?;
            (base.display().to_string(), Some(own))
        }
        Some(None) => {
            warnings.push(
                "the Modelfile's FROM is a placeholder, ./BASE.gguf: set it to the base model's GGUF \
                 (export-gguf of --model without --adapter), or pass --base-gguf"
                    .to_string(),
            );
            ("./BASE.gguf".to_string(), Some(own))
        }
    };
    let dir = config.parent().unwrap_or(Path::new("."));
    let (mut text, warning) = modelfile::modelfile(&from, adapter.as_deref(), dir)?;
    if base == Some(None) {
        let note = "# FROM: replace ./BASE.gguf by the base model's GGUF (lora-ft export-gguf --model M BASE.gguf)\n";
        text = text.replacen("FROM ", &format!("{note}FROM "), 1);
    }
    warnings.extend(warning);
    let path = modelfile::path_beside(out);
    std::fs::write(&path, text).with_context(|| durable::Writing(path.clone()))?;
    Ok((path, warnings))
}

/// `general.name`: the model folder's name, or the Hub repo's without its owner.
fn model_name(source: &str) -> String {
    let trimmed = source.trim_end_matches('/');
    trimmed.rsplit('/').next().unwrap_or(trimmed).to_string()
}
