//! The models served: `GET /v1/models` (the base by its served name and each adapter with the
//! base as its `parent`, as vLLM lists LoRA adapters), and vLLM's
//! `POST /v1/load_lora_adapter` / `POST /v1/unload_lora_adapter`, which work only with
//! `--adapter-dir`: a `lora_path` is resolved (links followed) and must lie inside that folder,
//! so no other path from a request reaches the file system.

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use super::body::typed;
use super::errors::ApiError;
use super::state::AppState;

/// `GET /v1/models`'s body.
pub fn list(state: &AppState) -> Value {
    let base = &state.options.served_model_name;
    let model = |id: &str, parent: Option<&str>| {
        json!({
            "id": id, "object": "model", "created": state.started, "owned_by": "lora-ft",
            "root": parent.unwrap_or(id), "parent": parent, "max_model_len": state.engine.max_context(),
        })
    };
    let mut data = vec![model(base, None)];
    data.extend(state.engine.adapters().iter().map(|a| model(a, Some(base))));
    json!({"object": "list", "data": data})
}

#[derive(Deserialize)]
struct LoadBody {
    lora_name: String,
    lora_path: String,
}

#[derive(Deserialize)]
struct UnloadBody {
    lora_name: String,
}

/// The adapter folder of the server, or the 403 of a server started without one.
fn adapter_dir(state: &AppState) -> Result<&Path, ApiError> {
    state.options.adapter_dir.as_deref().ok_or_else(|| {
        ApiError::status(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            "Loading and unloading adapters is off: start lora-ft serve with --adapter-dir DIR to load \
             adapters from DIR while serving.",
        )
    })
}

/// `lora_path` resolved inside `dir` (relative paths are taken from it), or a 400.
pub fn resolve_inside(dir: &Path, lora_path: &str) -> Result<PathBuf, ApiError> {
    let path = dir.join(lora_path);
    let outside = || {
        ApiError::field(
            "lora_path",
            format!("lora_path {lora_path:?} is not an adapter folder inside the server's --adapter-dir"),
        )
    };
    let resolved = path.canonicalize().map_err(|_| outside())?;
    if resolved == dir || !resolved.starts_with(dir) || !resolved.is_dir() {
        return Err(outside());
    }
    Ok(resolved)
}

/// `POST /v1/load_lora_adapter`: the adapter loaded under `lora_name`.
pub async fn load(state: &AppState, body: &Value) -> Result<String, ApiError> {
    let dir = adapter_dir(state)?;
    let LoadBody { lora_name, lora_path } = typed(body)?;
    check_name(state, &lora_name)?;
    if state.engine.adapters().contains(&lora_name) {
        return Err(ApiError::field(
            "lora_name",
            format!("an adapter named {lora_name:?} is already loaded"),
        ));
    }
    let path = resolve_inside(dir, &lora_path)?;
    let engine = state.engine.clone();
    let name = lora_name.clone();
    tokio::task::spawn_blocking(move || engine.add_adapter(&name, &path))
        .await
        .map_err(|e| ApiError::internal(format!("loading the adapter: {e}")))?
        .map_err(|e| ApiError::field("lora_path", format!("loading adapter {lora_name:?}: {e:#}")))?;
    tracing::info!("loaded adapter {lora_name} from {lora_path}");
    Ok(format!("Success: LoRA adapter '{lora_name}' added successfully."))
}

/// `POST /v1/unload_lora_adapter`: the adapter `lora_name` dropped.
pub fn unload(state: &AppState, body: &Value) -> Result<String, ApiError> {
    adapter_dir(state)?;
    let UnloadBody { lora_name } = typed(body)?;
    if !state.engine.adapters().contains(&lora_name) {
        return Err(ApiError::model_not_found(&lora_name));
    }
    state.engine.remove_adapter(&lora_name).map_err(|e| ApiError::internal(format!("{e:#}")))?;
    tracing::info!("unloaded adapter {lora_name}");
    Ok(format!("Success: LoRA adapter '{lora_name}' removed successfully."))
}

/// An adapter's name: not empty, not the base's.
fn check_name(state: &AppState, name: &str) -> Result<(), ApiError> {
    if name.trim().is_empty() {
        return Err(ApiError::field("lora_name", "lora_name must not be empty"));
    }
    if name == state.options.served_model_name {
        return Err(ApiError::field("lora_name", "lora_name is the base model's name"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_folders_inside_the_adapter_dir_resolve() {
        let root = std::env::temp_dir().join(format!("lora-ft-serve-resolve-{}", std::process::id()));
        let dir = root.join("adapters");
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::create_dir_all(root.join("outside")).unwrap();
        let dir = dir.canonicalize().unwrap();
        assert_eq!(resolve_inside(&dir, "a").unwrap(), dir.join("a"));
        assert_eq!(resolve_inside(&dir, dir.join("a").to_str().unwrap()).unwrap(), dir.join("a"));
        for bad in ["../outside", "/etc", "", ".", "missing", "a/../../outside"] {
            let e = resolve_inside(&dir, bad).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("lora_path"), "{bad}");
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(root.join("outside"), dir.join("link")).unwrap();
            assert!(resolve_inside(&dir, "link").is_err(), "a link out of the folder");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}
