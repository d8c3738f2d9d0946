# Metadata loop of bench/fs.sh and bench/fs-nfs.sh: a python loop of system
# calls (its own cost, a few us per call, is the same for every setup).
# usage: fs-meta.py DIR stat|create|readdir NFILES RUNTIME_S CREATE_BATCH
# DIR/meta holds NFILES files f0..; prints {"ops": N, "ops_s": R}.
import json, os, sys, time

d, what, n, runtime = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
batch = int(sys.argv[5])
ops, t0 = 0, time.perf_counter()
if what == "stat":
    names = [os.path.join(d, "meta", f"f{i}") for i in range(n)]
    while time.perf_counter() - t0 < runtime:
        for p in names:
            os.lstat(p)
        ops += n
elif what == "create":
    p = os.path.join(d, "cu")
    while time.perf_counter() - t0 < runtime:
        for i in range(batch):
            fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
            os.close(fd)
            os.unlink(p)
        ops += batch
elif what == "readdir":
    m = os.path.join(d, "meta")
    while time.perf_counter() - t0 < runtime:
        k = sum(1 for _ in os.scandir(m))
        assert k == n, k
        ops += 1
else:
    sys.exit(f"fs-meta.py: unknown job {what!r} (stat, create, readdir)")
el = time.perf_counter() - t0
print(json.dumps({"ops": ops, "ops_s": ops / el}))
