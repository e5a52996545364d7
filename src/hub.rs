//! Model sources: a `.gguf` file (imported once into the lora-ft cache), a local Hugging Face
//! folder, or a Hub repo id (hf-hub: revision, `HF_TOKEN`, `HF_HOME` cache, offline when cached).

use anyhow::{bail, Context, Result};
use hf_hub::api::sync::{ApiBuilder, ApiRepo};
use hf_hub::{Repo, RepoType};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The files of one model, all existing on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    pub dir: PathBuf,
    pub config: PathBuf,
    /// model.safetensors, or every shard the index lists (sorted, without repeats).
    pub weights: Vec<PathBuf>,
    pub tokenizer: PathBuf,
    pub tokenizer_config: Option<PathBuf>,
    pub generation_config: Option<PathBuf>,
}

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// Resolve `source`: a path ending in `.gguf`, an existing folder, or a Hub repo id at
/// `revision` (a branch, tag or commit).
pub fn resolve(source: &str, revision: &str) -> Result<ModelFiles> {
    let path = Path::new(source);
    if source.ends_with(".gguf") {
        return resolve_gguf(path);
    }
    if path.is_dir() {
        return local_folder(path);
    }
    if path.exists() {
        bail!("model source {source} is a file but not a .gguf file; give a folder, a .gguf file or a Hub repo id");
    }
    if looks_like_a_path(source) {
        bail!("model source {source} does not exist (and is not a Hub repo id, which reads org/name)");
    }
    hub_repo(source, revision)
}

/// A source no Hub repo id could be (`org/name`): a missing folder is told as one, not as a
/// failed download.
fn looks_like_a_path(source: &str) -> bool {
    source.starts_with(['/', '.', '~']) || source.contains('\\') || source.matches('/').count() > 1
}

/// config.json and the weights of `source`, no tokenizer needed: a local folder as it is,
/// otherwise the full resolution (a .gguf import, a Hub download).
pub fn config_and_weights(source: &str, revision: &str) -> Result<(PathBuf, Vec<PathBuf>)> {
    if Path::new(source).is_dir() {
        return local_weights(Path::new(source));
    }
    let files = resolve(source, revision)?;
    Ok((files.config, files.weights))
}

/// The config.json of `source` alone (for planning before a load): a local folder's, a GGUF's
/// import's, or a Hub repo's (from the cache, else downloading that one file).
pub fn config_json(source: &str, revision: &str) -> Result<PathBuf> {
    let path = Path::new(source);
    if source.ends_with(".gguf") {
        return Ok(resolve_gguf(path)?.config);
    }
    if path.is_dir() {
        let config = path.join("config.json");
        return match config.is_file() {
            true => Ok(config),
            false => bail!("no config.json in model folder {}", path.display()),
        };
    }
    if looks_like_a_path(source) {
        bail!("model source {source} does not exist (and is not a Hub repo id, which reads org/name)");
    }
    if let Ok(files) = cached_snapshot(&hub_cache_root(), source, revision) {
        return Ok(files.config);
    }
    api_repo(source, revision, false)?
        .get("config.json")
        .with_context(|| format!("downloading config.json from Hub repo {source} at revision {revision}"))
}

/// A model's config.json, read for planning, and its chat template where one is at hand.
pub struct PlanningSource {
    pub config: crate::arch::ModelConfig,
    /// `chat_template` of the tokenizer_config.json beside config.json (a local folder, a cached
    /// Hub snapshot, a GGUF file's metadata); `None` where there is none.
    pub chat_template: Option<String>,
}

