//! Saves that lose nothing: files and folders are written under a temporary name, fsynced and
//! renamed, so a crash or a full disk leaves the old version or the new one, never half of
//! either; and a write that runs out of space is told as one message that says which file and
//! where to free space.

use std::collections::HashMap;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::Tensor;

/// Context of every write of a save: the file, so a failure can name it.
#[derive(Debug, thiserror::Error)]
#[error("writing {}", .0.display())]
pub struct Writing(pub PathBuf);

/// Context of a whole save: what it was for ("checkpoint step 40", "the final adapter").
#[derive(Debug, thiserror::Error)]
#[error("saving {0}")]
pub struct Saving(pub String);

/// `path` with `bytes` (no fsync: `write_dir_atomic` syncs what its `fill` wrote).
pub fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| Writing(path.to_path_buf()))
}

/// A safetensors file; the OS error of a failed write stays in the chain (`out_of_space`).
pub fn write_safetensors(tensors: &HashMap<String, Tensor>, path: &Path) -> anyhow::Result<()> {
    candle_core::safetensors::save(tensors, path).with_context(|| Writing(path.to_path_buf()))?;
    as_created(path)
}

/// Gives `path` the mode a plainly created file gets (0666 less the umask). The safetensors crate
/// writes through a temporary file, which is made 0600: an adapter or a merged model would be
/// unreadable to the rest of a team sharing the machine.
pub fn as_created(path: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = 0o666 & !umask();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the permissions of {}", path.display()))?;
    }
    Ok(())
}

/// This process's umask, from /proc (reading it with umask(2) would set it); 022 where /proc
/// does not say.
#[cfg(unix)]
fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("Umask:"))?;
                u32::from_str_radix(line.trim_start_matches("Umask:").trim(), 8).ok()
            })
            .unwrap_or(0o022)
    })
}

/// Writes `bytes` to a temporary file, fsyncs it and renames it over `path`; a failed write
/// removes the temporary file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = temp_sibling(path);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .with_context(|| Writing(tmp.clone()));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp); // best effort: `e` is the error that matters
        return Err(e);
    }
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    sync_path(parent(path))
}

/// Writes a folder whole or not at all: `fill` writes the files into a temporary sibling folder,
/// which is fsynced and then moved into `dir` (renames need no space). A failed `fill` (a full
/// disk) removes the temporary folder and leaves `dir` as it was.
pub fn write_dir_atomic(dir: &Path, fill: impl FnOnce(&Path) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let tmp = temp_sibling(dir);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("removing the leftover {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    if let Err(e) = fill(&tmp).and_then(|()| sync_folder(&tmp)) {
        let _ = std::fs::remove_dir_all(&tmp); // best effort: `e` is the error that matters
        return Err(e);
    }
    move_into(&tmp, dir)
}

/// Renames the folder `tmp` to `dir`, or, when `dir` exists (a user's adapter folder may hold
/// other files), each of its files into `dir`.
fn move_into(tmp: &Path, dir: &Path) -> anyhow::Result<()> {
    let rename = |from: &Path, to: &Path| {
        std::fs::rename(from, to).with_context(|| format!("renaming {} to {}", from.display(), to.display()))
    };
    if !dir.exists() {
        rename(tmp, dir)?;
    } else {
        for entry in std::fs::read_dir(tmp).with_context(|| format!("listing {}", tmp.display()))? {
            let file = entry?.path();
            rename(&file, &dir.join(file.file_name().unwrap_or_default()))?;
        }
        std::fs::remove_dir(tmp).with_context(|| format!("removing {}", tmp.display()))?;
        sync_path(dir)?;
    }
    sync_path(parent(dir))
}

/// fsync of every file in `dir`, then of `dir` itself.
fn sync_folder(dir: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        sync_path(&entry?.path())?;
    }
    sync_path(dir)
}

/// fsync of a file or a directory (a directory's entries: what a rename changed). A full disk
/// can surface here first (delayed allocation), so it is a write of `path`.
pub fn sync_path(path: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {} to sync it", path.display()))?;
    file.sync_all().with_context(|| Writing(path.to_path_buf()))
}

fn temp_sibling(path: &Path) -> PathBuf {
    let name = path.file_name().map_or("file".into(), |n| n.to_string_lossy());
    path.with_file_name(format!(".{name}.tmp"))
}

/// The folder holding `path` ("." for a bare file name).
fn parent(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Whether an OS error is a write that ran out of room: the disk (ENOSPC), a quota (EDQUOT), or
/// the largest file the file system or `ulimit -f` allows (EFBIG).
pub fn is_out_of_space(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::FileTooLarge)
}

/// The OS error in `e`'s chain that is a write running out of room, if any.
pub fn out_of_space(e: &anyhow::Error) -> Option<&std::io::Error> {
    e.chain().filter_map(|c| c.downcast_ref::<std::io::Error>()).find(|io| is_out_of_space(io))
}

