//! GGUF vocabulary → tokenizer.json + tokenizer_config.json, built the way transformers'
//! `integrations/gguf/gguf_tokenizer_mapping.py` builds its fast tokenizer from the same file.

use super::Metadata;
use anyhow::{bail, Result};
use serde_json::{json, Map, Value as Json};
use std::collections::{HashMap, HashSet};

/// llama.cpp's token type for control tokens (`<|im_start|>`); 4 is user-defined.
pub(super) const CONTROL: i64 = 3;
pub(super) const USER_DEFINED: i64 = 4;

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

pub(super) fn convert(meta: &Metadata, context_length: u64) -> Result<TokenizerFiles> {
    let model_key = "tokenizer.ggml.model";
    match meta.string(model_key)? {
        "gpt2" => convert_bpe(meta, context_length),
        "llama" => super::spm::convert(meta, context_length),
        model => bail!(
            "{}: GGUF key `{model_key}` is {model:?}; the importer builds byte-level BPE (\"gpt2\") and \
             SentencePiece (\"llama\") tokenizers only — for another model use its Hugging Face repo",
            meta.file.display()
        ),
    }
}

/// A byte-level BPE (`gpt2`) vocabulary: tokens and merges as the file has them.
fn convert_bpe(meta: &Metadata, context_length: u64) -> Result<TokenizerFiles> {
    let tokens_key = "tokenizer.ggml.tokens";
    let Some(tokens) = meta.strings(tokens_key)? else {
        bail!("{}: GGUF key `{tokens_key}` is missing", meta.file.display());
    };
    let merges_key = "tokenizer.ggml.merges";
    let Some(merges) = meta.strings(merges_key)? else {
        bail!("{}: GGUF key `{merges_key}` is missing (a gpt2 tokenizer needs it)", meta.file.display());
    };
    let token_types = meta.ints("tokenizer.ggml.token_type")?.unwrap_or_default();
    let specials = special_tokens(meta, &tokens)?;

    let vocab = byte_level_vocab(&tokens);
    let merges = merges
        .iter()
        .map(|merge| match merge.split_once(' ') {
            Some((left, right)) => Ok(json!([left, right])),
            None => bail!("{}: merge {merge:?} in `{merges_key}` has no space", meta.file.display()),
        })
        .collect::<Result<Vec<_>>>()?;
    let added = added_tokens(&tokens, &token_types, &vocab, &specials);
    let add_bos = meta.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = meta.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let pre = meta.opt_string("tokenizer.ggml.pre")?;

    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added.iter().map(AddedToken::to_json).collect::<Vec<_>>(),
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer(pre),
        "post_processor": post_processor(&specials, add_bos, add_eos),
        "decoder": byte_level(true),
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": ignores_merges(pre),
            "vocab": vocab,
            "merges": merges,
        },
    });
    let config = tokenizer_config(meta, &specials, &added, (add_bos, add_eos), context_length)?;
    Ok(TokenizerFiles { tokenizer, tokenizer_config: config, vocab_size: tokens.len() })
}

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

/// GPT-2's reversible byte → printable character map (`bytes_to_unicode`).
fn bytes_to_unicode() -> [char; 256] {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for byte in 0..256u32 {
        let code = if printable(byte) {
            byte
        } else {
            next += 1;
            next - 1
        };
        map[byte as usize] = char::from_u32(code).expect("codes below 512 are chars");
    }
    map
}