/// config.json of `source` without loading or importing weights: a GGUF file's from its
/// metadata (`gguf::read_configs`), else as `config_json` finds it; checked to be a family the
/// layers compute.
pub fn planning_source(source: &str, revision: &str) -> Result<PlanningSource> {
    let template = |tokenizer_config: &serde_json::Value| {
        tokenizer_config.get("chat_template").and_then(|t| t.as_str()).map(str::to_string)
    };
    if source.ends_with(".gguf") {
        let (config, tokenizer_config) = crate::gguf::read_configs(Path::new(source))?;
        let config = crate::arch::ModelConfig::from_value(config, source)?;
        return Ok(PlanningSource { config, chat_template: template(&tokenizer_config) });
    }
    let path = config_json(source, revision)?;
    let config = crate::arch::ModelConfig::from_file(&path)?;
    let beside = path.with_file_name("tokenizer_config.json");
    let chat_template = std::fs::read_to_string(&beside)
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|json| template(&json));
    Ok(PlanningSource { config, chat_template })
}

/// Import the GGUF file once into `<lora-ft cache>/imported/<stem>-<hash of size and mtime>`.
fn resolve_gguf(gguf: &Path) -> Result<ModelFiles> {
    let meta =
        std::fs::metadata(gguf).with_context(|| format!("model source {} does not exist", gguf.display()))?;
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    let stamp = format!("{}:{}", meta.len(), mtime.map_or(0, |d| d.as_nanos()));
    let stem = gguf.file_stem().map_or("model".into(), |s| s.to_string_lossy());
    let dir = crate::cache::dir().join("imported").join(format!("{stem}-{:08x}", fnv1a32(&stamp)));
    let done = dir.join(".import-complete");
    if !done.exists() {
        tracing::info!("importing {} into {}", gguf.display(), dir.display());
        let started = std::time::Instant::now();
        let summary = crate::gguf::import_gguf(gguf, &dir)?;
        std::fs::write(&done, format!("{summary:?}\n"))
            .with_context(|| format!("writing {}", done.display()))?;
        tracing::info!("imported {} tensors in {:.1?}", summary.tensors, started.elapsed());
    }
    local_folder(&dir)
}

fn fnv1a32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// A folder with config.json, tokenizer.json and single or sharded safetensors.
pub fn local_folder(dir: &Path) -> Result<ModelFiles> {
    let file = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
    let required =
        |name: &str| file(name).with_context(|| format!("no {name} in model folder {}", dir.display()));
    let (config, weights) = local_weights(dir)?;
    Ok(ModelFiles {
        dir: dir.to_path_buf(),
        config,
        weights,
        tokenizer: required("tokenizer.json")?,
        tokenizer_config: file("tokenizer_config.json"),
        generation_config: file("generation_config.json"),
    })
}

/// config.json and the safetensors files of a model folder (no tokenizer needed: benchmarks
/// run random models that have none).
pub fn local_weights(dir: &Path) -> Result<(PathBuf, Vec<PathBuf>)> {
    let file = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
    let config =
        file("config.json").with_context(|| format!("no config.json in model folder {}", dir.display()))?;
    let weights = if let Some(index) = file(INDEX) {
        shard_names(&index)?.into_iter().map(|name| dir.join(name)).collect::<Vec<_>>()
    } else if let Some(single) = file(SINGLE) {
        vec![single]
    } else {
        bail!("no {SINGLE} or {INDEX} in model folder {}", dir.display());
    };
    if let Some(missing) = weights.iter().find(|shard| !shard.is_file()) {
        bail!("{} lists shard {} which does not exist", dir.join(INDEX).display(), missing.display());
    }
    Ok((config, weights))
}

/// The shard file names in a safetensors index's `weight_map`, sorted, each once.
fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).with_context(|| format!("reading {}", index.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", index.display()))?;
    let Some(map) = json.get("weight_map").and_then(|m| m.as_object()) else {
        bail!("{}: key `weight_map` is missing or not an object", index.display());
    };
    let mut shards = BTreeSet::new();
    for (tensor, shard) in map {
        let Some(shard) = shard.as_str() else {
            bail!("{}: `weight_map.{tensor}` is not a file name", index.display());
        };
        shards.insert(shard.to_string());
    }
    if shards.is_empty() {
        bail!("{}: `weight_map` lists no shards", index.display());
    }
    Ok(shards.into_iter().collect())
}

/// The hf-hub cache root: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`.
fn hub_cache_root() -> PathBuf {
    match std::env::var_os("HF_HUB_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => hf_hub::Cache::from_env().path().clone(),
    }
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "TRUE" | "yes" | "ON" | "on"))
}

