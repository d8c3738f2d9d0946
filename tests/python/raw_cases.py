#!/usr/bin/env python3
"""NBD protocol corner cases over a raw socket (malformed input the libnbd
client would never send). Driven by crates/iolift/tests/nbd_protocol.rs.

usage: raw_cases.py --socket PATH [--export NAME] [--ro-export NAME]
                    [--max-request BYTES] CASE...

Each CASE checks the server's exact answer, then that a fresh client can
still connect, write, read back and disconnect cleanly. Prints "ok CASE".
"""

import argparse
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nbdraw as N  # noqa: E402
from caserun import run_cases  # noqa: E402

EINVAL, EPERM, ENOSPC, EOVERFLOW, ENOMEM = 22, 1, 28, 75, 12

ARGS = None


def conn():
    return N.Conn(ARGS.socket)


def check_alive():
    """A fresh client connects, writes, reads back, disconnects."""
    c = conn().connect(ARGS.export, structured=True)
    pat = os.urandom(4096)
    off = 8192 * 3
    err, _, _ = c.transact(N.CMD_WRITE, off, len(pat), data=pat, handle=11)
    assert err == 0, "fresh client: write failed %s" % N.errname(err)
    err, data, _ = c.transact(N.CMD_READ, off, len(pat), handle=12)
    assert err == 0 and data == pat, "fresh client: read-back mismatch (err %s)" % N.errname(err)
    c.send_request(N.CMD_DISC, 13)
    c.expect_closed()


def expect_err(got, want, what):
    want = want if isinstance(want, (list, tuple)) else [want]
    assert got in want, "%s: got error %s, want %s" % (
        what, N.errname(got) if got else "success", "/".join(N.errname(w) for w in want))


# -- handshake ---------------------------------------------------------------

def case_truncated_handshake():
    # 1) connect and go away before sending anything
    c = conn()
    c.recv_exact(18)
    c.close()
    # 2) half of the client flags
    c = conn()
    c.recv_exact(18)
    c.send(b"\x00\x00")
    c.close()
    # 3) half an option header
    c = conn()
    c.greeting()
    c.send(struct.pack(">Q", N.IHAVEOPT) + b"\x00\x00")
    c.close()
    # 4) option header announcing data that never comes
    c = conn()
    c.greeting()
    c.send_option(N.OPT_GO, b"\x00\x00\x00", length=100)
    c.close()
    # 5) half a request header in transmission
    c = conn().connect(ARGS.export)
    c.send(struct.pack(">IHH", N.REQUEST_MAGIC, 0, N.CMD_READ))
    c.close()
    # 6) a write whose payload is cut short
    c = conn().connect(ARGS.export)
    c.send_request(N.CMD_WRITE, 1, 0, 65536, data=b"x" * 1000)
    c.close()


def case_bad_client_flags():
    c = conn()
    c.greeting(client_flags=0xFFFF0000)
    c.expect_closed()


def case_bad_option_magic():
    c = conn()
    c.greeting()
    c.send_option(N.OPT_GO, b"", magic=0x1122334455667788)
    c.expect_closed()


def case_unknown_option():
    c = conn()
    c.greeting()
    r = c.option(0x7777, b"hello")
    assert r[-1][0] == N.REP_ERR_UNSUP, "unknown option: reply %x, want NBD_REP_ERR_UNSUP" % r[-1][0]
    # the session goes on: a second unknown option, then GO works
    r = c.option(0xFFFF, b"")
    assert r[-1][0] == N.REP_ERR_UNSUP, "second unknown option: reply %x" % r[-1][0]
    c.go(ARGS.export)
    err, _, _ = c.transact(N.CMD_READ, 0, 512)
    assert err == 0, "read after unknown options: %s" % N.errname(err)
    c.close()


def case_huge_option():
    """An option longer than any real one (1 MiB): an error reply (the
    negotiation goes on) or a disconnect, never a hang."""
    c = conn()
    c.greeting()
    c.send_option(N.OPT_GO, bytes(1 << 20))
    try:
        _, rtype, _ = c.read_option_reply()
    except N.Closed:
        return
    except socket.timeout:
        raise AssertionError("server neither answered nor closed after a 1 MiB option")
    assert rtype & N.REP_ERR, "1 MiB option accepted: reply %x" % rtype
    c.go(ARGS.export)
    err, _, _ = c.transact(N.CMD_READ, 0, 512)
    assert err == 0, "read after a rejected huge option: %s" % N.errname(err)
    c.close()


def case_unknown_export():
    c = conn()
    c.greeting()
    nb = b"no-such-export-xyz"
    r = c.option(N.OPT_GO, struct.pack(">I", len(nb)) + nb + struct.pack(">H", 0))
    assert r[-1][0] in (N.REP_ERR_UNKNOWN, N.REP_ERR_UNSUP, N.REP_ERR_POLICY, N.REP_ERR_INVALID), \
        "GO to an unknown export: reply %x" % r[-1][0]
    assert r[-1][0] == N.REP_ERR_UNKNOWN, "want NBD_REP_ERR_UNKNOWN, got %x" % r[-1][0]
    c.go(ARGS.export)
    c.close()


