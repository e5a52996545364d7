//! When a reply ends and what of its text is returned: stop strings over the detokenized text as
//! vLLM and OpenAI treat them (the text ends before the first stop string, matched across token
//! boundaries), and why generation finished, named as OpenAI's `finish_reason`.

use anyhow::ensure;

/// Why a sequence ended, as OpenAI's `finish_reason` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token id or stop string.
    Stop,
    /// `max_new_tokens` or the model's last position.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Streams a reply's text, releasing a piece only once it cannot be the start of a stop string:
/// a partial match at the end is held back until the text diverges from it (released then) or
/// completes it (the text stops before it).
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// The text so far, cut before the stop string once one matched.
    text: String,
    /// How many bytes of `text` were released.
    released: usize,
    stopped: bool,
}

impl StopMatcher {
    /// An error for an empty stop string (`check_stop_strings`).
    pub fn new(stops: &[String]) -> anyhow::Result<Self> {
        check_stop_strings(stops)?;
        Ok(Self { stops: stops.to_vec(), text: String::new(), released: 0, stopped: false })
    }

    /// Whether a stop string was found; nothing more is taken after it.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Appends the next piece of detokenized text; returns the text it releases (possibly empty).
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        // a stop string ending in the new piece starts at most its length back
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.text.len().saturating_sub(longest.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.text.push_str(piece);
        let first = self.stops.iter().filter_map(|s| self.text[from..].find(s.as_str())).min();
        if let Some(at) = first {
            self.text.truncate(from + at);
            self.stopped = true;
            return self.release(self.text.len());
        }
        let held = self.partial_match_len();
        self.release(self.text.len() - held)
    }

    /// The held-back rest, released when the reply ends without completing a stop string.
    pub fn finish(&mut self) -> String {
        self.release(self.text.len())
    }

    /// The whole text so far (held-back bytes included), cut before a matched stop string.
    pub fn text(&self) -> &str {
        &self.text
    }

    fn release(&mut self, upto: usize) -> String {
        let upto = upto.max(self.released);
        let out = self.text[self.released..upto].to_string();
        self.released = upto;
        out
    }

    /// The longest end of the text that is a proper start of some stop string.
    fn partial_match_len(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let min_start = self.text.len().saturating_sub(longest.saturating_sub(1)).max(self.released);
        (min_start..self.text.len())
            .filter(|&i| self.text.is_char_boundary(i))
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.text[i..])))
            .map_or(0, |i| self.text.len() - i)
    }
}

/// An error for an empty stop string (it would end every reply before its first token).
pub fn check_stop_strings(stops: &[String]) -> anyhow::Result<()> {
    ensure!(stops.iter().all(|s| !s.is_empty()), "stop strings must not be empty");
    Ok(())
}

/// The text cut before the first stop string it contains (vLLM, OpenAI: the stop string is not
/// returned), and whether one was found.
pub fn cut_at_stop(text: &str, stops: &[String]) -> (String, bool) {
    match stops.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s.as_str())).min() {
        Some(at) => (text[..at].to_string(), true),
        None => (text.to_string(), false),
    }
}
