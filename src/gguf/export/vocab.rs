//! A Hugging Face tokenizer (tokenizer.json, tokenizer_config.json, tokenizer.model) → the
//! `tokenizer.*` keys of a GGUF file, as llama.cpp's `convert_hf_to_gguf.py` writes them: a
//! byte-level BPE as a `gpt2` vocabulary (`get_vocab_base`: tokens by id, their types, the
//! merges), a SentencePiece one as `llama` (`vocab_spm.rs`), then gguf-py's `SpecialVocab`
//! for both: the special token ids, the add-bos/eos flags and the chat template.

use super::vocab_spm;
use crate::arch::families::by_model_type;
use crate::arch::family::SpacePrefix;
use crate::gguf::format::vocab::{looks_special, split_regex, CONTROL, NORMAL, UNUSED, USER_DEFINED};
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;

/// The pre-tokenizer names whose split regex the import knows, tried in this order (the first
/// name of each regex is the one convert_hf_to_gguf.py writes for the models lora-ft trains).
const SPLIT_NAMES: [&str; 5] = ["llama-bpe", "tekken", "qwen2", "qwen35", "gpt-4o"];

/// The tokenizer keys for a model of `vocab_size` token ids (config.json's, which may be more
/// than the tokenizer's: the rest become `[PAD{id}]`). `config` is config.json, whose
/// `*_token_id`s stand in for special tokens tokenizer_config.json does not name.
pub(super) fn tokenizer_metadata(
    dir: &Path,
    vocab_size: usize,
    config: &Json,
) -> Result<Vec<(String, Value)>> {
    let file = dir.join("tokenizer.json");
    let has_model_file = dir.join("tokenizer.model").is_file();
    // the converter reads tokenizer.model first; tokenizer.json is then not needed
    let tokenizer = if has_model_file && !file.is_file() { Json::Null } else { read_json(&file)? };
    let tokenizer_config = read_json(&dir.join("tokenizer_config.json"))?;
    let model = &tokenizer["model"];
    // SentencePiece-style BPE (Llama 2, Mistral 7B, Gemma) falls back to `<0xNN>` pieces; byte-level
    // BPE has no unknown bytes (Qwen's NFC normalizer does not make it SentencePiece)
    let sentencepiece = model["byte_fallback"] == true;
    let (tokens, mut keys) = if has_model_file || sentencepiece {
        spm_keys(dir, &tokenizer, vocab_size, &tokenizer_config, config)?
    } else {
        gpt2_keys(&file, &tokenizer, vocab_size)?
    };
    let ids: HashMap<&str, usize> = tokens.iter().enumerate().map(|(id, t)| (t.as_str(), id)).collect();
    for (name, key) in [
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("unk", "unknown_token_id"),
        ("pad", "padding_token_id"),
    ] {
        let from_tokenizer = match &tokenizer_config[format!("{name}_token")] {
            Json::String(token) => ids.get(token.as_str()).copied(),
            Json::Object(token) => token["content"].as_str().and_then(|t| ids.get(t).copied()),
            _ => None,
        };
        let id = from_tokenizer.or_else(|| config[format!("{name}_token_id")].as_u64().map(|id| id as usize));
        if let Some(id) = id.filter(|id| *id < tokens.len()) {
            keys.push((format!("tokenizer.ggml.{key}"), Value::U32(id as u32)));
        }
    }
    for flag in ["add_bos_token", "add_eos_token"] {
        if let Some(value) = tokenizer_config[flag].as_bool() {
            keys.push((format!("tokenizer.ggml.{flag}"), Value::Bool(value)));
        }
    }
    if let Some(template) = chat_template(dir, &tokenizer_config)? {
        keys.push(("tokenizer.chat_template".to_string(), Value::String(template)));
    }
    Ok(keys)
}

type VocabKeys = (Vec<String>, Vec<(String, Value)>);

/// A byte-level BPE: `gpt2` with its pre-tokenizer's name and merges.
fn gpt2_keys(file: &Path, tokenizer: &Json, vocab_size: usize) -> Result<VocabKeys> {
    let model = &tokenizer["model"];
    if model["type"] != "BPE" {
        bail!(
            "{}: a {} tokenizer; export-gguf writes BPE and SentencePiece ones",
            file.display(),
            model["type"]
        );
    }
    let pre = pre_tokenizer_name(&tokenizer["pre_tokenizer"])
        .with_context(|| format!("{}: pre_tokenizer", file.display()))?;
    let (tokens, types) = tokens_and_types(file, tokenizer, vocab_size)?;
    let merges = merges(file, &model["merges"])?;
    let keys = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array(tokens.iter().cloned().map(Value::String).collect()),
        ),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(types.into_iter().map(Value::I32).collect())),
        ("tokenizer.ggml.merges".to_string(), Value::Array(merges.into_iter().map(Value::String).collect())),
    ];
    Ok((tokens, keys))
}

