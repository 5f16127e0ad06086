/* CRC-32C (Castagnoli) implementations and run-time dispatch. See crc32c_impl.h.
 *
 * Hardware path (x86-64 SSE4.2 crc32 instruction, or ARMv8 CRC extension): long buffers are
 * split into three interleaved streams because the instruction has a latency of about three
 * cycles but a throughput of one per cycle; the three partial registers are joined with a
 * "shift by N zero bytes" operator, a linear map on the 32-bit register precomputed as four
 * 256-entry tables (GF(2) matrix squaring). Software path: slicing-by-8 tables.
 */
#include "crc32c_impl.h"
#include <stdlib.h>
#include <string.h>

#define POLY_REFLECTED 0x82F63B78u
#define STRIDE_LONG 8192u   /* bytes per stream in the three-way loop for long buffers */
#define STRIDE_SHORT 256u   /* bytes per stream for medium buffers */

static uint32_t table_sw[8][256];
static uint32_t shift_long[4][256];
static uint32_t shift_short[4][256];
static int initialised = 0;
static int use_hw = 0;
static int forced_sw = 0;
static const char *hw_name = "slicing-by-8";

static uint64_t load_le64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* ---------------- software: slicing-by-8 ---------------- */
static void build_sw_tables(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ POLY_REFLECTED : c >> 1;
        table_sw[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = table_sw[0][n];
        for (int k = 1; k < 8; k++) {
            c = table_sw[0][c & 0xff] ^ (c >> 8);
            table_sw[k][n] = c;
        }
    }
}

