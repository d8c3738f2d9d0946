//! Tests of the NBD front-end.
