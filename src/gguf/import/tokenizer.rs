//! GGUF vocabulary → tokenizer.json + tokenizer_config.json, built the way transformers'
//! `integrations/gguf/gguf_tokenizer_mapping.py` builds its fast tokenizer from the same file: a
//! byte-level BPE (`gpt2`) here, a SentencePiece one (`llama`) in `spm.rs`.

use super::spm;
use super::tokenizer_files::{
    post_processor, special_tokens, tokenizer_config, AddedToken, TokenizerFiles, CONTROL, USER_DEFINED,
};
use crate::gguf::format::metadata::Metadata;
use crate::gguf::format::vocab::split_regex;
use anyhow::{bail, Result};
use serde_json::{json, Map, Value as Json};
use std::collections::{HashMap, HashSet};

pub(super) fn convert(meta: &Metadata, context_length: u64) -> Result<TokenizerFiles> {
    let model_key = "tokenizer.ggml.model";
    match meta.string(model_key)? {
        "gpt2" => convert_bpe(meta, context_length),
        "llama" => spm::convert(meta, context_length),
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
}