def case_list_and_info():
    c = conn()
    c.greeting()
    r = c.option(N.OPT_LIST)
    assert r[-1][0] == N.REP_ACK, "LIST: %x" % r[-1][0]
    names = [d[4:4 + struct.unpack(">I", d[:4])[0]].decode() for t, d in r[:-1] if t == N.REP_SERVER]
    assert ARGS.export in names, "LIST %r lacks %r" % (names, ARGS.export)
    r = c.go(ARGS.export, opt=N.OPT_INFO)
    assert c.block_size is not None, "INFO: no NBD_INFO_BLOCK_SIZE"
    mn, pref, mx = c.block_size
    assert mn >= 1 and pref >= mn and mx >= pref, "block sizes %r" % (c.block_size,)
    # INFO leaves us in negotiation: GO still works
    c.go(ARGS.export)
    c.close()


def case_abort():
    c = conn()
    c.greeting()
    c.send_option(N.OPT_ABORT)
    try:
        _, rtype, _ = c.read_option_reply()
        assert rtype == N.REP_ACK, "ABORT reply %x" % rtype
    except N.Closed:
        pass  # the spec lets the server just close
    c.expect_closed()


def case_export_name():
    """Old-style NBD_OPT_EXPORT_NAME entry into transmission (with NO_ZEROES)."""
    c = conn()
    c.greeting()
    nb = ARGS.export.encode()
    c.send_option(N.OPT_EXPORT_NAME, nb)
    size, flags = struct.unpack(">QH", c.recv_exact(10))
    assert size > 0 and flags & N.TF_HAS_FLAGS, "EXPORT_NAME: size %d flags %x" % (size, flags)
    err, _, _ = c.transact(N.CMD_READ, 0, 4096)
    assert err == 0
    c.close()


# -- transmission ------------------------------------------------------------

def case_bad_request_magic():
    c = conn().connect(ARGS.export)
    c.send_request(N.CMD_READ, 1, 0, 512, magic=0xDEADBEEF)
    c.expect_closed()


def case_unknown_command():
    for structured in (False, True):
        c = conn().connect(ARGS.export, structured=structured)
        err, _, _ = c.transact(42, 0, 0, handle=5)
        expect_err(err, EINVAL, "unknown command (structured=%s)" % structured)
        # unknown flag on a read
        err, _, _ = c.transact(N.CMD_READ, 0, 512, flags=0x8000, handle=6)
        expect_err(err, EINVAL, "unknown command flag")
        err, _, _ = c.transact(N.CMD_READ, 0, 512, handle=7)
        assert err == 0, "read after unknown command: %s" % N.errname(err)
        c.close()


def case_out_of_range():
    c = conn().connect(ARGS.export, structured=True)
    size = c.size
    err, _, _ = c.transact(N.CMD_READ, size - 512, 1024, handle=1)
    expect_err(err, EINVAL, "read past end")
    err, _, _ = c.transact(N.CMD_READ, size, 1, handle=2)
    expect_err(err, EINVAL, "read at end")
    err, _, _ = c.transact(N.CMD_WRITE, size - 512, 1024, data=b"w" * 1024, handle=3)
    expect_err(err, ENOSPC, "write past end")
    err, _, _ = c.transact(N.CMD_TRIM, size - 512, 1024, handle=4)
    expect_err(err, (EINVAL, ENOSPC), "trim past end")
    err, _, _ = c.transact(N.CMD_WRITE_ZEROES, size, 4096, handle=5)
    expect_err(err, (EINVAL, ENOSPC), "write-zeroes past end")
    err, _, _ = c.transact(N.CMD_CACHE, size, 4096, handle=6)
    expect_err(err, EINVAL, "cache past end")
    # overflowing offset + length (wraps 2^64)
    big = (1 << 64) - 512
    err, _, _ = c.transact(N.CMD_READ, big, 1024, handle=7)
    expect_err(err, (EINVAL, EOVERFLOW), "read with overflowing offset")
    err, _, _ = c.transact(N.CMD_WRITE, big, 1024, data=b"o" * 1024, handle=8)
    expect_err(err, (ENOSPC, EINVAL, EOVERFLOW), "write with overflowing offset")
    err, _, _ = c.transact(N.CMD_TRIM, big, 1024, handle=9)
    expect_err(err, (EINVAL, ENOSPC, EOVERFLOW), "trim with overflowing offset")
    # the last in-range byte still works, and nothing was written past end
    err, data, _ = c.transact(N.CMD_READ, size - 512, 512, handle=10)
    assert err == 0, "read of the last sector: %s" % N.errname(err)
    assert data != b"w" * 512, "a rejected write past end changed the last sector"
    c.close()