/// A SentencePiece vocabulary: `llama`, pre-tokenizer `default`, scores instead of merges
/// (`_set_vocab_sentencepiece`); `add_space_prefix` as the family's declaration says (Gemma's
/// false, from `Gemma2Model` / `Gemma3Model.set_vocab`; Llama's the tokenizer config's
/// `add_prefix_space` where it has one).
fn spm_keys(
    dir: &Path,
    tokenizer: &Json,
    vocab_size: usize,
    tokenizer_config: &Json,
    config: &Json,
) -> Result<VocabKeys> {
    let vocab = if dir.join("tokenizer.model").is_file() {
        vocab_spm::from_model_file(dir, vocab_size, tokenizer_config)?
    } else {
        vocab_spm::from_tokenizer_json(dir, tokenizer, vocab_size, tokenizer_config)?
    };
    let mut keys = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("llama".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String("default".into())),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array(vocab.tokens.iter().cloned().map(Value::String).collect()),
        ),
        (
            "tokenizer.ggml.scores".to_string(),
            Value::Array(vocab.scores.into_iter().map(Value::F32).collect()),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            Value::Array(vocab.types.into_iter().map(Value::I32).collect()),
        ),
    ];
    let model_type = config["model_type"].as_str().unwrap_or_default();
    let space_prefix = match by_model_type(model_type).map(|f| f.space_prefix) {
        Some(SpacePrefix::Off) => Some(false),
        Some(SpacePrefix::FromTokenizerConfig) => tokenizer_config["add_prefix_space"].as_bool(),
        Some(SpacePrefix::Unwritten) | None => None,
    };
    if let Some(prefix) = space_prefix {
        keys.push(("tokenizer.ggml.add_space_prefix".to_string(), Value::Bool(prefix)));
    }
    Ok((vocab.tokens, keys))
}

fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))
}

/// llama.cpp's name for the pre-tokenizer: GPT-2's byte-level regex (`gpt-2`: llama.cpp's
/// vocabulary loader refuses `gpt2`, "unknown pre-tokenizer type"), digits split one
/// by one before it (`smollm`, which llama.cpp runs as StarCoder's), or a split regex the import
/// maps from a name (`llama-bpe`, `tekken`, …).
fn pre_tokenizer_name(pre: &Json) -> Result<&'static str> {
    let is_byte_level = |step: &Json, regex: bool| step["type"] == "ByteLevel" && step["use_regex"] == regex;
    if is_byte_level(pre, true) {
        return Ok("gpt-2");
    }
    let steps = pre["pretokenizers"].as_array().map(Vec::as_slice).unwrap_or_default();
    match steps {
        [digits, byte_level]
            if digits["type"] == "Digits"
                && digits["individual_digits"] == true
                && is_byte_level(byte_level, true) =>
        {
            return Ok("smollm");
        }
        [split, byte_level] if split["type"] == "Split" && is_byte_level(byte_level, false) => {
            let regex = split["pattern"]["Regex"].as_str().unwrap_or_default();
            if let Some(name) = SPLIT_NAMES.into_iter().find(|name| split_regex(name) == Some(regex)) {
                return Ok(name);
            }
        }
        _ => {}
    }
    bail!("{pre} matches no llama.cpp pre-tokenizer lora-ft knows (gpt-2, smollm, {SPLIT_NAMES:?})")
}

/// Every id's token and llama.cpp token type.
fn tokens_and_types(file: &Path, tokenizer: &Json, vocab_size: usize) -> Result<(Vec<String>, Vec<i32>)> {
    let mut tokens: Vec<Option<(String, i32)>> = vec![None; vocab_size];
    let mut put = |token: &str, id: Option<u64>, kind: i32| -> Result<()> {
        let Some(slot) = id.and_then(|id| tokens.get_mut(id as usize)) else {
            bail!(
                "{}: token {token:?} has id {id:?}, outside config.json's vocab_size {vocab_size}",
                file.display()
            );
        };
        *slot = Some((token.to_string(), kind));
        Ok(())
    };
    let vocab = tokenizer["model"]["vocab"]
        .as_object()
        .with_context(|| format!("{}: no model.vocab", file.display()))?;
    for (token, id) in vocab {
        put(token, id.as_u64(), NORMAL)?;
    }
    for added in tokenizer["added_tokens"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let token = added["content"].as_str().unwrap_or_default();
        if added["special"] == true || looks_special(token) {
            put(token, added["id"].as_u64(), CONTROL)?;
        } else {
            put(&token.replace('▁', " "), added["id"].as_u64(), USER_DEFINED)?;
        }
    }
    Ok(tokens
        .into_iter()
        .enumerate()
        .map(|(id, slot)| slot.unwrap_or_else(|| (format!("[PAD{id}]"), UNUSED)))
        .unzip())
}

