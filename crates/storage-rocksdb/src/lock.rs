//! The directory lock: one live store per directory.
//!
//! `RocksDB` locks its directory too, but its error ("lock hold by current process" or an
//! `EAGAIN` on a file named `LOCK`) names neither the directory's owner nor what to do. This
//! lock is taken first, on a file of our own, so a second client gets
//! [`OpenError::Locked`](crate::OpenError::Locked) naming the directory and the holder's
//! process id.
//!
//! It is an OS advisory lock (`flock` on Unix, `LockFileEx` on Windows, through `fs4`) on an
//! open file description, with the holder's pid written into the file:
//! - the OS releases it when the holder dies, even by `SIGKILL`, so a crash never leaves a
//!   stale lock to clean up by hand (a pid file without a lock would);
//! - two stores in one process conflict as well, since each open creates its own description;
//! - the pid in the file is only a diagnostic: the lock decides, the pid explains.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use fs4::{FileExt, TryLockError};

use crate::error::OpenError;

/// Name of the lock file inside the store's directory.
pub const LOCK_FILE: &str = "prosody.lock";

/// Holds the lock until dropped (closing the file releases it).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Locks `dir` (which must exist) for this process.
    pub fn acquire(dir: &Path) -> Result<Self, OpenError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| OpenError::Io {
            dir: dir.to_path_buf(),
            action: "open the lock file",
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // Called through the trait: `File::try_lock` of std is newer than the workspace MSRV.
        match FileExt::try_lock(&file) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(OpenError::Locked {
                    dir: dir.to_path_buf(),
                    holder: read_holder(&mut file),
                });
            }
            Err(TryLockError::Error(source)) => return Err(io(source)),
        }
        write_holder(&mut file).map_err(|source| OpenError::Io {
            dir: dir.to_path_buf(),
            action: "write the lock file",
            source,
        })?;
        Ok(Self { _file: file })
    }
}

fn write_holder(file: &mut File) -> std::io::Result<()> {
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    writeln!(file, "{}", std::process::id())?;
    file.flush()
}

/// The pid the holder wrote, if it has written one yet.
fn read_holder(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder_and_the_first_release_frees_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let Err(OpenError::Locked {
            dir: locked,
            holder,
        }) = DirLock::acquire(dir.path())
        else {
            panic!("the second lock must fail");
        };
        assert_eq!(locked, dir.path());
        assert_eq!(holder, Some(std::process::id()));
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
        assert!(dir.path().join(LOCK_FILE).exists());
    }
}
