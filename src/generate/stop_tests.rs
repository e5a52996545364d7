//! Stop strings matched across token boundaries, held back while they may still match.

use super::stop::{cut_at_stop, FinishReason, StopMatcher};

fn matcher(stops: &[&str]) -> StopMatcher {
    StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

#[test]
fn a_stop_string_split_across_tokens_stops_before_it() {
    let mut m = matcher(&["STOP"]);
    assert_eq!(m.push("Hello wo"), "Hello wo");
    // "ST" may start the stop string: held back
    assert_eq!(m.push("rld! ST"), "rld! ");
    assert!(!m.stopped());
    assert_eq!(m.push("OP and more"), "");
    assert!(m.stopped());
    assert_eq!(m.text(), "Hello world! ");
    assert_eq!(m.push("ignored"), "");
    assert_eq!(m.finish(), "");
}

#[test]
fn a_partial_match_is_released_when_the_text_diverges() {
    let mut m = matcher(&["</s>"]);
    assert_eq!(m.push("a <"), "a ");
    assert_eq!(m.push("/"), "");
    assert_eq!(m.push("x>"), "</x>");
    assert_eq!(m.push(" <"), " ");
    // the reply ends: what was held back is released
    assert_eq!(m.finish(), "<");
    assert!(!m.stopped());
    assert_eq!(m.text(), "a </x> <");
}

#[test]
fn the_earliest_of_several_stop_strings_wins_within_one_piece() {
    let mut m = matcher(&["world", "lo w"]);
    assert_eq!(m.push("hello world"), "hel");
    assert!(m.stopped());
}

#[test]
fn multibyte_text_is_held_and_cut_at_char_boundaries() {
    let mut m = matcher(&["é!"]);
    assert_eq!(m.push("café"), "caf");
    assert_eq!(m.push("s"), "és");
    assert_eq!(m.push("né"), "n");
    assert_eq!(m.push("!x"), "");
    assert_eq!(m.text(), "cafésn");
}

#[test]
fn the_returned_text_excludes_the_stop_string() {
    let stops = vec!["\n\n".to_string(), "END".to_string()];
    assert_eq!(cut_at_stop("one\n\ntwo END", &stops), ("one".to_string(), true));
    assert_eq!(cut_at_stop("no stop here", &stops), ("no stop here".to_string(), false));
    assert_eq!(cut_at_stop("END", &stops), (String::new(), true));
}

#[test]
fn empty_stop_strings_are_refused_and_finish_reasons_use_openai_names() {
    let err = StopMatcher::new(&[String::new()]).unwrap_err().to_string();
    assert!(err.contains("stop strings"), "{err}");
    assert_eq!(FinishReason::Stop.to_string(), "stop");
    assert_eq!(FinishReason::Length.as_str(), "length");
}