/// `"a b"` per merge; tokenizer.json holds them so or as pairs, whose spaces gguf-py writes as
/// U+0120 (`chr(ord(' ') + 256)`).
fn merges(file: &Path, merges: &Json) -> Result<Vec<String>> {
    let Some(merges) = merges.as_array() else { bail!("{}: model.merges is missing", file.display()) };
    merges
        .iter()
        .map(|merge| match merge {
            Json::String(merge) => Ok(merge.clone()),
            Json::Array(pair) if pair.len() == 2 && pair.iter().all(Json::is_string) => Ok(pair
                .iter()
                .map(|part| part.as_str().unwrap_or_default().replace(' ', "\u{0120}"))
                .collect::<Vec<_>>()
                .join(" ")),
            other => bail!("{}: merge {other} is neither \"a b\" nor [a, b]", file.display()),
        })
        .collect()
}

/// tokenizer_config.json's `chat_template` (the `default` one of a list), else
/// chat_template.jinja, as transformers saves it since 4.43.
fn chat_template(dir: &Path, tokenizer_config: &Json) -> Result<Option<String>> {
    match &tokenizer_config["chat_template"] {
        Json::String(template) => return Ok(Some(template.clone())),
        Json::Array(named) => {
            let default = named.iter().find(|t| t["name"] == "default");
            return Ok(default.and_then(|t| t["template"].as_str()).map(str::to_string));
        }
        _ => {}
    }
    let jinja = dir.join("chat_template.jinja");
    match jinja.is_file() {
        true => {
            Ok(Some(std::fs::read_to_string(&jinja).with_context(|| format!("reading {}", jinja.display()))?))
        }
        false => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pre_tokenizers_are_named_as_llama_cpp_names_them() {
        let byte_level =
            |regex: bool| json!({ "type": "ByteLevel", "add_prefix_space": false, "use_regex": regex });
        assert_eq!(pre_tokenizer_name(&byte_level(true)).unwrap(), "gpt-2");
        let smollm = json!({ "type": "Sequence", "pretokenizers": [
            { "type": "Digits", "individual_digits": true }, byte_level(true) ] });
        assert_eq!(pre_tokenizer_name(&smollm).unwrap(), "smollm");
        let llama3 = json!({ "type": "Sequence", "pretokenizers": [
            { "type": "Split", "pattern": { "Regex": split_regex("llama3").unwrap() }, "behavior": "Isolated" },
            byte_level(false) ] });
        assert_eq!(pre_tokenizer_name(&llama3).unwrap(), "llama-bpe");
        let err = pre_tokenizer_name(&json!({ "type": "Metaspace" })).unwrap_err().to_string();
        assert!(err.contains("Metaspace") && err.contains("smollm"), "{err}");
    }

    #[test]
    fn tokens_by_id_with_their_types_and_padding() {
        let tokenizer = json!({
            "model": { "vocab": { "a": 0, "Ġb": 1 } },
            "added_tokens": [
                { "id": 2, "content": "<|im_start|>", "special": true },
                { "id": 3, "content": "<|x|>", "special": false },
                { "id": 4, "content": "▁user", "special": false },
            ],
        });
        let (tokens, types) = tokens_and_types(Path::new("t.json"), &tokenizer, 6).unwrap();
        assert_eq!(tokens, ["a", "Ġb", "<|im_start|>", "<|x|>", " user", "[PAD5]"]);
        assert_eq!(types, [1, 1, 3, 3, 4, 5]);
        let err = tokens_and_types(Path::new("t.json"), &tokenizer, 4).unwrap_err().to_string();
        assert!(err.contains("\" user\" has id Some(4)") && err.contains("vocab_size 4"), "{err}");
        let merged = merges(Path::new("t.json"), &json!(["a b", ["Ġb", "c d"]])).unwrap();
        assert_eq!(merged, ["a b", "Ġb cĠd"]);
    }
}
