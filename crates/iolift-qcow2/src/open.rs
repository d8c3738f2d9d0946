//! Opening an image: the header and its features, the L1 table, the
//! refcount table (writable opens), the backing file, the caches. Every
//! table offset is checked against the file before it is used.

use crate::alloc::Alloc;
use crate::backing::Backing;
use crate::cache::MappingCache;
use crate::control::{ControlPlane, CpStats, Meta, Options};
use crate::error::{io_ctx, Error, Result};
use crate::header::{field, Header};
use crate::io::{read_exact, sync, write_all};
use crate::mapping::l1_offset;
use crate::refcount::Refcounts;
use crate::snaptable::{read_table, Snapshot};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Backing chains deeper than this are refused (also stops loops).
pub const MAX_BACKING_DEPTH: usize = 16;
/// At most this many data paths (the holder record is a 64-bit mask).
pub const MAX_DATA_PATHS: usize = 64;

impl ControlPlane {
    /// Opens the image at `path`.
    pub fn open(path: &Path, opts: &Options) -> Result<Arc<ControlPlane>> {
        Self::open_depth(path, opts, 0)
    }

    pub(crate) fn open_depth(
        path: &Path,
        opts: &Options,
        depth: usize,
    ) -> Result<Arc<ControlPlane>> {
        if opts.data_paths == 0 || opts.data_paths > MAX_DATA_PATHS {
            return Err(Error::Invalid(format!(
                "data paths {} (must be 1..={MAX_DATA_PATHS})",
                opts.data_paths
            )));
        }
        let p = path.display();
        let file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .open(path)
            .map_err(io_ctx(format!("opening {p}")))?;
        let file_len = file.metadata().map_err(io_ctx(format!("stat {p}")))?.len();
        let mut first = vec![0u8; file_len.min(4096) as usize];
        read_exact(&file, 0, &mut first).map_err(io_ctx(format!("reading the header of {p}")))?;
        let mut hdr = Header::parse(&first, file_len)?;
        let mut cluster = vec![0u8; file_len.min(hdr.cluster_size()) as usize];
        read_exact(&file, 0, &mut cluster).map_err(io_ctx(format!("reading the header of {p}")))?;
        let mut name = vec![0u8; hdr.backing_file_size as usize];
        if hdr.backing_file_offset != 0 {
            read_exact(&file, hdr.backing_file_offset, &mut name)
                .map_err(io_ctx("reading the backing file name"))?;
        }
        hdr.parse_extensions(&cluster, &name)?;
        let writable = !opts.read_only;
        hdr.check_features(writable)?;
        let (snapshots, snap_len) = if hdr.nb_snapshots == 0 {
            (Vec::new(), 0)
        } else {
            if !hdr.snapshots_offset.is_multiple_of(hdr.cluster_size()) {
                return Err(Error::Corrupt(format!(
                    "snapshots_offset {:#x} is not cluster aligned",
                    hdr.snapshots_offset
                )));
            }
            read_table(&file, hdr.snapshots_offset, hdr.nb_snapshots, file_len)?
        };
        let cs = hdr.cluster_size();
        let mut raw = vec![0u8; hdr.l1_size as usize * 8];
        read_exact(&file, hdr.l1_table_offset, &mut raw).map_err(io_ctx("reading the L1 table"))?;
        let mut l1 = Vec::with_capacity(hdr.l1_size as usize);
        for (i, e) in raw.chunks_exact(8).enumerate() {
            let e = u64::from_be_bytes(e.try_into().unwrap());
            l1_offset(i, e, hdr.cluster_bits, file_len)?;
            l1.push(e);
        }
        let alloc = if writable {
            if hdr.version == 3 && hdr.autoclear != 0 {
                // Autoclear features (bitmaps, ...) this code does not
                // keep up to date: the spec says a writer clears them.
                write_all(&file, field::AUTOCLEAR, &0u64.to_be_bytes())
                    .map_err(io_ctx("clearing the autoclear feature bits"))?;
                sync(&file).map_err(io_ctx("fdatasync of the header"))?;
                hdr.autoclear = 0;
            }
            let rc = Refcounts::load(
                &file,
                hdr.cluster_bits,
                hdr.refcount_order,
                hdr.refcount_table_offset,
                hdr.refcount_table_clusters as u64,
                file_len,
            )?;
            let span = |off: u64, len: u64| (off / cs, (off + len).div_ceil(cs));
            let fixed = vec![
                (0, 1),
                span(hdr.l1_table_offset, hdr.l1_size as u64 * 8),
                span(
                    hdr.refcount_table_offset,
                    hdr.refcount_table_clusters as u64 * cs,
                ),
            ];
            let mut a = Alloc::new(rc, hdr.cluster_bits, file_len, fixed);
            for &e in &l1 {
                let off = e & crate::mapping::OFFSET_MASK;
                if off != 0 {
                    a.note_table(off >> hdr.cluster_bits);
                }
            }
            if snap_len > 0 {
                let (s, e) = span(hdr.snapshots_offset, snap_len);
                a.note_fixed(s, e);
            }
            for s in &snapshots {
                note_snapshot_tables(&file, &mut a, s, hdr.cluster_bits, file_len)?;
            }
            Some(a)
        } else {
            None
        };
        let backing = match &hdr.backing_file {
            None => None,
            Some(name) => Some(open_backing(
                path,
                name,
                hdr.backing_format.as_deref(),
                depth,
            )?),
        };
        let snap_offset = if snap_len > 0 {
            hdr.snapshots_offset
        } else {
            0
        };
        let direct = if opts.direct {
            use std::os::unix::fs::OpenOptionsExt;
            let f = OpenOptions::new()
                .read(true)
                .write(!opts.read_only)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .map_err(io_ctx(format!("opening {p} with O_DIRECT")))?;
            Some(f)
        } else {
            None
        };
        let caches = if opts.cache_entries == 0 {
            Vec::new()
        } else {
            (0..opts.data_paths)
                .map(|_| MappingCache::new(opts.cache_entries))
                .collect()
        };
        Ok(Arc::new(ControlPlane {
            file,
            hdr,
            meta: Mutex::new(Meta {
                l1,
                alloc,
                held: HashMap::new(),
                file_len,
                closed: false,
                snapshots,
                snap_offset,
                snap_clusters: snap_len.div_ceil(cs),
            }),
            backing,
            direct,
            caches,
            read_only: opts.read_only,
            stats: CpStats::default(),
        }))
    }
}

