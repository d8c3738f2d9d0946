// iolift: CRUSH do_rule on the GPU, bit-exact with crates/iolift-crush
// (src/mapper.rs, itself bit-exact with Ceph's mapper.c).
//
// This file is compiled three ways:
//   * by NVRTC at run time (the CUDA device), kernels below are the entry points;
//   * by NVRTC in CPU-only CI (crates/iolift-offload/tests/nvrtc.rs) to PTX,
//     so a kernel that does not compile fails the suite;
//   * by the host C++ compiler (g++) as a plain shared library with the shims
//     below, so the very same device code runs on the CPU and is compared
//     with the Rust mapper bit for bit (tests/host_kernel.rs).
//
// The map arrives as one flat u32 buffer (layout: crates/iolift-offload/src/kernels/crush/flat.rs
// and docs/offload.md), the straw2 numerators as a 65536-entry s64 table
// (crush_ln(u) - 2^48 for every u), the device reweights as u32s.
//
// Per mapping state is bounded: results up to CR_MAX_RESULT items; the
// uniform-bucket permutation is computed lazily (it is a pure function of
// x, bucket and r % size) in a sparse table of CR_PERM_CAP entries. An input
// that would exceed either bound is flagged (length CR_LEN_FALLBACK) and the
// host maps it with the CPU mapper, so results stay exact.

typedef unsigned int u32;
typedef int s32;
typedef unsigned long long u64;
typedef long long s64;

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CR_GPU 1
#define CR_FN __device__ __forceinline__
#define CR_FN_NOINLINE __device__ __noinline__
#define CR_EXTERN extern "C"
#define CR_BOUNDS(t, b) __launch_bounds__(t, b)
#else
#define CR_GPU 0
#define CR_BOUNDS(t, b)
#define CR_FN static inline
#define CR_FN_NOINLINE static
#define __global__
#define __device__
#define CR_EXTERN extern "C"
// Host shims for the CUDA built-ins the kernels use. Thread-local so a
// multi-threaded host caller can emulate several blocks at once.
struct cr_dim3 {
    u32 x, y, z;
};
static thread_local cr_dim3 threadIdx, blockIdx, blockDim, gridDim;
#endif

#define CR_ITEM_NONE 0x7fffffff
#define CR_ITEM_UNDEF 0x7ffffffe
#define CR_MAX_RESULT 32
#define CR_PERM_CAP 64
#define CR_LEN_FALLBACK 0xffffffffu
#define CR_S64_MIN (-9223372036854775807LL - 1)

#define CR_ALG_UNIFORM 1
#define CR_ALG_LIST 2
#define CR_ALG_TREE 3
#define CR_ALG_STRAW 4
#define CR_ALG_STRAW2 5

#define CR_OP_TAKE 1
#define CR_OP_CHOOSE_FIRSTN 2
#define CR_OP_CHOOSE_INDEP 3
#define CR_OP_EMIT 4
#define CR_OP_CHOOSELEAF_FIRSTN 6
#define CR_OP_CHOOSELEAF_INDEP 7
#define CR_OP_SET_CHOOSE_TRIES 8
#define CR_OP_SET_CHOOSELEAF_TRIES 9
#define CR_OP_SET_CHOOSE_LOCAL_TRIES 10
#define CR_OP_SET_CHOOSE_LOCAL_FALLBACK_TRIES 11
#define CR_OP_SET_CHOOSELEAF_VARY_R 12
#define CR_OP_SET_CHOOSELEAF_STABLE 13

// Flat map header (u32 words). Keep in sync with flat.rs.
#define H_MAGIC 0
#define H_MAX_DEVICES 1
#define H_MAX_BUCKETS 2
#define H_MAX_RULES 3
#define H_LOCAL_TRIES 4
#define H_LOCAL_FALLBACK 5
#define H_TOTAL_TRIES 6
#define H_DESCEND_ONCE 7
#define H_VARY_R 8
#define H_STABLE 9
#define H_BUCKETS_OFF 10
#define H_RULES_OFF 11
#define H_WORDS 16
#define CR_MAGIC 0x4352554du

// Bucket record (B_WORDS u32 each, slot i = bucket id -1-i).
#define B_ID 0
#define B_ALG 1
#define B_TYPE 2
#define B_SIZE 3
#define B_ITEMS 4
#define B_IW 5
#define B_AUX 6
#define B_AUXLEN 7
#define B_CA_IDS 8
#define B_CA_WS 9
#define B_CA_NPOS 10
#define B_WORDS 12
#define CR_NO_OFF 0xffffffffu

