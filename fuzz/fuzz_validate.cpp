// Fuzz target 1: kla_validate and kla_validate_backward (cuda/src/api/validate.cpp) and the
// host-only plan,
// kla_plan_chunk_forward_for (cuda/src/plan/), compiled in from their source paths, on parameter
// structs built from arbitrary bytes.
//
// Each input first builds a struct that is valid by construction (dtype, B, T, H, HV, K, V,
// padded or time-major input layouts, optional gates, varlen, states or a state pool) and
// checks that it is accepted; then it applies up to four mutations (any size, stride, enum
// (out-of-range values included), float, pointer, cu_seqlens / pool entry or count), then picks
// the device workspace (none, valid, or any pointer and size) and the arithmetic contract, and
// checks:
//   * kla_validate returns a kla_status in range, never NO_DEVICE / CUDA / UNSUPPORTED_PATH
//     (host-only validation), and ABI_MISMATCH exactly when the stamp is wrong;
//   * the message is "kla: ..." on failure and "" on success;
//   * the early checks (ABI stamp, dtype, coefficient, read-out, arithmetic, path, value_slice)
//     give exactly the status of the first one that fails, in kla_validate's order;
//   * if it returns KLA_SUCCESS, the struct is valid by the independent check below;
//   * if the independent check says valid, it is accepted;
//   * it touches no memory it was not given: cu_seqlens_host / state_indices_host point to heap
//     arrays of exactly the length the struct claims (num_seqs+1, N), so ASan reports any
//     overread; tensor and device pointers are unmapped garbage addresses or point into a small
//     harness buffer that is far smaller than the tensors claimed (never dereferenced).
// ABI 4 (read after all of the above, so older inputs decode as they did and keep their checks):
// the path request (mostly valid, sometimes any 32-bit value) and value_slice (0, 8, 16, 32, 64 or
// garbage) on a copy of the struct, checked the same way; a described device (compute capability,
// 1..200 multiprocessors, 0..256 KB of shared memory, tensor maps or not) for
// kla_plan_chunk_forward_for, whose result is checked against kla.h's promises without the
// library's arithmetic (check_plan below); and, rarely, a corrupted abi_version / struct_size,
// which must give KLA_ERROR_ABI_MISMATCH whatever the other fields hold, from kla_validate and
// from the plan (which validates first).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "bytes.hpp"
#include "kla/kla.h"
#include "plan/plan.hpp"

using kla::fuzz::Bytes;
using i128 = __int128;