fn hub_repo(repo_id: &str, revision: &str) -> Result<ModelFiles> {
    let root = hub_cache_root();
    let cached = cached_snapshot(&root, repo_id, revision);
    match cached {
        Ok(files) => return Ok(files),
        Err(err) if offline() => {
            return Err(
                err.context(format!("HF_HUB_OFFLINE is set and {repo_id}@{revision} is not fully cached"))
            )
        }
        Err(err) => tracing::debug!("not served from the cache: {err:#}"),
    }
    download(&api_repo(repo_id, revision, true)?, repo_id, revision)
}

/// The Hub client for one repo at one revision: the shared cache, `HF_ENDPOINT`, `HF_TOKEN`.
fn api_repo(repo_id: &str, revision: &str, progress: bool) -> Result<ApiRepo> {
    let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty());
    let mut builder = ApiBuilder::from_cache(hf_hub::Cache::new(hub_cache_root()))
        .with_progress(progress)
        .with_token(token);
    if let Ok(endpoint) = std::env::var("HF_ENDPOINT") {
        builder = builder.with_endpoint(endpoint);
    }
    let api = builder.build().context("building the Hugging Face Hub client")?;
    Ok(api.repo(Repo::with_revision(repo_id.to_string(), RepoType::Model, revision.to_string())))
}

fn download(repo: &ApiRepo, repo_id: &str, revision: &str) -> Result<ModelFiles> {
    let get = |name: &str| {
        repo.get(name)
            .with_context(|| format!("downloading {name} from Hub repo {repo_id} at revision {revision}"))
    };
    let config = get("config.json")?;
    let weights = match repo.get(INDEX) {
        Ok(index) => shard_names(&index)?.iter().map(|shard| get(shard)).collect::<Result<Vec<_>>>()?,
        Err(index_err) => vec![repo.get(SINGLE).map_err(|single_err| {
            anyhow::anyhow!(
                "Hub repo {repo_id} at revision {revision} has neither {INDEX} ({index_err}) nor {SINGLE} ({single_err})"
            )
        })?],
    };
    let tokenizer = get("tokenizer.json")?;
    let dir = config.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok(ModelFiles {
        dir,
        config,
        weights,
        tokenizer,
        tokenizer_config: repo.get("tokenizer_config.json").ok(),
        generation_config: repo.get("generation_config.json").ok(),
    })
}