// ---------------------------------------------------------------- hashing

// One step of the mix: x = (x - y - z) ^ (z shifted), as in iolift-crush's
// hash.rs (`mix`); nine steps rotate through (a, b, c).
#define CR_MIX_STEP(x, y, z, shifted) x = (x - y - z) ^ (shifted)
#define CR_MIX(a, b, c)                     \
    do {                                    \
        CR_MIX_STEP(a, b, c, c >> 13);      \
        CR_MIX_STEP(b, c, a, a << 8);       \
        CR_MIX_STEP(c, a, b, b >> 13);      \
        CR_MIX_STEP(a, b, c, c >> 12);      \
        CR_MIX_STEP(b, c, a, a << 16);      \
        CR_MIX_STEP(c, a, b, b >> 5);       \
        CR_MIX_STEP(a, b, c, c >> 3);       \
        CR_MIX_STEP(b, c, a, a << 10);      \
        CR_MIX_STEP(c, a, b, b >> 15);      \
    } while (0)

#define CR_SEED 1315423911u
#define CR_XC 231232u
#define CR_YC 1232u

CR_FN u32 cr_hash2(u32 a, u32 b) {
    u32 h = CR_SEED ^ a ^ b, x = CR_XC, y = CR_YC;
    CR_MIX(a, b, h);
    CR_MIX(x, a, h);
    CR_MIX(b, y, h);
    return h;
}

CR_FN u32 cr_hash3(u32 a, u32 b, u32 c) {
    u32 h = CR_SEED ^ a ^ b ^ c, x = CR_XC, y = CR_YC;
    CR_MIX(a, b, h);
    CR_MIX(c, x, h);
    CR_MIX(y, a, h);
    CR_MIX(b, x, h);
    CR_MIX(y, c, h);
    return h;
}

CR_FN u32 cr_hash4(u32 a, u32 b, u32 c, u32 d) {
    u32 h = CR_SEED ^ a ^ b ^ c ^ d, x = CR_XC, y = CR_YC;
    CR_MIX(a, b, h);
    CR_MIX(c, d, h);
    CR_MIX(a, x, h);
    CR_MIX(y, b, h);
    CR_MIX(c, x, h);
    CR_MIX(y, d, h);
    return h;
}

CR_FN u32 cr_ctz(u32 v) {
#if CR_GPU
    return (u32)(__ffs((int)v) - 1);
#else
    return (u32)__builtin_ctz(v);
#endif
}

// ---------------------------------------------------------------- context

struct CrCtx {
    const u32 *m;     // flat map
    const s64 *lnt;   // straw2 numerators, 65536 entries
    const u32 *w;     // device reweights (16.16)
    u32 wmax;         // reweight vector length
    u32 x;            // the input, as a bit pattern
    u32 lane, nlanes; // warp kernel: this lane, lanes per mapping (1 = thread kernel)
    int err;          // set when a bound is exceeded: host falls back
};

CR_FN const u32 *cr_bucket(const CrCtx *c, s32 id) {
    if (id >= 0) return 0;
    s64 idx = -1LL - (s64)id;
    if (idx >= (s64)c->m[H_MAX_BUCKETS]) return 0;
    const u32 *b = c->m + c->m[H_BUCKETS_OFF] + (u64)idx * B_WORDS;
    if (b[B_ALG] == 0) return 0;
    return b;
}

CR_FN const s32 *cr_items(const CrCtx *c, const u32 *b) { return (const s32 *)(c->m + b[B_ITEMS]); }

// ---------------------------------------------------------------- bucket algorithms

// Fisher-Yates prefix of the bucket permutation, kept sparse: only the
// positions touched so far are stored (identity elsewhere).
struct CrPerm {
    u32 pos[CR_PERM_CAP];
    u32 val[CR_PERM_CAP];
    u32 n;
};

CR_FN u32 cr_perm_get(const CrPerm *p, u32 i) {
    for (u32 k = 0; k < p->n; k++)
        if (p->pos[k] == i) return p->val[k];
    return i;
}

CR_FN void cr_perm_set(CrCtx *c, CrPerm *p, u32 i, u32 v) {
    for (u32 k = 0; k < p->n; k++)
        if (p->pos[k] == i) {
            p->val[k] = v;
            return;
        }
    if (p->n == CR_PERM_CAP) {
        c->err = 1;
        return;
    }
    p->pos[p->n] = i;
    p->val[p->n] = v;
    p->n++;
}

