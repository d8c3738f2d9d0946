//! Changes of the kv backend's namespace (create, unlink, rename, file
//! ids) and listings of the root directory, all against the index
//! object's omap; the data objects of a removed file go here too.

use super::meta::{io_err, Meta};
use super::nodes::DirPos;
use super::{bad_meta, data, dir_only, KvFs, ID_BATCH, NEXT_ID};
use crate::model::*;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::SystemTime;

impl KvFs {
    /// A new file id. Call with the namespace lock held.
    pub(super) fn new_id(&self) -> FsResult<u64> {
        let (id, reserve) = {
            let mut t = self.table();
            let id = t.next_id;
            t.next_id += 1;
            (id, (id >= t.reserved).then_some(id + ID_BATCH))
        };
        if let Some(upto) = reserve {
            let oid = self.layout.index();
            self.pool
                .setxattr(&oid, NEXT_ID, upto.to_string().as_bytes())
                .map_err(|e| io_err("reserve ids in", &oid, e))?;
            self.table().reserved = upto;
        }
        Ok(id)
    }

    /// Creates `name` (EEXIST if it exists) with one lookup and `opens`
    /// open files counted.
    pub(super) fn make(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        opens: u32,
    ) -> FsResult<Meta> {
        dir_only(parent)?;
        check_name(name)?;
        let _ns = self.ns();
        if self.fetch(name)?.is_some() {
            return Err(Errno(libc::EEXIST));
        }
        let now = SystemTime::now();
        let m = Meta {
            id: self.new_id()?,
            size: 0,
            mode: libc::S_IFREG | (mode & 0o7777),
            uid: ctx.uid,
            gid: ctx.gid,
            atime: now,
            mtime: now,
            ctime: now,
        };
        let oid = self.layout.index();
        self.pool
            .omap_update(&oid, &[(name.as_bytes(), &m.encode())], &[])
            .map_err(|e| io_err("create in", &oid, e))?;
        let mut t = self.table();
        let m = t.add_ref(name, m, 1, self.max_nodes)?;
        if let Some(n) = t.nodes.get_mut(&m.id) {
            n.opens += opens;
        }
        Ok(m)
    }

    /// Removes `id`'s data objects, logging a failure (the name is gone
    /// already, so there is no one to tell).
    pub(super) fn drop_data(&self, id: u64, size: u64) {
        if let Err(e) = data::remove(&self.pool, &self.layout, id, size) {
            tracing::warn!("kv: data of removed file {id} left behind: {e:?}");
        }
    }

    /// Unlinks `name` whose metadata is `m`. Call with the namespace lock
    /// held, after the index key is gone.
    pub(super) fn forget_name(&self, name: &OsStr, m: &Meta) {
        let held = self.table().unlinked(name);
        if held != Some(false) {
            self.drop_data(m.id, m.size);
        }
    }

