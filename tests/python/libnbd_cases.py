#!/usr/bin/env python3
"""NBD corner cases through libnbd (python3-libnbd, the library behind nbdsh,
nbdinfo, nbdcopy and fio's nbd engine). Driven by
crates/iolift/tests/nbd_protocol.rs.

usage: libnbd_cases.py --uri URI [--ro-uri URI] CASE...

libnbd's strict mode would refuse out-of-range or read-only requests on the
client side; the error cases turn it off so that the server's own answer is
what gets checked. Each CASE ends by checking that a fresh client still
works. Prints "ok CASE".
"""

import argparse
import errno
import os
import sys

import nbd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from caserun import run_cases  # noqa: E402

ARGS = None
HOLE, ZERO = nbd.STATE_HOLE, nbd.STATE_ZERO


def handle(uri=None, structured=True, strict=True):
    h = nbd.NBD()
    h.set_request_structured_replies(structured)
    if structured:
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    if not strict:
        h.set_strict_mode(0)
    h.connect_uri(uri or ARGS.uri)
    return h


def errnum(e):
    """nbd.Error.errno is a name ('EINVAL') in python3-libnbd; a number elsewhere."""
    if isinstance(e.errno, str):
        return getattr(errno, e.errno, -1)
    return e.errno


def expect_errno(want, fn, *a):
    want = want if isinstance(want, (list, tuple)) else [want]
    try:
        fn(*a)
    except nbd.Error as e:
        got = errnum(e)
        assert got in want, "%s%r: errno %s (%s), want %s" % (
            fn.__name__, a[1:] if len(a) > 1 else a, e.errno,
            e.string, "/".join(errno.errorcode[w] for w in want))
        return e
    raise AssertionError("%s%r succeeded, want %s" % (
        fn.__name__, a, "/".join(errno.errorcode[w] for w in want)))


def check_alive():
    h = handle()
    buf = os.urandom(8192)
    h.pwrite(buf, 12 << 20)
    assert h.pread(8192, 12 << 20) == buf, "fresh client: read-back mismatch"
    h.flush()
    h.shutdown()


def extents(h, off, length):
    """[(offset, length, flags)] for base:allocation over [off, off+length)."""
    out = []

    def cb(meta, offset, entries, err):
        assert meta == nbd.CONTEXT_BASE_ALLOCATION, meta
        o = offset
        for i in range(0, len(entries), 2):
            out.append((o, entries[i], entries[i + 1]))
            o += entries[i]
        return 0

    pos = off
    while pos < off + length:
        n = len(out)
        h.block_status(off + length - pos, pos, cb)
        assert len(out) > n, "block_status returned no extent at %d" % pos
        pos = out[-1][0] + out[-1][1]
    return out


def flags_over(ext, off, length):
    """The set of flag values covering [off, off+length)."""
    s = set()
    for o, n, f in ext:
        if o < off + length and o + n > off:
            s.add(f)
    return s


# -- cases -------------------------------------------------------------------

def case_errors():
    h = handle(strict=False)
    size = h.get_size()
    expect_errno(errno.EINVAL, h.pread, 1024, size - 512)
    expect_errno(errno.EINVAL, h.pread, 1, size)
    expect_errno(errno.ENOSPC, h.pwrite, b"x" * 1024, size - 512)
    expect_errno([errno.EINVAL, errno.ENOSPC], h.trim, 1024, size - 512)
    expect_errno([errno.EINVAL, errno.ENOSPC], h.zero, 1024, size - 512)
    expect_errno(errno.EINVAL, h.cache, 1024, size - 512)
    expect_errno(errno.EINVAL, h.block_status, 1024, size - 512, lambda *a: 0)
    # unknown/misplaced command flags: NO_HOLE on a read
    expect_errno(errno.EINVAL, h.pread, 512, 0, nbd.CMD_FLAG_NO_HOLE)
    # the same connection still works
    assert len(h.pread(4096, 0)) == 4096
    h.shutdown()