CR_FN_NOINLINE s32 cr_perm_choose(CrCtx *c, const u32 *b, s32 r) {
    u32 size = b[B_SIZE];
    u32 pr = (u32)r % size;
    u32 id = b[B_ID];
    const s32 *items = cr_items(c, b);
    if (pr == 0) return items[cr_hash3(c->x, id, 0) % size];
    if (pr >= CR_PERM_CAP / 2) {
        c->err = 1;
        return items[0];
    }
    CrPerm p;
    p.n = 0;
    for (u32 pn = 0; pn <= pr; pn++) {
        if (pn < size - 1) {
            u32 i = cr_hash3(c->x, id, pn) % (size - pn);
            if (i != 0) {
                u32 a = cr_perm_get(&p, pn + i), bb = cr_perm_get(&p, pn);
                cr_perm_set(c, &p, pn + i, bb);
                cr_perm_set(c, &p, pn, a);
            }
        }
    }
    return items[cr_perm_get(&p, pr)];
}

CR_FN s32 cr_list_choose(const CrCtx *c, const u32 *b, u32 r) {
    const s32 *items = cr_items(c, b);
    const u32 *iw = c->m + b[B_IW];
    const u32 *sum = c->m + b[B_AUX];
    for (s32 i = (s32)b[B_SIZE] - 1; i >= 0; i--) {
        u64 h = (u64)(cr_hash4(c->x, (u32)items[i], r, b[B_ID]) & 0xffff);
        u64 w = (h * (u64)sum[i]) >> 16;
        if (w < (u64)iw[i]) return items[i];
    }
    return items[0];
}

CR_FN s32 cr_tree_choose(const CrCtx *c, const u32 *b, u32 r) {
    const s32 *items = cr_items(c, b);
    const u32 *nw = c->m + b[B_AUX];
    u32 n = b[B_AUXLEN] >> 1;
    while ((n & 1) == 0 && n != 0) {
        u64 w = nw[n];
        u64 t = ((u64)cr_hash4(c->x, n, r, b[B_ID]) * w) >> 32;
        u32 h = cr_ctz(n);
        u32 l = n - (1u << (h - 1));
        if (t < (u64)nw[l])
            n = l;
        else
            n += 1u << (h - 1);
    }
    u32 i = n >> 1;
    return i < b[B_SIZE] ? items[i] : items[0];
}

CR_FN s32 cr_straw_choose(const CrCtx *c, const u32 *b, u32 r) {
    const s32 *items = cr_items(c, b);
    const u32 *straws = c->m + b[B_AUX];
    u32 high = 0;
    u64 high_draw = 0;
    for (u32 i = 0; i < b[B_SIZE]; i++) {
        u64 draw = (u64)(cr_hash3(c->x, (u32)items[i], r) & 0xffff) * (u64)straws[i];
        if (i == 0 || draw > high_draw) {
            high = i;
            high_draw = draw;
        }
    }
    return items[high];
}

// Best (draw, index): higher draw wins, equal draws keep the lower index
// (what the sequential "first strictly greater" scan picks).
CR_FN void cr_best(s64 *bd, u32 *bi, s64 d, u32 i) {
    if (d > *bd || (d == *bd && i < *bi)) {
        *bd = d;
        *bi = i;
    }
}

// Draws of items lane, lane+nlanes, ... of a straw2 bucket.
CR_FN void cr_straw2_part(const CrCtx *c, const u32 *b, u32 r, s32 position, u32 lane, u32 nlanes, s64 *bd,
                          u32 *bi) {
    const u32 *weights = c->m + b[B_IW];
    const s32 *ids = cr_items(c, b);
    if (b[B_CA_WS] != CR_NO_OFF && b[B_CA_NPOS] > 0) {
        u32 p = (u32)position;
        if (p > b[B_CA_NPOS] - 1) p = b[B_CA_NPOS] - 1;
        weights = c->m + b[B_CA_WS] + (u64)p * b[B_SIZE];
    }
    if (b[B_CA_IDS] != CR_NO_OFF) ids = (const s32 *)(c->m + b[B_CA_IDS]);
    for (u32 i = lane; i < b[B_SIZE]; i += nlanes) {
        u32 w = weights[i];
        s64 draw;
        if (w != 0) {
            u32 u = cr_hash3(c->x, (u32)ids[i], r) & 0xffff;
            draw = c->lnt[u] / (s64)w;
        } else {
            draw = CR_S64_MIN;
        }
        cr_best(bd, bi, draw, i);
    }
}

