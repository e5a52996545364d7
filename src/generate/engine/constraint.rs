//! A sequence's grammar at the token level: before each sampling, the logits of the tokens whose
//! text the grammar does not allow next are set to -inf (the end-of-turn ids too, until the
//! grammar may end), so the reply follows it by construction, greedy or sampled.

use std::collections::HashMap;
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

    /// Sets the logits of the tokens that cannot come next to -inf; an error where none can. A
    /// token whose first character the grammar refuses is refused without walking the rest (a
    /// JSON position allows few first characters of a vocabulary's hundred thousand tokens).
    pub fn mask(&self, logits: &mut [f32]) -> anyhow::Result<()> {
        let can_end = self.matcher.can_end();
        let mut first: HashMap<char, bool> = HashMap::new();
        let mut allows = |t: &str| match t.chars().next() {
            Some(c) => {
                let mut buf = [0u8; 4];
                *first.entry(c).or_insert_with(|| self.matcher.allows(c.encode_utf8(&mut buf)))
                    && (t.len() == c.len_utf8() || self.matcher.allows(t))
            }
            None => self.matcher.allows(t),
        };
        let mut any = false;
        for (id, logit) in logits.iter_mut().enumerate() {
            let allowed = if self.stop_ids.contains(&(id as u32)) {
                can_end
            } else {
                self.texts.get(id).and_then(Option::as_deref).is_some_and(&mut allows)
            };
            if allowed {
                any |= *logit > f32::NEG_INFINITY;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        anyhow::ensure!(any, "no token of the vocabulary can continue the reply's grammar");
        Ok(())
    }

    /// Takes a token the mask allowed; true when the grammar is complete and nothing may follow.
    pub fn accept(&mut self, token: u32) -> anyhow::Result<bool> {
        let text = self.texts.get(token as usize).and_then(Option::as_deref);
        let fed = text.is_some_and(|t| self.matcher.feed(t));
        anyhow::ensure!(fed, "token {token} does not follow the reply's grammar");
        Ok(self.matcher.must_end())
    }
}
