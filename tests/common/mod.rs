//! What the end-to-end tests that run the `lora-ft` binary share.

use std::path::{Path, PathBuf};

/// Writes `<root>/train.toml`: SmolLM2-135M (dense f32) on the CPU over the shipped dialogues at
/// 96 tokens, with `lora`, `train` and `checkpoint` as the lines of those sections (the device,
/// dtype and lengths are fixed here), its run in `<root>/run` and its adapter in
/// `<root>/adapters/a`.
#[allow(dead_code)]
pub fn smollm2_cpu_config(root: &Path, lora: &str, train: &str, checkpoint: &str) -> PathBuf {
    cpu_config(&lora_ft::fixtures::smollm2_dir(), root, lora, train, checkpoint)
}

/// `smollm2_cpu_config` with the tiny model (`tiny_smollm2_dir`) instead: seconds a run.
#[allow(dead_code)]
pub fn tiny_cpu_config(root: &Path, lora: &str, train: &str, checkpoint: &str) -> PathBuf {
    cpu_config(&tiny_smollm2_dir(), root, lora, train, checkpoint)
}

#[allow(dead_code)]
fn cpu_config(model: &Path, root: &Path, lora: &str, train: &str, checkpoint: &str) -> PathBuf {
    let toml = format!(
        r#"
[model]
source = "{model}"
quantization = "none"
[lora]
{lora}
[data]
train = "datasets/customer-service-v1/train.jsonl"
max_seq_len = 96
[train]
compute_dtype = "f32"
device = "cpu"
{train}
[checkpoint]
{checkpoint}
[output]
dir = "{root}/run"
adapter_name = "a"
adapters_dir = "{root}/adapters"
"#,
        model = model.display(),
        root = root.display()
    );
    std::fs::create_dir_all(root).unwrap();
    let file = root.join("train.toml");
    std::fs::write(&file, toml).unwrap();
    file
}

/// A random Llama small enough that a test trains it for several runs in seconds (2 layers,
/// hidden 64), with SmolLM2's tokenizer and chat template so it reads the shipped dialogues:
/// written once into the temp dir. Weights from a fixed seed, scaled so that logits vary by
/// several nats between tokens (a loss that depends on which rows a step trained).
#[allow(dead_code)]
pub fn tiny_smollm2_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join("lora-ft-tiny-smollm2-v1");
        if !dir.join("model.safetensors").exists() {
            let tmp = std::env::temp_dir().join(format!(".lora-ft-tiny-smollm2-{}", std::process::id()));
            write_tiny_smollm2(&tmp);
            // another test process may have won the race: its folder is as good as ours
            if std::fs::rename(&tmp, &dir).is_err() {
                let _ = std::fs::remove_dir_all(&tmp);
            }
        }
        dir
    })
    .clone()
}

fn write_tiny_smollm2(dir: &Path) {
    let src = lora_ft::fixtures::smollm2_dir();
    std::fs::create_dir_all(dir).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(file), dir.join(file)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    for (key, value) in [
        ("hidden_size", 64),
        ("intermediate_size", 128),
        ("num_hidden_layers", 2),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
        ("head_dim", 16),
    ] {
        config[key] = value.into();
    }
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    let mut seed = 7u64;
    let mut tensors = std::collections::HashMap::new();
    let mut put = |name: String, shape: &[usize], std: f32| {
        let values: Vec<f32> = (0..shape.iter().product()).map(|_| std * normal(&mut seed)).collect();
        let t = candle_core::Tensor::from_vec(values, shape, &candle_core::Device::Cpu).unwrap();
        tensors.insert(name, t);
    };
    put("model.embed_tokens.weight".into(), &[vocab, 64], 0.5);
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for (name, out, inp) in
            [("self_attn.q_proj", 64, 64), ("self_attn.k_proj", 32, 64), ("self_attn.v_proj", 32, 64)]
        {
            put(format!("{p}.{name}.weight"), &[out, inp], 1.0 / (inp as f32).sqrt());
        }
        put(format!("{p}.self_attn.o_proj.weight"), &[64, 64], 0.125);
        put(format!("{p}.mlp.gate_proj.weight"), &[128, 64], 0.125);
        put(format!("{p}.mlp.up_proj.weight"), &[128, 64], 0.125);
        put(format!("{p}.mlp.down_proj.weight"), &[64, 128], 0.088);
    }
    let ones =
        |n: usize| candle_core::Tensor::ones(n, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    for l in 0..2 {
        tensors.insert(format!("model.layers.{l}.input_layernorm.weight"), ones(64));
        tensors.insert(format!("model.layers.{l}.post_attention_layernorm.weight"), ones(64));
    }
    tensors.insert("model.norm.weight".into(), ones(64));
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
}

/// A standard normal draw (Box–Muller over SplitMix64), so the fixture is the same everywhere.
fn normal(state: &mut u64) -> f32 {
    let mut next = || {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let (u1, u2) = (next().max(1e-300), next());
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// A fresh folder under the system's temp dir for one test (`tag` names it; the process id and
/// a counter keep tests that run side by side apart), removed on drop.
#[allow(dead_code)]
pub struct Scratch(pub PathBuf);

#[allow(dead_code)]
impl Scratch {
    pub fn new(tag: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("lora-ft-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The bytes of a gzip file.
#[allow(dead_code)]
pub fn gunzip(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()).read_to_end(&mut out).unwrap();
    out
}

/// A tokenizer folder assembled from tests/fixtures/tokenizers: `family`'s files (gzip ones
/// decompressed) and `vocab`'s tokenizer.json.
#[allow(dead_code)]
pub fn tokenizer_folder(family: &str, vocab: &str) -> Scratch {
    let folder = Scratch::new(&format!("tok-{family}"));
    let dir = &folder.0;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers");
    let tokenizer = gunzip(&fixtures.join("vocab").join(format!("{vocab}.tokenizer.json.gz")));
    std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
    for entry in std::fs::read_dir(fixtures.join(family)).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        match name.strip_suffix(".gz") {
            Some(plain) => std::fs::write(dir.join(plain), gunzip(&path)).unwrap(),
            None => std::fs::write(dir.join(name), std::fs::read(&path).unwrap()).unwrap(),
        }
    }
    folder
}

/// Runs `bash scripts/<script>` unless `ready()` already holds, one test process at a time (a
/// lock file `<name>.lock` in the cache folder; a second process waits, then finds it done), and
/// fails saying what the script needs where it does not succeed. The tools the tests run (llama.cpp,
/// TensorBoard) are installed this way on a fresh machine instead of the test being skipped.
#[allow(dead_code)]
pub fn install_once(name: &str, script: &str, needs: &str, ready: impl Fn() -> bool) {
    if ready() {
        return;
    }
    let cache = lora_ft::cache::dir();
    std::fs::create_dir_all(&cache).unwrap();
    let lock = std::fs::File::create(cache.join(format!("{name}.lock"))).unwrap();
    lock.lock().unwrap();
    if !ready() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let status =
            std::process::Command::new("bash").arg(root.join("scripts").join(script)).status().unwrap();
        assert!(status.success(), "scripts/{script} failed ({status}): it needs {needs}");
    }
}
