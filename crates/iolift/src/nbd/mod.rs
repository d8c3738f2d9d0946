//! The NBD front-end (protocol: NetworkBlockDevice/nbd doc/proto.md).
