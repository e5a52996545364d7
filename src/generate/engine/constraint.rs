//! A sequence's grammar at the token level: before each sampling, the logits of the tokens whose
//! text the grammar does not allow next are set to -inf (the end-of-turn ids too, until the
//! grammar may end), so the reply follows it by construction, greedy or sampled.

use std::sync::Arc;

use crate::generate::constrained::matcher::Matcher;

use super::text::TokenTexts;

pub struct TokenConstraint {
    matcher: Matcher,
    texts: Arc<TokenTexts>,
    stop_ids: Vec<u32>,
}

impl TokenConstraint {
    pub fn new(matcher: Matcher, texts: Arc<TokenTexts>, stop_ids: &[u32]) -> Self {
        Self { matcher, texts, stop_ids: stop_ids.to_vec() }
    }

    /// `logits` with those of the tokens that cannot come next set to -inf; an error where none
    /// can. Every logit starts refused and the allowed tokens get theirs: those of each
    /// first character the grammar allows (`TokenTexts::by_first_char`: a JSON position allows
    /// few of a vocabulary's characters, so most tokens are never visited), each walked whole —
    /// except inside a string, where a token of plain characters is allowed by its length alone
    /// (`Matcher::string_room`) — and the end-of-turn ids where the grammar may end.
    pub fn masked(&self, logits: &[f32]) -> anyhow::Result<Vec<f32>> {
        let mut masked = vec![f32::NEG_INFINITY; logits.len()];
        let mut any = false;
        let mut admit = |id: usize| {
            if let Some(&logit) = logits.get(id) {
                masked[id] = logit;
                any |= logit > f32::NEG_INFINITY;
            }
        };
        let mut buf = [0u8; 4];
        let room = self.matcher.string_room();
        for (c, ids) in self.texts.by_first_char() {
            if !self.matcher.allows(c.encode_utf8(&mut buf)) {
                continue;
            }
            for &id in ids {
                let text = self.texts.get(id as usize).unwrap_or_default();
                let allowed = match (room, self.texts.plain_chars(id as usize)) {
                    (Some(room), Some(n)) => room.is_none_or(|r| n <= r),
                    _ => text.len() == c.len_utf8() || self.matcher.allows(text),
                };
                if allowed && !self.stop_ids.contains(&id) {
                    admit(id as usize);
                }
            }
        }
        if self.matcher.can_end() {
            self.stop_ids.iter().for_each(|&id| admit(id as usize));
        }
        anyhow::ensure!(any, "no token of the vocabulary can continue the reply's grammar");
        Ok(masked)
    }

    /// Takes a token the mask allowed; true when the grammar is complete and nothing may follow.
    pub fn accept(&mut self, token: u32) -> anyhow::Result<bool> {
        let text = self.texts.get(token as usize);
        let fed = text.is_some_and(|t| self.matcher.feed(t));
        anyhow::ensure!(fed, "token {token} does not follow the reply's grammar");
        Ok(self.matcher.must_end())
    }
}
