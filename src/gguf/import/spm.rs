//! SentencePiece GGUF vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral v0.1/v0.3,
//! Gemma 2/3) → a `tokenizers` BPE model that gives llama.cpp's ids.
//!
//! llama.cpp's SPM tokenizer (`llm_tokenizer_spm_session`) splits the text into UTF-8 characters
//! and repeatedly merges the adjacent pair whose concatenation is the vocabulary piece of the
//! highest score, falling back to `<0xNN>` byte tokens for what is left outside the vocabulary.
//! That is a BPE whose merges are every split of every piece into two pieces of the vocabulary,
//! ranked by the merged piece's score — what transformers' SentencePiece converters and its GGUF
//! loader build. Spaces become `▁`, with one prepended to each run of text (at the start and after
//! a special token) when `tokenizer.ggml.add_space_prefix` is true, llama.cpp's default for SPM;
//! Gemma's files set it false. Control tokens are special added tokens, user-defined ones (Gemma's
//! `<start_of_image>`-style markers, newline and space runs) plain added tokens, matched in the
//! raw text before anything else as llama.cpp partitions them out.

use super::tokenizer_files::{
    post_processor, special_tokens, tokenizer_config, AddedToken, TokenizerFiles, CONTROL, USER_DEFINED,
};
use crate::gguf::format::metadata::Metadata;
use crate::gguf::format::vocab;
use anyhow::{bail, Result};
use serde_json::{json, Map, Value as Json};
use std::collections::HashMap;

const UNKNOWN: i64 = vocab::UNKNOWN as i64;

pub(super) fn convert(meta: &Metadata, context_length: u64) -> Result<TokenizerFiles> {
    let file = meta.file.display();
    let tokens_key = "tokenizer.ggml.tokens";
    let Some(tokens) = meta.strings(tokens_key)? else { bail!("{file}: GGUF key `{tokens_key}` is missing") };
    let scores_key = "tokenizer.ggml.scores";
    let Some(scores) = meta.floats(scores_key)? else {
        bail!("{file}: GGUF key `{scores_key}` is missing (a SentencePiece tokenizer needs it)")
    };
    let types_key = "tokenizer.ggml.token_type";
    let types = meta.ints(types_key)?.unwrap_or_else(|| vec![1; tokens.len()]);
    for (key, len) in [(scores_key, scores.len()), (types_key, types.len())] {
        if len != tokens.len() {
            bail!("{file}: GGUF key `{key}` has {len} entries for {} tokens", tokens.len());
        }
    }
    let specials = special_tokens(meta, &tokens)?;
    // llama.cpp's defaults for an SPM vocabulary when the keys are absent
    let add_space_prefix = meta.opt_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    let add_bos = meta.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(true);
    let add_eos = meta.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);

    let mut vocab = Map::new();
    for (id, token) in tokens.iter().enumerate() {
        vocab.insert(token.to_string(), json!(id));
    }
    let added = added_tokens(&tokens, &types, &specials);
    let unk = specials.get("unk_token").map(|(token, _)| token.as_str());
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added.iter().map(AddedToken::to_json).collect::<Vec<_>>(),
        "normalizer": normalizer(add_space_prefix),
        "pre_tokenizer": null,
        "post_processor": post_processor(&specials, add_bos, add_eos),
        "decoder": decoder(add_space_prefix),
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": unk,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": true,
            "byte_fallback": true,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges(&tokens, &scores),
        },
    });
    let config = tokenizer_config(meta, &specials, &added, (add_bos, add_eos), context_length)?;
    Ok(TokenizerFiles { tokenizer, tokenizer_config: config, vocab_size: tokens.len() })
}