namespace {

alignas(64) unsigned char g_buf[4096];
// Addresses that are never mapped: validation must not dereference them.
constexpr std::uintptr_t kGarbage = 0x100000000000ull;

int g_invalid_line = 0;

// Enum fields are read and written as raw 32-bit integers: a C caller may store any int there.
static_assert(sizeof(kla_dtype) == 4 && sizeof(kla_coefficient) == 4 && sizeof(kla_readout) == 4 &&
              sizeof(kla_arithmetic) == 4 && sizeof(kla_path) == 4);
template <class E>
std::int32_t raw_enum(const E& e) {
  std::int32_t v;
  std::memcpy(&v, &e, 4);
  return v;
}
template <class E>
void set_enum(E& e, std::int32_t v) {
  std::memcpy(&e, &v, 4);
}

[[noreturn]] void die(const char* what, const kla_params& p, int st) {
  std::fprintf(stderr,
               "fuzz_validate: %s (status %d, message '%s', independent check line %d)\n  "
               "abi_version=%u struct_size=%u dtype=%d B=%lld T=%lld H=%lld HV=%lld K=%lld "
               "V=%lld num_seqs=%lld pool_size=%lld arithmetic=%d path=%d value_slice=%d "
               "workspace=%p workspace_size=%zu\n",
               what, st, kla_last_error_message(), g_invalid_line, p.abi_version, p.struct_size,
               int(raw_enum(p.dtype)), (long long)p.batch, (long long)p.seq_len,
               (long long)p.num_heads, (long long)p.num_v_heads, (long long)p.head_dim_k,
               (long long)p.head_dim_v, (long long)p.num_seqs, (long long)p.pool_size,
               int(raw_enum(p.arithmetic)), int(raw_enum(p.path)), int(p.value_slice), p.workspace,
               p.workspace_size);
  std::abort();
}

bool aligned(const void* p, std::uintptr_t a) {
  return (reinterpret_cast<std::uintptr_t>(p) % a) == 0;
}

// ---- the harness-owned host arrays --------------------------------------------------------------

struct HostArrays {
  std::vector<std::int32_t> cu, idx;  // logical contents (before sizing)
  bool cu_host = false, idx_host = false;
  std::unique_ptr<std::int32_t[]> cu_mem, idx_mem;  // exactly the claimed length
  std::int64_t cu_len = 0, idx_len = 0;
};

// ---- independent validity check -----------------------------------------------------------------

enum class Verdict { valid, invalid, unsure };
// The line of the independent check that said "invalid" (printed on failure).
#define KLA_INVALID() (g_invalid_line = __LINE__, Verdict::invalid)

// Saturating i128 arithmetic: every value is clamped to +-2^100, far beyond any int64 quantity,
// so sums and products of a few of them never overflow.
constexpr i128 kCap = i128(1) << 100;
i128 clamp(i128 x) {
  return x > kCap ? kCap : x < -kCap ? -kCap : x;
}
i128 mul(i128 a, i128 b) {
  i128 r;
  if (__builtin_mul_overflow(clamp(a), clamp(b), &r)) return (a < 0) != (b < 0) ? -kCap : kCap;
  return clamp(r);
}
i128 add(i128 a, i128 b) {
  return clamp(clamp(a) + clamp(b));
}

// Largest element offset + 1 of a [B,T,X,last] view (strides of extent-1 dims unused), in i128.
i128 span(const std::int64_t s[3], const std::int64_t ext[3], std::int64_t last) {
  i128 m = last;
  for (int d = 0; d < 3; ++d)
    if (ext[d] > 1) m = add(m, mul(ext[d] - 1, s[d]));
  return m;
}

bool strides_ok(const std::int64_t s[3], const std::int64_t ext[3], int elem) {
  for (int d = 0; d < 3; ++d) {
    if (ext[d] <= 1) continue;
    if (s[d] <= 0) return false;
    if ((i128(s[d]) * elem) % 16 != 0) return false;
  }
  return true;
}

// Is the output view [B,T,HV,V] free of self-overlap? Rows are V contiguous elements, so it
// overlaps iff two row starts differ by less than V. Exact by enumeration for small views;
// for large ones: valid when the dimensions nest in the canonical order (head inside T inside
// B, as kla.h documents), otherwise unsure.
Verdict o_disjoint(const std::int64_t s[3], const std::int64_t ext[3], std::int64_t V) {
  const i128 rows = mul(mul(ext[0], ext[1]), ext[2]);
  if (rows <= 4096) {
    std::vector<i128> st;
    st.reserve(size_t(rows));
    for (std::int64_t b = 0; b < ext[0]; ++b)
      for (std::int64_t t = 0; t < ext[1]; ++t)
        for (std::int64_t h = 0; h < ext[2]; ++h)
          st.push_back(i128(b) * s[0] + i128(t) * s[1] + i128(h) * s[2]);
    std::sort(st.begin(), st.end());
    for (size_t i = 1; i < st.size(); ++i)
      if (st[i] - st[i - 1] < V) return KLA_INVALID();
    // Disjoint; the validator's rule is the canonical nesting, which may refuse a disjoint but
    // differently ordered layout.
  }
  i128 inner = V;
  for (int d = 2; d >= 0; --d) {
    if (ext[d] <= 1) continue;
    if (s[d] < inner) return rows <= 4096 ? Verdict::unsure : KLA_INVALID();
    inner = add(inner, mul(ext[d] - 1, s[d]));
  }
  return Verdict::valid;
}

// The validator's known gaps (docs/fuzzing.md, "Findings"): it does not reject views whose byte
// extent overflows int64. With KLA_FUZZ_MASK_KNOWN (cmake -DKLA_FUZZ_MASK_KNOWN=ON, for long runs
// until the fix lands) such structs count as "unsure" instead of invalid, so fuzzing goes on
// past them; the reproducers stay in fuzz/regressions/validate/.
#ifdef KLA_FUZZ_MASK_KNOWN
constexpr Verdict kUnaddressable = Verdict::unsure;
#else
constexpr Verdict kUnaddressable = Verdict::invalid;
#endif

// The checks kla_validate makes before it reads any size, in its order, with the status each one
// gives (kla.h's status comments; the order is validate.cpp's: the stamp first, because a struct
// of another layout has other fields at these offsets, then the enums, then the path request).
// nullopt: all of them pass, and the rest is judged by `independent`.
bool valid_value_slice(std::int32_t vs) {
  return vs == 0 || vs == 8 || vs == 16 || vs == 32 || vs == 64;
}
std::optional<kla_status> early_status(const kla_params& p) {
  if (p.abi_version != KLA_ABI_VERSION || p.struct_size != sizeof(kla_params))
    return KLA_ERROR_ABI_MISMATCH;
  const auto dt = raw_enum(p.dtype), co = raw_enum(p.coefficient), ro = raw_enum(p.readout);
  const auto fm = raw_enum(p.arithmetic), path = raw_enum(p.path);
  if (dt < 0 || dt > 2) return KLA_ERROR_UNSUPPORTED_DTYPE;
  if (co < 0 || co > 1 || ro < 0 || ro > 2 || fm < 0 || fm > 1) return KLA_ERROR_INVALID_VALUE;
  if (path < KLA_PATH_AUTO || path > KLA_PATH_TOKENWISE) return KLA_ERROR_INVALID_VALUE;
  if (!valid_value_slice(p.value_slice)) return KLA_ERROR_INVALID_VALUE;
  if (p.value_slice != 0 && path == KLA_PATH_AUTO) return KLA_ERROR_INVALID_VALUE;
  return std::nullopt;
}

/// The workspace a call needs, from kla.h's documented layout alone (not the library's code): per
/// 64-token chunk slot (fixed lengths: N * ceil(T / 64); packed: T / 64 + N) one record of 34048
/// bytes a value head (T and P, 64 x 64 fp32 each, and 5 x 64 fp32 scalars), plus, for fp32 with
/// arithmetic FAST at head_dim_k 64, 96 or 128, the chunk's K and Q split into bf16 hi + lo:
/// 2 x ceil(K / 64) x 64 x 128 bytes each, per key head. Head dims set (validated).
/// Or, where kla.h says the sequence split may run (kla_workspace_size's comment), the split's
/// buffers if larger: for n segments (segments, or 16 for 0), M = N n packed sequences over B T
/// tokens and W = K + V, the passes' records and images for those M sequences, 2 tokens HV W dtype
/// elements, 2 M HV K W and 2 M HV K V floats and M + 1 int32, each piece rounded up to 16 bytes.
/// kla.h "Saved states": (K V + 64 V) bf16 a chunk slot and value head for bf16 FAST calls at
/// K = V = 128 without a state pool whose path request is AUTO or WY with value_slice 0 or 32, or
/// WY_TRANSPOSED with 0 or 64, and segments 0 or 1; 0 for every other call.
i128 documented_saved_states_size(const kla_params& p) {
  const bool can = raw_enum(p.dtype) == 1 && raw_enum(p.arithmetic) == 1 && p.head_dim_k == 128 &&
                   p.head_dim_v == 128 && !p.state_pool &&
                   (((raw_enum(p.path) == 0 || raw_enum(p.path) == 1) &&
                     (p.value_slice == 0 || p.value_slice == 32)) ||
                    (raw_enum(p.path) == 2 && (p.value_slice == 0 || p.value_slice == 64))) &&
                   (p.segments == 0 || p.segments == 1);
  if (!can) return 0;
  const bool packed = p.cu_seqlens != nullptr;
  const std::int64_t N = packed ? p.num_seqs : p.batch, T = p.seq_len;
  const i128 slots = packed ? i128(T / 64 + N) : mul(N, (T + 63) / 64);
  return mul(mul(slots, p.num_v_heads), (128 * 128 + 64 * 128) * 2);
}

i128 documented_workspace_size(const kla_params& p) {
  const bool packed = p.cu_seqlens != nullptr;
  const std::int64_t N = packed ? p.num_seqs : p.batch, T = p.seq_len, K = p.head_dim_k;
  const std::int64_t V = p.head_dim_v, HV = p.num_v_heads;
  const bool images =
      raw_enum(p.dtype) == 0 && raw_enum(p.arithmetic) == 1 && (K == 64 || K == 96 || K == 128);
  const i128 image = images ? i128(2 * ((K + 63) / 64) * 64 * 128) : 0;
  const auto records = [&](i128 slots) {
    return mul(slots, add(mul(HV, 34048), mul(2 * p.num_heads, image)));
  };
  const i128 one = records(packed ? i128(T / 64 + N) : mul(N, (T + 63) / 64));
  // When the split may run.
  const std::int64_t tokens = packed ? T : p.batch * T;
  bool split = p.segments != 1 && (p.segments >= 2 || N * HV <= 4) && K + V <= 256 &&
               !p.state_pool &&
               (packed || i128(p.batch) * T <= std::numeric_limits<std::int32_t>::max());
  if (split && !packed && p.batch > 1) {
    const struct {
      const void* ptr;
      const std::int64_t* s;
    } t[] = {{p.q, p.q_strides}, {p.k, p.k_strides}, {p.v, p.v_strides},
             {p.o, p.o_strides}, {p.g, p.g_strides}, {p.eta, p.eta_strides}};
    for (const auto& x : t)
      if (x.ptr && i128(x.s[0]) != mul(T, x.s[1])) split = false;
  }
  if (!split) return one;
  const i128 n = p.segments >= 2 ? p.segments : 16, M = i128(N) * n, W = K + V;
  if (M > std::numeric_limits<std::int32_t>::max()) return one;
  const std::int64_t es = raw_enum(p.dtype) == 0 ? 4 : 2;
  const auto r16 = [](i128 x) { return (x + 15) / 16 * 16; };
  i128 extra = r16(records(i128(tokens / 64) + M));
  extra = add(extra, mul(2, r16(mul(mul(tokens, HV), W * es))));
  extra = add(extra, mul(2, r16(mul(mul(M, HV), K * W * 4))));
  extra = add(extra, mul(2, r16(mul(mul(M, HV), K * V * 4))));
  extra = add(extra, r16((M + 1) * 4));
  if (extra > (i128(1) << 62)) return one;  // the split cannot run
  return extra > one ? extra : one;         // a call runs one pass or the split
}

Verdict independent(const kla_params& p, const HostArrays& a) {
  bool addressable = true;
  if (p.abi_version != KLA_ABI_VERSION || p.struct_size != sizeof(kla_params)) return KLA_INVALID();
  const auto dt = raw_enum(p.dtype), co = raw_enum(p.coefficient), ro = raw_enum(p.readout);
  const auto fm = raw_enum(p.arithmetic), path = raw_enum(p.path);
  if (dt < 0 || dt > 2 || co < 0 || co > 1 || ro < 0 || ro > 2 || fm < 0 || fm > 1)
    return KLA_INVALID();
  // ABI 4: a known path; value_slice 0 or one of the documented widths, nonzero only with an
  // explicit path.
  if (path < 0 || path > 5 || !valid_value_slice(p.value_slice) || (p.value_slice && path == 0))
    return KLA_INVALID();
  if (p.segments < 0 || p.segments > 16) return KLA_INVALID();  // the sequence split's count
  const std::int64_t B = p.batch, T = p.seq_len, H = p.num_heads, HV = p.num_v_heads;
  const std::int64_t K = p.head_dim_k, V = p.head_dim_v;
  if (B <= 0 || T <= 0 || H <= 0 || HV <= 0 || K <= 0 || V <= 0) return KLA_INVALID();
  if (HV % H != 0) return KLA_INVALID();
  for (std::int64_t d : {K, V})
    if (d < 16 || d > 256 || d % 16 != 0) return KLA_INVALID();
  // The kernels index sequences, tokens and heads with 32-bit integers.
  for (std::int64_t n : {B, T, H, HV})
    if (n > std::numeric_limits<std::int32_t>::max()) return KLA_INVALID();
  for (const void* t : {p.q, p.k, p.v, static_cast<const void*>(p.o)})
    if (!t || !aligned(t, 16)) return KLA_INVALID();
  const int elem = dt == 0 ? 4 : 2;
  const std::int64_t eqk[3] = {B, T, H}, evo[3] = {B, T, HV};
  if (!strides_ok(p.q_strides, eqk, elem) || !strides_ok(p.k_strides, eqk, elem) ||
      !strides_ok(p.v_strides, evo, elem) || !strides_ok(p.o_strides, evo, elem))
    return KLA_INVALID();
  // Every view must be addressable: its byte extent fits in int64 (kernels index with int64).
  const i128 lim = std::numeric_limits<std::int64_t>::max();
  if (mul(span(p.q_strides, eqk, K), elem) > lim || mul(span(p.k_strides, eqk, K), elem) > lim ||
      mul(span(p.v_strides, evo, V), elem) > lim || mul(span(p.o_strides, evo, V), elem) > lim)
    addressable = false;
  // (An unaddressable o is judged by `addressable` alone: its nesting sums would overflow int64.)
  Verdict verdict = addressable ? o_disjoint(p.o_strides, evo, V) : Verdict::unsure;
  if (verdict == Verdict::invalid) return verdict;
  for (auto [g, s] : {std::pair{p.g, p.g_strides}, std::pair{p.eta, p.eta_strides}}) {
    if (!g) continue;
    if (!aligned(g, 4)) return KLA_INVALID();
    if ((B > 1 && s[0] <= 0) || (T > 1 && s[1] <= 0)) return KLA_INVALID();
    const i128 ext = add(add(mul(B - 1, B > 1 ? s[0] : 0), mul(T - 1, T > 1 ? s[1] : 0)), HV);
    if (mul(ext, 4) > lim) addressable = false;
  }
  if (!p.eta && !std::isfinite(p.eta_value)) return KLA_INVALID();
  if (!std::isfinite(p.eps) || p.eps < 0) return KLA_INVALID();
  // The scale is read by the SCALE and QK_L2NORM read-outs.
  if (ro != KLA_READOUT_Q_L2NORM && !std::isfinite(p.scale)) return KLA_INVALID();
  std::int64_t N = B;
  if (bool(p.cu_seqlens) != bool(p.cu_seqlens_host)) return KLA_INVALID();
  if (p.cu_seqlens) {
    if (B != 1 || p.num_seqs <= 0 || p.num_seqs > std::numeric_limits<std::int32_t>::max())
      return KLA_INVALID();
    N = p.num_seqs;
    const std::int32_t* cu = p.cu_seqlens_host;
    if (cu[0] != 0 || cu[N] != T) return KLA_INVALID();
    for (std::int64_t n = 0; n < N; ++n)
      if (cu[n + 1] < cu[n]) return KLA_INVALID();
  }
  const i128 state_bytes = mul(mul(mul(N, HV), K * V), 4);
  if (state_bytes > lim) addressable = false;
  if (p.state_pool) {
    if (p.initial_state || p.final_state) return KLA_INVALID();
    if (!aligned(p.state_pool, 16) || p.pool_size <= 0 ||
        p.pool_size > std::numeric_limits<std::int32_t>::max())
      return KLA_INVALID();
    if (!p.state_indices || !p.state_indices_host) return KLA_INVALID();
    if (mul(mul(mul(p.pool_size, HV), K * V), 4) > lim) addressable = false;
    std::unordered_set<std::int32_t> seen;
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int32_t i = p.state_indices_host[n];
      if (i < -1 || i >= p.pool_size) return KLA_INVALID();
      if (i >= 0 && !seen.insert(i).second) return KLA_INVALID();
    }
  } else if (p.state_indices || p.state_indices_host) {
    return KLA_INVALID();
  }
  if (p.initial_state && !aligned(p.initial_state, 16)) return KLA_INVALID();
  if (p.final_state && !aligned(p.final_state, 16)) return KLA_INVALID();
  if (p.workspace &&
      (!aligned(p.workspace, 16) || i128(p.workspace_size) < documented_workspace_size(p)))
    return KLA_INVALID();  // the documented rule: 16-byte aligned, at least the documented size
  if (addressable && p.initial_state && p.final_state &&
      static_cast<const void*>(p.initial_state) != static_cast<const void*>(p.final_state)) {
    const i128 x = i128(reinterpret_cast<std::uintptr_t>(p.initial_state));
    const i128 y = i128(reinterpret_cast<std::uintptr_t>(p.final_state));
    if (x < add(y, state_bytes) && y < add(x, state_bytes)) return KLA_INVALID();
  }
  (void)a;
  return addressable ? verdict : kUnaddressable;
}

