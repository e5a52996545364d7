//! What both vocabularies' tokenizer files share (`tokenizer.rs` builds byte-level BPE ones,
//! `spm.rs` SentencePiece ones): the special tokens the file names, the added tokens,
//! tokenizer_config.json and the `[bos] $A [eos]` post-processor.

use crate::gguf::format::metadata::Metadata;
use crate::gguf::format::vocab;
use anyhow::{bail, Result};
use serde_json::{json, Map, Value as Json};
use std::collections::HashMap;

/// The token types the import tells apart (`format::vocab`'s), as `Metadata::ints` reads them.
pub(super) const CONTROL: i64 = vocab::CONTROL as i64;
pub(super) const USER_DEFINED: i64 = vocab::USER_DEFINED as i64;

/// What a vocabulary converts into.
pub(super) struct TokenizerFiles {
    pub tokenizer: Json,
    pub tokenizer_config: Json,
    pub vocab_size: usize,
}

/// The special-token names of tokenizer_config.json and the GGUF keys holding their ids.
const SPECIAL_TOKENS: [(&str, &str); 4] = [
    ("bos_token", "tokenizer.ggml.bos_token_id"),
    ("eos_token", "tokenizer.ggml.eos_token_id"),
    ("unk_token", "tokenizer.ggml.unknown_token_id"),
    ("pad_token", "tokenizer.ggml.padding_token_id"),
];

/// tokenizer_config.json: the special tokens, the add_bos/add_eos flags the file sets, the chat
/// template and the added tokens.
pub(super) fn tokenizer_config(
    meta: &Metadata,
    specials: &HashMap<&'static str, (String, u64)>,
    added: &[AddedToken],
    (add_bos, add_eos): (bool, bool),
    context_length: u64,
) -> Result<Json> {
    let mut config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos && specials.contains_key("bos_token"),
        "add_eos_token": add_eos && specials.contains_key("eos_token"),
        "clean_up_tokenization_spaces": false,
        "model_max_length": context_length,
        "chat_template": meta.opt_string("tokenizer.chat_template")?,
        "added_tokens_decoder": added_tokens_decoder(added),
    });
    for (name, _) in SPECIAL_TOKENS {
        config[name] = json!(specials.get(name).map(|(token, _)| token));
    }
    Ok(config)
}

/// bos/eos/unk/pad as (token, id), for the ids the file states.
pub(super) fn special_tokens(
    meta: &Metadata,
    tokens: &[&str],
) -> Result<HashMap<&'static str, (String, u64)>> {
    let mut specials = HashMap::new();
    for (name, key) in SPECIAL_TOKENS {
        if let Some(id) = meta.opt_uint(key)? {
            let Some(token) = tokens.get(id as usize) else {
                bail!(
                    "{}: GGUF key `{key}` = {id} is outside the vocabulary of {} tokens",
                    meta.file.display(),
                    tokens.len()
                );
            };
            specials.insert(name, (token.to_string(), id));
        }
    }
    Ok(specials)
}

pub(super) struct AddedToken {
    pub id: usize,
    pub content: String,
    pub special: bool,
}

impl AddedToken {
    pub(super) fn to_json(&self) -> Json {
        json!({
            "id": self.id,
            "content": self.content,
            "single_word": false,
            "lstrip": false,
            "rstrip": false,
            "normalized": false,
            "special": self.special,
        })
    }
}

fn added_tokens_decoder(added: &[AddedToken]) -> Json {
    let mut decoder = Map::new();
    for token in added {
        let mut entry = token.to_json();
        entry.as_object_mut().map(|e| e.remove("id"));
        decoder.insert(token.id.to_string(), entry);
    }
    Json::Object(decoder)
}

/// transformers' `update_post_processor`: `[bos] $A [eos]`, for the flags the file sets.
pub(super) fn post_processor(
    specials: &HashMap<&'static str, (String, u64)>,
    add_bos: bool,
    add_eos: bool,
) -> Json {
    let bos = specials.get("bos_token").filter(|_| add_bos);
    let eos = specials.get("eos_token").filter(|_| add_eos);
    let piece = |token: &(String, u64), type_id: u32| json!({ "SpecialToken": { "id": token.0, "type_id": type_id } });
    let sequence = |id: &str, type_id: u32| json!({ "Sequence": { "id": id, "type_id": type_id } });
    let mut single = Vec::new();
    let mut pair = Vec::new();
    bos.into_iter().for_each(|t| single.push(piece(t, 0)));
    single.push(sequence("A", 0));
    eos.into_iter().for_each(|t| single.push(piece(t, 0)));
    pair.extend(single.iter().cloned());
    bos.into_iter().for_each(|t| pair.push(piece(t, 1)));
    pair.push(sequence("B", 1));
    eos.into_iter().for_each(|t| pair.push(piece(t, 1)));
    let mut special_tokens = Map::new();
    for (token, id) in bos.into_iter().chain(eos) {
        special_tokens.insert(token.clone(), json!({ "id": token, "ids": [id], "tokens": [token] }));
    }
    json!({ "type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special_tokens })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_processor_adds_bos_when_asked() {
        let mut specials = HashMap::new();
        specials.insert("bos_token", ("<s>".to_string(), 1));
        let none = post_processor(&specials, false, false);
        assert_eq!(none["single"].as_array().unwrap().len(), 1);
        let bos = post_processor(&specials, true, true);
        assert_eq!(bos["single"][0]["SpecialToken"]["id"], "<s>");
        assert_eq!(bos["pair"].as_array().unwrap().len(), 4);
        assert_eq!(bos["special_tokens"]["<s>"]["ids"], json!([1]));
    }
}