/// A repo snapshot already in the hf-hub cache layout
/// (`<root>/models--org--name/{refs/<revision>, snapshots/<commit>/...}`), with no network.
pub fn cached_snapshot(root: &Path, repo_id: &str, revision: &str) -> Result<ModelFiles> {
    let repo_dir = root.join(Repo::model(repo_id.to_string()).folder_name());
    let ref_file = repo_dir.join("refs").join(revision);
    let commit = if ref_file.is_file() {
        std::fs::read_to_string(&ref_file).with_context(|| format!("reading {}", ref_file.display()))?
    } else {
        revision.to_string() // a commit hash names its snapshot directly
    };
    let snapshot = repo_dir.join("snapshots").join(commit.trim());
    if !snapshot.is_dir() {
        bail!(
            "{repo_id}@{revision} is not in the Hugging Face cache (looked for {} and {})",
            ref_file.display(),
            snapshot.display()
        );
    }
    local_folder(&snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("lora-ft-hub-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn touch(dir: &Path, names: &[&str]) {
        for name in names {
            std::fs::write(dir.join(name), "{}").unwrap();
        }
    }

    #[test]
    fn single_file_folder() {
        let tmp = TempDir::new("single");
        touch(&tmp.0, &["config.json", "model.safetensors", "tokenizer.json", "generation_config.json"]);
        let files = resolve(tmp.0.to_str().unwrap(), "main").unwrap();
        assert_eq!(files.weights, vec![tmp.0.join("model.safetensors")]);
        assert_eq!(files.tokenizer, tmp.0.join("tokenizer.json"));
        assert_eq!(files.tokenizer_config, None);
        assert_eq!(files.generation_config, Some(tmp.0.join("generation_config.json")));
    }

    #[test]
    fn sharded_folder_lists_each_shard_once() {
        let tmp = TempDir::new("sharded");
        touch(&tmp.0, &["config.json", "tokenizer.json", "tokenizer_config.json"]);
        let index = r#"{"metadata": {"total_size": 8}, "weight_map": {
            "a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
            "c": "model-00001-of-00002.safetensors"}}"#;
        std::fs::write(tmp.0.join(INDEX), index).unwrap();
        let err = local_folder(&tmp.0).unwrap_err().to_string();
        assert!(err.contains("model-00001-of-00002.safetensors which does not exist"), "{err}");
        touch(&tmp.0, &["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
        let files = local_folder(&tmp.0).unwrap();
        let names: Vec<_> = files.weights.iter().map(|p| p.file_name().unwrap().to_str().unwrap()).collect();
        assert_eq!(names, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
        assert_eq!(files.tokenizer_config, Some(tmp.0.join("tokenizer_config.json")));
    }

    #[test]
    fn folder_errors_say_what_was_tried() {
        let tmp = TempDir::new("missing");
        touch(&tmp.0, &["config.json", "tokenizer.json"]);
        let err = local_folder(&tmp.0).unwrap_err().to_string();
        assert!(
            err.contains("no model.safetensors or model.safetensors.index.json in model folder"),
            "{err}"
        );
        touch(&tmp.0, &["model.safetensors"]);
        std::fs::remove_file(tmp.0.join("tokenizer.json")).unwrap();
        let err = local_folder(&tmp.0).unwrap_err().to_string();
        assert!(err.contains("no tokenizer.json in model folder"), "{err}");
        std::fs::write(tmp.0.join(INDEX), r#"{"weight_map": []}"#).unwrap();
        let err = local_folder(&tmp.0).unwrap_err().to_string();
        assert!(err.contains("`weight_map` is missing or not an object"), "{err}");
    }

    #[test]
    fn offline_cache_resolves_branch_and_commit() {
        let tmp = TempDir::new("cache");
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let repo = tmp.0.join("models--org--tiny-model");
        let snapshot = repo.join("snapshots").join(sha);
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join("main"), sha).unwrap();
        touch(&snapshot, &["config.json", "model.safetensors", "tokenizer.json"]);

        let by_branch = cached_snapshot(&tmp.0, "org/tiny-model", "main").unwrap();
        assert_eq!(by_branch.dir, snapshot);
        assert_eq!(by_branch.weights, vec![snapshot.join("model.safetensors")]);
        let by_commit = cached_snapshot(&tmp.0, "org/tiny-model", sha).unwrap();
        assert_eq!(by_commit, by_branch);
        let err = cached_snapshot(&tmp.0, "org/tiny-model", "v2").unwrap_err().to_string();
        assert!(err.contains("org/tiny-model@v2 is not in the Hugging Face cache"), "{err}");
        assert!(cached_snapshot(&tmp.0, "org/other", "main").is_err());
    }

    #[test]
    fn a_missing_folder_is_not_looked_up_on_the_hub() {
        let tmp = TempDir::new("gone");
        for source in [tmp.0.join("no-such-model"), PathBuf::from("./models/llama"), PathBuf::from("a/b/c")] {
            let source = source.to_str().unwrap();
            let err = resolve(source, "main").unwrap_err().to_string();
            assert_eq!(
                err,
                format!(
                    "model source {source} does not exist (and is not a Hub repo id, which reads org/name)"
                )
            );
        }
    }

    #[test]
    fn non_gguf_file_is_rejected() {
        let tmp = TempDir::new("file");
        touch(&tmp.0, &["weights.bin"]);
        let err = resolve(tmp.0.join("weights.bin").to_str().unwrap(), "main").unwrap_err().to_string();
        assert!(err.contains("is a file but not a .gguf file"), "{err}");
    }
}
