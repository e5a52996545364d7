//! The data pipeline on the real SmolLM2 tokenizer: file:line errors, truncation and dropping,
//! batching order and resume, and the `data check` report.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use lora_ft::config::{Config, TruncationSide};
use lora_ft::data::{
    data_check, read_messages_jsonl, Batch, BatchLoader, ChatTokenizer, Example, TokenizedDataset,
};

/// A file of its own for each call: tests run in parallel threads of one process, and two of
/// them writing one path would read each other's half-written text.
fn temp_file(name: &str, text: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("lora-ft-data-{}-{call}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn row(user: &str, assistant: &str) -> String {
    serde_json::json!({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]})
        .to_string()
}

fn tokenizer() -> ChatTokenizer {
    ChatTokenizer::from_dir(&lora_ft::fixtures::smollm2_dir()).unwrap()
}

#[test]
fn malformed_lines_name_file_and_line() {
    let good = row("hi", "hello");
    let cases = [
        (format!("{good}\n\n{{\"messages\": 3}}\n"), 3, r#"expected a "messages" array"#),
        (format!("{good}\n{{\"messages\": [\n"), 2, "invalid JSON: "),
        (
            format!("{good}\n{good}\n{{\"messages\": [{{\"role\": \"user\", \"content\": \"x\"}}]}}"),
            3,
            "conversation has no assistant turn to train on",
        ),
        (
            r#"{"messages": [{"role": "tool", "content": "x"}]}"#.to_string(),
            1,
            r#"messages[0]: a "tool" message must follow an assistant message with "tool_calls""#,
        ),
        (
            r#"{"messages": [{"role": "robot", "content": "x"}]}"#.to_string(),
            1,
            r#"messages[0]: unknown role "robot""#,
        ),
    ];
    for (i, (text, line, message)) in cases.iter().enumerate() {
        let path = temp_file(&format!("bad{i}.jsonl"), text);
        let err = read_messages_jsonl(&path).unwrap_err().to_string();
        let expected = format!("{}:{line}: {message}", path.display());
        assert!(err.starts_with(&expected), "case {i}: {err:?} does not start with {expected:?}");
    }
    let blank_lines_skipped = temp_file("good.jsonl", &format!("{good}\n\n{good}\n"));
    let conversations = read_messages_jsonl(&blank_lines_skipped).unwrap();
    assert_eq!(conversations.iter().map(|c| c.line).collect::<Vec<_>>(), [1, 3]);
}

/// A short row, and a row whose long question pushes the reply past `max_len` tokens.
fn short_and_long() -> (PathBuf, Example, Example) {
    let long_question = "Please tell me about the weather in Paris. ".repeat(20);
    let path =
        temp_file("trunc.jsonl", &format!("{}\n{}\n", row("Hi", "Hello!"), row(&long_question, "Sunny.")));
    let conversations = read_messages_jsonl(&path).unwrap();
    let tok = tokenizer();
    let short = tok.encode(&conversations[0].messages).unwrap();
    let long = tok.encode(&conversations[1].messages).unwrap();
    (path, short, long)
}

#[test]
fn right_truncation_drops_rows_whose_reply_is_cut_off() {
    let (path, short, long) = short_and_long();
    let max_len = short.len() + 10;
    assert!(long.len() > max_len + 20);
    let ds = TokenizedDataset::from_jsonl(&path, &tokenizer(), max_len, TruncationSide::Right).unwrap();
    assert_eq!((ds.stats.rows, ds.stats.truncated, ds.stats.dropped), (2, 1, 1));
    assert_eq!(ds.stats.lengths, [short.len(), long.len()]);
    assert_eq!(ds.examples, std::slice::from_ref(&short));
    assert_eq!(ds.lines, [1]);
    assert_eq!(ds.stats.tokens, short.len());
    // "Hello!<|im_end|>": the reply's tokens plus the end-of-turn token.
    assert_eq!(ds.stats.trained_tokens, short.trained_tokens());
    assert_eq!(short.labels.iter().filter(|&&l| l != -100).count(), short.trained_tokens());
}

#[test]
fn left_truncation_keeps_the_end_of_the_conversation() {
    let (path, short, long) = short_and_long();
    let max_len = short.len() + 10;
    let ds = TokenizedDataset::from_jsonl(&path, &tokenizer(), max_len, TruncationSide::Left).unwrap();
    assert_eq!((ds.stats.rows, ds.stats.truncated, ds.stats.dropped), (2, 1, 0));
    let tail = long.len() - max_len;
    assert_eq!(ds.examples[1].input_ids, long.input_ids[tail..]);
    assert_eq!(ds.examples[1].labels, long.labels[tail..]);
    assert_eq!(ds.examples[1].trained_tokens(), long.trained_tokens());
    assert_eq!(ds.stats.tokens, short.len() + max_len);
}

fn numbered_examples(n: u32) -> Arc<Vec<Example>> {
    // Row i has i + 1 tokens, all equal to i, so every batch shows which rows it holds.
    let rows = (0..n).map(|i| Example {
        input_ids: vec![i; i as usize + 1],
        labels: vec![i64::from(i); i as usize + 1],
        ..Default::default()
    });
    Arc::new(rows.collect())
}

#[test]
fn shuffled_epochs_are_seeded_permutations() {
    let examples = numbered_examples(10);
    let loader = BatchLoader::new(examples.clone(), 3, 99, Some(42));
    let order0 = loader.epoch_order(0);
    assert_eq!(order0, BatchLoader::new(examples.clone(), 3, 99, Some(42)).epoch_order(0));
    assert_ne!(order0, loader.epoch_order(1));
    assert_ne!(order0, BatchLoader::new(examples.clone(), 3, 99, Some(43)).epoch_order(0));
    let mut sorted = order0.clone();
    sorted.sort();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    assert_ne!(order0, sorted);
    assert_eq!(BatchLoader::new(examples, 3, 99, None).epoch_order(5), sorted);
}

#[test]
fn loader_batches_follow_the_order_and_resume_mid_epoch() {
    let examples = numbered_examples(10);
    let loader = BatchLoader::new(examples.clone(), 3, 99, Some(7));
    assert_eq!(loader.num_batches(), 4);
    let order = loader.epoch_order(2);
    let expected: Vec<Batch> = order
        .chunks(3)
        .map(|c| Batch::from_examples(&c.iter().map(|&i| &examples[i]).collect::<Vec<_>>(), 99))
        .collect();
    let batches: Vec<Batch> = loader.epoch(2, 0).collect();
    assert_eq!(batches, expected);
    assert_eq!(batches.iter().map(|b| b.batch_size).collect::<Vec<_>>(), [3, 3, 3, 1]);
    let first = &batches[0];
    let longest = order[..3].iter().max().unwrap() + 1;
    assert_eq!(first.seq_len, longest);
    assert_eq!(first.input_ids.len(), 3 * first.seq_len);
    let resumed: Vec<Batch> = loader.epoch(2, 2).collect();
    assert_eq!(resumed, expected[2..]);
    // Stopping early must not hang on the prefetch thread.
    let mut partial = loader.epoch(3, 0);
    assert!(partial.next().is_some());
    drop(partial);
}

#[test]
fn data_check_reports_counts_and_marks_trained_text() {
    let long_question = "Please tell me about the weather in Paris. ".repeat(20);
    let file = temp_file(
        "check.jsonl",
        &format!("{}\n{}\n", row("What is the capital of France?", "Paris."), row(&long_question, "Sunny.")),
    );
    let cfg = Config::from_toml(
        "[model]\nsource = \"x\"\n[data]\ntrain = \"t.jsonl\"\nmax_seq_len = 64\n",
        Path::new("run.toml"),
    )
    .unwrap();
    let report = data_check(&file, &cfg, &lora_ft::fixtures::smollm2_dir()).unwrap();
    let tok = tokenizer();
    let conversations = read_messages_jsonl(&file).unwrap();
    let short = tok.encode(&conversations[0].messages).unwrap();
    let long = tok.encode(&conversations[1].messages).unwrap();
    for line in [
        "conversations: 2".to_string(),
        "messages: system 0, user 2, assistant 2".to_string(),
        format!("tokens per conversation (before truncation): min {0}, p50 {0}, p90 {1}, p95 {1}, p99 {1}, max {1}", short.len(), long.len()),
        "max_seq_len: 64, truncation_side: right".to_string(),
        "truncated: 1 of 2 rows longer than max_seq_len".to_string(),
        "dropped: 1 rows with no trained token left after truncation".to_string(),
        format!("kept: 1 rows, {} tokens, {} trained", short.len(), short.trained_tokens()),
        // the one kept row padded to max_seq_len (64, the multiple's cap) by default, or not at all
        format!(
            "batches of 4 (one epoch, one GPU): 1 lengths, padding {:.1}% of the tokens computed \
             (pad_to_multiple_of = 64); to the longest row only: 1 lengths, 0.0%",
            100.0 * (1.0 - short.len() as f64 / 64.0)
        ),
    ] {
        assert!(report.contains(&line), "missing {line:?} in:\n{report}");
    }
    let example = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n[[Paris.<|im_end|>]]\n";
    assert!(report.ends_with(example), "{report}");
    assert!(report.contains(&format!("example ({}:1)", file.display())), "{report}");
}

/// With `data.packing` a row longer than max_seq_len is cut and counted exactly as without it
/// (packing takes the dataset after the cut): the cut dialogue fills a packed row of its own,
/// whole, and the short one gets another.
#[test]
fn packing_cuts_and_counts_a_long_row_as_without_packing() {
    let (path, short, long) = short_and_long();
    let max_len = short.len() + 10;
    let ds = TokenizedDataset::from_jsonl(&path, &tokenizer(), max_len, TruncationSide::Left).unwrap();
    assert_eq!((ds.stats.rows, ds.stats.truncated, ds.stats.dropped), (2, 1, 0));
    let (rows, stats) = lora_ft::data::pack(ds.examples.clone(), max_len);
    assert_eq!((stats.dialogues, stats.rows, stats.tokens), (2, 2, short.len() + max_len));
    let tail = long.len() - max_len;
    assert_eq!(rows[0].input_ids, long.input_ids[tail..], "the cut row, longest first");
    assert_eq!(rows[0].labels, long.labels[tail..]);
    assert_eq!(rows[1].input_ids, short.input_ids);
}
