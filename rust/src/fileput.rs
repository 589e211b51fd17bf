//! The local object store's durable put as one call: write a fresh temp file, sync its data,
//! publish it under its final name (hard link: create-if-absent; rename: overwrite), then sync
//! the directory so the name survives a crash.
//!
//! Why native: done from Python, each of these ~9 system calls gives up the GIL and must win it
//! back; next to a busy Python thread every win waits up to the interpreter's switch interval
//! (5 ms), so a 2 ms put took 30–40 ms. Here the whole sequence runs without the GIL, once.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// What a put did, when it did not fail outright.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The object is published (created, or replaced when not exclusive).
    Published = 0,
    /// Exclusive and the final name exists already: nothing changed.
    Exists = 1,
    /// The temp name is taken (a crashed process's leftover): pick another name.
    TempTaken = 2,
    /// The directory does not exist: create it, then try again.
    NoDirectory = 3,
}

/// An I/O error with the path it concerns.
#[derive(Debug)]
pub struct PutError {
    pub error: io::Error,
    pub path: String,
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> PutError + '_ {
    move |error| PutError {
        error,
        path: path.to_string_lossy().into_owned(),
    }
}

/// Write `data` to `temp` (created exclusively, in `final_path`'s directory), sync it if `sync`,
/// then link (`exclusive`) or rename it to `final_path`, and sync the directory if `sync`.
/// The temp file never outlives a failure or an `Exists` outcome.
pub fn put_file(
    temp: &Path,
    final_path: &Path,
    data: &[u8],
    exclusive: bool,
    sync: bool,
) -> Result<PutOutcome, PutError> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o666);
    let mut file = match options.open(temp) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(PutOutcome::TempTaken),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(PutOutcome::NoDirectory),
        Err(e) => return Err(at(temp)(e)),
    };
    let written = file
        .write_all(data)
        .and_then(|()| if sync { file.sync_data() } else { Ok(()) });
    drop(file);
    if let Err(e) = written {
        let _ = fs::remove_file(temp);
        return Err(at(temp)(e));
    }
    if exclusive {
        let linked = fs::hard_link(temp, final_path);
        let _ = fs::remove_file(temp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(PutOutcome::Exists),
            Err(e) => return Err(at(final_path)(e)),
        }
    } else if let Err(e) = fs::rename(temp, final_path) {
        let _ = fs::remove_file(temp);
        return Err(at(final_path)(e));
    }
    if sync {
        let dir = final_path.parent().unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(at(dir))?;
    }
    Ok(PutOutcome::Published)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wp-fileput-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn exclusive_put_creates_once_and_leaves_no_temp() {
        let d = scratch("excl");
        let (tmp, fin) = (d.join(".t1"), d.join("obj"));
        assert_eq!(
            put_file(&tmp, &fin, b"one", true, true).unwrap(),
            PutOutcome::Published
        );
        let tmp2 = d.join(".t2");
        assert_eq!(
            put_file(&tmp2, &fin, b"two", true, true).unwrap(),
            PutOutcome::Exists
        );
        assert_eq!(fs::read(&fin).unwrap(), b"one");
        assert_eq!(names(&d), vec!["obj"]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn overwrite_replaces() {
        let d = scratch("over");
        let fin = d.join("obj");
        put_file(&d.join(".a"), &fin, b"old", false, false).unwrap();
        put_file(&d.join(".b"), &fin, b"new", false, true).unwrap();
        assert_eq!(fs::read(&fin).unwrap(), b"new");
        assert_eq!(names(&d), vec!["obj"]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn taken_temp_and_missing_directory_are_outcomes() {
        let d = scratch("outcomes");
        let tmp = d.join(".taken");
        fs::write(&tmp, b"leftover").unwrap();
        let fin = d.join("obj");
        assert_eq!(
            put_file(&tmp, &fin, b"x", true, true).unwrap(),
            PutOutcome::TempTaken
        );
        assert_eq!(fs::read(&tmp).unwrap(), b"leftover"); // not ours: untouched
        assert!(!fin.exists());
        let missing = d.join("no/such");
        assert_eq!(
            put_file(&missing.join(".t"), &missing.join("o"), b"x", false, true).unwrap(),
            PutOutcome::NoDirectory
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn rename_over_a_directory_fails_and_cleans_up() {
        let d = scratch("dir");
        fs::create_dir_all(d.join("sub/child")).unwrap();
        let err = put_file(&d.join(".t"), &d.join("sub"), b"x", false, true).unwrap_err();
        assert!(err.path.ends_with("sub"), "{err:?}");
        assert_eq!(names(&d), vec!["sub"]);
        fs::remove_dir_all(&d).unwrap();
    }
}