CR_FN s32 cr_straw2_choose(const CrCtx *c, const u32 *b, u32 r, s32 position) {
    s64 bd = CR_S64_MIN;
    u32 bi = 0xffffffffu;
    if (c->nlanes <= 1) {
        cr_straw2_part(c, b, r, position, 0, 1, &bd, &bi);
    } else {
#if CR_GPU
        // Latency kernel: this lane's share, then a butterfly reduction;
        // every lane ends with the same winner.
        cr_straw2_part(c, b, r, position, c->lane, c->nlanes, &bd, &bi);
        for (u32 off = c->nlanes >> 1; off > 0; off >>= 1) {
            s64 od = __shfl_xor_sync(0xffffffffu, bd, off);
            u32 oi = __shfl_xor_sync(0xffffffffu, bi, off);
            cr_best(&bd, &bi, od, oi);
        }
#else
        // Host emulation of the warp: each lane's partial, then the same
        // butterfly combine over the lane values.
        s64 ld[32];
        u32 li[32];
        u32 n = c->nlanes > 32 ? 32 : c->nlanes;
        for (u32 l = 0; l < n; l++) {
            ld[l] = CR_S64_MIN;
            li[l] = 0xffffffffu;
            cr_straw2_part(c, b, r, position, l, n, &ld[l], &li[l]);
        }
        for (u32 off = n >> 1; off > 0; off >>= 1) {
            s64 nd[32];
            u32 ni[32];
            for (u32 l = 0; l < n; l++) {
                nd[l] = ld[l];
                ni[l] = li[l];
                cr_best(&nd[l], &ni[l], ld[l ^ off], li[l ^ off]);
            }
            for (u32 l = 0; l < n; l++) {
                ld[l] = nd[l];
                li[l] = ni[l];
            }
        }
        bd = ld[0];
        bi = li[0];
#endif
    }
    if (bi == 0xffffffffu) bi = 0;
    return cr_items(c, b)[bi];
}

CR_FN s32 cr_bucket_choose(CrCtx *c, const u32 *b, s32 r, s32 position) {
    switch (b[B_ALG]) {
    case CR_ALG_UNIFORM:
        return cr_perm_choose(c, b, r);
    case CR_ALG_LIST:
        return cr_list_choose(c, b, (u32)r);
    case CR_ALG_TREE:
        return cr_tree_choose(c, b, (u32)r);
    case CR_ALG_STRAW:
        return cr_straw_choose(c, b, (u32)r);
    case CR_ALG_STRAW2:
        return cr_straw2_choose(c, b, (u32)r, position);
    default:
        return cr_items(c, b)[0];
    }
}

CR_FN bool cr_is_out(const CrCtx *c, s32 item) {
    if ((u32)item >= c->wmax) return true;
    u32 w = c->w[item];
    if (w >= 0x10000) return false;
    if (w == 0) return true;
    return (cr_hash2(c->x, (u32)item) & 0xffff) >= w;
}

// ---------------------------------------------------------------- choose_firstn / choose_indep

