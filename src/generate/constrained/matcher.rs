//! A grammar of text (fixed texts and JSON values of a schema's shapes, one or more calls of a
//! list) matched a character at a time: the matcher holds every way the text so far can go on
//! (a stack of what is open, for each), so it says of any piece of text whether it may come next,
//! whether the text may end here, and whether it must.

use std::sync::{Arc, OnceLock};

use super::schema::{Node, Property, MAX_DIGITS};

/// Whitespace characters in a row where JSON allows whitespace, at most.
const MAX_WHITESPACE: u8 = 4;
/// Digits of a number's exponent at most.
const MAX_EXPONENT_DIGITS: usize = 3;

/// One piece of a grammar's sequence.
#[derive(Debug, Clone)]
pub enum Item {
    Text(String),
    Value(Arc<Node>),
}

/// `open`, one item sequence of `calls` (or several with `sep` between them, where `many`), `close`.
#[derive(Debug)]
pub struct Grammar {
    starts: Vec<State>,
}

/// What comes after a call where several may follow one another.
#[derive(Debug)]
struct Calls {
    calls: Vec<Vec<Frame>>,
    sep: Arc<str>,
    close: Arc<str>,
}

#[derive(Debug, Clone)]
enum Frame {
    /// A JSON value of this shape, whitespace before it allowed.
    Value(Arc<Node>),
    /// The rest of a fixed text, from byte `at`.
    Text {
        text: Arc<str>,
        at: usize,
    },
    /// Inside a string: its characters so far (an escape counts one).
    Str {
        len: usize,
        min: usize,
        max: Option<usize>,
        escape: Escape,
    },
    Number {
        integer: bool,
        part: Part,
        digits: usize,
    },
    /// Inside an object of `node`'s shape: the properties written so far (by index; any order),
    /// the one being written.
    Object {
        node: Arc<Node>,
        used: Vec<bool>,
        current: usize,
        phase: Phase,
    },
    /// Inside an array of `node`'s shape, `count` items begun.
    Array {
        node: Arc<Node>,
        count: usize,
        phase: Phase,
    },
    /// Between calls: another (after the separator), or the close.
    Calls(Arc<Calls>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Escape {
    None,
    Backslash,
    /// Hex digits of `\u` still to come.
    Unicode(u8),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Part {
    Sign,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Just opened: an item (a key) or the close.
    Open,
    /// After a comma: an item (a key).
    Next,
    /// After a key: the colon.
    Colon,
    /// After an item: a comma or the close.
    After,
}

/// One way the text can go on: what is open (innermost last) and the whitespace just written.
#[derive(Debug, Clone)]
struct State {
    frames: Vec<Frame>,
    whitespace: u8,
}

/// Where a text stands in a grammar.
#[derive(Debug, Clone)]
pub struct Matcher {
    states: Vec<State>,
}

fn frames_of(items: &[Item]) -> Vec<Frame> {
    items
        .iter()
        .rev()
        .filter_map(|item| match item {
            Item::Text(t) if t.is_empty() => None,
            Item::Text(t) => Some(Frame::Text { text: t.as_str().into(), at: 0 }),
            Item::Value(node) => Some(Frame::Value(node.clone())),
        })
        .collect()
}

impl Grammar {
    /// `open`, then one of `calls` (each a sequence of items), or one or more of them with `sep`
    /// between where `many`, then `close`.
    pub fn calls(open: &str, calls: &[Vec<Item>], sep: &str, close: &str, many: bool) -> Self {
        let bodies: Vec<Vec<Frame>> = calls.iter().map(|c| frames_of(c)).collect();
        let open = frames_of(&[Item::Text(open.into())]);
        let bottom = match many {
            true => vec![Frame::Calls(Arc::new(Calls {
                calls: bodies.clone(),
                sep: sep.into(),
                close: close.into(),
            }))],
            false => frames_of(&[Item::Text(close.into())]),
        };
        let starts = bodies
            .iter()
            .map(|body| State { frames: [&bottom[..], body, &open].concat(), whitespace: 0 })
            .collect();
        Self { starts }
    }

    /// The matcher at the grammar's start.
    pub fn matcher(&self) -> Matcher {
        Matcher { states: self.starts.clone() }
    }
}

impl Matcher {
    /// Takes `text`; false (and the matcher unchanged) where it cannot come next.
    pub fn feed(&mut self, text: &str) -> bool {
        match advance(self.states.clone(), text) {
            Some(states) => {
                self.states = states;
                true
            }
            None => false,
        }
    }

    /// Whether `text` may come next.
    pub fn allows(&self, text: &str) -> bool {
        self.states.iter().any(|state| advance(vec![state.clone()], text).is_some())
    }

    /// Where every state is inside a JSON string and not within an escape: how many more plain
    /// characters (neither a quote, a backslash nor a control character) the most permissive
    /// state takes, `Some(None)` for any number; `None` where a state stands anywhere else. A text
    /// of n plain characters may then come next exactly when n fits, without walking it.
    pub fn string_room(&self) -> Option<Option<usize>> {
        let mut room = Some(0);
        for state in &self.states {
            let Some(Frame::Str { len, max, escape: Escape::None, .. }) = state.frames.last() else {
                return None;
            };
            room = match (room, max) {
                (Some(r), Some(max)) => Some(r.max(max.saturating_sub(*len))),
                _ => None,
            };
        }
        Some(room)
    }

    /// Whether the text may end here (the grammar is complete).
    pub fn can_end(&self) -> bool {
        self.states.iter().any(can_end)
    }

    /// Whether the text must end here (complete, and nothing may follow).
    pub fn must_end(&self) -> bool {
        self.states.iter().all(|s| s.frames.is_empty())
    }
}

fn can_end(state: &State) -> bool {
    for frame in state.frames.iter().rev() {
        match frame {
            Frame::Number { .. } if number_complete(frame) => continue,
            Frame::Calls(calls) => return calls.close.is_empty(),
            _ => return false,
        }
    }
    true
}

fn number_complete(frame: &Frame) -> bool {
    matches!(frame, Frame::Number { part: Part::Zero | Part::Int | Part::Frac | Part::ExpDigits, .. })
}

/// The shapes of any JSON value.
fn any_value() -> &'static [Arc<Node>] {
    static ANY: OnceLock<Vec<Arc<Node>>> = OnceLock::new();
    ANY.get_or_init(|| {
        let any = Arc::new(Node::Any);
        vec![
            Arc::new(Node::Object(None)),
            Arc::new(Node::Array { items: any, min: 0, max: None }),
            Arc::new(Node::String { min: 0, max: None }),
            Arc::new(Node::Number { integer: false }),
            Arc::new(Node::Literal(vec!["true".into(), "false".into(), "null".into()])),
        ]
    })
}

/// Whether more properties may come (`None`: any keys may).
fn more_keys(props: &Option<Vec<Property>>, used: &[bool]) -> bool {
    props.as_ref().is_none_or(|_| used.iter().any(|u| !u))
}

/// Whether the object may close (every required property written).
fn may_close(props: &Option<Vec<Property>>, used: &[bool]) -> bool {
    props.as_ref().is_none_or(|p| p.iter().zip(used).all(|(p, used)| *used || !p.required))
}

/// The states `states` reach through `text`, or `None` where no path takes all of it.
fn advance(mut states: Vec<State>, text: &str) -> Option<Vec<State>> {
    for c in text.chars() {
        let mut next = Vec::new();
        for state in states {
            step(state, c, &mut next);
        }
        if next.is_empty() {
            return None;
        }
        states = next;
    }
    Some(states)
}

/// The states `state` goes to on `c`, pushed onto `out`.
fn step(mut state: State, c: char, out: &mut Vec<State>) {
    let space = matches!(c, ' ' | '\t' | '\n' | '\r');
    let whitespace = |mut state: State, out: &mut Vec<State>| {
        if state.whitespace < MAX_WHITESPACE {
            state.whitespace += 1;
            out.push(state);
        }
    };
    if !space {
        state.whitespace = 0;
    }
    loop {
        let Some(top) = state.frames.last_mut() else { return };
        match top {
            Frame::Text { text, at } => {
                if text[*at..].starts_with(c) {
                    *at += c.len_utf8();
                    if *at == text.len() {
                        state.frames.pop();
                    }
                    out.push(state);
                }
                return;
            }
            Frame::Value(node) => {
                if space {
                    return whitespace(state, out);
                }
                let node = node.clone();
                state.frames.pop();
                return start_value(state, &node, c, out);
            }
            Frame::Str { len, min, max, escape } => {
                let ok = match *escape {
                    Escape::Backslash => {
                        *escape = match c {
                            'u' => Escape::Unicode(4),
                            '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' => Escape::None,
                            _ => return,
                        };
                        true
                    }
                    Escape::Unicode(n) => {
                        *escape = if n == 1 { Escape::None } else { Escape::Unicode(n - 1) };
                        c.is_ascii_hexdigit()
                    }
                    Escape::None if c == '"' => {
                        if *len < *min {
                            return;
                        }
                        state.frames.pop();
                        out.push(state);
                        return;
                    }
                    Escape::None if (c as u32) < 0x20 => false,
                    Escape::None => {
                        // a character (an escape's backslash starts one) past `max` is refused
                        let fits = max.is_none_or(|max| *len < max);
                        *len += 1;
                        if c == '\\' {
                            *escape = Escape::Backslash;
                        }
                        fits
                    }
                };
                if ok {
                    out.push(state);
                }
                return;
            }
            Frame::Number { integer, part, digits } => {
                let digit = c.is_ascii_digit();
                let (new, counted) = match (*part, c) {
                    (Part::Sign, '0') => (Some(Part::Zero), 1),
                    (Part::Sign, _) if digit => (Some(Part::Int), 1),
                    (Part::Int, _) if digit && *digits < MAX_DIGITS => (Some(Part::Int), *digits + 1),
                    (Part::Zero | Part::Int, '.') if !*integer => (Some(Part::Dot), 0),
                    (Part::Zero | Part::Int | Part::Frac, 'e' | 'E') if !*integer => (Some(Part::Exp), 0),
                    (Part::Dot, _) if digit => (Some(Part::Frac), 1),
                    (Part::Frac, _) if digit && *digits < MAX_DIGITS => (Some(Part::Frac), *digits + 1),
                    (Part::Exp, '+' | '-') => (Some(Part::ExpSign), 0),
                    (Part::Exp | Part::ExpSign, _) if digit => (Some(Part::ExpDigits), 1),
                    (Part::ExpDigits, _) if digit && *digits < MAX_EXPONENT_DIGITS => {
                        (Some(Part::ExpDigits), *digits + 1)
                    }
                    _ => (None, 0),
                };
                if let Some(new) = new {
                    (*part, *digits) = (new, counted);
                    out.push(state);
                    return;
                }
                if !number_complete(&*top) {
                    return;
                }
                // the number ended: `c` belongs to what holds it
                state.frames.pop();
            }
            Frame::Object { node, used, current, phase } => {
                let Node::Object(props) = &**node else { return };
                if space {
                    return whitespace(state, out);
                }
                match (*phase, c) {
                    (Phase::Open | Phase::Next, '"') => {
                        let Some(list) = props else {
                            *phase = Phase::Colon;
                            state.frames.push(Frame::Str { len: 0, min: 0, max: None, escape: Escape::None });
                            out.push(state);
                            return;
                        };
                        // any property not written yet
                        let (list, free) = (list.clone(), used.iter().map(|u| !u).collect::<Vec<_>>());
                        for (i, prop) in list.iter().enumerate().filter(|(i, _)| free[*i]) {
                            let mut branch = state.clone();
                            if let Some(Frame::Object { used, current, phase, .. }) = branch.frames.last_mut()
                            {
                                (used[i], *current, *phase) = (true, i, Phase::Colon);
                            }
                            branch.frames.push(Frame::Text { text: prop.key.as_str().into(), at: 1 });
                            out.push(branch);
                        }
                    }
                    (Phase::Open, '}') | (Phase::After, '}') if may_close(props, used) => {
                        state.frames.pop();
                        out.push(state);
                    }
                    (Phase::After, ',') if more_keys(props, used) => {
                        *phase = Phase::Next;
                        out.push(state);
                    }
                    (Phase::Colon, ':') => {
                        let value = match props {
                            Some(list) => list[*current].value.clone(),
                            None => Arc::new(Node::Any),
                        };
                        *phase = Phase::After;
                        state.frames.push(Frame::Value(value));
                        out.push(state);
                    }
                    _ => {}
                }
                return;
            }
            Frame::Array { node, count, phase } => {
                let Node::Array { items, min, max } = &**node else { return };
                if space {
                    return whitespace(state, out);
                }
                let room = max.is_none_or(|max| *count < max);
                match (*phase, c) {
                    (Phase::Open, ']') | (Phase::After, ']') if *count >= *min => {
                        state.frames.pop();
                        out.push(state);
                        return;
                    }
                    (Phase::After, ',') if room => {
                        *count += 1;
                        let items = items.clone();
                        state.frames.push(Frame::Value(items));
                        out.push(state);
                        return;
                    }
                    (Phase::Open, _) if room => {
                        (*count, *phase) = (1, Phase::After);
                        let items = items.clone();
                        state.frames.push(Frame::Value(items));
                        // `c` starts the first item
                    }
                    _ => return,
                }
            }
            Frame::Calls(calls) => {
                let calls = calls.clone();
                state.frames.pop();
                if !calls.close.is_empty() {
                    let mut closing = state.clone();
                    closing.frames.push(Frame::Text { text: calls.close.clone(), at: 0 });
                    step(closing, c, out);
                }
                for body in &calls.calls {
                    let mut branch = state.clone();
                    branch.frames.push(Frame::Calls(calls.clone()));
                    branch.frames.extend(body.iter().cloned());
                    if !calls.sep.is_empty() {
                        branch.frames.push(Frame::Text { text: calls.sep.clone(), at: 0 });
                    }
                    step(branch, c, out);
                }
                return;
            }
        }
    }
}

/// The states of a value of shape `node` begun by `c`.
fn start_value(mut state: State, node: &Arc<Node>, c: char, out: &mut Vec<State>) {
    let frame = match (&**node, c) {
        (Node::Any, _) => {
            return any_value().iter().for_each(|alt| start_value(state.clone(), alt, c, out));
        }
        (Node::Choice(alts), _) => {
            return alts.iter().for_each(|alt| start_value(state.clone(), alt, c, out))
        }
        (Node::Literal(texts), _) => {
            for text in texts.iter().filter(|t| t.starts_with(c)) {
                let mut branch = state.clone();
                if text.len() > c.len_utf8() {
                    branch.frames.push(Frame::Text { text: text.as_str().into(), at: c.len_utf8() });
                }
                out.push(branch);
            }
            return;
        }
        (Node::String { min, max }, '"') => Frame::Str { len: 0, min: *min, max: *max, escape: Escape::None },
        (Node::Number { integer }, '-') => Frame::Number { integer: *integer, part: Part::Sign, digits: 0 },
        (Node::Number { integer }, '0') => Frame::Number { integer: *integer, part: Part::Zero, digits: 1 },
        (Node::Number { integer }, '1'..='9') => {
            Frame::Number { integer: *integer, part: Part::Int, digits: 1 }
        }
        (Node::Object(props), '{') => {
            let used = vec![false; props.as_ref().map_or(0, Vec::len)];
            Frame::Object { node: node.clone(), used, current: 0, phase: Phase::Open }
        }
        (Node::Array { .. }, '[') => Frame::Array { node: node.clone(), count: 0, phase: Phase::Open },
        _ => return,
    };
    state.frames.push(frame);
    out.push(state);
}
