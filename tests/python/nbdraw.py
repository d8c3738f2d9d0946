"""A minimal raw-socket NBD client for protocol corner-case tests.

Written from the NBD protocol specification (NetworkBlockDevice/nbd
doc/proto.md). It deliberately lets the caller send malformed things.
"""

import errno
import socket
import struct
import time

NBDMAGIC = b"NBDMAGIC"
IHAVEOPT = 0x49484156454F5054
OPT_REPLY_MAGIC = 0x3E889045565A9
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
STRUCTURED_REPLY_MAGIC = 0x668E33EF

# handshake flags
FLAG_FIXED_NEWSTYLE = 1
FLAG_NO_ZEROES = 2

# options
OPT_EXPORT_NAME = 1
OPT_ABORT = 2
OPT_LIST = 3
OPT_INFO = 6
OPT_GO = 7
OPT_STRUCTURED_REPLY = 8
OPT_LIST_META_CONTEXT = 9
OPT_SET_META_CONTEXT = 10

# option reply types
REP_ACK = 1
REP_SERVER = 2
REP_INFO = 3
REP_META_CONTEXT = 4
REP_ERR = 1 << 31
REP_ERR_UNSUP = REP_ERR + 1
REP_ERR_POLICY = REP_ERR + 2
REP_ERR_INVALID = REP_ERR + 3
REP_ERR_UNKNOWN = REP_ERR + 6
REP_ERR_TOO_BIG = REP_ERR + 9

INFO_EXPORT = 0
INFO_BLOCK_SIZE = 3

# transmission flags
TF_HAS_FLAGS = 1 << 0
TF_READ_ONLY = 1 << 1
TF_SEND_FLUSH = 1 << 2
TF_SEND_FUA = 1 << 3
TF_SEND_TRIM = 1 << 5
TF_SEND_DF = 1 << 7
TF_SEND_WRITE_ZEROES = 1 << 6
TF_CAN_MULTI_CONN = 1 << 8
TF_SEND_CACHE = 1 << 10
TF_SEND_FAST_ZERO = 1 << 11

# commands
CMD_READ = 0
CMD_WRITE = 1
CMD_DISC = 2
CMD_FLUSH = 3
CMD_TRIM = 4
CMD_CACHE = 5
CMD_WRITE_ZEROES = 6
CMD_BLOCK_STATUS = 7

CMD_FLAG_FUA = 1
CMD_FLAG_NO_HOLE = 2
CMD_FLAG_DF = 4
CMD_FLAG_REQ_ONE = 8
CMD_FLAG_FAST_ZERO = 0x10

# structured reply chunk types
RT_NONE = 0
RT_OFFSET_DATA = 1
RT_OFFSET_HOLE = 2
RT_BLOCK_STATUS = 5
RT_ERROR = (1 << 15) + 1
RT_ERROR_OFFSET = (1 << 15) + 2
REPLY_FLAG_DONE = 1


class Closed(Exception):
    """The server closed the connection."""