template <int DEPTH>
CR_FN_NOINLINE u32 cr_choose_firstn(CrCtx *c, const u32 *bucket, s32 numrep, s32 type, s32 *out, u32 outpos,
                                    s32 out_size, u32 tries, u32 recurse_tries, u32 local_retries,
                                    u32 local_fallback, bool recurse_to_leaf, u32 vary_r, u32 stable, s32 *out2,
                                    s32 parent_r) {
    const s32 max_devices = (s32)c->m[H_MAX_DEVICES];
    s32 count = out_size;
    s32 rep = stable ? 0 : (s32)outpos;
    while (rep < numrep && count > 0) {
        u32 ftotal = 0;
        bool skip_rep = false;
        s32 item = 0;
        for (;;) { // retry_descent
            bool retry_descent = false;
            const u32 *in_b = bucket;
            u32 flocal = 0;
            for (;;) { // retry_bucket
                bool retry_bucket = false;
                bool collide = false;
                bool reject;
                s32 r = (s32)((u32)rep + (u32)parent_r + ftotal);
                u32 size = in_b[B_SIZE];
                if (size == 0) {
                    reject = true;
                } else {
                    if (local_fallback > 0 && flocal >= (size >> 1) && flocal > local_fallback)
                        item = cr_perm_choose(c, in_b, r);
                    else
                        item = cr_bucket_choose(c, in_b, r, (s32)outpos);
                    if (c->err) return outpos;
                    if (item >= max_devices) {
                        skip_rep = true;
                        break;
                    }
                    s32 itemtype = 0;
                    const u32 *ib = 0;
                    if (item < 0) {
                        ib = cr_bucket(c, item);
                        if (!ib) {
                            skip_rep = true;
                            break;
                        }
                        itemtype = (s32)ib[B_TYPE];
                    }
                    if (itemtype != type) {
                        if (ib) {
                            in_b = ib;
                            continue;
                        }
                        skip_rep = true;
                        break;
                    }
                    for (u32 i = 0; i < outpos; i++)
                        if (out[i] == item) {
                            collide = true;
                            break;
                        }
                    bool rej = false;
                    if (DEPTH == 0 && !collide && recurse_to_leaf && out2) {
                        if (item < 0) {
                            s32 sub_r = vary_r ? (s32)(r >> (vary_r - 1)) : 0;
                            u32 got = 0;
                            if constexpr (DEPTH == 0) {
                                got = cr_choose_firstn<1>(c, ib, stable ? 1 : (s32)outpos + 1, 0, out2, outpos,
                                                          count, recurse_tries, 0, local_retries, local_fallback,
                                                          false, vary_r, stable, 0, sub_r);
                            }
                            if (c->err) return outpos;
                            if (got <= outpos) rej = true;
                        } else {
                            out2[outpos] = item;
                        }
                    }
                    if (!rej && !collide && itemtype == 0) rej = cr_is_out(c, item);
                    reject = rej;
                }
                if (reject || collide) {
                    ftotal++;
                    flocal++;
                    if (collide && flocal <= local_retries)
                        retry_bucket = true;
                    else if (local_fallback > 0 && flocal <= size + local_fallback)
                        retry_bucket = true;
                    else if (ftotal < tries)
                        retry_descent = true;
                    else
                        skip_rep = true;
                }
                if (!retry_bucket) break;
            }
            if (!retry_descent) break;
        }
        if (!skip_rep) {
            out[outpos] = item;
            outpos++;
            count--;
        }
        rep++;
    }
    return outpos;
}

template <int DEPTH>
CR_FN_NOINLINE void cr_choose_indep(CrCtx *c, const u32 *bucket, s32 left, s32 numrep, s32 type, s32 *out,
                                    u32 outpos, u32 tries, u32 recurse_tries, bool recurse_to_leaf, s32 *out2,
                                    s32 parent_r) {
    const s32 max_devices = (s32)c->m[H_MAX_DEVICES];
    u32 endpos = outpos + (u32)(left > 0 ? left : 0);
    for (u32 rep = outpos; rep < endpos; rep++) {
        out[rep] = CR_ITEM_UNDEF;
        if (out2) out2[rep] = CR_ITEM_UNDEF;
    }
    u32 nrep = (u32)numrep;
    u32 ftotal = 0;
    while (left > 0 && ftotal < tries) {
        for (u32 rep = outpos; rep < endpos; rep++) {
            if (out[rep] != CR_ITEM_UNDEF) continue;
            const u32 *in_b = bucket;
            for (;;) {
                u32 size = in_b[B_SIZE];
                u32 ru = rep + (u32)parent_r;
                if (in_b[B_ALG] == CR_ALG_UNIFORM && nrep != 0 && size % nrep == 0)
                    ru += (nrep + 1) * ftotal;
                else
                    ru += nrep * ftotal;
                s32 r = (s32)ru;
                if (size == 0) break;
                s32 item = cr_bucket_choose(c, in_b, r, (s32)outpos);
                if (c->err) return;
                bool none = item >= max_devices;
                s32 itemtype = 0;
                const u32 *ib = 0;
                if (!none && item < 0) {
                    ib = cr_bucket(c, item);
                    if (ib)
                        itemtype = (s32)ib[B_TYPE];
                    else
                        none = true;
                }
                if (!none && itemtype != type) {
                    if (item >= 0) {
                        none = true;
                    } else {
                        in_b = ib;
                        continue;
                    }
                }
                if (none) {
                    out[rep] = CR_ITEM_NONE;
                    if (out2) out2[rep] = CR_ITEM_NONE;
                    left--;
                    break;
                }
                bool dup = false;
                for (u32 i = outpos; i < endpos; i++)
                    if (out[i] == item) {
                        dup = true;
                        break;
                    }
                if (dup) break;
                if (DEPTH == 0 && recurse_to_leaf && out2) {
                    if (item < 0) {
                        if constexpr (DEPTH == 0) {
                            cr_choose_indep<1>(c, ib, 1, numrep, 0, out2, rep, recurse_tries, 0, false, 0, r);
                        }
                        if (c->err) return;
                        if (out2[rep] == CR_ITEM_NONE) break;
                    } else {
                        out2[rep] = item;
                    }
                }
                if (itemtype == 0 && cr_is_out(c, item)) break;
                out[rep] = item;
                left--;
                break;
            }
        }
        ftotal++;
    }
    for (u32 rep = outpos; rep < endpos; rep++) {
        if (out[rep] == CR_ITEM_UNDEF) out[rep] = CR_ITEM_NONE;
        if (out2 && out2[rep] == CR_ITEM_UNDEF) out2[rep] = CR_ITEM_NONE;
    }
}

