//! Small pieces the FUSE file-system mount tests share: a scratch layout
//! (a source directory and a mount point not yet made) and a plain HTTP
//! GET for a server's /metrics page.

use std::io::{Read, Write};
use std::path::PathBuf;

/// A fresh temporary directory holding `src` (made, empty) and the path
/// `m/mnt` (not made: the mount helpers create it). The directory goes
/// away when the returned `TempDir` is dropped.
pub fn mount_layout() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().expect("creating a temporary directory");
    let src = tmp.path().join("src");
    let mnt = tmp.path().join("m").join("mnt");
    std::fs::create_dir_all(&src).expect("creating the source directory");
    (tmp, src, mnt)
}

/// The whole answer (status line, headers and body) to `GET path` from
/// the HTTP/1.0 server at `addr`.
pub fn http_get(addr: &str, path: &str) -> String {
    let mut s =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").expect("sending the request");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("reading the answer");
    body
}