// ---- building structs ---------------------------------------------------------------------------

void* buf_at(std::size_t off) {
  return g_buf + (off % sizeof(g_buf));
}
void* garbage(std::uintptr_t off) {
  return reinterpret_cast<void*>(kGarbage + off);
}

// A pointer picked from bytes: NULL, into the harness buffer (aligned or not), or garbage.
void* pick_ptr(Bytes& r) {
  const unsigned sel = r.u8();
  const unsigned off = r.u8();
  switch (sel % 7) {
    case 0: return nullptr;
    case 1: return buf_at(16u * off);
    case 2: return buf_at(16u * off + 1 + off % 15);  // misaligned by 1..15 bytes
    case 3: return buf_at(4u * off);                  // 4-byte aligned
    case 4: return garbage(16u * off);
    case 5: return garbage(off);
    default: return buf_at(2u * off);
  }
}

std::int64_t pick_i64(Bytes& r, std::int64_t cur) {
  const auto wrap = [](std::uint64_t u) {
    std::int64_t v;
    std::memcpy(&v, &u, 8);
    return v;
  };
  switch (r.u8() % 18) {
    case 0: return 0;
    case 1: return -1;
    case 2: return 1;
    case 3: return wrap(std::uint64_t(cur) + 1);
    case 4: return wrap(std::uint64_t(cur) - 1);
    case 5: return wrap(std::uint64_t(cur) * 2);
    case 6: return std::numeric_limits<std::int64_t>::max();
    case 7: return std::numeric_limits<std::int64_t>::min();
    case 8: return std::numeric_limits<std::int32_t>::max();
    case 9: return std::int64_t(std::numeric_limits<std::int32_t>::max()) + 1;
    case 10: return std::int64_t(1) << r.range(16, 47);
    case 11: return 16 * std::int64_t(r.range(0, 20));
    case 12: return r.range(1, 16);
    case 13: return wrap(0 - std::uint64_t(cur));
    case 14: return (std::int64_t(1) << 62) + r.range(0, 3);
    case 15: return wrap(std::uint64_t(cur) + 8 * std::uint64_t(r.range(-4, 9)));
    default: return r.i64();
  }
}

float pick_f32(Bytes& r) {
  switch (r.u8() % 10) {
    case 0: return std::numeric_limits<float>::quiet_NaN();
    case 1: return std::numeric_limits<float>::infinity();
    case 2: return -std::numeric_limits<float>::infinity();
    case 3: return -0.0f;
    case 4: return -1.0f;
    case 5: return std::numeric_limits<float>::denorm_min();
    case 6: return std::numeric_limits<float>::max();
    case 7: return 0.0f;
    case 8: return -std::numeric_limits<float>::denorm_min();
    default: return r.f32();
  }
}

