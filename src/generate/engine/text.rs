//! A reply's text from its tokens: special tokens left out but those that carry a tool call (the
//! tool-call parser reads them), decoded as the tokens come. Each new token's piece is decoded over
//! a window of the last tokens (vLLM's incremental detokenization) so that the pieces add up to the
//! whole reply's text, and a piece ending in an incomplete character waits for the next token.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use tokenizers::Tokenizer;

use crate::data::TOOL_CALL_TOKENS;

/// Each token's text as it adds to a reply (`None`: a token that adds none, or only part of a
/// character), by id; and the ids of the tokens with a text grouped by its first character, so
/// that a grammar position that refuses a character refuses its tokens without visiting them.
pub struct TokenTexts {
    texts: Vec<Option<String>>,
    by_first: Vec<(char, Vec<u32>)>,
    /// Each token's count of characters where all are plain inside a JSON string (no quote,
    /// backslash or control character), else 0.
    plain: Vec<u32>,
}

impl TokenTexts {
    pub fn new(texts: Vec<Option<String>>) -> Self {
        let mut groups: std::collections::BTreeMap<char, Vec<u32>> = std::collections::BTreeMap::new();
        for (id, text) in texts.iter().enumerate() {
            if let Some(c) = text.as_deref().and_then(|t| t.chars().next()) {
                groups.entry(c).or_default().push(id as u32);
            }
        }
        let plain_char = |c: char| c != '"' && c != '\\' && c as u32 >= 0x20;
        let plain = texts
            .iter()
            .map(|t| match t.as_deref() {
                Some(t) if t.chars().all(plain_char) => t.chars().count() as u32,
                _ => 0,
            })
            .collect();
        Self { texts, by_first: groups.into_iter().collect(), plain }
    }

    /// Token `id`'s count of characters where all are plain inside a JSON string.
    pub fn plain_chars(&self, id: usize) -> Option<usize> {
        self.plain.get(id).filter(|&&n| n > 0).map(|&n| n as usize)
    }

    /// Token `id`'s text, where it has one.
    pub fn get(&self, id: usize) -> Option<&str> {
        self.texts.get(id).and_then(Option::as_deref)
    }

    /// The tokens with a text, by its first character.
    pub fn by_first_char(&self) -> &[(char, Vec<u32>)] {
        &self.by_first
    }
}

/// The tokenizer and the ids a reply's text leaves out.
pub struct ReplyText<'t> {
    tokenizer: &'t Tokenizer,
    dropped: HashSet<u32>,
    /// Built on first use (constrained decoding).
    token_texts: OnceLock<Arc<TokenTexts>>,
}

impl<'t> ReplyText<'t> {
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        let dropped = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special && !TOOL_CALL_TOKENS.contains(&token.content.as_str()))
            .map(|(id, _)| id)
            .collect();
        Self { tokenizer, dropped, token_texts: OnceLock::new() }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.tokenizer
    }

    /// The text of a whole reply.
    pub fn decode(&self, ids: &[u32]) -> anyhow::Result<String> {
        let kept: Vec<u32> = ids.iter().copied().filter(|id| !self.dropped.contains(id)).collect();
        self.decode_kept(&kept)
    }

    /// Every token's text after another token (so that a SentencePiece token's leading space
    /// is kept, as in the middle of a reply), computed once.
    pub fn token_texts(&self) -> Arc<TokenTexts> {
        self.token_texts
            .get_or_init(|| {
                let anchor = self.tokenizer.token_to_id("a").filter(|id| !self.dropped.contains(id));
                let before = anchor.and_then(|a| self.decode_kept(&[a]).ok()).unwrap_or_default();
                let text_of = |id: u32| {
                    if self.dropped.contains(&id) {
                        return None;
                    }
                    let ids: Vec<u32> = anchor.into_iter().chain([id]).collect();
                    let text = self.decode_kept(&ids).ok()?;
                    let text = text.strip_prefix(before.as_str())?;
                    (!text.is_empty() && !text.contains('\u{FFFD}')).then(|| text.to_string())
                };
                Arc::new(TokenTexts::new(
                    (0..self.tokenizer.get_vocab_size(true) as u32).map(text_of).collect(),
                ))
            })
            .clone()
    }

    fn decode_kept(&self, ids: &[u32]) -> anyhow::Result<String> {
        self.tokenizer.decode(ids, false).map_err(anyhow::Error::msg)
    }
}

/// Where one reply's decoding stands: its kept ids, the window's start (`prefix`) and the end of
/// what was released (`read`).
#[derive(Debug, Default, Clone)]
pub struct Detokenizer {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl Detokenizer {
    /// The text the next token adds (empty while it ends in an incomplete character, or for a
    /// token the text leaves out).
    pub fn push(&mut self, text: &ReplyText, id: u32) -> anyhow::Result<String> {
        if text.dropped.contains(&id) {
            return Ok(String::new());
        }
        self.ids.push(id);
        let before = text.decode_kept(&self.ids[self.prefix..self.read])?;
        let now = text.decode_kept(&self.ids[self.prefix..])?;
        if now.len() <= before.len() || now.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(new_part(&before, &now))
    }

    /// What is left when the reply ends (an incomplete character's replacement included).
    pub fn finish(&mut self, text: &ReplyText) -> anyhow::Result<String> {
        let before = text.decode_kept(&self.ids[self.prefix..self.read])?;
        let now = text.decode_kept(&self.ids[self.prefix..])?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(if now.len() > before.len() { new_part(&before, &now) } else { String::new() })
    }
}

/// What `now` adds to `before`: its bytes past the longest common start, on a character boundary.
fn new_part(before: &str, now: &str) -> String {
    if let Some(rest) = now.strip_prefix(before) {
        return rest.to_string();
    }
    let common = before.char_indices().zip(now.chars()).take_while(|((_, a), b)| a == b).count();
    let at = now.char_indices().nth(common).map_or(now.len(), |(i, _)| i);
    now[at..].to_string()
}
