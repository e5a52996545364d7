use super::event::{encode, What};
use super::read::{decode_event, read_events, records};
use super::record::{crc32c, frame, masked_crc32c};
use super::*;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The CRC32C check value of the Castagnoli polynomial, and its mask as TFRecord computes it
/// (`((crc >> 15) | (crc << 17)) + 0xa282ead8`; TensorBoard's `masked_crc32c` gives 0xc78ab0e5).
#[test]
fn crc32c_and_its_mask_match_the_known_vector() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(b""), 0);
    let crc = 0xE306_9283u32;
    #[allow(clippy::manual_rotate)] // TFRecord's formula as written, not the code's rotate_right
    let masked = ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8);
    assert_eq!(masked, 0xc78a_b0e5);
    assert_eq!(masked_crc32c(b"123456789"), masked);
}

/// "hello" framed as TensorBoard's `RecordWriter` frames it (bytes from tensorboard 2.21).
#[test]
fn a_record_is_framed_as_tensorboards_record_writer_frames_it() {
    assert_eq!(hex(&frame(b"hello")), "0500000000000000eab2043e68656c6c6fbb1f1c19");
    assert_eq!(records(&frame(b"hello")).unwrap(), vec![b"hello".as_slice()]);
}

/// Events byte for byte as TensorBoard's own protobuf classes (`event_pb2.Event(...)
/// .SerializeToString()`, tensorboard 2.21) serialize them.
#[test]
fn events_encode_as_tensorboards_protobuf_classes_do() {
    let scalars = [("train/loss", 0.25f32)];
    assert_eq!(
        hex(&encode(1.5, 300, &What::Scalars(&scalars))),
        "09000000000000f83f10ac022a130a110a0a747261696e2f6c6f7373150000803e"
    );
    assert_eq!(
        hex(&encode(2.0, 0, &What::FileVersion(FILE_VERSION))),
        "0900000000000000401a0d627261696e2e4576656e743a32"
    );
    assert_eq!(hex(&encode(2.0, 5, &What::SessionStart)), "09000000000000004010053a020801");
    assert_eq!(
        hex(&encode(2.0, 7, &What::Text { tag: "config", text: "a = 1" })),
        "09000000000000004010072a210a1f0a06636f6e666967420b08071200420561203d20314a080a060a0474657874"
    );
}

/// A CRC that does not match, or a record cut short, is an error naming the record.
#[test]
fn the_reader_refuses_a_flipped_bit_and_a_torn_record() {
    let mut bytes = frame(b"one");
    bytes.extend(frame(b"two"));
    assert_eq!(records(&bytes).unwrap(), vec![b"one".as_slice(), b"two".as_slice()]);
    let mut flipped = bytes.clone();
    flipped[19 + 12] ^= 1; // the second record's first data byte (the first is 19 bytes)
    let err = records(&flipped).unwrap_err().to_string();
    assert_eq!(err, "record 1: the data's CRC is wrong");
    let err = records(&bytes[..bytes.len() - 2]).unwrap_err().to_string();
    assert!(err.starts_with("record 1: 3 bytes announced"), "{err}");
}