def case_simple_replies():
    """Without STRUCTURED_REPLY every reply is simple; errors carry no data."""
    c = conn().connect(ARGS.export, structured=False)
    pat = os.urandom(65536)
    err, _, _ = c.transact(N.CMD_WRITE, 1 << 20, len(pat), data=pat, handle=1)
    assert err == 0, "simple write: %s" % N.errname(err)
    c.send_request(N.CMD_READ, 2, 1 << 20, len(pat))
    r = c.read_reply(len(pat))
    assert r["kind"] == "simple" and r["error"] == 0, "simple read reply %r" % {
        k: v for k, v in r.items() if k != "data"}
    assert r["data"] == pat, "simple read: wrong data"
    # an error reply for a read must not be followed by data: the next reply parses
    c.send_request(N.CMD_READ, 3, c.size, 4096)
    r = c.read_reply(4096)
    assert r["kind"] == "simple" and r["error"] == EINVAL, "read past end: %r" % r
    c.send_request(N.CMD_FLUSH, 4)
    r = c.read_reply()
    assert r["kind"] == "simple" and r["handle"] == 4 and r["error"] == 0, r
    c.close()


def case_structured_replies():
    c = conn().connect(ARGS.export, structured=True)
    pat = os.urandom(65536)
    off = 2 << 20
    err, _, _ = c.transact(N.CMD_WRITE, off, len(pat), data=pat, handle=1)
    assert err == 0, "structured write: %s" % N.errname(err)
    # read data + a never-written (zero) tail
    err, data, chunks = c.transact(N.CMD_READ, off, 131072, handle=2)
    assert err == 0 and data == pat + bytes(65536), "structured read content"
    assert all(ch["kind"] == "chunk" for ch in chunks)
    assert chunks[-1]["flags"] & N.REPLY_FLAG_DONE
    # DF: at most one content chunk; EINVAL if SEND_DF is not advertised
    err, data, chunks = c.transact(N.CMD_READ, off, 65536, flags=N.CMD_FLAG_DF, handle=3)
    if c.tflags & N.TF_SEND_DF:
        assert err == 0 and data == pat, "DF read: %s" % N.errname(err)
        assert sum(1 for ch in chunks if ch["type"] in (N.RT_OFFSET_DATA, N.RT_OFFSET_HOLE)) \
            <= 1, "DF read sent several content chunks"
    else:
        expect_err(err, EINVAL, "DF read without SEND_DF")
    # an error arrives as an error chunk carrying EINVAL
    err, _, chunks = c.transact(N.CMD_READ, c.size, 512, handle=4)
    assert err == EINVAL, N.errname(err)
    assert any(ch["type"] in (N.RT_ERROR, N.RT_ERROR_OFFSET) for ch in chunks), \
        "no error chunk for a failed structured read"
    c.close()


def case_out_of_order():
    """Many requests in flight on one connection; every handle answered once."""
    c = conn().connect(ARGS.export, structured=True)
    n = 64
    blobs = {}
    for i in range(n):
        d = os.urandom(4096)
        blobs[i] = d
        c.send_request(N.CMD_WRITE, 1000 + i, (4 << 20) + i * 4096, 4096, data=d)
    seen = set()
    for _ in range(n):
        r = c.read_reply()
        if r["kind"] == "simple":
            assert r["error"] == 0
            h = r["handle"]
        else:
            assert r["flags"] & N.REPLY_FLAG_DONE and r["type"] == N.RT_NONE, r
            h = r["handle"]
        assert 1000 <= h < 1000 + n and h not in seen, "bad/duplicate handle %d" % h
        seen.add(h)
    for i in range(n):
        c.send_request(N.CMD_READ, 5000 + i, (4 << 20) + i * 4096, 4096)
    got = {}
    pending = set(range(5000, 5000 + n))
    while pending:
        # collect() would require order: parse chunks by handle here instead
        r = c.read_reply(4096)
        h = r["handle"]
        assert h in pending, "unexpected handle %d" % h
        if r["kind"] == "simple":
            assert r["error"] == 0
            got[h] = r["data"]
            pending.discard(h)
            continue
        if r["type"] == N.RT_OFFSET_DATA:
            got.setdefault(h, bytearray(4096))
            (o,) = struct.unpack(">Q", r["payload"][:8])
            base = (4 << 20) + (h - 5000) * 4096
            got[h][o - base:o - base + len(r["payload"]) - 8] = r["payload"][8:]
        elif r["type"] & (1 << 15):
            raise AssertionError("error chunk for read %d" % h)
        if r["flags"] & N.REPLY_FLAG_DONE:
            pending.discard(h)
    for i in range(n):
        assert bytes(got[5000 + i]) == blobs[i], "read %d returned wrong data" % i
    c.close()


