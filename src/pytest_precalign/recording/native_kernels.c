/* One read of a CPU tensor for its statistics, its zero count, or an optimizer step's norms.
 *
 * Built on first use by the platform's C compiler, one entry point at a time (-DWANT_<name>,
 * or -DWANT_ALL), and loaded with ctypes (native_kernels.py); every entry point is plain C
 * on raw, contiguous memory.
 *
 * The order of every addition is fixed by this source, not by the CPU: LANES independent
 * accumulators, each summing BLOCK / LANES elements, their per-block sums added into double
 * lanes, and the lanes' totals added pairwise (a binary counter over superblocks) in double.
 * A tensor's sum and sum of squares are accumulated in double from the first element (each
 * square of a float exact): two tensors one ulp apart in one element get different sums,
 * which merging replicated ranks relies on. An optimizer step's norms (NORMS) accumulate
 * squares in the tensor's accumulation type per block, as torch does. Compiled with -ffp-contract=off (no fused multiply-add) and without
 * -ffast-math, so the compiler may widen the lanes into whatever vectors the CPU has
 * (target_clones: AVX-512, AVX2, SSE2) but never reorders an addition: the bits are the same
 * on every x86-64 CPU, whatever its vector width or thread count.
 *
 * Values: max and min exact; the sum and the sum of squares within SUM_ULPS epsilon of the
 * exact values (native_kernels.py); a zero count exact. A NaN is never picked by max/min here:
 * a tensor that is not finite has a sum or sum of squares that is not finite either, and the
 * caller takes torch's reductions for it.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>

#define LANES 32
#define BLOCK 256

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && !defined(PRECALIGN_NO_CLONES)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

/* A float's square in double is exact (24-bit significands, 48 bits of product), so
 * q + (double)v * (double)v rounds once whether or not the compiler fuses it into an FMA:
 * the float kernels let it (on the CPUs that have one), the others never. */
#if defined(__GNUC__) && !defined(__clang__)
#define EXACT_PRODUCTS __attribute__((optimize("fp-contract=fast")))
#else
#define EXACT_PRODUCTS
#endif

/* Half types widened exactly to float. */
static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    float f;
    if (exp == 0x1fu) { /* inf / nan */
        uint32_t u = sign | 0x7f800000u | (man << 13);
        memcpy(&f, &u, sizeof f);
        return f;
    }
    if (exp == 0) { /* zero / subnormal: man * 2^-24, exact in float */
        f = (float)man * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    uint32_t u = sign | ((exp + 112u) << 23) | (man << 13);
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float from_f32(float v) { return v; }
static inline double from_f64(double v) { return v; }

/* Pairwise sum of superblock totals: a binary counter of partial sums, so the total of n
 * superblocks carries log2(n) roundings, not n. */
typedef struct {
    double level[64];
    int top;
    int64_t count;
} cascade;

static inline void cascade_push(cascade *c, double v) {
    int64_t k = c->count++;
    while (k & 1) {
        v = c->level[--c->top] + v;
        k >>= 1;
    }
    c->level[c->top++] = v;
}

static inline double cascade_total(const cascade *c) {
    double total = 0.0;
    for (int i = c->top - 1; i >= 0; i--) total = c->level[i] + total;
    return total;
}

/* The lanes' totals added in a fixed pairwise tree. */
static inline double lanes_total(double *lane) {
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; j++) lane[j] = lane[j] + lane[j + width];
    return lane[0];
}

/* Elements per superblock: the double lanes hold SUPER blocks before they are pushed. */
#define SUPER_NARROW 64 /* float accumulation: 64 block sums in a double lane lose nothing */
#define SUPER_WIDE 1    /* double accumulation: every block's lane sums go to the cascade */

/* Sharing a tensor's full superblocks between threads: built with -fopenmp (native_kernels.py
 * does so only where torch itself runs on GCC's OpenMP runtime, so these are torch's own
 * intra-op threads, as many as torch.get_num_threads()), a tensor of at least MIN_SHARED
 * superblocks is read in contiguous shares, one per thread; elsewhere by the calling thread. */
#define MAX_THREADS 64
#define MIN_SHARED 4
#define MAX_SHARED_LEAVES 512
#define lanes_reset(MX, MN)                                                                  \
    for (int j = 0; j < LANES; j++) {                                                        \
        (MX)[j] = -INFINITY;                                                                 \
        (MN)[j] = INFINITY;                                                                  \
    }