    /// A directory listing from cookie `off`, at most `max` entries, each
    /// with the file's metadata (`None` for `.` and `..`).
    pub(super) fn list(
        &self,
        fh: u64,
        off: u64,
        max: usize,
    ) -> FsResult<Vec<(DirEntry, Option<Meta>)>> {
        let mut out = Vec::new();
        for (i, name) in [(0u64, "."), (1, "..")] {
            if off <= i && out.len() < max {
                out.push((
                    DirEntry {
                        ino: ROOT,
                        offset: i + 1,
                        kind: libc::S_IFDIR,
                        name: OsString::from(name),
                    },
                    None,
                ));
            }
        }
        let mut pos = off.max(2);
        let saved = self
            .table()
            .dirs
            .get(&fh)
            .and_then(|d| (d.off == pos).then(|| d.after.clone()));
        let oid = self.layout.index();
        // Resume after the saved key, or skip `pos - 2` keys from the start.
        let mut after = match saved {
            Some(a) => a,
            None => {
                let mut skip = pos - 2;
                let mut after: Option<Vec<u8>> = None;
                while skip > 0 {
                    let (v, more) = self
                        .pool
                        .omap_list(&oid, after.as_deref(), skip.min(1024))
                        .map_err(|e| io_err("list", &oid, e))?;
                    let Some(last) = v.last() else { break };
                    skip -= v.len() as u64;
                    after = Some(last.0.clone());
                    if !more {
                        break;
                    }
                }
                if skip > 0 {
                    return Ok(out);
                }
                after
            }
        };
        while out.len() < max {
            let want = (max - out.len()).min(1024) as u64;
            let (v, more) = self
                .pool
                .omap_list(&oid, after.as_deref(), want)
                .map_err(|e| io_err("list", &oid, e))?;
            let n = v.len();
            for (k, val) in v {
                pos += 1;
                after = Some(k.clone());
                match Meta::decode(&val) {
                    Ok(m) => out.push((
                        DirEntry {
                            ino: m.id,
                            offset: pos,
                            kind: libc::S_IFREG,
                            name: OsString::from_vec(k),
                        },
                        Some(m),
                    )),
                    Err(e) => {
                        // Left out of the listing; lookup of it says EIO.
                        bad_meta(&k, &e);
                    }
                }
            }
            if !more || n == 0 {
                break;
            }
        }
        let mut t = self.table();
        if let Some(d) = t.dirs.get_mut(&fh) {
            *d = DirPos { off: pos, after };
        }
        Ok(out)
    }

    /// One open file of `ino` closed: drops the node if nothing holds it,
    /// and removes the data of an unlinked file at its last close.
    pub(super) fn release_node(&self, ino: u64) {
        let gone = {
            let mut t = self.table();
            let Some(n) = t.nodes.get_mut(&ino) else {
                return;
            };
            n.opens = n.opens.saturating_sub(1);
            let gone = (n.opens == 0 && n.name.is_none()).then_some((n.meta.id, n.meta.size));
            t.maybe_drop(ino);
            gone
        };
        if let Some((id, size)) = gone {
            self.drop_data(id, size);
        }
    }

    pub(super) fn rename_in_index(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        dir_only(parent)?;
        dir_only(newparent)?;
        check_name(name)?;
        check_name(newname)?;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            // RENAME_WHITEOUT: no overlay whiteouts in a flat store.
            return Err(Errno::EINVAL);
        }
        let _ns = self.ns();
        let src = self.fetch(name)?.ok_or(Errno::ENOENT)?;
        if name == newname {
            return Ok(());
        }
        let dst = self.fetch(newname)?;
        let oid = self.layout.index();
        let now = SystemTime::now();
        let moved = Meta { ctime: now, ..src };
        if flags & libc::RENAME_EXCHANGE != 0 {
            let dst = dst.ok_or(Errno::ENOENT)?;
            let other = Meta { ctime: now, ..dst };
            let (a, b) = (moved.encode(), other.encode());
            self.pool
                .omap_update(
                    &oid,
                    &[(newname.as_bytes(), &a), (name.as_bytes(), &b)],
                    &[],
                )
                .map_err(|e| io_err("rename in", &oid, e))?;
            let mut t = self.table();
            for (id, n, m) in [(src.id, newname, moved), (dst.id, name, other)] {
                t.names.remove(n);
                if let Some(node) = t.nodes.get_mut(&id) {
                    node.name = Some(n.to_os_string());
                    node.meta.ctime = m.ctime;
                    t.names.insert(n.to_os_string(), id);
                }
            }
            return Ok(());
        }
        if dst.is_some() && flags & libc::RENAME_NOREPLACE != 0 {
            return Err(Errno(libc::EEXIST));
        }
        self.pool
            .omap_update(
                &oid,
                &[(newname.as_bytes(), &moved.encode())],
                &[name.as_bytes()],
            )
            .map_err(|e| io_err("rename in", &oid, e))?;
        if let Some(d) = dst {
            self.forget_name(newname, &d);
        }
        let mut t = self.table();
        t.names.remove(name);
        if let Some(node) = t.nodes.get_mut(&src.id) {
            node.name = Some(newname.to_os_string());
            node.meta.ctime = now;
            t.names.insert(newname.to_os_string(), src.id);
        }
        Ok(())
    }
}