// A struct that kla.h says is valid, built from bytes.
void build_valid(Bytes& r, kla_params& p, HostArrays& a) {
  kla_params_init(&p);
  const int dt = r.range(0, 3);
  set_enum(p.dtype, dt);
  const int elem = dt == 0 ? 4 : 2, align_el = 16 / elem;
  const std::int64_t B = r.range(1, 3), T = r.range(1, 48), H = r.range(1, 4);
  const std::int64_t HV = H * r.range(1, 3), K = 16 * r.range(1, 16), V = 16 * r.range(1, 16);
  p.batch = B, p.seq_len = T, p.num_heads = H, p.num_v_heads = HV, p.head_dim_k = K,
  p.head_dim_v = V;
  auto layout = [&](std::int64_t* s, std::int64_t heads, std::int64_t last, bool may_transpose) {
    const std::int64_t hs = last + align_el * r.range(0, 3);
    if (may_transpose && r.flag()) {  // time-major [T,B,H,last]: allowed for inputs
      s[0] = heads * hs, s[1] = B * heads * hs, s[2] = hs;
    } else {
      s[0] = T * heads * hs, s[1] = heads * hs, s[2] = hs;
    }
  };
  p.q = buf_at(16u * r.u8()), layout(p.q_strides, H, K, true);
  p.k = buf_at(16u * r.u8()), layout(p.k_strides, H, K, true);
  p.v = buf_at(16u * r.u8()), layout(p.v_strides, HV, V, true);
  p.o = buf_at(16u * r.u8()), layout(p.o_strides, HV, V, false);
  if (r.flag()) {
    p.g = static_cast<const float*>(buf_at(4u * r.u8()));
    p.g_strides[0] = T * HV, p.g_strides[1] = HV;
  }
  if (r.flag()) {
    p.eta = static_cast<const float*>(buf_at(4u * r.u8()));
    p.eta_strides[0] = T * HV + r.range(0, 4), p.eta_strides[1] = HV;
  }
  p.eta_value = float(r.range(0, 17)) / 8.0f;
  p.eps = r.flag() ? 0.0f : float(r.u8()) / 64.0f;
  p.scale = float(r.u8()) / 16.0f;
  set_enum(p.coefficient, r.range(0, 2));
  set_enum(p.readout, r.range(0, 3));
  std::int64_t N = B;
  if (B == 1 && r.flag()) {
    N = r.range(1, 6);
    std::vector<std::int32_t> cuts(size_t(N - 1));
    for (auto& c : cuts) c = std::int32_t(r.u8() % (T + 1));
    std::sort(cuts.begin(), cuts.end());
    a.cu = {0};
    a.cu.insert(a.cu.end(), cuts.begin(), cuts.end());
    a.cu.push_back(std::int32_t(T));
    a.cu_host = true;
    p.num_seqs = N;
    p.cu_seqlens = static_cast<const std::int32_t*>(garbage(0x1000));
  }
  const std::uintptr_t state_bytes = std::uintptr_t(N * HV * K * V * 4);
  switch (r.range(0, 6)) {
    case 1: p.initial_state = static_cast<const float*>(buf_at(16u * r.u8())); break;
    case 2: p.final_state = static_cast<float*>(buf_at(16u * r.u8())); break;
    case 3:
      p.final_state = static_cast<float*>(garbage(0x2000));
      p.initial_state = p.final_state;
      break;
    case 4:
      p.initial_state = static_cast<const float*>(garbage(0x4000));
      p.final_state = static_cast<float*>(garbage(0x4000 + state_bytes + 16u * r.u8()));
      break;
    case 5: {
      p.state_pool = static_cast<float*>(garbage(0x8000));
      p.pool_size = N + r.range(0, 3);
      std::vector<std::int32_t> rows(size_t(p.pool_size));
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = std::int32_t(i);
      for (size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[r.u8() % i]);
      a.idx.assign(rows.begin(), rows.begin() + N);
      for (auto& x : a.idx)
        if (r.u8() % 4 == 0) x = -1;
      a.idx_host = true;
      p.state_indices = static_cast<const std::int32_t*>(garbage(0x3000));
      break;
    }
    default: break;
  }
}

void mutate(Bytes& r, kla_params& p, HostArrays& a) {
  std::int64_t* strides[] = {p.q_strides, p.k_strides, p.v_strides, p.o_strides};
  const unsigned field = r.u8() % 31;
  switch (field) {
    case 0: set_enum(p.dtype, std::int32_t(pick_i64(r, raw_enum(p.dtype)))); break;
    case 1: set_enum(p.coefficient, std::int32_t(pick_i64(r, raw_enum(p.coefficient)))); break;
    case 2: set_enum(p.readout, std::int32_t(pick_i64(r, raw_enum(p.readout)))); break;
    case 3: p.batch = pick_i64(r, p.batch); break;
    case 4: p.seq_len = pick_i64(r, p.seq_len); break;
    case 5: p.num_heads = pick_i64(r, p.num_heads); break;
    case 6: p.num_v_heads = pick_i64(r, p.num_v_heads); break;
    case 7: p.head_dim_k = pick_i64(r, p.head_dim_k); break;
    case 8: p.head_dim_v = pick_i64(r, p.head_dim_v); break;
    case 9:
    case 10: {
      const unsigned t = r.u8() % 4, d = r.u8() % 3;
      strides[t][d] = pick_i64(r, strides[t][d]);
      break;
    }
    case 11: {
      const unsigned d = r.u8() % 2;
      (r.flag() ? p.g_strides : p.eta_strides)[d] = pick_i64(r, p.g_strides[d]);
      break;
    }
    case 12: p.eta_value = pick_f32(r); break;
    case 13: p.eps = pick_f32(r); break;
    case 14: p.scale = pick_f32(r); break;
    case 15: {
      const unsigned t = r.u8() % 4;
      void* v = pick_ptr(r);
      if (t == 0) p.q = v;
      if (t == 1) p.k = v;
      if (t == 2) p.v = v;
      if (t == 3) p.o = v;
      break;
    }
    case 16: (r.flag() ? p.g : p.eta) = static_cast<const float*>(pick_ptr(r)); break;
    case 17: p.initial_state = static_cast<const float*>(pick_ptr(r)); break;
    case 18: p.final_state = static_cast<float*>(pick_ptr(r)); break;
    case 19: p.state_pool = static_cast<float*>(pick_ptr(r)); break;
    case 20: p.pool_size = pick_i64(r, p.pool_size); break;
    case 21: p.num_seqs = pick_i64(r, p.num_seqs); break;
    case 22:
      p.cu_seqlens = r.flag() ? nullptr : static_cast<const std::int32_t*>(pick_ptr(r));
      break;
    case 23: a.cu_host = !a.cu_host; break;
    case 24:
      p.state_indices = r.flag() ? nullptr : static_cast<const std::int32_t*>(pick_ptr(r));
      break;
    case 25: a.idx_host = !a.idx_host; break;
    case 26: {  // one cu_seqlens entry (appends when past the end)
      const size_t i = r.u8() % (a.cu.size() + 1);
      const auto v = std::int32_t(pick_i64(r, i < a.cu.size() ? a.cu[i] : 0));
      if (i < a.cu.size())
        a.cu[i] = v;
      else
        a.cu.push_back(v);
      break;
    }
    case 27: {  // one pool index
      const size_t i = r.u8() % (a.idx.size() + 1);
      const auto v = std::int32_t(pick_i64(r, i < a.idx.size() ? a.idx[i] : 0));
      if (i < a.idx.size())
        a.idx[i] = v;
      else
        a.idx.push_back(v);
      break;
    }
    case 28: {  // in-place / partially overlapping states
      p.final_state = static_cast<float*>(buf_at(16u * r.u8() + (r.flag() ? 4 : 0)));
      p.initial_state = static_cast<const float*>(buf_at(16u * r.u8()));
      break;
    }
    case 29: {  // the sequence split's count: valid 0..16 mostly, sometimes any
      const std::int32_t pick[] = {0, 1, 2, 3, 16, 17, -1};
      p.segments = r.flag() ? pick[r.u8() % 7] : std::int32_t(r.u32());
      break;
    }
    default: {  // a whole stride triple from raw bytes
      const unsigned t = r.u8() % 4;
      for (int d = 0; d < 3; ++d) strides[t][d] = r.i64();
      break;
    }
  }
}

// Sizes the host arrays to exactly what the struct claims and points the struct at them.
constexpr std::int64_t kMaxHostLen = 4096;
void attach(kla_params& p, HostArrays& a) {
  p.cu_seqlens_host = nullptr, p.state_indices_host = nullptr;
  if (a.cu_host) {
    if (p.num_seqs > kMaxHostLen - 1) p.num_seqs = kMaxHostLen - 1;  // what we can allocate
    a.cu_len = p.num_seqs >= 0 ? p.num_seqs + 1 : 1;
    a.cu_mem = std::make_unique<std::int32_t[]>(size_t(a.cu_len));
    for (std::int64_t i = 0; i < a.cu_len; ++i)
      a.cu_mem[size_t(i)] = size_t(i) < a.cu.size() ? a.cu[size_t(i)] : std::int32_t(p.seq_len);
    p.cu_seqlens_host = a.cu_mem.get();
  }
  if (a.idx_host) {
    const std::int64_t n = (p.cu_seqlens && p.cu_seqlens_host) ? p.num_seqs : p.batch;
    if (n > kMaxHostLen) return;  // cannot give that many: leave state_indices_host NULL
    a.idx_len = n > 0 ? n : 1;
    a.idx_mem = std::make_unique<std::int32_t[]>(size_t(a.idx_len));
    for (std::int64_t i = 0; i < a.idx_len; ++i)
      a.idx_mem[size_t(i)] = size_t(i) < a.idx.size() ? a.idx[size_t(i)] : -1;
    p.state_indices_host = a.idx_mem.get();
  }
}