/// `disk full while writing FILE (WHAT): OS ERROR; ADVICE`, or `None` when `e` is not a write
/// that ran out of room. FILE and WHAT come from the `Writing` and `Saving` contexts.
pub fn disk_full_message(e: &anyhow::Error) -> Option<String> {
    let os = out_of_space(e)?;
    let file = e.downcast_ref::<Writing>().map(|w| w.0.as_path());
    let place = file.map_or(String::new(), |f| format!(" while writing {}", f.display()));
    let what = e.downcast_ref::<Saving>().map_or(String::new(), |s| format!(" ({})", s.0));
    // the temporary folder of a failed save is gone: name the nearest folder still there
    let folder = file.and_then(|f| f.ancestors().skip(1).find(|d| d.is_dir()));
    let folder = folder.map_or("the output folder's file system".into(), |d| d.display().to_string());
    let advice = match os.kind() {
        ErrorKind::QuotaExceeded => format!("free space on {folder} or raise your disk quota"),
        ErrorKind::FileTooLarge => format!(
            "the file outgrew what {folder}'s file system or the file-size limit (ulimit -f) allows: \
             save to another file system or raise the limit"
        ),
        _ => format!("free space on {folder}"),
    };
    Some(format!("disk full{place}{what}: {os}; {advice}, and run again"))
}

#[cfg(test)]
mod tests {
    /// A safetensors file gets the mode of a plainly created one, not the temporary file's 0600.
    #[cfg(unix)]
    #[test]
    fn safetensors_files_get_the_mode_of_a_created_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("lora-ft-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (plain, tensors) = (dir.join("plain"), dir.join("t.safetensors"));
        std::fs::write(&plain, b"x").unwrap();
        let t = candle_core::Tensor::zeros(3, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        write_safetensors(&std::collections::HashMap::from([("t".to_string(), t)]), &tensors).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&tensors), mode(&plain));
        let _ = std::fs::remove_dir_all(&dir);
    }

    use super::*;
    use std::io::Error;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lora-ft-durable-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn failed_save(os: Error, file: &Path) -> anyhow::Error {
        Err::<(), _>(os)
            .with_context(|| Writing(file.to_path_buf()))
            .context(crate::memory::Phase("save"))
            .context(Saving("checkpoint step 40".into()))
            .unwrap_err()
    }

    /// ENOSPC, EDQUOT and EFBIG are a full disk, told with the file, the save and the folder to
    /// free; other errors are not taken for one.
    #[test]
    fn out_of_space_errors_name_the_file_the_save_and_the_folder() {
        let dir = temp("message");
        let file = dir.join(".step-40.tmp").join("adapter_model.safetensors");
        let kinds = [ErrorKind::StorageFull, ErrorKind::QuotaExceeded, ErrorKind::FileTooLarge];
        for (kind, advice) in kinds.into_iter().zip(["free space on", "disk quota", "ulimit -f"]) {
            let text = disk_full_message(&failed_save(Error::from(kind), &file)).unwrap();
            let head = format!("disk full while writing {} (checkpoint step 40): ", file.display());
            assert!(text.starts_with(&head), "{text}");
            assert!(text.contains(&dir.display().to_string()) && text.contains(advice), "{text}");
        }
        #[cfg(target_os = "linux")]
        for errno in [28, 122, 27] {
            assert!(disk_full_message(&failed_save(Error::from_raw_os_error(errno), &file)).is_some());
        }
        assert_eq!(disk_full_message(&failed_save(Error::from(ErrorKind::NotFound), &file)), None);
        assert_eq!(disk_full_message(&anyhow::anyhow!("no space left on device (a message only)")), None);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// candle's safetensors writer keeps the OS error in the chain, so its kind can be read.
    #[test]
    fn a_failed_safetensors_write_keeps_the_os_error() {
        let file = std::env::temp_dir().join("lora-ft-no-such-folder").join("x").join("a.safetensors");
        let tensors = HashMap::from([(
            "w".to_string(),
            Tensor::zeros(4, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
        )]);
        let e = write_safetensors(&tensors, &file).unwrap_err();
        let os = e.chain().find_map(|c| c.downcast_ref::<Error>());
        assert_eq!(os.map(Error::kind), Some(ErrorKind::NotFound), "{e:#}");
        assert_eq!(e.downcast_ref::<Writing>().map(|w| w.0.clone()), Some(file));
    }

    /// A folder whose files cannot all be written (a full disk) is left as it was, with no
    /// temporary folder; a whole one replaces the old files and keeps the user's others.
    #[test]
    fn a_failed_folder_write_changes_nothing() {
        let root = temp("folder");
        let dir = root.join("adapter");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.json"), "old").unwrap();
        std::fs::write(dir.join("README.md"), "mine").unwrap();
        let full = write_dir_atomic(&dir, |tmp| {
            write(&tmp.join("a.json"), b"new")?;
            Err(Error::from(ErrorKind::StorageFull)).with_context(|| Writing(tmp.join("b.safetensors")))
        });
        assert!(disk_full_message(&full.unwrap_err()).is_some());
        assert_eq!(std::fs::read_to_string(dir.join("a.json")).unwrap(), "old");
        assert!(!root.join(".adapter.tmp").exists());

        write_dir_atomic(&dir, |tmp| write(&tmp.join("a.json"), b"new")).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("a.json")).unwrap(), "new");
        assert_eq!(std::fs::read_to_string(dir.join("README.md")).unwrap(), "mine");
        let fresh = root.join("fresh");
        write_dir_atomic(&fresh, |tmp| write(&tmp.join("a.json"), b"new")).unwrap();
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 2, "no temporary folder left");
        std::fs::remove_dir_all(&root).ok();
    }
}
