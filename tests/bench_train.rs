//! `lora-ft bench train` on the CPU: one JSON row per shape with the step's rate, and with
//! `LORA_FT_TIMELINE=1` every timed step's marks (profile.rs `timeline`) in the order the step
//! runs them.

use std::process::Command;

use serde_json::Value as Json;

fn bench(timeline: bool) -> Json {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    cmd.args(["bench", "train", "--model", "tests/fixtures/tiny-llama", "--shapes", "16x2", "--steps", "3"])
        .args(["--device", "cpu", "--dtype", "f32"])
        .current_dir(root)
        .env_remove("LORA_FT_TIMELINE");
    if timeline {
        cmd.env("LORA_FT_TIMELINE", "1");
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Json> =
        stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 1, "{stdout}");
    rows.into_iter().next().unwrap()
}

#[test]
fn a_row_per_shape_and_the_timeline_of_its_timed_steps() {
    let row = bench(false);
    assert_eq!((row["seq"].as_u64(), row["bs"].as_u64()), (Some(16), Some(2)));
    assert!(row["tok_s"].as_f64().unwrap() > 0.0 && row["loss"].as_f64().unwrap().is_finite(), "{row}");
    assert_eq!(row["kept_layers"], 0, "the CPU has no budget: every layer recomputed");
    assert!(row.get("timeline").is_none(), "no marks unless asked: {row}");

    let row = bench(true);
    let marks: Vec<(String, f64, f64)> = serde_json::from_value(row["timeline"].clone()).unwrap();
    let names: Vec<&str> = marks.iter().map(|m| m.0.as_str()).collect();
    // tiny-llama has 2 layers, each recomputed; the marks of one step, then the next step's call
    let step = [
        "step",
        "embedding",
        "forward 0 Recomputed",
        "forward 1 Recomputed",
        "loss",
        "backward 1 Recomputed",
        "backward 0 Recomputed",
        "forward and backward returned",
        "clip",
        "optimizer",
    ];
    let mut want: Vec<&str> = Vec::new();
    for n in 0..3 {
        if n > 0 {
            want.push("step called");
        }
        want.extend(step);
    }
    assert_eq!(names, want);
    assert_eq!((marks[0].1, marks[0].2), (0.0, 0.0), "times from the first step's start");
    for pair in marks.windows(2) {
        assert!(pair[1].2 >= pair[0].2, "host times in order: {pair:?}");
    }
    for (name, gpu, host) in &marks {
        assert_eq!(gpu, host, "{name}: without a GPU the device's time is the host's");
    }
}