// ---------------------------------------------------------------- do_rule

// Map one input; returns the result length, or CR_LEN_FALLBACK when the
// input must be mapped on the host (a bound was exceeded).
CR_FN_NOINLINE u32 cr_do_rule(CrCtx *c, s32 ruleno, s32 *result, u32 result_max) {
    const u32 *m = c->m;
    if (ruleno < 0 || (u32)ruleno >= m[H_MAX_RULES]) return 0;
    const u32 *rr = m + m[H_RULES_OFF] + 2u * (u32)ruleno;
    if (rr[1] == CR_NO_OFF) return 0;
    if (result_max > CR_MAX_RESULT) return CR_LEN_FALLBACK;
    const u32 *steps = m + rr[0];
    u32 nsteps = rr[1];
    s32 a[CR_MAX_RESULT], bb[CR_MAX_RESULT], cc[CR_MAX_RESULT];
    s32 *w = a, *o = bb;
    u32 wsize = 0, result_len = 0;
    s32 rmax = (s32)result_max;
    s32 max_devices = (s32)m[H_MAX_DEVICES];
    u32 choose_tries = m[H_TOTAL_TRIES] + 1;
    u32 choose_leaf_tries = 0;
    u32 local_retries = m[H_LOCAL_TRIES];
    u32 local_fallback = m[H_LOCAL_FALLBACK];
    u32 vary_r = m[H_VARY_R];
    u32 stable = m[H_STABLE];
    for (u32 s = 0; s < nsteps; s++) {
        u32 op = steps[3 * s];
        s32 arg1 = (s32)steps[3 * s + 1];
        s32 arg2 = (s32)steps[3 * s + 2];
        switch (op) {
        case CR_OP_TAKE:
            if ((arg1 >= 0 && arg1 < max_devices) || cr_bucket(c, arg1)) {
                if (result_max > 0) {
                    w[0] = arg1;
                    wsize = 1;
                }
            }
            break;
        case CR_OP_SET_CHOOSE_TRIES:
            if (arg1 > 0) choose_tries = (u32)arg1;
            break;
        case CR_OP_SET_CHOOSELEAF_TRIES:
            if (arg1 > 0) choose_leaf_tries = (u32)arg1;
            break;
        case CR_OP_SET_CHOOSE_LOCAL_TRIES:
            if (arg1 >= 0) local_retries = (u32)arg1;
            break;
        case CR_OP_SET_CHOOSE_LOCAL_FALLBACK_TRIES:
            if (arg1 >= 0) local_fallback = (u32)arg1;
            break;
        case CR_OP_SET_CHOOSELEAF_VARY_R:
            if (arg1 >= 0) vary_r = (u32)arg1;
            break;
        case CR_OP_SET_CHOOSELEAF_STABLE:
            if (arg1 >= 0) stable = (u32)arg1;
            break;
        case CR_OP_CHOOSE_FIRSTN:
        case CR_OP_CHOOSELEAF_FIRSTN:
        case CR_OP_CHOOSE_INDEP:
        case CR_OP_CHOOSELEAF_INDEP: {
            if (wsize == 0) break;
            bool firstn = op == CR_OP_CHOOSE_FIRSTN || op == CR_OP_CHOOSELEAF_FIRSTN;
            bool leaf = op == CR_OP_CHOOSELEAF_FIRSTN || op == CR_OP_CHOOSELEAF_INDEP;
            u32 osize = 0;
            for (u32 i = 0; i < wsize; i++) {
                s32 numrep = arg1;
                if (numrep <= 0) {
                    numrep = (s32)((u32)numrep + (u32)rmax);
                    if (numrep <= 0) continue;
                }
                const u32 *bk = cr_bucket(c, w[i]);
                if (!bk) continue;
                if (firstn) {
                    u32 recurse_tries = choose_leaf_tries ? choose_leaf_tries
                                        : m[H_DESCEND_ONCE] ? 1
                                                            : choose_tries;
                    osize += cr_choose_firstn<0>(c, bk, numrep, arg2, o + osize, 0, rmax - (s32)osize,
                                                 choose_tries, recurse_tries, local_retries, local_fallback,
                                                 leaf, vary_r, stable, cc + osize, 0);
                } else {
                    s32 out_size = numrep < rmax - (s32)osize ? numrep : rmax - (s32)osize;
                    cr_choose_indep<0>(c, bk, out_size, numrep, arg2, o + osize, 0, choose_tries,
                                       choose_leaf_tries ? choose_leaf_tries : 1, leaf, cc + osize, 0);
                    osize += (u32)(out_size > 0 ? out_size : 0);
                }
                if (c->err) return CR_LEN_FALLBACK;
            }
            if (leaf)
                for (u32 i = 0; i < osize; i++) o[i] = cc[i];
            s32 *t = w;
            w = o;
            o = t;
            wsize = osize;
            break;
        }
        case CR_OP_EMIT:
            for (u32 i = 0; i < wsize && result_len < result_max; i++) result[result_len++] = w[i];
            wsize = 0;
            break;
        default:
            break;
        }
    }
    return result_len;
}