#ifdef _OPENMP
#include <omp.h>
static int shares_for(int64_t supers) {
    if (supers < MIN_SHARED || omp_in_parallel()) return 1;
    int threads = omp_get_max_threads();
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > supers) threads = (int)supers;
    return threads < 1 ? 1 : threads;
}
#define SHARE_SUPERBLOCKS(CALL, INIT)                                                        \
    _Pragma("omp parallel num_threads(threads)") {                                           \
        int t = omp_get_thread_num();                                                        \
        int64_t first = supers * t / threads, count = supers * (t + 1) / threads - first;    \
        INIT;                                                                                \
        CALL;                                                                                \
    }
#else
static int shares_for(int64_t supers) { (void)supers; return 1; }
#define SHARE_SUPERBLOCKS(CALL, INIT)
#endif

/* Blocks [0, count) of x, BLOCK elements each: every block's LANES sums and sums of squares
 * (one element in LANES to each, in order) added into ds and dq, and every element into the
 * LANES running max/min (a lane keeps the first of equal values: -0 and +0 are equal). */
#define STATS_BLOCKS(NAME, T, ACC, LOAD, CONTRACT)                                           \
    static inline CONTRACT void NAME##_blocks(const T *restrict x, int64_t count,            \
                                              ACC *restrict mx, ACC *restrict mn,            \
                                              double *restrict ds, double *restrict dq) {    \
        for (int64_t b = 0; b < count; b++, x += BLOCK) {                                    \
            double s[LANES], q[LANES];                                                       \
            for (int j = 0; j < LANES; j++) s[j] = q[j] = 0;                                 \
            for (int k = 0; k < BLOCK; k += LANES) {                                         \
                for (int j = 0; j < LANES; j++) {                                            \
                    ACC v = LOAD(x[k + j]);                                                  \
                    s[j] = s[j] + (double)v;                                                 \
                    q[j] = q[j] + (double)v * (double)v;                                     \
                    mx[j] = v > mx[j] ? v : mx[j];                                           \
                    mn[j] = v < mn[j] ? v : mn[j];                                           \
                }                                                                            \
            }                                                                                \
            for (int j = 0; j < LANES; j++) {                                                \
                ds[j] = ds[j] + s[j];                                                        \
                dq[j] = dq[j] + q[j];                                                        \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \

/* Superblocks [first, first + count) of x, each SUPER blocks: every superblock's sum and sum
 * of squares (its lanes' totals, pairwise) into ls[sb], lq[sb], the elements into the lanes'
 * max/min. Whichever thread reads a superblock, its sums are the same. */
#define STATS_RANGE(NAME, T, ACC, LOAD, SUPER, CONTRACT)                                     \
    STATS_BLOCKS(NAME, T, ACC, LOAD, CONTRACT)                                               \
    CLONES CONTRACT void NAME##_range(const T *x, int64_t first, int64_t count, ACC *lmx,    \
                                      ACC *lmn, double *ls, double *lq) {                    \
        ACC mx[LANES], mn[LANES];                                                            \
        for (int j = 0; j < LANES; j++) {                                                    \
            mx[j] = lmx[j];                                                                  \
            mn[j] = lmn[j];                                                                  \
        }                                                                                    \
        for (int64_t sb = first; sb < first + count; sb++) {                                 \
            double ds[LANES], dq[LANES];                                                     \
            for (int j = 0; j < LANES; j++) ds[j] = dq[j] = 0.0;                             \
            NAME##_blocks(x + sb * (int64_t)(SUPER * BLOCK), SUPER, mx, mn, ds, dq);         \
            ls[sb] = lanes_total(ds);                                                        \
            lq[sb] = lanes_total(dq);                                                        \
        }                                                                                    \
        for (int j = 0; j < LANES; j++) {                                                    \
            lmx[j] = mx[j];                                                                  \
            lmn[j] = mn[j];                                                                  \
        }                                                                                    \
    }                                                                                        \

/* out[0] max, out[1] min, out[2] sum, out[3] sum of squares, the sums in double (not rounded
 * to float: two tensors a few ulps apart in one element keep different sums, which a merge of
 * replicated ranks relies on); returns 1 when all four are finite, else 0 (the caller then
 * takes torch's reductions, which also count the NaNs and Infs). The full superblocks are
 * read by NAME_range, on the threads of the OpenMP runtime torch uses where the kernel was
 * built with it (contiguous shares, one per thread); their sums are then added in index order
 * (the cascade), the lanes' max/min in thread order, then the last, partial superblock and
 * the tail, here: the bits do not depend on the thread count. */
#define STATS(NAME, T, ACC, LOAD, SUPER, CONTRACT)                                           \
    STATS_RANGE(NAME, T, ACC, LOAD, SUPER, CONTRACT)                                         \
    CLONES CONTRACT int NAME(const T *x, int64_t n, double *out) {                           \
        ACC mx[LANES], mn[LANES];                                                            \
        double ds[LANES], dq[LANES];                                                         \
        cascade cs = {{0}, 0, 0}, cq = {{0}, 0, 0};                                          \
        for (int j = 0; j < LANES; j++) {                                                    \
            mx[j] = -INFINITY;                                                               \
            mn[j] = INFINITY;                                                                \
            ds[j] = 0.0;                                                                     \
            dq[j] = 0.0;                                                                     \
        }                                                                                    \
        int64_t supers = n / (SUPER * BLOCK);                                                \
        double small_s[MAX_SHARED_LEAVES], small_q[MAX_SHARED_LEAVES];                       \
        double *ls = small_s, *lq = small_q;                                                 \
        if (supers > MAX_SHARED_LEAVES) {                                                    \
            ls = (double *)malloc(sizeof(double) * 2 * (size_t)supers);                      \
            if (!ls) return 0;                                                               \
            lq = ls + supers;                                                                \
        }                                                                                    \
        int threads = shares_for(supers);                                                    \
        if (threads > 1) {                                                                   \
            ACC tmx[MAX_THREADS][LANES], tmn[MAX_THREADS][LANES];                            \
            SHARE_SUPERBLOCKS(NAME##_range(x, first, count, tmx[t], tmn[t], ls, lq),         \
                              lanes_reset(tmx[t], tmn[t]));                                  \
            for (int t = 0; t < threads; t++)                                                \
                for (int j = 0; j < LANES; j++) {                                            \
                    mx[j] = tmx[t][j] > mx[j] ? tmx[t][j] : mx[j];                           \
                    mn[j] = tmn[t][j] < mn[j] ? tmn[t][j] : mn[j];                           \
                }                                                                            \
        } else {                                                                             \
            NAME##_range(x, 0, supers, mx, mn, ls, lq);                                      \
        }                                                                                    \
        for (int64_t sb = 0; sb < supers; sb++) {                                            \
            cascade_push(&cs, ls[sb]);                                                       \
            cascade_push(&cq, lq[sb]);                                                       \
        }                                                                                    \
        if (ls != small_s) free(ls);                                                         \
        int64_t i = supers * (int64_t)(SUPER * BLOCK);                                       \
        NAME##_blocks(x + i, (n - i) / BLOCK, mx, mn, ds, dq); /* the last superblock's blocks */\
        i += (n - i) / BLOCK * BLOCK;                                                        \
        ACC tmx = -INFINITY, tmn = INFINITY;                                                 \
        double ts = 0.0, tq = 0.0;                                                           \
        for (; i < n; i++) { /* the tail, in order */                                        \
            ACC v = LOAD(x[i]);                                                              \
            ts = ts + (double)v;                                                             \
            tq = tq + (double)v * (double)v;                                                 \
            tmx = v > tmx ? v : tmx;                                                         \
            tmn = v < tmn ? v : tmn;                                                         \
        }                                                                                    \
        cascade_push(&cs, lanes_total(ds));                                                  \
        cascade_push(&cq, lanes_total(dq));                                                  \
        cascade_push(&cs, ts);                                                               \
        cascade_push(&cq, tq);                                                               \
        for (int j = 0; j < LANES; j++) {                                                    \
            tmx = mx[j] > tmx ? mx[j] : tmx;                                                 \
            tmn = mn[j] < tmn ? mn[j] : tmn;                                                 \
        }                                                                                    \
        out[0] = (double)tmx;                                                                \
        out[1] = (double)tmn;                                                                \
        out[2] = cascade_total(&cs);                                                         \
        out[3] = cascade_total(&cq);                                                         \
        return isfinite(out[0]) && isfinite(out[1]) && isfinite(out[2]) && isfinite(out[3]); \
    }

#if defined(WANT_ALL) || defined(WANT_precalign_stats_f32)
STATS(precalign_stats_f32, float, float, from_f32, SUPER_NARROW, EXACT_PRODUCTS)
#endif
#if defined(WANT_ALL) || defined(WANT_precalign_stats_bf16)
STATS(precalign_stats_bf16, uint16_t, float, from_bf16, SUPER_NARROW, EXACT_PRODUCTS)
#endif
#if defined(WANT_ALL) || defined(WANT_precalign_stats_f16)
STATS(precalign_stats_f16, uint16_t, float, from_f16, SUPER_NARROW, EXACT_PRODUCTS)
#endif
#if defined(WANT_ALL) || defined(WANT_precalign_stats_f64)
STATS(precalign_stats_f64, double, double, from_f64, SUPER_WIDE, )
#endif

/* Elements whose value is zero (+0 or -0), from their bits: NaN is not zero. Superblocks
 * of 64 blocks are counted on torch's threads, as the statistics are. */
#define ZEROS(NAME, U, MASK)                                                                 \
    CLONES int64_t NAME##_range(const U *x, int64_t first, int64_t count) {                  \
        int64_t total = 0;                                                                   \
        const U *p = x + first * (int64_t)(SUPER_NARROW * BLOCK);                            \
        for (int64_t b = 0; b < count * SUPER_NARROW; b++, p += BLOCK) {                     \
            uint32_t c[LANES];                                                               \
            for (int j = 0; j < LANES; j++) c[j] = 0;                                        \
            for (int k = 0; k < BLOCK; k += LANES)                                           \
                for (int j = 0; j < LANES; j++) c[j] += (p[k + j] & (MASK)) == 0;            \
            for (int j = 0; j < LANES; j++) total += c[j];                                   \
        }                                                                                    \
        return total;                                                                        \
    }                                                                                        \
    CLONES int64_t NAME(const U *x, int64_t n) {                                             \
        int64_t supers = n / (SUPER_NARROW * BLOCK), total = 0;                              \
        int threads = shares_for(supers);                                                    \
        if (threads > 1) {                                                                   \
            int64_t part[MAX_THREADS];                                                       \
            SHARE_SUPERBLOCKS(part[t] = NAME##_range(x, first, count), (void)0);             \
            for (int t = 0; t < threads; t++) total += part[t];                              \
        } else {                                                                             \
            total = NAME##_range(x, 0, supers);                                              \
        }                                                                                    \
        for (int64_t i = supers * (int64_t)(SUPER_NARROW * BLOCK); i < n; i++)               \
            total += (x[i] & (MASK)) == 0;                                                   \
        return total;                                                                        \
    }                                                                                        \

#if defined(WANT_ALL) || defined(WANT_precalign_zeros_32)
ZEROS(precalign_zeros_32, uint32_t, 0x7fffffffu)
#endif
#if defined(WANT_ALL) || defined(WANT_precalign_zeros_16)
ZEROS(precalign_zeros_16, uint16_t, 0x7fffu)
#endif
#if defined(WANT_ALL) || defined(WANT_precalign_zeros_64)
ZEROS(precalign_zeros_64, uint64_t, 0x7fffffffffffffffull)
#endif

/* An optimizer step's two norms from one read of the parameters and their snapshot:
 * out[0] the sum of squares of `after`, out[1] of `before - after`. With `keep`, each block
 * of `after` is then copied over its block of `before` while both are in cache: the snapshot
 * of the next step, without another read of the parameters. */
#define NORMS(NAME, T, ACC, LOAD, SUPER)                                                     \
    static inline void NAME##_blocks(const T *restrict after, T *restrict before,            \
                                     int64_t count, int keep, double *restrict dp,           \
                                     double *restrict du) {                                  \
        for (int64_t b = 0; b < count; b++, after += BLOCK, before += BLOCK) {               \
            ACC p[LANES], u[LANES];                                                          \
            for (int j = 0; j < LANES; j++) p[j] = u[j] = 0;                                 \
            for (int k = 0; k < BLOCK; k += LANES) {                                         \
                for (int j = 0; j < LANES; j++) {                                            \
                    ACC a = LOAD(after[k + j]);                                              \
                    ACC d = LOAD(before[k + j]) - a;                                         \
                    p[j] = p[j] + a * a;                                                     \
                    u[j] = u[j] + d * d;                                                     \
                }                                                                            \
            }                                                                                \
            for (int j = 0; j < LANES; j++) {                                                \
                dp[j] = dp[j] + (double)p[j];                                                \
                du[j] = du[j] + (double)u[j];                                                \
            }                                                                                \
            if (keep) memcpy(before, after, sizeof(T) * BLOCK);                              \
        }                                                                                    \
    }                                                                                        \
    CLONES void NAME##_range(const T *after, T *before, int64_t first, int64_t count,        \
                             int keep, double *lp, double *lu) {                             \
        for (int64_t sb = first; sb < first + count; sb++) {                                 \
            int64_t i = sb * (int64_t)(SUPER * BLOCK);                                       \
            double dp[LANES], du[LANES];                                                     \
            for (int j = 0; j < LANES; j++) dp[j] = du[j] = 0.0;                             \
            NAME##_blocks(after + i, before + i, SUPER, keep, dp, du);                       \
            lp[sb] = lanes_total(dp);                                                        \
            lu[sb] = lanes_total(du);                                                        \
        }                                                                                    \
    }                                                                                        \
    CLONES void NAME(const T *after, T *before, int64_t n, int keep, double *out) {          \
        double dp[LANES], du[LANES];                                                         \
        cascade cp = {{0}, 0, 0}, cu = {{0}, 0, 0};                                          \
        for (int j = 0; j < LANES; j++) dp[j] = du[j] = 0.0;                                 \
        int64_t supers = n / (SUPER * BLOCK);                                                \
        double small_p[MAX_SHARED_LEAVES], small_u[MAX_SHARED_LEAVES];                       \
        double *lp = small_p, *lu = small_u;                                                 \
        if (supers > MAX_SHARED_LEAVES) {                                                    \
            lp = (double *)malloc(sizeof(double) * 2 * (size_t)supers);                      \
            if (!lp) {                                                                       \
                out[0] = out[1] = NAN;                                                       \
                return;                                                                      \
            }                                                                                \
            lu = lp + supers;                                                                \
        }                                                                                    \
        int threads = shares_for(supers);                                                    \
        if (threads > 1) {                                                                   \
            SHARE_SUPERBLOCKS(NAME##_range(after, before, first, count, keep, lp, lu),       \
                              (void)0);                                                      \
        } else {                                                                             \
            NAME##_range(after, before, 0, supers, keep, lp, lu);                            \
        }                                                                                    \
        for (int64_t sb = 0; sb < supers; sb++) {                                            \
            cascade_push(&cp, lp[sb]);                                                       \
            cascade_push(&cu, lu[sb]);                                                       \
        }                                                                                    \
        if (lp != small_p) free(lp);                                                         \
        int64_t i = supers * (int64_t)(SUPER * BLOCK);                                       \
        NAME##_blocks(after + i, before + i, (n - i) / BLOCK, keep, dp, du); /* the last */  \
        i += (n - i) / BLOCK * BLOCK;                                                        \
        double tp = 0.0, tu = 0.0;                                                           \
        for (int64_t t = i; t < n; t++) {                                                    \
            ACC a = LOAD(after[t]);                                                          \
            ACC d = LOAD(before[t]) - a;                                                     \
            tp = tp + (double)(a * a);                                                       \
            tu = tu + (double)(d * d);                                                       \
        }                                                                                    \
        if (keep && n > i) memcpy(before + i, after + i, sizeof(T) * (size_t)(n - i));       \
        cascade_push(&cp, lanes_total(dp));                                                  \
        cascade_push(&cu, lanes_total(du));                                                  \
        cascade_push(&cp, tp);                                                               \
        cascade_push(&cu, tu);                                                               \
        out[0] = cascade_total(&cp);                                                         \
        out[1] = cascade_total(&cu);                                                         \
    }                                                                                        \

#if defined(WANT_ALL) || defined(WANT_precalign_norms_f32)
NORMS(precalign_norms_f32, float, float, from_f32, SUPER_NARROW)
#endif
#if defined(WANT_ALL) || defined(WANT_precalign_norms_bf16)
NORMS(precalign_norms_bf16, uint16_t, float, from_bf16, SUPER_NARROW)
#endif
#if defined(WANT_ALL) || defined(WANT_precalign_norms_f16)
NORMS(precalign_norms_f16, uint16_t, float, from_f16, SUPER_NARROW)
#endif
#if defined(WANT_ALL) || defined(WANT_precalign_norms_f64)
NORMS(precalign_norms_f64, double, double, from_f64, SUPER_WIDE)
#endif

/* The version of this source's interface. */
int precalign_kernels_version(void) { return 4; }

/* 1 when this library shares its reads with the threads of the OpenMP runtime (-fopenmp). */
int precalign_shared_threads(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
