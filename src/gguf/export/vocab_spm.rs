//! A SentencePiece vocabulary (Llama 2, Mistral 7B, Gemma) → `tokenizer.ggml.tokens`, `scores`
//! and `token_type` of a `tokenizer.ggml.model = "llama"` file.
//!
//! From `tokenizer.model` (the SentencePiece `ModelProto`), exactly as convert_hf_to_gguf.py's
//! `_create_vocab_sentencepiece` reads it: every piece with its score and type (unknown,
//! control, unused and byte kept; user-defined pieces become normal, as sentencepiece's
//! `Is*` tests leave them), ids up to config.json's vocab_size padded with `[PAD{id}]` (score
//! −10000, unused), then `added_tokens.json` and tokenizer_config.json's `added_tokens_decoder`
//! (control when special or special-looking, else user-defined with `▁` as a space; score −1000).
//!
//! Without `tokenizer.model` (the converter then fails for Gemma 2, or writes every score as
//! −1000 for Llama, which llama.cpp's SentencePiece merging cannot tokenize with), from
//! tokenizer.json's byte-fallback BPE: transformers' converter ordered the merges by the
//! SentencePiece score of the merged piece, so a piece's score is minus the rank of the first
//! merge that makes it (0 for pieces no merge makes: single characters and bytes, which
//! llama.cpp never merges into); `<0xNN>` byte, the model's `unk_token` unknown — the rule that
//! wrote tests/fixtures/vocab-gguf's Gemma files, which llama.cpp's `test-tokenizer-0` passes.

use crate::gguf::format::vocab::{looks_special, BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED};
use anyhow::{bail, Context, Result};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;

/// Tokens, scores and types by id.
pub(super) struct SpmVocab {
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    pub types: Vec<i32>,
}

impl SpmVocab {
    fn padded(vocab_size: usize, score: f32) -> Self {
        Self {
            tokens: (0..vocab_size).map(|id| format!("[PAD{id}]")).collect(),
            scores: vec![score; vocab_size],
            types: vec![UNUSED; vocab_size],
        }
    }

    fn set(&mut self, id: usize, token: String, score: f32, kind: i32) {
        self.tokens[id] = token;
        self.scores[id] = score;
        self.types[id] = kind;
    }

    /// `added_tokens.json` (user-defined) and tokenizer_config.json's `added_tokens_decoder`,
    /// over the pieces; ids past vocab_size are skipped, as the converter skips them.
    fn add_tokens(&mut self, dir: &Path, tokenizer_config: &Json) -> Result<()> {
        let added = dir.join("added_tokens.json");
        if added.is_file() {
            let text =
                std::fs::read_to_string(&added).with_context(|| format!("reading {}", added.display()))?;
            let added_json: Json =
                serde_json::from_str(&text).with_context(|| format!("{}: not JSON", added.display()))?;
            for (token, id) in added_json.as_object().into_iter().flatten() {
                let id =
                    id.as_u64().with_context(|| format!("{}: {token:?} has id {id}", added.display()))?;
                if (id as usize) < self.tokens.len() {
                    self.set(id as usize, token.clone(), -1000.0, USER_DEFINED);
                }
            }
        }
        for (id, data) in tokenizer_config["added_tokens_decoder"].as_object().into_iter().flatten() {
            let id: usize =
                id.parse().with_context(|| format!("tokenizer_config.json: added token id {id:?}"))?;
            let token = data["content"].as_str().unwrap_or_default();
            if id >= self.tokens.len() {
                continue;
            }
            if data["special"] == true || looks_special(token) {
                self.set(id, token.to_string(), -1000.0, CONTROL);
            } else {
                self.set(id, token.replace('▁', " "), -1000.0, USER_DEFINED);
            }
        }
        Ok(())
    }
}

/// The vocabulary of `tokenizer.model` in `dir`, padded to `vocab_size`.
pub(super) fn from_model_file(dir: &Path, vocab_size: usize, tokenizer_config: &Json) -> Result<SpmVocab> {
    let file = dir.join("tokenizer.model");
    let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    let pieces = parse_model_proto(&bytes)
        .with_context(|| format!("{}: not a SentencePiece model", file.display()))?;
    let mut vocab = SpmVocab::padded(vocab_size, -10000.0);
    for (id, (piece, score, kind)) in pieces.into_iter().enumerate().take(vocab_size) {
        // sentencepiece's IsUnknown / IsControl / IsUnused / IsByte; the rest normal
        let kind = match kind {
            2 => UNKNOWN,
            3 => CONTROL,
            5 => UNUSED,
            6 => BYTE,
            _ => NORMAL,
        };
        vocab.set(id, piece, score, kind);
    }
    vocab.add_tokens(dir, tokenizer_config)?;
    Ok(vocab)
}