// ---------------------------------------------------------------- placement seeds

CR_FN u32 cr_stable_mod(u32 x, u32 b, u32 bmask) { return (x & bmask) < b ? (x & bmask) : (x & (bmask >> 1)); }

// pg_pool_t::raw_pg_to_pps for PG seed ps.
CR_FN u32 cr_pps(u32 ps, u32 pgp_num, u32 pgp_mask, u32 pool_id, u32 hashpspool) {
    u32 m = cr_stable_mod(ps, pgp_num, pgp_mask);
    return hashpspool ? cr_hash2(m, pool_id) : m + pool_id;
}

// ---------------------------------------------------------------- kernels

// Input i: xs[i] when xs is given, else x0 + i (a PG seed range when
// pool_mode is set, mapped through cr_pps first).
struct CrInputs {
    u32 pgp_num, pgp_mask, pool_id, hashpspool, pool_mode;
};

CR_FN s32 cr_input(const s32 *xs, s32 x0, u64 i, const CrInputs *in) {
    if (xs) return xs[i];
    u32 v = (u32)x0 + (u32)i;
    if (in->pool_mode) v = cr_pps(v, in->pgp_num, in->pgp_mask, in->pool_id, in->hashpspool);
    return (s32)v;
}

// What every grid entry point takes: the flat map, the straw2 ln table,
// the device reweights (wmax of them), the rule, the inputs (xs[i], or
// x0 + i when xs is null; flags bit 1: pool mode, bit 0: hashpspool), and
// where the results go (rows of result_max items, one length per input).
#define CR_MAP_PARAMS                                                                                         \
    const u32 *map, const s64 *lnt, const u32 *weights, u32 wmax, s32 ruleno, const s32 *xs, s32 x0, u32 n, \
        u32 result_max, u32 pgp_num, u32 pgp_mask, u32 pool_id, u32 flags, s32 *out, u32 *lens
// The same, passed on.
#define CR_MAP_ARGS map, lnt, weights, wmax, ruleno, xs, x0, n, result_max, pgp_num, pgp_mask, pool_id, flags, out, lens

