/* The minimal NBD responder of the QD 1 floor sections (bench/nbd.sh
 * FLOOR=1, bench/qcow2.sh FLOOR=1): one thread per connection, a blocking
 * recv per request and one writev per reply, nothing else. Reads answer
 * zeros, or with FILE, pread(2) of that file opened with O_DIRECT (the
 * export is then the file's size; reads must be 4 KiB aligned); writes
 * are dropped. Not a server: a measuring stick for what any server can
 * reach through a client and a kernel.
 *
 *   cc -O2 -pthread -o floor bench/nbd-floor.c
 *   floor SOCKET SPIN(0|1) STRUCTURED(0|1) [FILE]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>
static int spin, sr, dfd = -1;
static uint64_t size = 1ULL << 30;
static int rd(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {
        ssize_t k = recv(fd, c, n, spin ? MSG_DONTWAIT : 0);
        if (k > 0) { c += k; n -= (size_t)k; continue; }
        if (k == 0) return -1;
        if (errno == EAGAIN || errno == EINTR) continue;
        return -1;
    }
    return 0;
}
static int wrv(int fd, struct iovec *v, int cnt) {
    while (cnt) {
        ssize_t k = writev(fd, v, cnt);
        if (k < 0) { if (errno == EINTR) continue; return -1; }
        while (cnt && (size_t)k >= v->iov_len) { k -= (ssize_t)v->iov_len; v++; cnt--; }
        if (cnt) { v->iov_base = (char *)v->iov_base + k; v->iov_len -= (size_t)k; }
    }
    return 0;
}
static int wr(int fd, const void *p, size_t n) {
    struct iovec v = {(void *)p, n};
    return wrv(fd, &v, 1);
}
static void be32(unsigned char *p, uint32_t x) { x = htobe32(x); memcpy(p, &x, 4); }
static void be64(unsigned char *p, uint64_t x) { x = htobe64(x); memcpy(p, &x, 8); }
static uint32_t get32(const unsigned char *p) { uint32_t x; memcpy(&x, p, 4); return be32toh(x); }
static int optrep(int fd, uint32_t opt, uint32_t type, const void *d, uint32_t len) {
    unsigned char h[20];
    be64(h, 0x3e889045565a9ULL); be32(h + 8, opt); be32(h + 12, type); be32(h + 16, len);
    if (wr(fd, h, 20)) return -1;
    return len ? wr(fd, d, len) : 0;
}
#define MAXLEN (32u << 20)
static void *conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    unsigned char *buf = NULL, g[18], oh[16], info[12], h[28], r[16];
    uint32_t cf;
    if (posix_memalign((void **)&buf, 4096, MAXLEN)) goto out;
    memset(buf, 0, MAXLEN);
    be64(g, 0x4e42444d41474943ULL); be64(g + 8, 0x49484156454F5054ULL); g[16] = 0; g[17] = 3;
    if (wr(fd, g, 18) || rd(fd, &cf, 4)) goto out;
    for (;;) { /* options: GO and EXPORT_NAME are answered, others unsupported */
        if (rd(fd, oh, 16)) goto out;
        uint32_t opt = get32(oh + 8), len = get32(oh + 12);
        if (len > MAXLEN || rd(fd, buf, len)) goto out;
        memset(info, 0, sizeof info); be64(info + 2, size); info[11] = 1; /* HAS_FLAGS */
        if (opt == 1) { if (wr(fd, info + 2, 10)) goto out; break; }
        if (opt == 7) { if (optrep(fd, 7, 3, info, 12) || optrep(fd, 7, 1, NULL, 0)) goto out; break; }
        if (opt == 2) goto out;
        if (opt == 8 && sr) { if (optrep(fd, 8, 1, NULL, 0)) goto out; continue; }
        if (optrep(fd, opt, 0x80000001u, NULL, 0)) goto out;
    }
    memset(buf, 0, MAXLEN);
    for (;;) { /* transmission: simple replies */
        if (rd(fd, h, 28)) goto out;
        uint16_t type = (uint16_t)(h[6] << 8 | h[7]);
        uint32_t len = get32(h + 24);
        if (type == 2) goto out;
        be32(r, 0x67446698); be32(r + 4, 0); memcpy(r + 8, h + 8, 8);
        if (type == 1 && (len > MAXLEN || rd(fd, buf, len))) goto out;
        if (type == 0 && len <= MAXLEN && dfd >= 0) { /* the file's bytes */
            uint64_t off; memcpy(&off, h + 16, 8); off = be64toh(off);
            if (pread(dfd, buf, len, (off_t)off) != (ssize_t)len) be32(r + 4, 5); /* EIO */
            if (get32(r + 4)) { struct iovec e = {r, 16}; if (wrv(fd, &e, 1)) goto out; continue; }
        }
        if (type == 0 && len <= MAXLEN && sr) { /* OFFSET_DATA chunk, flag DONE */
            unsigned char c[28];
            be32(c, 0x668e33ef); c[4] = 0; c[5] = 1; c[6] = 0; c[7] = 1;
            memcpy(c + 8, h + 8, 8); be32(c + 16, 8 + len); memcpy(c + 20, h + 16, 8);
            struct iovec v[2] = {{c, 28}, {buf, len}};
            if (wrv(fd, v, 2)) goto out;
            continue;
        }
        struct iovec v[2] = {{r, 16}, {buf, type == 0 && len <= MAXLEN ? len : 0}};
        if (type == 0 && len > MAXLEN) be32(r + 4, 22); /* simple error: fine for a floor */
        if (wrv(fd, v, 2)) goto out;
    }
out:
    free(buf);
    close(fd);
    return NULL;
}
int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: floor SOCKET SPIN(0|1) STRUCTURED(0|1) [FILE]\n"); return 2; }
    spin = atoi(argv[2]);
    sr = atoi(argv[3]);
    if (argc > 4) {
        dfd = open(argv[4], O_RDONLY | O_DIRECT);
        off_t end = dfd < 0 ? -1 : lseek(dfd, 0, SEEK_END);
        if (end < 0) { perror(argv[4]); return 1; }
        size = (uint64_t)end;
    }
    int l = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
    if (bind(l, (void *)&a, sizeof a) || listen(l, 16)) { perror("bind"); return 1; }
    for (;;) {
        int fd = accept(l, NULL, NULL);
        pthread_t t;
        if (fd >= 0 && pthread_create(&t, NULL, conn, (void *)(intptr_t)fd) == 0) pthread_detach(t);
        else if (fd >= 0) close(fd);
    }
}