/// The vocabulary spelled in the byte alphabet: a token using any other character (a llama.cpp
/// export quirk) is re-spelled from its UTF-8 bytes. Later duplicates win, as in a Python dict.
fn byte_level_vocab(tokens: &[&str]) -> Map<String, Json> {
    let alphabet = bytes_to_unicode();
    let spelled: HashSet<char> = alphabet.iter().copied().collect();
    let mut vocab = Map::new();
    for (id, token) in tokens.iter().enumerate() {
        let key = if token.chars().all(|c| spelled.contains(&c)) {
            token.to_string()
        } else {
            token.bytes().map(|b| alphabet[b as usize]).collect()
        };
        vocab.insert(key, json!(id));
    }
    vocab
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

/// Control tokens spelled in the byte alphabet become special added tokens, user-defined tokens
/// present in the vocabulary plain added ones; bos/eos/unk/pad are special too (transformers adds
/// the named special tokens it has not seen). Sorted by id.
fn added_tokens(
    tokens: &[&str],
    token_types: &[i64],
    vocab: &Map<String, Json>,
    specials: &HashMap<&'static str, (String, u64)>,
) -> Vec<AddedToken> {
    let spelled: HashSet<char> = bytes_to_unicode().iter().copied().collect();
    let vocab_id = |token: &str| vocab.get(token).and_then(Json::as_u64).map(|id| id as usize);
    let mut added: HashMap<String, AddedToken> = HashMap::new();
    for (token, &kind) in tokens.iter().zip(token_types) {
        let special = match kind {
            CONTROL if token.chars().all(|c| spelled.contains(&c)) => true,
            USER_DEFINED if vocab.contains_key(*token) => false,
            _ => continue,
        };
        if let Some(id) = vocab_id(token) {
            added.entry(token.to_string()).or_insert(AddedToken { id, content: token.to_string(), special });
        }
    }
    for (token, id) in specials.values() {
        let id = vocab_id(token).unwrap_or(*id as usize);
        added.entry(token.clone()).or_insert(AddedToken { id, content: token.clone(), special: true });
    }
    let mut added: Vec<AddedToken> = added.into_values().collect();
    added.sort_by_key(|token| token.id);
    added
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

fn byte_level(add_prefix_space: bool) -> Json {
    json!({ "type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": true, "use_regex": true })
}

/// GPT-2's byte-level split, or the split regex transformers knows for `tokenizer.ggml.pre`.
fn pre_tokenizer(pre: Option<&str>) -> Json {
    let Some(split) = pre.and_then(split_regex) else { return byte_level(false) };
    json!({
        "type": "Sequence",
        "pretokenizers": [
            { "type": "Split", "pattern": { "Regex": split }, "behavior": "Isolated", "invert": false },
            { "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false },
        ],
    })
}

/// transformers' `GGUF_PRE_TOKENIZER_SPLITS`.
pub(super) fn split_regex(pre: &str) -> Option<&'static str> {
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3,
        "tekken" => TEKKEN,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2,
        "qwen35" => QWEN35,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O,
        _ => return None,
    })
}

/// The pre-tokenizers for which llama.cpp sets `ignore_merges` (llama-vocab.cpp): a word that is
/// itself a token is taken whole, as the models' own tokenizer.json say (Llama 3's and Tekken's
/// `"ignore_merges": true`). Without it " Việt" is 3 Llama 3 tokens instead of llama.cpp's one.
fn ignores_merges(pre: Option<&str>) -> bool {
    matches!(
        pre,
        Some(
            "llama3"
                | "llama-v3"
                | "llama-bpe"
                | "falcon3"
                | "falcon-h1"
                | "pixtral"
                | "midm-2.0"
                | "lfm2"
                | "tekken"
        )
    )
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
    fn byte_alphabet_matches_gpt2() {
        let map = bytes_to_unicode();
        assert_eq!(map[b'!' as usize], '!');
        assert_eq!(map[b' ' as usize], 'Ġ'); // U+0120: the 33rd unprintable byte
        assert_eq!(map[b'\n' as usize], 'Ċ');
        assert_eq!(map[0], 'Ā');
        assert_eq!(map[173], 'Ń'); // soft hyphen: the 68th unprintable byte (values from Python)
        assert_eq!(map.iter().collect::<HashSet<_>>().len(), 256);
    }

    #[test]
    fn tokens_outside_the_byte_alphabet_are_respelled() {
        let vocab = byte_level_vocab(&["Ġhello", " x", "é"]);
        assert_eq!(vocab["Ġhello"], json!(0));
        assert_eq!(vocab["Ġx"], json!(1));
        assert_eq!(vocab["é"], json!(2)); // 'é' (U+00E9) is itself a byte-alphabet char
    }

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