def case_read_only():
    h = handle(ARGS.ro_uri, strict=False)
    assert h.is_read_only(), "read-only export not flagged READ_ONLY"
    before = h.pread(65536, 0)
    expect_errno(errno.EPERM, h.pwrite, b"\xee" * 4096, 0)
    # FUA may not be advertised on a read-only export: EINVAL is fine too
    expect_errno([errno.EPERM, errno.EINVAL], h.pwrite, b"\xee" * 4096, 0, nbd.CMD_FLAG_FUA)
    expect_errno(errno.EPERM, h.trim, 4096, 0)
    expect_errno(errno.EPERM, h.zero, 4096, 0)
    # FAST_ZERO is not advertised on a read-only export: EINVAL is fine too
    expect_errno([errno.EPERM, errno.EINVAL], h.zero, 4096, 0, nbd.CMD_FLAG_FAST_ZERO)
    assert h.pread(65536, 0) == before, "read-only export changed"
    h.shutdown()


def case_block_status():
    h = handle()
    assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION), "base:allocation not negotiated"
    mib = 1 << 20
    base = 32 * mib
    # fresh area: nothing written anywhere in [base, base+8M)
    h.trim(8 * mib, base)
    data = os.urandom(64 * 1024)
    h.pwrite(data, base + mib)              # data
    h.pwrite(os.urandom(mib), base + 3 * mib)
    h.trim(mib, base + 3 * mib)              # written, then trimmed
    h.pwrite(os.urandom(mib), base + 5 * mib)
    h.zero(mib, base + 5 * mib, nbd.CMD_FLAG_NO_HOLE)  # zeroed, must stay allocated
    h.flush()
    ext = extents(h, base, 8 * mib)
    total = sum(n for _, n, _ in ext)
    assert ext[0][0] == base and total >= 8 * mib, "extents do not cover the range: %r" % ext[:4]
    f = flags_over(ext, base + mib, len(data))
    assert all(x & HOLE == 0 and x & ZERO == 0 for x in f), \
        "written data reported as hole/zero: %r" % f
    f = flags_over(ext, base + 3 * mib, mib)
    assert f == {HOLE | ZERO}, "trimmed range: flags %r, want hole|zero" % f
    f = flags_over(ext, base + 5 * mib, mib)
    assert all(x & HOLE == 0 for x in f), "NO_HOLE zeroed range reported as a hole: %r" % f
    f = flags_over(ext, base + 7 * mib, mib)
    assert f == {HOLE | ZERO}, "never-written range: flags %r" % f
    # content agrees with the map
    assert h.pread(len(data), base + mib) == data
    assert h.pread(mib, base + 3 * mib) == bytes(mib)
    assert h.pread(mib, base + 5 * mib) == bytes(mib)
    # REQ_ONE: exactly one extent
    got = []
    h.block_status(8 * mib, base, lambda m, o, e, err: got.append(len(e)) or 0,
                   nbd.CMD_FLAG_REQ_ONE)
    assert got == [2], "REQ_ONE returned %r entries" % got
    h.shutdown()