int check(const kla_params& p, const HostArrays& a, bool built_valid) {
  const kla_status st = kla_validate(&p);
  const int s = int(st);
  if (s < KLA_SUCCESS || s > KLA_ERROR_ABI_MISMATCH) die("status out of range", p, s);
  if (st == KLA_ERROR_NO_DEVICE || st == KLA_ERROR_CUDA)
    die("host validation reported a device error", p, s);
  if (st == KLA_ERROR_UNSUPPORTED_PATH) die("validation reported a plan error", p, s);
  if (const auto want = early_status(p); want && st != *want) {
    std::fprintf(stderr, "fuzz_validate: expected status %d (%s)\n", int(*want),
                 kla_status_string(*want));
    die("an early check (stamp, enum, path, value_slice) gave the wrong status", p, s);
  }
  if (!early_status(p) && st == KLA_ERROR_ABI_MISMATCH)
    die("ABI mismatch on a stamped struct", p, s);
  const std::string msg = kla_last_error_message();
  if (st == KLA_SUCCESS && !msg.empty()) die("message set on success", p, s);
  if (st != KLA_SUCCESS && msg.rfind("kla: ", 0) != 0) die("empty or unprefixed message", p, s);
  if (std::strcmp(kla_status_string(st), "KLA_ERROR_UNKNOWN_STATUS") == 0)
    die("status without a name", p, s);
  g_invalid_line = 0;
  const Verdict v = independent(p, a);
  if (st == KLA_SUCCESS && v == Verdict::invalid) die("accepted an invalid struct", p, s);
  if (st != KLA_SUCCESS && v == Verdict::valid) die("rejected a valid struct", p, s);
  if (built_valid && st != KLA_SUCCESS) die("rejected a struct valid by construction", p, s);
  // The library's workspace size against kla.h's documented layout, computed independently.
  if (st == KLA_SUCCESS && i128(kla_workspace_size(&p)) != documented_workspace_size(p))
    die("kla_workspace_size differs from the documented layout", p, s);
  // The saved states' size reads the struct as it is (any enum value, any sizes) and must say
  // why it is 0; on a valid struct it is kla.h's.
  const std::size_t saved = kla_saved_states_size(&p);
  if (saved == 0 && std::string(kla_last_error_message()).rfind("kla: ", 0) != 0)
    die("kla_saved_states_size 0 without a message", p, s);
  if (st == KLA_SUCCESS && i128(saved) != documented_saved_states_size(p))
    die("kla_saved_states_size differs from kla.h's", p, s);
  return s;
}

// ---- ABI 4: the path request, the described device, the plan, the stamp -------------------------

// kla.h's names of the paths (kla_plan.path_name, kla_path_name), by value.
constexpr const char* kPathNames[] = {"auto", "wy",      "wy_transposed",
                                      "tf32", "generic", "tokenwise"};

// Mostly a valid path (0 = AUTO, so inputs that end before this byte keep AUTO), sometimes any
// 32-bit value.
std::int32_t pick_path(Bytes& r) {
  const unsigned sel = r.u8() % 16;
  if (sel < 12) return std::int32_t(sel % 6);
  switch (sel) {
    case 12: return -1;
    case 13: return KLA_PATH_TOKENWISE + 1;
    case 14: return std::int32_t(pick_i64(r, KLA_PATH_TOKENWISE));  // truncated to 32 bits
    default: return std::int32_t(r.u32());
  }
}

// Mostly 0 or a documented width, sometimes a near miss or any 32-bit value.
std::int32_t pick_value_slice(Bytes& r) {
  static constexpr std::int32_t kGood[] = {0, 8, 16, 32, 64, 0, 16, 32, 8, 0};
  constexpr std::int32_t kMin = std::numeric_limits<std::int32_t>::min();
  constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  static constexpr std::int32_t kBad[] = {-8, -1, 1, 4, 12, 24, 48, 96, 128, 256, kMin, kMax};
  const unsigned sel = r.u8() % 12;
  if (sel < 10) return kGood[sel];
  if (sel == 10) return kBad[r.u8() % 12];
  return std::int32_t(r.u32());
}

// A device for kla_plan_chunk_forward_for: H100, A100, or described field by field (compute
// capability from a list, 1..200 multiprocessors, 0..256 KB of opt-in shared memory, tensor maps
// or not).
kla_device_info pick_device(Bytes& r) {
  kla_device_info d{};
  switch (r.u8() % 4) {
    case 0: d = {9, 0, 132, 232448, 1}; break;
    case 1: d = {8, 0, 108, 166912, 1}; break;
    default: {
      static constexpr int kCc[][2] = {{9, 0}, {8, 0},  {8, 6},  {8, 9}, {7, 5},
                                       {7, 0}, {10, 0}, {12, 0}, {6, 1}, {9, 0}};
      const unsigned c = r.u8() % 10;
      d.compute_major = kCc[c][0], d.compute_minor = kCc[c][1];
      d.multiprocessors = 1 + r.u8() % 200;
      static constexpr std::int64_t kSmem[] = {0, 48 * 1024, 101376, 166912, 232448, 256 * 1024};
      const unsigned m = r.u8();
      d.max_smem_per_block =
          m % 2 ? kSmem[(m / 2) % 6] : std::int64_t(r.u32() % (256u * 1024u + 1u));
      d.tensor_maps = r.flag() ? 1 : 0;
    }
  }
  return d;
}

struct PlanResult {
  kla_status st = KLA_SUCCESS;
  kla_plan plan;
  std::string msg;
};

// The public entry point (this target compiles the plan with KLA_HAVE_SM90A: the build of the GPU
// preset, whose WY paths the plan may pick).
PlanResult plan_public(const kla_params& p, const kla_device_info& d) {
  PlanResult r;
  std::memset(&r.plan, 0xA5, sizeof r.plan);
  r.st = kla_plan_chunk_forward_for(&p, &d, &r.plan);
  r.msg = kla_last_error_message();
  return r;
}

// The plan of a build without sm_90a kernels (BuildInfo{false}), through the plan layer's own
// entry (plan/plan.hpp) for params kla_validate accepts.
PlanResult plan_no_sm90a(const kla_params& p, const kla_device_info& d) {
  PlanResult r;
  std::memset(&r.plan, 0xA5, sizeof r.plan);
  if (kla_validate(&p) != KLA_SUCCESS) std::abort();  // (also clears the message)
  kla::plan::Plan out;
  r.st = kla::plan::plan_chunk(p, kla::plan::from_c(d), kla::plan::BuildInfo{false}, out);
  if (r.st == KLA_SUCCESS) kla::plan::to_c(out, r.plan);
  r.msg = kla_last_error_message();
  return r;
}

[[noreturn]] void die_plan(const char* what, const kla_params& p, const kla_device_info& d,
                           const PlanResult& r, bool sm90a) {
  std::fprintf(stderr,
               "fuzz_validate: plan%s: %s\n  device: compute %d.%d, %d multiprocessors, "
               "max_smem_per_block %lld, tensor_maps %d; status %d, message '%s'\n",
               sm90a ? "" : " (build without sm_90a)", what, d.compute_major, d.compute_minor,
               d.multiprocessors, (long long)d.max_smem_per_block, d.tensor_maps, int(r.st),
               r.msg.c_str());
  if (r.st == KLA_SUCCESS) {
    const kla_plan& pl = r.plan;
    const void* nul = std::memchr(pl.reason, 0, sizeof pl.reason);
    const int len = nul ? int(static_cast<const char*>(nul) - pl.reason) : int(sizeof pl.reason);
    std::fprintf(stderr,
                 "  plan: path %d chunk_len %d value_slice %d stages %d threads %d blocks %lld "
                 "prep_blocks %lld smem %lld prep_smem %lld workspace_bytes %zu\n  reason '%.*s'\n",
                 int(raw_enum(pl.path)), pl.chunk_len, pl.value_slice, pl.stages, pl.threads,
                 (long long)pl.blocks, (long long)pl.prep_blocks, (long long)pl.smem_bytes,
                 (long long)pl.prep_smem_bytes, pl.workspace_bytes, len, pl.reason);
  }
  die(what, p, int(r.st));
}

// Two plans run the same kernels with the same tiling (the reason may differ).
bool same_plan(const kla_plan& a, const kla_plan& b) {
  return raw_enum(a.path) == raw_enum(b.path) && a.chunk_len == b.chunk_len &&
         a.value_slice == b.value_slice && a.stages == b.stages && a.threads == b.threads &&
         a.blocks == b.blocks && a.prep_blocks == b.prep_blocks && a.smem_bytes == b.smem_bytes &&
         a.prep_smem_bytes == b.prep_smem_bytes && a.workspace_bytes == b.workspace_bytes &&
         a.segments == b.segments;
}