fn step_record(step: usize, loss: f64, gpu: Option<f64>) -> StepRecord {
    StepRecord {
        step,
        epoch: step as f64 / 10.0,
        loss,
        lr: 1e-4 * step as f64,
        grad_norm: 0.5 + step as f64,
        loss_scale: 65536.0,
        skipped_steps: 0,
        trained_tokens: 100,
        tokens: 128,
        tokens_per_s: 1000.0 + step as f64,
        elapsed_s: step as f64,
        gpu_allocated_gib: gpu,
        gpu_peak_gib: gpu.map(|g| g + 1.0),
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lora-ft-tb-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn config() -> Config {
    let text = "[model]\nsource = \"m\"\n[data]\ntrain = \"t.jsonl\"\n[train]\nlr = 3e-4\n";
    Config::from_toml(text, Path::new("run.toml")).unwrap()
}

/// A written file read back: the version first, the config as text, then every step's and
/// evaluation's exact values at their steps.
#[test]
fn a_written_file_reads_back_with_its_steps_and_values() {
    let dir = temp_dir("roundtrip");
    let mut tb = TensorBoard::create(&dir, 0, &config()).unwrap();
    tb.step(&step_record(1, 2.5, None)).unwrap();
    tb.step(&step_record(2, 2.25, Some(3.5))).unwrap();
    tb.eval(&EvalRecord { step: 2, eval_loss: 2.0, eval_ppl: 2f64.exp(), eval_tokens: 50 }).unwrap();
    let name = tb.path().file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    let events = read_events(tb.path()).unwrap();
    assert_eq!(events.len(), 5, "{events:?}");
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    assert!(events.iter().all(|e| e.wall_time > 1.6e9), "{events:?}");
    let (tag, plugin, texts) = &events[1].texts[0];
    assert_eq!((tag.as_str(), plugin.as_str(), texts.len()), ("config", "text", 1));
    let toml = texts[0].strip_prefix("```toml\n").and_then(|t| t.strip_suffix("```\n")).unwrap();
    let back = Config::from_toml(toml, Path::new("tb")).unwrap();
    assert_eq!(back.train.lr, 3e-4);
    assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(config()).unwrap());

    let named = |e: &read::Event| -> Vec<(String, f32)> { e.scalars.clone() };
    assert_eq!(events[2].step, 1);
    assert_eq!(
        named(&events[2]),
        [
            ("train/loss", 2.5),
            ("train/learning_rate", 1e-4),
            ("train/grad_norm", 1.5),
            ("train/loss_scale", 65536.0),
            ("train/epoch", 0.1),
            ("train/tokens_per_s", 1001.0),
        ]
        .map(|(t, v)| (t.to_string(), v))
    );
    assert_eq!(events[3].step, 2);
    let gpu: Vec<_> = events[3].scalars.iter().filter(|(t, _)| t.starts_with("gpu/")).cloned().collect();
    assert_eq!(
        gpu,
        [("gpu/memory_allocated_gib".to_string(), 3.5), ("gpu/memory_peak_gib".to_string(), 4.5)]
    );
    assert_eq!(events[4].step, 2);
    assert_eq!(
        named(&events[4]),
        [("eval/loss".to_string(), 2.0), ("eval/perplexity".to_string(), 2f64.exp() as f32)]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A resumed run writes a second file and leaves the first as it was; its file starts with a
/// restart at the step after its checkpoint.
#[test]
fn a_resumed_run_adds_a_file_and_leaves_the_first_whole() {
    let dir = temp_dir("resume");
    let mut first = TensorBoard::create(&dir, 0, &config()).unwrap();
    for step in 1..=3 {
        first.step(&step_record(step, 3.0 - step as f64 / 4.0, None)).unwrap();
    }
    let first_path = first.path().to_path_buf();
    drop(first);
    let before = std::fs::read(&first_path).unwrap();
    let mut second = TensorBoard::create(&dir, 2, &config()).unwrap();
    second.step(&step_record(3, 1.0, None)).unwrap();
    assert_ne!(second.path(), first_path);
    assert_eq!(std::fs::read(&first_path).unwrap(), before);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);

    let steps = |path: &Path| -> Vec<(i64, f32)> {
        let events = read_events(path).unwrap();
        events.iter().filter_map(|e| e.scalars.first().map(|(_, v)| (e.step, *v))).collect()
    };
    assert_eq!(steps(&first_path), [(1, 2.75), (2, 2.5), (3, 2.25)]);
    let events = read_events(second.path()).unwrap();
    assert!(events[1].session_start && events[1].step == 3, "{events:?}");
    assert_eq!(steps(second.path()), [(3, 1.0)]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A folder that cannot be created is an error naming it.
#[test]
fn an_unwritable_folder_is_named() {
    let dir = temp_dir("unwritable");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a-file");
    std::fs::write(&file, "").unwrap();
    let err = TensorBoard::create(&file.join("tb"), 0, &config()).err().unwrap();
    assert!(format!("{err:#}").starts_with(&format!("creating {}", file.join("tb").display())), "{err:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// decode_event reads what encode wrote for a step of 2^40 (a varint of several bytes).
#[test]
fn a_large_step_survives_the_varint() {
    let event = decode_event(&encode(3.0, 1 << 40, &What::Scalars(&[("x", -1.0)]))).unwrap();
    assert_eq!((event.step, event.scalars), (1 << 40, vec![("x".to_string(), -1.0)]));
}