def case_oversized_request():
    mx = ARGS.max_request
    c = conn().connect(ARGS.export, structured=True)
    if c.block_size:
        assert c.block_size[2] <= mx, "advertised max block %d > --max-request %d" % (
            c.block_size[2], mx)
    err, _, _ = c.transact(N.CMD_READ, 0, mx + 1, handle=1)
    expect_err(err, (EINVAL, EOVERFLOW, ENOMEM), "read of max_request+1 bytes")
    err, _, _ = c.transact(N.CMD_READ, 0, 4096, handle=2)
    assert err == 0, "connection unusable after an oversized read"
    c.close()
    # an oversized write: an error (payload skipped) or a disconnect, never a hang
    c = conn().connect(ARGS.export, structured=True)
    c.send_request(N.CMD_WRITE, 3, 0, mx + 4096)
    try:
        c.send(bytes(mx + 4096))
    except (BrokenPipeError, ConnectionResetError):
        return
    except socket.timeout:
        pass
    try:
        err, _, _ = c.collect(3)
        expect_err(err, (EINVAL, EOVERFLOW, ENOMEM, ENOSPC), "oversized write")
        err, data, _ = c.transact(N.CMD_READ, 0, 4096, handle=4)
        assert err == 0, "read after an oversized write: %s" % N.errname(err)
    except N.Closed:
        pass
    c.close()


def case_read_only():
    name = ARGS.ro_export
    c = conn().connect(name, structured=True)
    assert c.tflags & N.TF_READ_ONLY, "export %r not flagged read-only: %x" % (name, c.tflags)
    err, before, _ = c.transact(N.CMD_READ, 0, 4096, handle=1)
    assert err == 0
    err, _, _ = c.transact(N.CMD_WRITE, 0, 4096, data=b"\xaa" * 4096, handle=2)
    expect_err(err, EPERM, "write to read-only export")
    err, _, _ = c.transact(N.CMD_TRIM, 0, 4096, handle=3)
    expect_err(err, EPERM, "trim on read-only export")
    err, _, _ = c.transact(N.CMD_WRITE_ZEROES, 0, 4096, handle=4)
    expect_err(err, EPERM, "write-zeroes on read-only export")
    err, after, _ = c.transact(N.CMD_READ, 0, 4096, handle=5)
    assert err == 0 and after == before, "read-only export changed"
    c.close()


def flood(c, n):
    """Queues up to n writes+reads without reading replies, until the socket
    buffer is full (then stops: the server is busy answering)."""
    c.s.settimeout(0.2)
    sent = 0
    try:
        for i in range(n):
            c.send_request(N.CMD_READ, 100 + i, i * 65536, 65536)
            c.send_request(N.CMD_WRITE, i, (8 << 20) + i * 65536, 65536, data=b"v" * 65536)
            sent += 1
        # a write whose payload never fully arrives
        c.send_request(N.CMD_WRITE, 999, 0, 65536, data=b"half")
    except (socket.timeout, BlockingIOError):
        pass
    return sent


def case_client_vanishes():
    """Clients die with many requests in flight (unread replies, half-sent
    payloads); another client keeps working meanwhile."""
    bystander = conn().connect(ARGS.export, structured=True)
    for k in range(8):
        c = conn().connect(ARGS.export, structured=(k % 2 == 0))
        sent = flood(c, 64)
        assert sent > 0, "could not queue a single request"
        if k % 2:
            c.abort_rst()
        else:
            c.close()
        err, _, _ = bystander.transact(N.CMD_READ, 0, 4096, handle=50 + k)
        assert err == 0, "bystander read failed after client %d vanished" % k
    bystander.close()
    time.sleep(0.2)


def case_disc_flushes_inflight():
    """NBD_CMD_DISC after writes still in flight: they are all done before close."""
    c = conn().connect(ARGS.export)
    blobs = [os.urandom(4096) for _ in range(32)]
    base = 16 << 20
    for i, b in enumerate(blobs):
        c.send_request(N.CMD_WRITE, i, base + i * 4096, 4096, data=b)
    c.send_request(N.CMD_DISC, 99)
    # replies for the writes may come, then EOF
    n = 0
    try:
        while True:
            r = c.read_reply()
            assert r["error"] == 0
            n += 1
    except N.Closed:
        pass
    d = conn().connect(ARGS.export)
    for i, b in enumerate(blobs):
        err, data, _ = d.transact(N.CMD_READ, base + i * 4096, 4096, handle=i)
        assert err == 0 and data == b, "write %d before DISC lost" % i
    d.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--export", default="")
    p.add_argument("--ro-export", default="ro")
    p.add_argument("--max-request", type=int, default=32 << 20)
    run_cases(globals(), p)


if __name__ == "__main__":
    main()