// One plan result for validated params, against kla.h's promises (none of the library's own
// arithmetic: the documented path conditions, the grid that N x HV x V / value_slice blocks
// make, the device's limits, the caller's workspace).
void check_plan(const kla_params& p, const kla_device_info& d, const PlanResult& r, bool sm90a) {
  const auto bad = [&](const char* what) { die_plan(what, p, d, r, sm90a); };
  const std::int32_t want = raw_enum(p.path);
  if (r.st != KLA_SUCCESS && r.st != KLA_ERROR_UNSUPPORTED_PATH)
    bad("status is neither KLA_SUCCESS nor KLA_ERROR_UNSUPPORTED_PATH");
  if (r.st != KLA_SUCCESS) {
    if (r.msg.size() <= 5 || r.msg.rfind("kla: ", 0) != 0) bad("refused without a message");
    // (or, for a split that cannot run, the segments request: kla_params.segments)
    if (want != KLA_PATH_AUTO && r.msg.find(kPathNames[want]) == std::string::npos &&
        !(p.segments >= 2 && r.msg.rfind("kla: segments = ", 0) == 0))
      bad("the refusal of a requested path does not name the path");
    return;
  }
  if (want == KLA_PATH_TOKENWISE) bad("the chunk planner accepted a TOKENWISE request");
  const kla_plan& pl = r.plan;
  const std::int32_t path = raw_enum(pl.path);
  if (path < KLA_PATH_WY || path > KLA_PATH_TOKENWISE) bad("plan.path is AUTO or unknown");
  if (path == KLA_PATH_TOKENWISE) bad("the chunk planner planned the tokenwise kernel");
  if (want != KLA_PATH_AUTO && path != want) bad("a requested path was not honoured");
  if (!pl.path_name || std::strcmp(pl.path_name, kla_path_name(pl.path)) != 0 ||
      std::strcmp(pl.path_name, kPathNames[path]) != 0)
    bad("path_name is not kla_path_name(path)");
  if (!std::memchr(pl.reason, 0, sizeof pl.reason)) bad("reason not NUL-terminated in its buffer");
  if (pl.reason[0] == 0) bad("empty reason");
  const bool two_pass = path != KLA_PATH_GENERIC;
  const bool wy = path == KLA_PATH_WY || path == KLA_PATH_WY_TRANSPOSED;
  if (!p.workspace && two_pass) bad("a two-pass path without a workspace (only GENERIC can run)");
  if (!sm90a && wy) bad("a WY path in a build without sm_90a kernels");

  const std::int64_t K = p.head_dim_k, V = p.head_dim_v, HV = p.num_v_heads;
  // kla.h, kla_params.segments: a requested count runs as requested, 1 never splits; a split
  // plan's numbers are its second pass's, over N x segments sequences.
  if (pl.segments < 1 || pl.segments > 16) bad("segments not in [1, 16]");
  if (p.segments >= 2 && pl.segments != p.segments) bad("a requested split was not honoured");
  if (p.segments == 1 && pl.segments != 1) bad("split with segments = 1");
  if (pl.segments > 1 && K + V > 256) bad("a split with K + V > 256");
  const std::int64_t N = (p.cu_seqlens ? p.num_seqs : p.batch) * pl.segments;
  const std::int32_t vs = pl.value_slice;
  if (vs <= 0 || V % vs != 0) bad("value_slice does not divide head_dim_v");
  if (p.value_slice != 0 && vs != p.value_slice) bad("a requested value_slice was not honoured");
  const auto dt = raw_enum(p.dtype);
  const bool fast = raw_enum(p.arithmetic) == KLA_ARITHMETIC_FAST;
  // The documented conditions of each path (kla.h, kla_path and kla_params.value_slice).
  if (wy) {
    if (d.compute_major != 9) bad("a WY path on a device that is not compute capability 9.x");
    if (!d.tensor_maps) bad("a WY path without tensor maps");
  }
  switch (path) {
    case KLA_PATH_WY:
      if (vs != 8 && vs != 16 && vs != 32) bad("WY with a value_slice other than 8, 16, 32");
      if (vs == 8 && K < 96) bad("WY with 8-column slices and head_dim_k < 96");
      if (K != 64 && K != 96 && K != 128) bad("WY with head_dim_k not in {64, 96, 128}");
      if (dt == KLA_DTYPE_FP32 && !fast) bad("WY for fp32 with arithmetic ACCURATE");
      break;
    case KLA_PATH_WY_TRANSPOSED:
      if (vs != 64) bad("WY_TRANSPOSED with a value_slice other than 64");
      if (K != 64 && K != 128) bad("WY_TRANSPOSED with head_dim_k not in {64, 128}");
      if (V % 64 != 0) bad("WY_TRANSPOSED with head_dim_v not a multiple of 64");
      if (dt == KLA_DTYPE_FP32) bad("WY_TRANSPOSED for fp32");
      break;
    case KLA_PATH_TF32:
      if (vs != 8 && vs != 16 && vs != 32) bad("TF32 with a value_slice other than 8, 16, 32");
      if (d.compute_major < 8) bad("TF32 on a device before compute capability 8.0");
      break;
    default:  // GENERIC
      if (vs != 16 && vs != 32) bad("GENERIC with a value_slice other than 16, 32");
      // (a split on GENERIC passes keeps its own buffers in the workspace)
      if (pl.workspace_bytes != 0 && pl.segments == 1)
        bad("GENERIC (workspace-free) uses workspace bytes");
      if (pl.prep_blocks != 0 || pl.prep_smem_bytes != 0) bad("GENERIC (one pass) has a prep");
      break;
  }
  // kla.h, kla_arithmetic: FAST runs where asked for and the path has it (fp32 on WY, bf16 / fp16
  // on WY_TRANSPOSED); every other call runs ACCURATE.
  const bool fast_path =
      dt == KLA_DTYPE_FP32 ? path == KLA_PATH_WY : path == KLA_PATH_WY_TRANSPOSED;
  if (raw_enum(pl.arithmetic) !=
      (fast && fast_path ? KLA_ARITHMETIC_FAST : KLA_ARITHMETIC_ACCURATE))
    bad("kla_plan.arithmetic is not FAST exactly where asked for on a path that has it");
  if (two_pass ? pl.chunk_len != 64 : pl.chunk_len != 32 && pl.chunk_len != 64)
    bad("chunk_len is not 64 (two-pass paths) or 32 / 64 (generic)");
  if (two_pass && (pl.prep_blocks <= 0 || pl.workspace_bytes == 0))
    bad("a two-pass path without prep blocks or workspace bytes");
  if (pl.stages < 1) bad("stages < 1");
  if (pl.threads < 32 || pl.threads > 1024 || pl.threads % 32 != 0)
    bad("threads not a whole number of warps in [32, 1024]");
  if (vs > 0 && i128(pl.blocks) != i128(N) * HV * V / vs) bad("blocks != N * HV * V / value_slice");
  if (pl.blocks > std::numeric_limits<std::int32_t>::max()) bad("blocks exceed the grid's 2^31-1");
  if (pl.smem_bytes <= 0 || pl.smem_bytes > d.max_smem_per_block)
    bad("smem_bytes not in (0, the device's max_smem_per_block]");
  if (pl.prep_smem_bytes < 0 || pl.prep_smem_bytes > d.max_smem_per_block)
    bad("prep_smem_bytes not in [0, the device's max_smem_per_block]");
  if (!p.workspace && pl.workspace_bytes != 0) bad("workspace_bytes without a workspace");
  if (p.workspace && pl.workspace_bytes > p.workspace_size) bad("workspace_bytes > workspace_size");
  if (p.workspace && pl.workspace_bytes > kla_workspace_size(&p))
    bad("workspace_bytes > kla_workspace_size(p)");
}