class Conn:
    """One raw connection. All reads have a timeout: a hang is a failure."""

    def __init__(self, sock_path=None, tcp=None, timeout=10.0):
        if sock_path:
            self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.s.settimeout(timeout)
            self.s.connect(sock_path)
        else:
            host, port = tcp
            self.s = socket.create_connection((host, port), timeout=timeout)
        self.structured = False
        self.size = None
        self.tflags = None
        self.block_size = None
        self.contexts = {}

    # -- raw I/O ---------------------------------------------------------
    def send(self, b):
        self.s.sendall(b)

    def recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.s.recv(n - len(buf))
            except ConnectionResetError:
                raise Closed("connection reset after %d of %d bytes" % (len(buf), n))
            if not chunk:
                raise Closed("EOF after %d of %d bytes" % (len(buf), n))
            buf += chunk
        return bytes(buf)

    def expect_closed(self, within=10.0):
        """Asserts the server closes the connection (EOF/reset) in time,
        sending nothing (or anything: we only drain) meanwhile."""
        deadline = time.monotonic() + within
        self.s.settimeout(0.5)
        while time.monotonic() < deadline:
            try:
                b = self.s.recv(65536)
            except socket.timeout:
                continue
            except (ConnectionResetError, BrokenPipeError):
                return
            if not b:
                return
        raise AssertionError("server did not close the connection within %.0fs" % within)

    def abort_rst(self):
        """Closes with a TCP-style reset where possible (SO_LINGER 0)."""
        try:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.s.close()

    def close(self):
        self.s.close()

    # -- handshake -------------------------------------------------------
    def greeting(self, client_flags=FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES):
        hello = self.recv_exact(18)
        assert hello[:8] == NBDMAGIC, "bad greeting %r" % hello[:8]
        magic, hflags = struct.unpack(">QH", hello[8:])
        assert magic == IHAVEOPT, "not newstyle: %x" % magic
        assert hflags & FLAG_FIXED_NEWSTYLE, "server is not fixed-newstyle"
        self.hflags = hflags
        if client_flags is not None:
            self.send(struct.pack(">I", client_flags))
        return hflags

    def send_option(self, opt, data=b"", magic=IHAVEOPT, length=None):
        if length is None:
            length = len(data)
        self.send(struct.pack(">QII", magic, opt, length) + data)

    def read_option_reply(self):
        hdr = self.recv_exact(20)
        magic, opt, rtype, length = struct.unpack(">QIII", hdr)
        assert magic == OPT_REPLY_MAGIC, "bad option reply magic %x" % magic
        data = self.recv_exact(length) if length else b""
        return opt, rtype, data

    def option(self, opt, data=b""):
        """Sends an option; returns the list of (type, data) replies up to
        the final one (ACK or an error)."""
        self.send_option(opt, data)
        out = []
        while True:
            ropt, rtype, rdata = self.read_option_reply()
            assert ropt == opt, "reply for option %d, expected %d" % (ropt, opt)
            out.append((rtype, rdata))
            if rtype == REP_ACK or rtype & REP_ERR:
                return out

    def go(self, name="", infos=(INFO_BLOCK_SIZE,), opt=OPT_GO):
        nb = name.encode()
        data = struct.pack(">I", len(nb)) + nb + struct.pack(">H", len(infos))
        data += b"".join(struct.pack(">H", i) for i in infos)
        replies = self.option(opt, data)
        rtype, rdata = replies[-1]
        if rtype != REP_ACK:
            raise AssertionError("GO %r failed: reply %x %r" % (name, rtype, rdata))
        for t, d in replies[:-1]:
            if t != REP_INFO:
                continue
            (it,) = struct.unpack(">H", d[:2])
            if it == INFO_EXPORT:
                self.size, self.tflags = struct.unpack(">QH", d[2:12])
            elif it == INFO_BLOCK_SIZE:
                self.block_size = struct.unpack(">III", d[2:14])
        assert self.size is not None, "GO: no NBD_INFO_EXPORT"
        return replies

    def negotiate_structured(self):
        r = self.option(OPT_STRUCTURED_REPLY)
        assert r[-1][0] == REP_ACK, "STRUCTURED_REPLY refused: %x" % r[-1][0]
        self.structured = True

    def set_meta_context(self, name="", queries=("base:allocation",), opt=OPT_SET_META_CONTEXT):
        nb = name.encode()
        data = struct.pack(">I", len(nb)) + nb + struct.pack(">I", len(queries))
        for q in queries:
            qb = q.encode()
            data += struct.pack(">I", len(qb)) + qb
        replies = self.option(opt, data)
        assert replies[-1][0] == REP_ACK, "meta context: %x" % replies[-1][0]
        for t, d in replies[:-1]:
            assert t == REP_META_CONTEXT, t
            (cid,) = struct.unpack(">I", d[:4])
            self.contexts[d[4:].decode()] = cid
        return self.contexts

    def connect(self, name="", structured=False, meta=False):
        self.greeting()
        if structured or meta:
            self.negotiate_structured()
        if meta:
            self.set_meta_context(name)
        self.go(name)
        return self

    # -- transmission ----------------------------------------------------
    def send_request(self, cmd, handle, offset=0, length=0, flags=0, data=b"",
                     magic=REQUEST_MAGIC):
        self.send(struct.pack(">IHHQQI", magic, flags, cmd, handle, offset, length) + data)

    def read_reply(self, read_len=0):
        """Reads one reply message. Returns a dict:
        simple:     {kind:'simple', handle, error, data}
        structured: {kind:'chunk', handle, flags, type, payload}
        `read_len` is the data length a successful simple read reply carries."""
        (magic,) = struct.unpack(">I", self.recv_exact(4))
        if magic == SIMPLE_REPLY_MAGIC:
            err, handle = struct.unpack(">IQ", self.recv_exact(12))
            data = self.recv_exact(read_len) if (err == 0 and read_len) else b""
            return {"kind": "simple", "handle": handle, "error": err, "data": data}
        if magic == STRUCTURED_REPLY_MAGIC:
            flags, typ, handle, length = struct.unpack(">HHQI", self.recv_exact(16))
            payload = self.recv_exact(length) if length else b""
            return {"kind": "chunk", "handle": handle, "flags": flags, "type": typ,
                    "payload": payload}
        raise AssertionError("bad reply magic %x" % magic)

    def transact(self, cmd, offset=0, length=0, flags=0, data=b"", handle=1):
        """One request, one complete reply. Returns (error, data, chunks)."""
        self.send_request(cmd, handle, offset, length, flags, data)
        return self.collect(handle, length if cmd == CMD_READ else 0, offset)

    def collect(self, handle, read_len=0, offset=0):
        """Reads replies until the one for `handle` is complete."""
        r = self.read_reply(read_len)
        assert r["handle"] == handle, "reply for handle %d, expected %d" % (r["handle"], handle)
        if r["kind"] == "simple":
            return r["error"], r["data"], []
        chunks = [r]
        while not (r["flags"] & REPLY_FLAG_DONE):
            r = self.read_reply()
            assert r["kind"] == "chunk", "simple reply in the middle of a structured reply"
            assert r["handle"] == handle, "interleaved handle %d" % r["handle"]
            chunks.append(r)
        err = 0
        buf = bytearray(read_len)
        covered = 0
        for c in chunks:
            t, p = c["type"], c["payload"]
            if t & (1 << 15):
                (e,) = struct.unpack(">I", p[:4])
                assert e != 0, "error chunk with error 0"
                err = err or e
            elif t == RT_OFFSET_DATA:
                (o,) = struct.unpack(">Q", p[:8])
                d = p[8:]
                assert offset <= o and o + len(d) <= offset + read_len, "data chunk out of range"
                buf[o - offset:o - offset + len(d)] = d
                covered += len(d)
            elif t == RT_OFFSET_HOLE:
                o, n = struct.unpack(">QI", p[:12])
                assert offset <= o and o + n <= offset + read_len, "hole chunk out of range"
                buf[o - offset:o - offset + n] = bytes(n)
                covered += n
        if err == 0 and read_len:
            assert covered == read_len, "read chunks cover %d of %d bytes" % (covered, read_len)
        return err, bytes(buf) if read_len else b"", chunks


def errname(e):
    return errno.errorcode.get(e, str(e))