/// Opens a backing file: its name is relative to the image's folder
/// unless absolute; its format comes from the image or from its magic.
fn open_backing(image: &Path, name: &str, format: Option<&str>, depth: usize) -> Result<Backing> {
    if depth + 1 >= MAX_BACKING_DEPTH {
        return Err(Error::Unsupported(format!(
            "backing chain deeper than {MAX_BACKING_DEPTH} (a loop?) at {name:?}"
        )));
    }
    let mut p = PathBuf::from(name);
    if p.is_relative() {
        if let Some(dir) = image.parent() {
            p = dir.join(p);
        }
    }
    let ctx = |e: Error| match e {
        Error::Io { ctx, source } => Error::Io {
            ctx: format!("backing file {}: {ctx}", p.display()),
            source,
        },
        Error::Corrupt(m) => Error::Corrupt(format!("backing file {}: {m}", p.display())),
        Error::Unsupported(m) => Error::Unsupported(format!("backing file {}: {m}", p.display())),
        other => other,
    };
    let format = match format {
        Some(f) => f.to_string(),
        None => {
            let f =
                File::open(&p).map_err(io_ctx(format!("opening backing file {}", p.display())))?;
            let mut magic = [0u8; 4];
            let is_qcow2 = read_exact(&f, 0, &mut magic).is_ok()
                && u32::from_be_bytes(magic) == crate::header::MAGIC;
            if is_qcow2 { "qcow2" } else { "raw" }.to_string()
        }
    };
    match format.as_str() {
        "raw" => {
            let f =
                File::open(&p).map_err(io_ctx(format!("opening backing file {}", p.display())))?;
            let size = f
                .metadata()
                .map_err(io_ctx(format!("stat backing file {}", p.display())))?
                .len();
            Ok(Backing::Raw { file: f, size })
        }
        "qcow2" => {
            let opts = Options {
                read_only: true,
                cache_entries: 0,
                data_paths: 1,
                direct: false,
            };
            let cp = ControlPlane::open_depth(&p, &opts, depth + 1).map_err(ctx)?;
            Ok(Backing::Qcow2(cp))
        }
        other => Err(Error::Unsupported(format!(
            "backing file format {other:?} (only raw and qcow2)"
        ))),
    }
}

/// Marks a snapshot's L1 table and L2 tables as metadata for the
/// allocator (checked like the active ones).
fn note_snapshot_tables(
    file: &File,
    a: &mut Alloc,
    s: &Snapshot,
    cb: u32,
    file_len: u64,
) -> Result<()> {
    let cs = 1u64 << cb;
    let len = s.l1_size as u64 * 8;
    if s.l1_size as u64 > crate::header::MAX_L1_ENTRIES
        || !s.l1_offset.is_multiple_of(cs)
        || s.l1_offset + len > file_len
    {
        return Err(Error::Corrupt(format!(
            "snapshot {:?}: L1 table at {:#x} ({} entries) is unaligned or past the end of the file",
            s.name, s.l1_offset, s.l1_size
        )));
    }
    a.note_fixed(
        s.l1_offset / cs,
        (s.l1_offset + len).div_ceil(cs).max(s.l1_offset / cs + 1),
    );
    let mut raw = vec![0u8; len as usize];
    read_exact(file, s.l1_offset, &mut raw).map_err(io_ctx("reading a snapshot's L1 table"))?;
    for (i, e) in raw.chunks_exact(8).enumerate() {
        let off = l1_offset(i, u64::from_be_bytes(e.try_into().unwrap()), cb, file_len)?;
        if off != 0 {
            a.note_table(off >> cb);
        }
    }
    Ok(())
}

impl crate::backing::Image for ControlPlane {
    fn size(&self) -> u64 {
        ControlPlane::size(self)
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.read_locked(off, buf)
    }
}