// kla_plan_chunk_forward_for on params whose kla_validate status is `vstatus`: it validates first
// (same status and message on invalid params, whatever the device and plan pointers), then plans;
// the plan is checked (check_plan), deterministic, what the plan's own choice gives when
// requested explicitly, and what a build without the sm_90a kernels plans unless it is a WY path.
void check_plans(const kla_params& p, int vstatus, const kla_device_info& d) {
  const PlanResult r = plan_public(p, d);
  kla_plan scratch;
  if (vstatus != KLA_SUCCESS) {
    if (int(r.st) != vstatus) die_plan("status differs from kla_validate's", p, d, r, true);
    kla_validate(&p);
    if (r.msg != kla_last_error_message())
      die_plan("message differs from kla_validate's", p, d, r, true);
    if (int(kla_plan_chunk_forward_for(&p, nullptr, nullptr)) != vstatus)
      die_plan("NULL device / plan checked before the params", p, d, r, true);
    return;
  }
  if (kla_plan_chunk_forward_for(&p, nullptr, &scratch) != KLA_ERROR_NULL_POINTER ||
      kla_plan_chunk_forward_for(&p, &d, nullptr) != KLA_ERROR_NULL_POINTER)
    die_plan("a NULL device or plan is not KLA_ERROR_NULL_POINTER", p, d, r, true);
  check_plan(p, d, r, true);
  const PlanResult again = plan_public(p, d);
  if (again.st != r.st || again.msg != r.msg ||
      (r.st == KLA_SUCCESS &&
       (!same_plan(r.plan, again.plan) || std::strcmp(r.plan.reason, again.plan.reason) != 0)))
    die_plan("not deterministic", p, d, again, true);
  if (r.st == KLA_SUCCESS && p.value_slice == 0) {
    kla_params q = p;
    q.path = r.plan.path;
    q.value_slice = r.plan.value_slice;
    q.segments = r.plan.segments;  // (a split's maps pass may not take its second pass's width)
    const PlanResult rq = plan_public(q, d);
    if (r.plan.segments > 1 && rq.st == KLA_ERROR_UNSUPPORTED_PATH) {
      // the requested width applies to both passes: refused, with a message, is kla.h's rule
    } else if (rq.st != KLA_SUCCESS || !same_plan(r.plan, rq.plan))
      die_plan("the plan's own path and value_slice, requested explicitly, plan differently", q, d,
               rq, true);
  }
  const PlanResult rn = plan_no_sm90a(p, d);
  check_plan(p, d, rn, false);
  const std::int32_t path = r.st == KLA_SUCCESS ? raw_enum(r.plan.path) : -1;
  if (r.st != KLA_SUCCESS && rn.st == KLA_SUCCESS)
    die_plan("without sm_90a kernels it plans what the sm_90a build refuses", p, d, rn, false);
  if (r.st == KLA_SUCCESS && path != KLA_PATH_WY && path != KLA_PATH_WY_TRANSPOSED &&
      (rn.st != KLA_SUCCESS || !same_plan(r.plan, rn.plan)))
    die_plan("without sm_90a kernels a non-WY plan changes", p, d, rn, false);
}

// A stamp value other than `good`: 0, the previous ABI's, off by one, all ones or any.
std::uint32_t pick_bad_stamp(Bytes& r, std::uint32_t good, std::uint32_t older) {
  std::uint32_t v;
  switch (r.u8() % 6) {
    case 0: v = 0; break;
    case 1: v = older; break;
    case 2: v = good + 1; break;
    case 3: v = good - 1; break;
    case 4: v = 0xFFFFFFFFu; break;
    default: v = r.u32(); break;
  }
  return v == good ? good ^ 0x80000000u : v;
}

}  // namespace

// ---- the saved backward's plan (kla_plan_chunk_backward_saved_for)
// ----------------------------------------------------------

// The saved backward's plan of a valid backward b, for a fuzzed request (a kla_state_grad or any
// int, a segment from the valid ones or any int) on a fuzzed device, against rules written here
// independently of plan/backward_plan.cpp: a forward that cannot save (kla_saved_states_size 0) is
// UNSUPPORTED_PATH; then a request outside the enum, a segment other than 0, 8, ..., 128, or a
// nonzero one without CHAIN is INVALID_VALUE; a device description outside the forward plan's
// ranges INVALID_VALUE; CHAIN where the device is not 9.0 UNSUPPORTED_PATH. A success names SCAN or
// CHAIN (never AUTO), CHAIN only on 9.0, the segment asked for or one of the five, SCAN no
// segment, and a NUL-terminated reason; a refusal leaves the plan untouched.
void check_backward_plan(const kla_backward_params& b, Bytes& r) {
  const kla_device_info dev = pick_device(r);
  std::int32_t request = r.range(0, 3);
  if (r.u8() % 8 == 7) request = std::int32_t(r.u32());
  static constexpr std::int32_t kSegments[] = {0, 8, 16, 32, 64, 128};
  std::int32_t segment = r.flag() ? kSegments[r.u8() % 6] : 0;
  if (r.u8() % 8 == 7) segment = std::int32_t(r.u32());
  kla_backward_plan plan, untouched;
  std::memset(&plan, 0x5A, sizeof plan);
  std::memset(&untouched, 0x5A, sizeof untouched);
  const kla_status st = kla_plan_chunk_backward_saved_for(&b, &dev, request, segment, &plan);
  const std::string msg = kla_last_error_message();
  const int si = int(st);
  if (si < KLA_SUCCESS || si > KLA_ERROR_ABI_MISMATCH)
    die("backward plan: status out of range", b.forward, si);
  if (st != KLA_SUCCESS && msg.rfind("kla: ", 0) != 0)
    die("backward plan: unprefixed message", b.forward, si);
  if (st != KLA_SUCCESS && std::memcmp(&plan, &untouched, sizeof plan) != 0)
    die("backward plan: a refusal wrote the plan", b.forward, si);
  bool segment_ok = false;
  for (std::int32_t x : kSegments) segment_ok = segment_ok || x == segment;
  const bool can_save = kla_saved_states_size(&b.forward) > 0;
  const bool device_ok = dev.multiprocessors >= 1 && dev.max_smem_per_block >= 0;
  const bool sm90 = dev.compute_major == 9 && dev.compute_minor == 0;
  kla_status want = KLA_SUCCESS;
  if (!can_save)
    want = KLA_ERROR_UNSUPPORTED_PATH;
  else if (request < 0 || request > 2 || !segment_ok || (segment != 0 && request != 2))
    want = KLA_ERROR_INVALID_VALUE;
  else if (!device_ok)
    want = KLA_ERROR_INVALID_VALUE;
  else if (request == 2 && !sm90)
    want = KLA_ERROR_UNSUPPORTED_PATH;
  // The shared memory the kernels need is the plan's own rule (bwd_layout.hpp): a refusal for it
  // (UNSUPPORTED_PATH naming "shared memory") is accepted wherever success was expected.
  const bool smem_refusal =
      st == KLA_ERROR_UNSUPPORTED_PATH && msg.find("shared memory") != std::string::npos;
  if (st != want && !(want == KLA_SUCCESS && smem_refusal) &&
      !(want == KLA_ERROR_UNSUPPORTED_PATH && smem_refusal && request == 2)) {
    std::fprintf(stderr, "fuzz_validate: backward plan expected %s, got %s ('%s')\n",
                 kla_status_string(want), kla_status_string(st), msg.c_str());
    die("backward plan: wrong status", b.forward, si);
  }
  if (st != KLA_SUCCESS) return;
  if (plan.state_grad != KLA_STATE_GRAD_SCAN && plan.state_grad != KLA_STATE_GRAD_CHAIN)
    die("backward plan: neither SCAN nor CHAIN", b.forward, si);
  if (request == 1 && plan.state_grad != KLA_STATE_GRAD_SCAN)
    die("backward plan: SCAN asked, not given", b.forward, si);
  if (request == 2 && plan.state_grad != KLA_STATE_GRAD_CHAIN)
    die("backward plan: CHAIN asked, not given", b.forward, si);
  if (plan.state_grad == KLA_STATE_GRAD_CHAIN &&
      (!sm90 || plan.prep_beside != 0 ||
       (segment != 0 ? plan.chain_segment != segment
                     : plan.chain_segment < 8 || plan.chain_segment > 128 ||
                           (plan.chain_segment & (plan.chain_segment - 1)) != 0)))
    die("backward plan: a chain that cannot be", b.forward, si);
  if (plan.state_grad == KLA_STATE_GRAD_SCAN &&
      (plan.chain_segment != 0 || (plan.prep_beside != 0 && plan.prep_beside != 1)))
    die("backward plan: a scan with a segment", b.forward, si);
  if (std::memchr(plan.reason, 0, sizeof plan.reason) == nullptr || plan.reason[0] == 0)
    die("backward plan: reason not a string", b.forward, si);
}

// ---- the backward (kla_validate_backward)
// ----------------------------------------------------------

