"""The C++ every generated translation unit starts with: kiln's helpers with eager's exact
semantics (max/min with NaN, floor division, remainder, half conversions), the math functions
written so gcc vectorizes them, and the libmvec declarations; plus the flags that link them.
"""

# glibc's libmvec has SIMD versions of these; declaring them `omp declare simd` lets gcc call
# the vector variants from vectorized loops (math.h only does so under -ffast-math)
VECTOR_LIBM = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
               "log", "log2", "log10", "log1p", "expm1", "exp2", "erf", "erfc")
VECTOR_LIBM_BINARY = ("atan2", "pow")
# -fno-builtin-atan: under -fno-math-errno gcc 12 folds sin(atan(x)) and cos(atan(x)) into
# `|x| < t ? x / sqrt(x*x + 1) : copysign(1, x)` (and 1 / sqrt(...) : 0), which is 1 or 0 for a NaN x;
# atan as a plain function keeps eager's NaN, and gcc still calls its vector variant (a sweep of
# every pair f(g(x)) of these functions at NaN, inf, 0 and huge x found no other fold that differs)
LINK_FLAGS = ("-fno-math-errno", "-fno-trapping-math", "-fno-builtin-atan", "-fno-builtin-atanf", "-lmvec")
PRELUDE = r"""
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

// NaN if either is (eager's max/min), else a when equal. Written as b's NaN test first: under
// -fno-trapping-math, gcc 12 vectorizes a chain of nine of these (a 3x3 max pool) only in this form
template <typename T> static inline T kiln_max(T a, T b) { return (b != b) ? b : ((a >= b || a != a) ? a : b); }
template <typename T> static inline T kiln_min(T a, T b) { return (b != b) ? b : ((a <= b || a != a) ? a : b); }
// the same as an accumulator's update (a max/min reduction): a's NaN test, then one compare, two
// selects per vector instead of six ops; gcc vectorizes a reduction in this form, though not a
// chain of nine (a 3x3 max pool), which keeps kiln_max's
template <typename T> static inline T kiln_max_acc(T a, T b) { return (a != a) ? a : ((a >= b) ? a : b); }
template <typename T> static inline T kiln_min_acc(T a, T b) { return (a != a) ? a : ((a <= b) ? a : b); }
template <typename T> static inline T kiln_relu(T a) { return a < 0 ? T(0) : a; }
// index min/max by value: std::min/max take references, which makes an omp simd loop keep its
// index temporaries in memory (and gcc then refuses to vectorize it)
static inline int64_t kiln_imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t kiln_imax(int64_t a, int64_t b) { return a > b ? a : b; }
template <typename T> static inline T kiln_sign(T a) { return T((a > T(0)) - (a < T(0))); }
template <typename T> static inline T kiln_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    if (b == 0) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && (b < 0) != (mod < 0)) div -= T(1);
    if (div == 0) return std::copysign(T(0), a / b);
    T fl = std::floor(div);
    return div - fl > T(0.5) ? fl + T(1) : fl;
  } else {
    if (b == 0) return 0;
    T q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
  }
}
template <typename T> static inline T kiln_truncdiv(T a, T b) { return b == 0 ? T(0) : T(a / b); }
template <typename T> static inline T kiln_remainder(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    T mod = std::fmod(a, b);
    if (mod != 0 && (b < 0) != (mod < 0)) mod += b;
    return mod;
  } else {
    if (b == 0) return 0;
    T r = a % b;
    if (r != 0 && (r < 0) != (b < 0)) r += b;
    return r;
  }
}
template <typename T> static inline T kiln_fmod(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::fmod(a, b);
  else return b == 0 ? T(0) : T(a % b);
}
template <typename T> static inline T kiln_ipow(T base, T exp) {
  T result = 1;
  while (exp > 0) { if (exp & 1) result *= base; base *= base; exp >>= 1; }
  return result;
}
static inline float kiln_round_f16(float x) { return (float)(_Float16)x; }
static inline float kiln_bf16_load(uint16_t v) {
  uint32_t u = (uint32_t)v << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline uint16_t kiln_bf16_store(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if (f != f) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
static inline float kiln_round_bf16(float x) { return kiln_bf16_load(kiln_bf16_store(x)); }

// float exp/tanh/sigmoid are kiln's own, inlined into the loop that gcc vectorizes; the other
// functions (erf among them: the Abramowitz-Stegun formula kiln had lost all relative accuracy
// near 0) call libm, whose vector variants gcc calls from vectorized loops (VECTOR_LIBM above).
// exp: Cody-Waite reduction + degree-6 polynomial, ~1.5 ulp, inf/NaN/denormal results as IEEE;
// double uses libm.
static inline float kiln_exp(float x) {
  // inputs whose result is 0 or inf (set at the end) compute exp(0) instead: scaling by 2^-150
  // makes denormal intermediates, which cost x86 ~100 cycles each (a masked attention row is
  // mostly float-min logits: 6x slower softmax). Two selects, not one with ||, which gcc does not
  // vectorize. NaN needs no select: it flows through the arithmetic (any NaN operand makes the
  // product NaN, whatever scale its bits give), which saves two of the ~20 vector ops; the integer
  // steps are unsigned so that NaN's bits do not overflow a signed int
  float xc = x < -103.97207708f ? 0.0f : x;
  xc = x > 88.72283905206835f ? 0.0f : xc;
  float t = xc * 1.44269504088896341f + 12582912.0f;  // round to nearest via the 1.5*2^23 trick
  float n = t - 12582912.0f;
  uint32_t ti; std::memcpy(&ti, &t, 4);
  int32_t ni = (int32_t)(ti - 0x4B400000u);
  float r = std::fma(n, -0.693359375f, xc);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500E-4f;
  p = std::fma(p, r, 1.3981999507E-3f);
  p = std::fma(p, r, 8.3334519073E-3f);
  p = std::fma(p, r, 4.1665795894E-2f);
  p = std::fma(p, r, 1.6666665459E-1f);
  p = std::fma(p, r, 5.0000001201E-1f);
  p = std::fma(p, r * r, r) + 1.0f;
  int32_t n1 = ni >> 1, n2 = (int32_t)((uint32_t)ni - (uint32_t)n1);  // two scalings reach denormal results
  uint32_t b1 = ((uint32_t)n1 + 127u) << 23, b2 = ((uint32_t)n2 + 127u) << 23;
  float s1, s2; std::memcpy(&s1, &b1, 4); std::memcpy(&s2, &b2, 4);
  float res = p * s1 * s2;
  res = x > 88.72283905206835f ? std::numeric_limits<float>::infinity() : res;
  return x < -103.97207708f ? 0.0f : res;
}
static inline double kiln_exp(double x) { return std::exp(x); }
static inline float kiln_tanh(float x) {
  float ax = x < 0 ? -x : x;
  float z = x * x;
  float small = ((((-5.70498872745E-3f * z + 2.06390887954E-2f) * z - 5.37397155531E-2f) * z
                  + 1.33314422036E-1f) * z - 3.33332819422E-1f) * z * x + x;
  float big = 1.0f - 2.0f / (kiln_exp(2.0f * ax) + 1.0f);
  big = x < 0 ? -big : big;
  float r = ax < 0.625f ? small : big;
  // NaN, and -0.0 (the polynomial gives +0.0), as eager; two selects, not one with ||, which
  // gcc does not vectorize
  r = x == 0.0f ? x : r;
  return x != x ? x : r;
}
static inline double kiln_tanh(double x) { return std::tanh(x); }
template <typename T> static inline T kiln_sigmoid(T x) { return T(1) / (T(1) + kiln_exp(-x)); }

// checks of generated kernels (codegen/cpp_memory.py): a failure records (code, index, bound) for
// the wrapper to raise, and the access goes to element 0 or nowhere
static __attribute__((noinline, cold)) int64_t kiln_fail(int64_t i, int64_t n, int64_t* err, int64_t code) {
  __atomic_store_n(&err[1], i, __ATOMIC_RELAXED);
  __atomic_store_n(&err[2], n, __ATOMIC_RELAXED);
  __atomic_store_n(&err[0], code, __ATOMIC_RELAXED);
  return 0;
}
static inline bool kiln_index_is_bad(int64_t i, int64_t n) { return (uint64_t)i >= (uint64_t)n; }
static inline int64_t kiln_index_or_zero(int64_t i, int64_t n) { return kiln_index_is_bad(i, n) ? 0 : i; }
static inline bool kiln_wrapped_index_is_bad(int64_t i, int64_t n) { return (uint64_t)(i + n) >= (uint64_t)(2 * n); }
static inline int64_t kiln_wrapped_index_or_zero(int64_t i, int64_t n) {
  return kiln_wrapped_index_is_bad(i, n) ? 0 : (i < 0 ? i + n : i);
}
static inline bool kiln_in_bounds(int64_t i, int64_t n, int64_t* err, int64_t code) {
  if ((uint64_t)i < (uint64_t)n) return true;
  kiln_fail(i, n, err, code);
  return false;
}
template <typename T> static inline T kiln_checked_load(const T* p, int64_t i, int64_t n, int64_t* err, int64_t code) {
  return kiln_in_bounds(i, n, err, code) ? p[i] : T(0);
}

extern "C" {
DECLARE_VECTOR_LIBM
// float -> int casts are xor-ed with this (0, but the compiler cannot know: another library may
// define it), so gcc cannot turn (float)(int)x into trunc(x), which under -fno-trapping-math it
// does, and which keeps trunc(-0.25) = -0.0 where the int round trip gives +0.0
int kiln_opaque_zero = 0;
}

#pragma omp declare reduction(kiln_maxr : float, double : omp_out = kiln_max(omp_out, omp_in)) \
    initializer(omp_priv = -std::numeric_limits<decltype(omp_orig)>::infinity())
#pragma omp declare reduction(kiln_minr : float, double : omp_out = kiln_min(omp_out, omp_in)) \
    initializer(omp_priv = std::numeric_limits<decltype(omp_orig)>::infinity())
"""


PRELUDE = PRELUDE.replace("DECLARE_VECTOR_LIBM", "\n".join(
    f"#pragma omp declare simd notinbranch\n{t} {name}{suffix}({', '.join([t] * arity)});"
    for names, arity in ((VECTOR_LIBM, 1), (VECTOR_LIBM_BINARY, 2))
    for name in names for t, suffix in (("float", "f"), ("double", ""))))