static uint32_t raw_sw(uint32_t crc, const unsigned char *p, size_t len) {
    while (len && ((uintptr_t)p & 7)) {
        crc = table_sw[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w = load_le64(p) ^ crc;
        crc = table_sw[7][w & 0xff] ^ table_sw[6][(w >> 8) & 0xff] ^
              table_sw[5][(w >> 16) & 0xff] ^ table_sw[4][(w >> 24) & 0xff] ^
              table_sw[3][(w >> 32) & 0xff] ^ table_sw[2][(w >> 40) & 0xff] ^
              table_sw[1][(w >> 48) & 0xff] ^ table_sw[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--) crc = table_sw[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

/* ---------------- zero-shift operators ---------------- */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* Tables for the operator "append len zero bytes" on the raw register. */
static void build_shift_tables(uint32_t tables[4][256], size_t len_bytes) {
    uint32_t op[32], tmp[32];
    /* Operator for one zero bit on a reflected register. */
    op[0] = POLY_REFLECTED;
    for (int n = 1; n < 32; n++) op[n] = 1u << (n - 1);
    /* Square to get one zero byte (2^3 bits). */
    for (int i = 0; i < 3; i++) {
        gf2_square(tmp, op);
        memcpy(op, tmp, sizeof op);
    }
    /* len_bytes is a power of two: square log2(len_bytes) more times. */
    size_t n = len_bytes;
    while (n > 1) {
        gf2_square(tmp, op);
        memcpy(op, tmp, sizeof op);
        n >>= 1;
    }
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) tables[k][b] = gf2_times(op, b << (8 * k));
}

static inline uint32_t apply_shift(uint32_t tables[4][256], uint32_t crc) {
    return tables[0][crc & 0xff] ^ tables[1][(crc >> 8) & 0xff] ^
           tables[2][(crc >> 16) & 0xff] ^ tables[3][crc >> 24];
}

/* ---------------- hardware ---------------- */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define VREPL_HAVE_HW 1
#include <nmmintrin.h>
#define HW_TARGET __attribute__((target("sse4.2")))
HW_TARGET static inline uint64_t hw_u64(uint64_t crc, uint64_t v) { return _mm_crc32_u64(crc, v); }
HW_TARGET static inline uint32_t hw_u8(uint32_t crc, unsigned char v) { return _mm_crc32_u8(crc, v); }
static int detect_hw(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) { hw_name = "sse4.2"; return 1; }
    return 0;
}
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define VREPL_HAVE_HW 1
#include <sys/auxv.h>
#include <arm_acle.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#define HW_TARGET __attribute__((target("+crc")))
HW_TARGET static inline uint64_t hw_u64(uint64_t crc, uint64_t v) { return __crc32cd((uint32_t)crc, v); }
HW_TARGET static inline uint32_t hw_u8(uint32_t crc, unsigned char v) { return __crc32cb(crc, v); }
static int detect_hw(void) {
    if (getauxval(AT_HWCAP) & HWCAP_CRC32) { hw_name = "armv8-crc"; return 1; }
    return 0;
}
#else
#define VREPL_HAVE_HW 0
static int detect_hw(void) { return 0; }
#endif

#if VREPL_HAVE_HW
HW_TARGET static uint32_t raw_hw(uint32_t crc32, const unsigned char *p, size_t len) {
    uint64_t crc = crc32;
    while (len && ((uintptr_t)p & 7)) {
        crc = hw_u8((uint32_t)crc, *p++);
        len--;
    }
    /* Three streams of STRIDE_LONG, then of STRIDE_SHORT, joined with the shift tables. */
    while (len >= 3 * STRIDE_LONG) {
        uint64_t c1 = 0, c2 = 0;
        const unsigned char *end = p + STRIDE_LONG;
        do {
            crc = hw_u64(crc, load_le64(p));
            c1 = hw_u64(c1, load_le64(p + STRIDE_LONG));
            c2 = hw_u64(c2, load_le64(p + 2 * STRIDE_LONG));
            p += 8;
        } while (p < end);
        crc = apply_shift(shift_long, (uint32_t)crc) ^ (uint32_t)c1;
        crc = apply_shift(shift_long, (uint32_t)crc) ^ (uint32_t)c2;
        p += 2 * STRIDE_LONG;
        len -= 3 * STRIDE_LONG;
    }
    while (len >= 3 * STRIDE_SHORT) {
        uint64_t c1 = 0, c2 = 0;
        const unsigned char *end = p + STRIDE_SHORT;
        do {
            crc = hw_u64(crc, load_le64(p));
            c1 = hw_u64(c1, load_le64(p + STRIDE_SHORT));
            c2 = hw_u64(c2, load_le64(p + 2 * STRIDE_SHORT));
            p += 8;
        } while (p < end);
        crc = apply_shift(shift_short, (uint32_t)crc) ^ (uint32_t)c1;
        crc = apply_shift(shift_short, (uint32_t)crc) ^ (uint32_t)c2;
        p += 2 * STRIDE_SHORT;
        len -= 3 * STRIDE_SHORT;
    }
    while (len >= 8) {
        crc = hw_u64(crc, load_le64(p));
        p += 8;
        len -= 8;
    }
    while (len--) crc = hw_u8((uint32_t)crc, *p++);
    return (uint32_t)crc;
}
#endif

const char *vrepl_crc32c_init(void) {
    if (!initialised) {
        build_sw_tables();
        build_shift_tables(shift_long, STRIDE_LONG);
        build_shift_tables(shift_short, STRIDE_SHORT);
        use_hw = detect_hw();
        /* VREPL_CRC32C=software forces the portable path in every extension that links this
         * file (each gets its own copy of these statics). */
        const char *force = getenv("VREPL_CRC32C");
        if (force && strcmp(force, "software") == 0) forced_sw = 1;
        initialised = 1;
    }
    return vrepl_crc32c_impl_name();
}

void vrepl_crc32c_force_software(int on) { forced_sw = on ? 1 : 0; }

const char *vrepl_crc32c_impl_name(void) {
    return (use_hw && !forced_sw) ? hw_name : "slicing-by-8";
}

uint32_t vrepl_crc32c_sw(uint32_t crc, const void *data, size_t len) {
    return ~raw_sw(~crc, (const unsigned char *)data, len);
}

uint32_t vrepl_crc32c(uint32_t crc, const void *data, size_t len) {
#if VREPL_HAVE_HW
    if (use_hw && !forced_sw) return ~raw_hw(~crc, (const unsigned char *)data, len);
#endif
    return ~raw_sw(~crc, (const unsigned char *)data, len);
}