def case_zero_flags():
    h = handle()
    mib = 1 << 20
    off = 48 * mib
    h.pwrite(b"\x5a" * mib, off)
    assert h.can_zero(), "export cannot WRITE_ZEROES"
    h.zero(mib // 2, off)
    assert h.pread(mib // 2, off) == bytes(mib // 2)
    assert h.pread(mib // 2, off + mib // 2) == b"\x5a" * (mib // 2), "zero went too far"
    h.pwrite(b"\x5b" * mib, off)
    h.zero(mib, off, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FUA)
    assert h.pread(mib, off) == bytes(mib)
    assert h.can_fast_zero(), "export does not advertise SEND_FAST_ZERO"
    h.pwrite(b"\x5c" * mib, off)
    try:
        h.zero(mib, off, nbd.CMD_FLAG_FAST_ZERO)
        assert h.pread(mib, off) == bytes(mib), "fast zero did not zero"
    except nbd.Error as e:
        # FAST_ZERO may only fail with ENOTSUP, leaving the data alone
        assert errnum(e) in (errno.ENOTSUP, errno.EOPNOTSUPP), "fast zero: %s" % e
        assert h.pread(mib, off) == b"\x5c" * mib, "failed fast zero changed data"
    h.shutdown()


def case_cache():
    h = handle()
    assert h.can_cache(), "export does not advertise SEND_CACHE"
    h.pwrite(b"c" * 65536, 0)
    h.cache(1 << 20, 0)
    assert h.pread(65536, 0) == b"c" * 65536, "CACHE changed data"
    h.shutdown()


def case_simple_vs_structured():
    mib = 1 << 20
    off = 56 * mib
    data = os.urandom(mib)
    hs = handle(structured=True)
    assert hs.get_structured_replies_negotiated(), "structured replies not negotiated"
    hs.pwrite(data, off)
    hs.flush()
    hp = handle(structured=False)
    assert not hp.get_structured_replies_negotiated()
    assert not hp.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    assert hp.pread(mib, off) == data, "simple-reply read mismatch"
    # structured read: chunks reassemble to the data (+ a hole/zero tail)
    chunks = []

    def cb(buf, offset, status, err):
        chunks.append((offset, len(buf), status))
        return 0

    buf = hs.pread_structured(2 * mib, off, cb)
    assert buf[:mib] == data and buf[mib:] == bytes(mib), "structured read mismatch"
    assert sum(n for _, n, _ in chunks) == 2 * mib, "chunks cover %d bytes" % sum(
        n for _, n, _ in chunks)
    assert all(s in (nbd.READ_DATA, nbd.READ_HOLE) for _, _, s in chunks), chunks
    # the same read in simple mode returns the same bytes
    assert hp.pread(2 * mib, off) == buf
    hs.shutdown()
    hp.shutdown()


def case_multi_conn():
    """Writes acknowledged on several connections are all visible, after a
    FLUSH on one of them, to a new connection (multi-conn consistency)."""
    hs = [handle() for _ in range(4)]
    assert all(h.can_multi_conn() for h in hs), "export does not advertise CAN_MULTI_CONN"
    blobs = {}
    cookies = []
    for i in range(64):
        h = hs[i % 4]
        d = os.urandom(65536)
        off = (64 << 20) + i * 65536
        blobs[off] = d
        cookies.append((h, h.aio_pwrite(d, off)))
    for h in hs:
        while h.aio_in_flight() > 0:
            h.poll(-1)
    for h, c in cookies:
        assert h.aio_command_completed(c)
    hs[2].flush()
    reader = handle()
    for off, d in blobs.items():
        assert reader.pread(len(d), off) == d, "write at %d not visible after flush" % off
    for h in hs + [reader]:
        h.shutdown()


def case_fua_and_flush():
    h = handle()
    assert h.can_fua() and h.can_flush(), "export lacks FUA/FLUSH"
    d = os.urandom(4096)
    h.pwrite(d, 4096, nbd.CMD_FLAG_FUA)
    h.flush()
    assert h.pread(4096, 4096) == d
    h.shutdown()


def case_many_in_flight():
    """256 mixed requests in flight on one connection."""
    h = handle()
    want = {}
    cs = []
    for i in range(128):
        off = (80 << 20) + i * 8192
        d = os.urandom(8192)
        want[off] = d
        cs.append(h.aio_pwrite(d, off))
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for c in cs:
        assert h.aio_command_completed(c), "write %d not completed" % c
    bufs = []
    for off in want:
        b = nbd.Buffer(8192)
        bufs.append((off, b, h.aio_pread(b, off)))
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for _, _, c in bufs:
        assert h.aio_command_completed(c)
    for off, b, _ in bufs:
        assert b.to_bytearray() == want[off], "aio read at %d mismatch" % off
    h.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--ro-uri")
    run_cases(globals(), p)


if __name__ == "__main__":
    main()