/// The vocabulary of a byte-fallback BPE tokenizer.json, scores from the merge order.
pub(super) fn from_tokenizer_json(
    dir: &Path,
    tokenizer: &Json,
    vocab_size: usize,
    tokenizer_config: &Json,
) -> Result<SpmVocab> {
    let file = dir.join("tokenizer.json");
    let model = &tokenizer["model"];
    let merges =
        model["merges"].as_array().with_context(|| format!("{}: model.merges is missing", file.display()))?;
    let mut rank: HashMap<String, usize> = HashMap::new();
    for (i, merge) in merges.iter().enumerate() {
        let joined = match merge {
            Json::String(m) => m.replacen(' ', "", 1),
            Json::Array(pair) => pair.iter().filter_map(Json::as_str).collect(),
            other => bail!("{}: merge {other} is neither \"a b\" nor [a, b]", file.display()),
        };
        rank.entry(joined).or_insert(i);
    }
    let unk = model["unk_token"].as_str();
    let mut vocab = SpmVocab::padded(vocab_size, -1000.0);
    let pieces = model["vocab"].as_object().with_context(|| format!("{}: no model.vocab", file.display()))?;
    for (piece, id) in pieces {
        let Some(id) = id.as_u64().map(|id| id as usize).filter(|&id| id < vocab_size) else {
            bail!(
                "{}: piece {piece:?} has id {id}, outside config.json's vocab_size {vocab_size}",
                file.display()
            );
        };
        let is_byte = piece.len() == 6 && piece.starts_with("<0x") && piece.ends_with('>');
        let (kind, score) = if Some(piece.as_str()) == unk {
            (UNKNOWN, 0.0)
        } else if is_byte {
            (BYTE, 0.0)
        } else {
            (NORMAL, rank.get(piece).map_or(0.0, |&r| -(r as f32)))
        };
        vocab.set(id, piece.clone(), score, kind);
    }
    vocab.add_tokens(dir, tokenizer_config)?;
    Ok(vocab)
}

/// The pieces of a SentencePiece `ModelProto` (field 1, repeated `SentencePiece` { piece = 1,
/// score = 2, type = 3 (NORMAL = 1 when absent) }); the other fields are skipped.
fn parse_model_proto(bytes: &[u8]) -> Result<Vec<(String, f32, u64)>> {
    let mut pieces = Vec::new();
    let mut reader = Proto { bytes, at: 0 };
    while let Some((field, value)) = reader.next_field()? {
        if let (1, Field::Bytes(message)) = (field, value) {
            let (mut piece, mut score, mut kind) = (String::new(), 0f32, 1u64);
            let mut inner = Proto { bytes: message, at: 0 };
            while let Some((field, value)) = inner.next_field()? {
                match (field, value) {
                    (1, Field::Bytes(text)) => {
                        piece = String::from_utf8(text.to_vec()).context("a piece is not UTF-8")?
                    }
                    (2, Field::Fixed32(bits)) => score = f32::from_bits(bits),
                    (3, Field::Varint(v)) => kind = v,
                    _ => {}
                }
            }
            pieces.push((piece, score, kind));
        }
    }
    if pieces.is_empty() {
        bail!("no pieces");
    }
    Ok(pieces)
}

enum Field<'a> {
    Varint(u64),
    Fixed32(u32),
    Fixed64,
    Bytes(&'a [u8]),
}

struct Proto<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Proto<'a> {
    fn varint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.bytes.get(self.at).context("truncated varint")?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        bail!("varint longer than 64 bits")
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len()).context("truncated field")?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn next_field(&mut self) -> Result<Option<(u64, Field<'a>)>> {
        if self.at >= self.bytes.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Fixed64
            }
            2 => {
                let n = usize::try_from(self.varint()?).context("field length")?;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().context("fixed32")?)),
            wire => bail!("wire type {wire} at byte {}", self.at),
        };
        Ok(Some((key >> 3, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_of_a_hand_written_model_proto() {
        // piece "▁a" score -1.5 type absent (normal); piece "<unk>" score 0 type 2; a skipped field 2
        let mut bytes = vec![0x12, 0x02, 0x08, 0x01];
        let first: Vec<u8> =
            [vec![0x0a, 4], "▁a".as_bytes().to_vec(), vec![0x15], (-1.5f32).to_le_bytes().to_vec()].concat();
        let second: Vec<u8> = [vec![0x0a, 5], b"<unk>".to_vec(), vec![0x18, 2]].concat();
        for piece in [first, second] {
            bytes.push(0x0a);
            bytes.push(piece.len() as u8);
            bytes.extend(piece);
        }
        let pieces = parse_model_proto(&bytes).unwrap();
        assert_eq!(pieces, [("▁a".to_string(), -1.5, 1), ("<unk>".to_string(), 0.0, 2)]);
        let err = parse_model_proto(&bytes[..bytes.len() - 3]).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
    }
}