// kla_validate_backward on the backward of forward params p: gradient tensors that are valid by
// construction (contiguous, 16-byte aligned garbage addresses, dg / deta exactly where g / eta
// are, a workspace of kla_backward_workspace_size), then at most one planted fault with the
// status it must give. Checks the status range, the message convention, success where the
// forward (with d_o as o and what the backward ignores cleared) is valid, and each fault's status
// where it is the only thing wrong.
void check_backward(const kla_params& p, Bytes& r) {
  kla_backward_params b;
  kla_backward_params_init(&b);
  b.forward = p;
  const std::int64_t B = p.batch, T = p.seq_len, H = p.num_heads, HV = p.num_v_heads;
  const std::int64_t K = p.head_dim_k, V = p.head_dim_v;
  b.d_o = p.o;
  for (int d = 0; d < 3; ++d) b.d_o_strides[d] = p.o_strides[d];
  // Contiguous strides, where they fit in 64 bits (else the case only checks the conventions).
  std::int64_t qs[3] = {1, 1, 1}, vs[3] = {1, 1, 1}, gs = 1, hk = 0, hv = 0, gt = 0;
  const bool fits = !__builtin_mul_overflow(H, K, &hk) && !__builtin_mul_overflow(T, hk, &qs[0]) &&
                    !__builtin_mul_overflow(HV, V, &hv) && !__builtin_mul_overflow(T, hv, &vs[0]) &&
                    !__builtin_mul_overflow(T, HV, &gt);
  if (fits)
    qs[1] = hk, qs[2] = K, vs[1] = hv, vs[2] = V, gs = HV;
  else
    qs[0] = vs[0] = 1;
  b.dq = garbage(0x100000), b.dk = garbage(0x200000), b.dv = garbage(0x300000);
  for (int d = 0; d < 3; ++d) b.dq_strides[d] = b.dk_strides[d] = qs[d], b.dv_strides[d] = vs[d];
  if (p.g) {
    b.dg = static_cast<float*>(garbage(0x400000));
    b.dg_strides[0] = gt, b.dg_strides[1] = gs;
  }
  if (p.eta) {
    b.deta = static_cast<float*>(garbage(0x500000));
    b.deta_strides[0] = gt, b.deta_strides[1] = gs;
  }
  b.workspace = garbage(0x600000);
  b.workspace_size = kla_backward_workspace_size(&b);
  // The forward as the backward validates it (its arithmetic is the backward's: kept, so an
  // unknown one is refused).
  kla_params f = p;
  f.o = const_cast<void*>(b.d_o);
  f.final_state = nullptr, f.workspace = nullptr, f.workspace_size = 0;
  set_enum(f.path, KLA_PATH_AUTO), f.value_slice = 0;
  const bool stamped = p.abi_version == KLA_ABI_VERSION && p.struct_size == sizeof(kla_params);
  const bool fwd_ok = stamped && !p.state_pool && kla_validate(&f) == KLA_SUCCESS && K <= 128 &&
                      V <= 128 && b.workspace_size > 0;
  const bool sane = fwd_ok && fits && B > 0 && T > 0 && H > 0 && HV > 0;
  kla_status want = KLA_SUCCESS;
  switch (r.u8() % 8) {
    case 1: b.dq = nullptr, want = KLA_ERROR_NULL_POINTER; break;
    case 2: b.dv = garbage(0x300001), want = KLA_ERROR_MISALIGNED; break;
    case 3:
      if (T > 1 && K >= 16 && K <= 4096)  // a T stride of 0 (K = 16) or one that overlaps
        b.dk_strides[1] = K - 16, want = KLA_ERROR_BAD_STRIDE;
      break;
    case 4:
      if (!p.g)
        b.dg = static_cast<float*>(garbage(0x400000)), want = KLA_ERROR_INVALID_VALUE;
      else
        b.dg = nullptr, want = KLA_ERROR_NULL_POINTER;
      break;
    case 5:
      if (b.workspace_size > 0) b.workspace_size -= 1, want = KLA_ERROR_INVALID_SIZE;
      break;
    case 6: b.abi_version = KLA_ABI_VERSION + 1, want = KLA_ERROR_ABI_MISMATCH; break;
    default: break;
  }
  const kla_status st = kla_validate_backward(&b);
  const int si = int(st);
  if (si < KLA_SUCCESS || si > KLA_ERROR_ABI_MISMATCH) die("backward: status out of range", p, si);
  if (st == KLA_ERROR_NO_DEVICE || st == KLA_ERROR_CUDA || st == KLA_ERROR_UNSUPPORTED_PATH)
    die("backward: host validation reported a device or plan error", p, si);
  const std::string msg = kla_last_error_message();
  if (st == KLA_SUCCESS && !msg.empty()) die("backward: message set on success", p, si);
  if (st != KLA_SUCCESS && msg.rfind("kla: ", 0) != 0) die("backward: unprefixed message", p, si);
  if (want == KLA_ERROR_ABI_MISMATCH && st != want) die("backward: stamp not refused", p, si);
  if (sane && st != want) {
    std::fprintf(stderr, "fuzz_validate: backward expected %s, got %s ('%s')\n",
                 kla_status_string(want), kla_status_string(st), msg.c_str());
    die("backward: wrong status on a valid forward", p, si);
  }
  if (st == KLA_SUCCESS) check_backward_plan(b, r);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (kla_validate(nullptr) != KLA_ERROR_NULL_POINTER) std::abort();
  kla_params_init(nullptr);  // must not crash
  if (kla_abi_version() != KLA_ABI_VERSION || !kla::plan::this_build().sm90a) std::abort();
  {  // kla_params_init: the stamp and kla.h's defaults, over a struct full of garbage
    kla_params d;
    std::memset(&d, 0xA5, sizeof d);
    kla_params_init(&d);
    if (d.abi_version != KLA_ABI_VERSION || d.struct_size != sizeof(kla_params) ||
        raw_enum(d.path) != KLA_PATH_AUTO || d.value_slice != 0 || d.eta_value != 1.0f ||
        d.eps != 0.0f || d.scale != 0.0f || raw_enum(d.coefficient) != KLA_COEFF_KACZMARZ ||
        raw_enum(d.readout) != KLA_READOUT_SCALE || raw_enum(d.arithmetic) != 0 ||
        d.segments != 0 || d.workspace || d.q || d.cu_seqlens || d.state_pool)
      std::abort();
  }
  for (std::int32_t v = 0; v <= KLA_PATH_TOKENWISE; ++v) {
    kla_path path;
    set_enum(path, v);
    if (std::strcmp(kla_path_name(path), kPathNames[v]) != 0) std::abort();
  }
  Bytes r(data, size);
  kla_params p;
  HostArrays a;
  build_valid(r, p, a);
  {
    kla_params q = p;
    HostArrays b;
    b.cu = a.cu, b.idx = a.idx, b.cu_host = a.cu_host, b.idx_host = a.idx_host;
    attach(q, b);
    check(q, b, true);
  }
  const int n = r.u8() % 5;
  for (int i = 0; i < n; ++i) mutate(r, p, a);
  attach(p, a);
  // Last (so that inputs written before it existed decode as they did): the device workspace.
  const unsigned ws_case = r.u8() % 4;
  switch (ws_case) {
    case 2:  // valid: 16-byte aligned, at least kla_workspace_size(p) bytes
      p.workspace = garbage(0x10000);
      p.workspace_size = kla_workspace_size(&p) + 16u * r.u8();
      break;
    case 3: {
      p.workspace = pick_ptr(r);
      const auto need = std::int64_t(kla_workspace_size(&p));
      p.workspace_size = std::size_t(pick_i64(r, need));
      break;
    }
    default: break;
  }
  // Newer still (ABI 3): the arithmetic (fp32_math until ABI 5), any 32-bit value from time to
  // time; a valid workspace stays valid (its need grows with FAST).
  set_enum(p.arithmetic, r.flag() ? std::int32_t(pick_i64(r, 0)) : r.range(0, 2));
  if (ws_case == 2) p.workspace_size = std::max(p.workspace_size, kla_workspace_size(&p));
  const int s1 = check(p, a, false);

  // ABI 4, read after everything above (inputs that end earlier keep AUTO, 0, H100, no
  // corruption). The path request on a copy, so the struct above is checked as before.
  kla_params p2 = p;
  set_enum(p2.path, pick_path(r));
  p2.value_slice = pick_value_slice(r);
  const int s2 = check(p2, a, false);
  const kla_device_info dev = pick_device(r);
  check_plans(p, s1, dev);
  if (raw_enum(p2.path) != KLA_PATH_AUTO || p2.value_slice != 0) check_plans(p2, s2, dev);
  // Rarely: a struct stamped for another layout, whatever its other fields hold.
  if (r.u8() % 16 == 15) {
    kla_params pc = p2;
    const unsigned which = r.u8() % 3;
    if (which != 1) pc.abi_version = pick_bad_stamp(r, KLA_ABI_VERSION, KLA_ABI_VERSION - 1);
    if (which != 0) pc.struct_size = pick_bad_stamp(r, sizeof(kla_params), sizeof(kla_params) - 16);
    if (check(pc, a, false) != KLA_ERROR_ABI_MISMATCH) die("stamp not refused", pc, -1);
    check_plans(pc, KLA_ERROR_ABI_MISMATCH, dev);
  }
  // Last of all (inputs that end earlier run it with no planted fault): the backward.
  check_backward(p, r);
  return 0;
}