/// Every split of every piece into two pieces of the vocabulary, the merges of the highest
/// scoring pieces first (ties: the lower id first, then the split of the higher scoring halves):
/// the order in which llama.cpp's SPM tokenizer prefers them.
fn merges(tokens: &[&str], scores: &[f32]) -> Vec<Json> {
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        ids.entry(token).or_insert(id);
    }
    let mut merges: Vec<(usize, usize, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if ids[piece] != id {
            continue; // a duplicate spelling: llama.cpp looks up the first
        }
        for (split, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(split);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                merges.push((id, l, r));
            }
        }
    }
    let by_score = |a: usize, b: usize| scores[b].total_cmp(&scores[a]);
    merges.sort_by(|&(p, l, r), &(q, m, s)| {
        by_score(p, q).then(p.cmp(&q)).then_with(|| by_score(l, m)).then_with(|| by_score(r, s))
    });
    merges.into_iter().map(|(_, l, r)| json!([tokens[l], tokens[r]])).collect()
}

/// Control and unknown tokens become special added tokens, user-defined ones plain added tokens
/// (llama.cpp splits both out of the text first); bos/eos/unk/pad are special. Sorted by id.
fn added_tokens(
    tokens: &[&str],
    types: &[i64],
    specials: &HashMap<&'static str, (String, u64)>,
) -> Vec<AddedToken> {
    let mut added: Vec<AddedToken> = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (id, (token, &kind)) in tokens.iter().zip(types).enumerate() {
        let special = match kind {
            CONTROL | UNKNOWN => true,
            USER_DEFINED => false,
            _ => continue,
        };
        if token.is_empty() || seen.insert(token, id).is_some() {
            continue;
        }
        added.push(AddedToken { id, content: token.to_string(), special });
    }
    for (token, id) in specials.values() {
        if !seen.contains_key(token.as_str()) {
            added.push(AddedToken { id: *id as usize, content: token.clone(), special: true });
        }
    }
    added.sort_by_key(|token| token.id);
    added
}

/// Spaces as `▁`, and one `▁` before each run of text when llama.cpp adds a space prefix.
fn normalizer(add_space_prefix: bool) -> Json {
    let replace = json!({ "type": "Replace", "pattern": { "String": " " }, "content": "▁" });
    match add_space_prefix {
        true => {
            json!({ "type": "Sequence", "normalizers": [{ "type": "Prepend", "prepend": "▁" }, replace] })
        }
        false => replace,
    }
}

fn decoder(add_space_prefix: bool) -> Json {
    let mut steps = vec![
        json!({ "type": "Replace", "pattern": { "String": "▁" }, "content": " " }),
        json!({ "type": "ByteFallback" }),
        json!({ "type": "Fuse" }),
    ];
    if add_space_prefix {
        steps.push(json!({ "type": "Strip", "content": " ", "start": 1, "stop": 0 }));
    }
    json!({ "type": "Sequence", "decoders": steps })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_the_merged_pieces_score() {
        let tokens = ["a", "b", "c", "ab", "bc", "abc"];
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let merges = merges(&tokens, &scores);
        // "bc" scores highest, then "ab"; "abc" splits as "a"+"bc" and "ab"+"c", the split with
        // the higher scoring halves ("a" 0.0 > "ab" -2.0) first
        assert_eq!(merges, [json!(["b", "c"]), json!(["a", "b"]), json!(["a", "bc"]), json!(["ab", "c"])]);
    }

    #[test]
    fn control_and_user_defined_tokens_are_added() {
        let tokens = ["<unk>", "<s>", "▁a", "<start_of_turn>", "  "];
        let types = [UNKNOWN, CONTROL, 1, CONTROL, USER_DEFINED];
        let mut specials = HashMap::new();
        specials.insert("bos_token", ("<s>".to_string(), 1));
        let added = added_tokens(&tokens, &types, &specials);
        let got: Vec<(usize, &str, bool)> =
            added.iter().map(|t| (t.id, t.content.as_str(), t.special)).collect();
        assert_eq!(
            got,
            [(0, "<unk>", true), (1, "<s>", true), (3, "<start_of_turn>", true), (4, "  ", false)]
        );
    }

    #[test]
    fn the_space_prefix_is_a_prepend_normalizer() {
        assert_eq!(normalizer(true)["normalizers"][0]["prepend"], "▁");
        assert_eq!(normalizer(false)["type"], "Replace");
        assert_eq!(decoder(true)["decoders"].as_array().unwrap().len(), 4);
        assert_eq!(decoder(false)["decoders"].as_array().unwrap().len(), 3);
    }
}