// Maps x as lane `lane` of `nlanes` (1: a thread alone; more: the lanes
// share each straw2 bucket's draws) and, on lane 0, stores the result as
// input i's: its row and length, or CR_LEN_FALLBACK for the host to redo.
CR_FN void cr_map_one(const u32 *map, const s64 *lnt, const u32 *weights, u32 wmax, s32 ruleno, u32 x, u32 lane,
                      u32 nlanes, u64 i, u32 result_max, s32 *out, u32 *lens) {
    CrCtx c;
    c.m = map;
    c.lnt = lnt;
    c.w = weights;
    c.wmax = wmax;
    c.x = x;
    c.lane = lane;
    c.nlanes = nlanes;
    c.err = 0;
    s32 res[CR_MAX_RESULT];
    u32 len = cr_do_rule(&c, ruleno, res, result_max);
    if (lane != 0) return;
    if (len == CR_LEN_FALLBACK || c.err) {
        lens[i] = CR_LEN_FALLBACK;
        return;
    }
    lens[i] = len;
    for (u32 k = 0; k < len; k++) out[i * result_max + k] = res[k];
}

// Throughput kernel: one thread per input.
CR_FN void cr_map_thread(CR_MAP_PARAMS) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    CrInputs in = {pgp_num, pgp_mask, pool_id, flags & 1u, (flags >> 1) & 1u};
    cr_map_one(map, lnt, weights, wmax, ruleno, (u32)cr_input(xs, x0, i, &in), 0, 1, i, result_max, out, lens);
}

// Throughput kernel: one thread per input. The _lb6/_lb8 variants ask for
// 6 / 8 resident blocks of 128 threads per SM (fewer registers, more warps
// in flight); the CUDA device picks one with IOLIFT_THREAD_KERNEL.
CR_EXTERN __global__ void crush_map_thread(CR_MAP_PARAMS) { cr_map_thread(CR_MAP_ARGS); }
CR_EXTERN __global__ void CR_BOUNDS(128, 6) crush_map_thread_lb6(CR_MAP_PARAMS) { cr_map_thread(CR_MAP_ARGS); }
CR_EXTERN __global__ void CR_BOUNDS(128, 8) crush_map_thread_lb8(CR_MAP_PARAMS) { cr_map_thread(CR_MAP_ARGS); }

// Latency kernel: one warp (32 lanes) per input; the draws of each straw2
// bucket are spread over the lanes and reduced with shuffles. Lane 0 writes.
CR_EXTERN __global__ void crush_map_warp(CR_MAP_PARAMS) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 i = t >> 5;
    if (i >= n) return; // whole warps exit together (n is per warp)
    CrInputs in = {pgp_num, pgp_mask, pool_id, flags & 1u, (flags >> 1) & 1u};
    cr_map_one(map, lnt, weights, wmax, ruleno, (u32)cr_input(xs, x0, i, &in), (u32)(t & 31), 32, i, result_max,
               out, lens);
}

#if !CR_GPU
// ---------------------------------------------------------------- host entry points (tests)

// Run the throughput kernel over n inputs exactly as a grid of blocks of
// 128 threads would, block by block, on the calling thread.
CR_EXTERN void crush_host_thread(CR_MAP_PARAMS) {
    blockDim.x = 128;
    gridDim.x = (n + 127) / 128;
    for (u32 b = 0; b < gridDim.x; b++) {
        blockIdx.x = b;
        for (u32 t = 0; t < 128; t++) {
            threadIdx.x = t;
            crush_map_thread(CR_MAP_ARGS);
        }
    }
}

// Run the latency kernel's entry point as its grid would (32 threads per
// input, blocks of 128): on the host each lane emulates the whole warp's
// straw2 split and reduction itself, and lane 0 writes, as on the GPU.
CR_EXTERN void crush_host_warp_grid(CR_MAP_PARAMS) {
    blockDim.x = 128;
    gridDim.x = (u32)(((u64)n * 32 + 127) / 128);
    for (u32 b = 0; b < gridDim.x; b++) {
        blockIdx.x = b;
        for (u32 t = 0; t < 128; t++) {
            threadIdx.x = t;
            crush_map_warp(CR_MAP_ARGS);
        }
    }
}

// The latency kernel's per-input logic with the warp emulated: the straw2
// draws are split over `lanes` lanes and combined by the butterfly order.
CR_EXTERN void crush_host_warp(const u32 *map, const s64 *lnt, const u32 *weights, u32 wmax, s32 ruleno,
                               const s32 *xs, u32 n, u32 result_max, u32 lanes, s32 *out, u32 *lens) {
    for (u32 i = 0; i < n; i++)
        cr_map_one(map, lnt, weights, wmax, ruleno, (u32)xs[i], 0, lanes, i, result_max, out, lens);
}
#endif
