// Host-side part of the C ABI: parameter defaults, validation, status strings, names and the
// thread-local error message. Pure C++ with no CUDA dependency, so it builds and is tested on
// machines without a GPU (and can be fuzzed). Every entry point calls kla_validate first.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_set>

#include "kla/kla.h"
#include "api/errors.hpp"
#include "cp/segments.hpp"
#include "bwd/bwd_layout.hpp"
#include "layout/chunk_geometry.hpp"
#include "layout/saved_states.hpp"
#include "layout/wy_layout.hpp"

#ifndef KLA_VERSION_STRING
#define KLA_VERSION_STRING "0.0.0"
#endif

namespace kla::detail {

namespace {
thread_local std::string t_last_error;
}

kla_status fail(kla_status s, const std::string& message) {
  t_last_error = "kla: " + message;
  return s;
}

void clear_error() {
  t_last_error.clear();
}

namespace {

bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

std::size_t dtype_bytes(kla_dtype d) {
  return d == KLA_DTYPE_FP32 ? 4 : 2;
}

// Checks the B, T, head strides of a 4-d tensor [B,T,X,last] (last contiguous). A stride of a
// dimension of extent 1 is never used and is not checked.
kla_status check_strides(const char* name, const int64_t* s, const int64_t ext[3],
                         std::size_t elem) {
  static const char* dims[3] = {"B", "T", "head"};
  for (int d = 0; d < 3; ++d) {
    if (ext[d] <= 1) continue;
    if (s[d] <= 0)
      return fail(KLA_ERROR_BAD_STRIDE,
                  cat(name, "_strides[", d, "] (", dims[d], ") = ", s[d], " must be positive"));
    if ((static_cast<std::uint64_t>(s[d]) * elem) % 16 != 0)
      return fail(KLA_ERROR_MISALIGNED, cat(name, "_strides[", d, "] (", dims[d], ") = ", s[d],
                                            " elements is not a multiple of 16 bytes"));
  }
  return KLA_SUCCESS;
}

// Byte span of a strided tensor: (sum over used dims of (extent-1)*stride + inner) * elem, with
// every step checked, so absurd sizes or strides are refused instead of wrapping around (and
// later checks on spans, which assume no overflow, stay defined).
kla_status check_span(const char* name, const int64_t* s, const int64_t* ext, int dims,
                      int64_t inner, std::size_t elem) {
  int64_t span = inner;
  for (int d = 0; d < dims; ++d) {
    if (ext[d] <= 1) continue;
    int64_t step = 0;
    if (__builtin_mul_overflow(ext[d] - 1, s[d], &step) ||
        __builtin_add_overflow(span, step, &span))
      return fail(KLA_ERROR_INVALID_SIZE, cat(name, " spans more than 2^63-1 elements"));
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(span, static_cast<int64_t>(elem), &bytes))
    return fail(KLA_ERROR_INVALID_SIZE, cat(name, " spans more than 2^63-1 bytes"));
  return KLA_SUCCESS;
}

// Output tensors must not overlap themselves: a sufficient condition is the row-major nesting
// head stride >= last extent, T stride >= extent of one token, B stride >= extent of a row.
kla_status check_no_overlap(const char* name, const int64_t* s, const int64_t ext[3],
                            int64_t last) {
  int64_t inner = last;  // elements spanned by one index of the next-outer dimension
  static const char* dims[3] = {"B", "T", "head"};
  for (int d = 2; d >= 0; --d) {
    if (ext[d] > 1) {
      if (s[d] < inner)
        return fail(KLA_ERROR_BAD_STRIDE,
                    cat(name, "_strides[", d, "] (", dims[d], ") = ", s[d], " makes ", name,
                        " overlap itself (need >= ", inner, ")"));
      inner = (ext[d] - 1) * s[d] + inner;
    }
  }
  return KLA_SUCCESS;
}

kla_status check_gate(const char* name, const float* p, const int64_t* s, int64_t B, int64_t T) {
  if (!p) return KLA_SUCCESS;
  if ((reinterpret_cast<std::uintptr_t>(p) & 3u) != 0)
    return fail(KLA_ERROR_MISALIGNED, cat(name, " is not 4-byte aligned"));
  const int64_t ext[2] = {B, T};
  for (int d = 0; d < 2; ++d)
    if (ext[d] > 1 && s[d] <= 0)
      return fail(KLA_ERROR_BAD_STRIDE,
                  cat(name, "_strides[", d, "] = ", s[d], " must be positive"));
  return KLA_SUCCESS;
}

bool head_dim_ok(int64_t d) {
  return d >= 16 && d <= 256 && d % 16 == 0;
}

}  // namespace

// The saving conditions are bwd_runs_bf16_input_grads' (the kernels that read saved states), one
// message each.
static_assert(kla::layout::kSavedHeadDim == kla::layout::kBwdCompiledHeadDim &&
                  kla::layout::bwd_runs_bf16_input_grads(true, true, kla::layout::kSavedHeadDim,
                                                         kla::layout::kSavedHeadDim),
              "saved states are read by the bf16 input gradients");

std::string saved_states_refusal(const kla_params& p) {
  using kla::layout::kSavedHeadDim;
  if (enum_bits(p.dtype) != KLA_DTYPE_BF16)
    return "only bf16 calls save states (the backward's bf16 kernels read them)";
  if (enum_bits(p.arithmetic) != KLA_ARITHMETIC_FAST)
    return "only arithmetic FAST saves states (its backward runs the bf16 kernels that read them)";
  if (p.head_dim_k != kSavedHeadDim || p.head_dim_v != kSavedHeadDim)
    return cat("head dims K = ", p.head_dim_k, ", V = ", p.head_dim_v,
               ": only K = V = ", kSavedHeadDim, " save states");
  if (p.state_pool) return "a state pool call has no backward, so nothing to save";
  const int path = enum_bits(p.path);  // any int a C caller stored (named only when a path)
  if (path != KLA_PATH_AUTO && path != KLA_PATH_WY && path != KLA_PATH_WY_TRANSPOSED)
    return cat("path ",
               path >= KLA_PATH_AUTO && path <= KLA_PATH_TOKENWISE ? kla_path_name(kla_path(path))
                                                                   : "(not a kla_path)",
               " was requested; the WY scans write saved states (path auto, wy or wy_transposed)");
  // The saving scan's columns: the transposed scan's 64, or the [token][column] scan's 32.
  const int columns =
      path == KLA_PATH_WY_TRANSPOSED ? kla::layout::kWyTColumns : kla::layout::kSavedValueSlice;
  if (p.value_slice != 0 && p.value_slice != columns)
    return cat("value_slice = ", p.value_slice, " was requested on path ",
               kla_path_name(kla_path(path)), "; its saving scan takes ", columns, " columns");
  if (p.segments != 0 && p.segments != 1)
    return cat("segments = ", p.segments, " was requested; saved states come from one pass");
  return "";
}

kla_status validate_saved_states(const kla_params& p, const void* saved, size_t saved_size,
                                 const char* who) {
  if (const std::string why = saved_states_refusal(p); !why.empty())
    return fail(KLA_ERROR_UNSUPPORTED_PATH, cat(who, ": this call cannot use saved states: ", why));
  if (!saved) return fail(KLA_ERROR_NULL_POINTER, cat(who, ": saved is NULL"));
  if ((reinterpret_cast<std::uintptr_t>(saved) & 15u) != 0)
    return fail(KLA_ERROR_MISALIGNED, cat(who, ": saved is not 16-byte aligned"));
  const std::size_t need = kla_saved_states_size(&p);
  if (saved_size < need)
    return fail(KLA_ERROR_INVALID_SIZE, cat(who, ": saved_size = ", saved_size,
                                            " is less than kla_saved_states_size() = ", need));
  return KLA_SUCCESS;
}

}  // namespace kla::detail

extern "C" {

void kla_params_init_abi(kla_params* p, uint32_t abi_version, uint32_t struct_size) {
  if (!p) return;
  if (abi_version != KLA_ABI_VERSION || struct_size != sizeof(kla_params)) {
    // Another layout: write only the stamp (the first 8 bytes of every layout since ABI 4, and no
    // more than the caller's struct holds), so kla_validate refuses the struct.
    if (struct_size >= 2 * sizeof(uint32_t)) {
      p->abi_version = abi_version;
      p->struct_size = struct_size;
    }
    return;
  }
  std::memset(p, 0, sizeof(*p));
  p->abi_version = abi_version;
  p->struct_size = struct_size;
  p->dtype = KLA_DTYPE_BF16;
  p->eta_value = 1.0f;
  p->eps = 0.0f;
  p->scale = 0.0f;
  p->coefficient = KLA_COEFF_KACZMARZ;
  p->readout = KLA_READOUT_SCALE;
  p->arithmetic = KLA_ARITHMETIC_ACCURATE;
  p->path = KLA_PATH_AUTO;
  p->value_slice = 0;
}

kla_status kla_validate(const kla_params* p) {
  using namespace kla::detail;
  clear_error();
  if (!p) return fail(KLA_ERROR_NULL_POINTER, "params is NULL");
  // First, before any other field is read: a struct of another layout (a caller built against
  // another kla.h) has other fields at these offsets.
  if (p->abi_version != KLA_ABI_VERSION || p->struct_size != sizeof(kla_params))
    return fail(KLA_ERROR_ABI_MISMATCH,
                cat("params are stamped abi_version = ", p->abi_version, ", struct_size = ",
                    p->struct_size, "; this library is ABI ", KLA_ABI_VERSION, " (struct_size ",
                    sizeof(kla_params), "): the caller was built against another kla.h"));
  const int dtype = enum_bits(p->dtype), coef = enum_bits(p->coefficient);
  const int readout = enum_bits(p->readout);
  if (dtype != KLA_DTYPE_FP32 && dtype != KLA_DTYPE_BF16 && dtype != KLA_DTYPE_FP16)
    return fail(KLA_ERROR_UNSUPPORTED_DTYPE, cat("dtype = ", dtype, " is not fp32, bf16 or fp16"));
  if (coef != KLA_COEFF_KACZMARZ && coef != KLA_COEFF_GIVEN)
    return fail(KLA_ERROR_INVALID_VALUE, cat("coefficient = ", coef, " is unknown"));
  if (readout != KLA_READOUT_SCALE && readout != KLA_READOUT_Q_L2NORM &&
      readout != KLA_READOUT_QK_L2NORM)
    return fail(KLA_ERROR_INVALID_VALUE, cat("readout = ", readout, " is unknown"));
  const int arithmetic = enum_bits(p->arithmetic);
  if (arithmetic != KLA_ARITHMETIC_ACCURATE && arithmetic != KLA_ARITHMETIC_FAST)
    return fail(KLA_ERROR_INVALID_VALUE, cat("arithmetic = ", arithmetic, " is unknown"));
  const int path = enum_bits(p->path);
  if (path < KLA_PATH_AUTO || path > KLA_PATH_TOKENWISE)
    return fail(KLA_ERROR_INVALID_VALUE, cat("path = ", path, " is unknown"));
  const int32_t vs = p->value_slice;
  if (vs != 0 && vs != 8 && vs != 16 && vs != 32 && vs != 64)
    return fail(KLA_ERROR_INVALID_VALUE,
                cat("value_slice = ", vs, " is not 0 (the plan's choice), 8, 16, 32 or 64"));
  if (vs != 0 && path == KLA_PATH_AUTO)
    return fail(KLA_ERROR_INVALID_VALUE,
                cat("value_slice = ", vs, " needs an explicit path (kla_params.path is AUTO)"));
  if (p->segments < 0 || p->segments > kla::cp::kMaxSegments)
    return fail(KLA_ERROR_INVALID_VALUE,
                cat("segments = ", p->segments,
                    " is not 0 (the plan's choice), 1 (no split) or 2..", kla::cp::kMaxSegments));

  const struct {
    const char* name;
    int64_t value;
  } sizes[] = {{"batch", p->batch},           {"seq_len", p->seq_len},
               {"num_heads", p->num_heads},   {"num_v_heads", p->num_v_heads},
               {"head_dim_k", p->head_dim_k}, {"head_dim_v", p->head_dim_v}};
  for (const auto& s : sizes)
    if (s.value <= 0)
      return fail(KLA_ERROR_INVALID_SIZE, cat(s.name, " = ", s.value, " must be positive"));
  const int64_t B = p->batch, T = p->seq_len, H = p->num_heads, HV = p->num_v_heads;
  const int64_t K = p->head_dim_k, V = p->head_dim_v;
  if (HV % H != 0)
    return fail(KLA_ERROR_SHAPE_MISMATCH,
                cat("num_v_heads = ", HV, " is not a multiple of num_heads = ", H));
  if (!head_dim_ok(K))
    return fail(KLA_ERROR_UNSUPPORTED_HEAD_DIM,
                cat("head_dim_k = ", K, " is not a multiple of 16 in [16, 256]"));
  if (!head_dim_ok(V))
    return fail(KLA_ERROR_UNSUPPORTED_HEAD_DIM,
                cat("head_dim_v = ", V, " is not a multiple of 16 in [16, 256]"));
  // The kernels index sequences, tokens and heads with 32-bit integers (KernelParams).
  const struct {
    const char* name;
    int64_t value;
  } narrowed[] = {{"batch", B}, {"seq_len", T}, {"num_heads", H}, {"num_v_heads", HV}};
  for (const auto& s : narrowed)
    if (s.value > INT32_MAX)
      return fail(KLA_ERROR_INVALID_SIZE, cat(s.name, " = ", s.value, " exceeds 2^31-1"));

  const struct {
    const char* name;
    const void* ptr;
  } tensors[] = {{"q", p->q}, {"k", p->k}, {"v", p->v}, {"o", p->o}};
  for (const auto& t : tensors) {
    if (!t.ptr) return fail(KLA_ERROR_NULL_POINTER, cat(t.name, " is NULL"));
    if (!aligned16(t.ptr))
      return fail(KLA_ERROR_MISALIGNED, cat(t.name, " is not 16-byte aligned"));
  }
  const std::size_t eb = dtype_bytes(static_cast<kla_dtype>(dtype));
  const int64_t ext_qk[3] = {B, T, H}, ext_vo[3] = {B, T, HV};
  if (auto s = check_strides("q", p->q_strides, ext_qk, eb)) return s;
  if (auto s = check_strides("k", p->k_strides, ext_qk, eb)) return s;
  if (auto s = check_strides("v", p->v_strides, ext_vo, eb)) return s;
  if (auto s = check_strides("o", p->o_strides, ext_vo, eb)) return s;
  if (auto s = check_span("q", p->q_strides, ext_qk, 3, K, eb)) return s;
  if (auto s = check_span("k", p->k_strides, ext_qk, 3, K, eb)) return s;
  if (auto s = check_span("v", p->v_strides, ext_vo, 3, V, eb)) return s;
  if (auto s = check_span("o", p->o_strides, ext_vo, 3, V, eb)) return s;
  if (auto s = check_no_overlap("o", p->o_strides, ext_vo, V)) return s;
  if (auto s = check_gate("g", p->g, p->g_strides, B, T)) return s;
  if (auto s = check_gate("eta", p->eta, p->eta_strides, B, T)) return s;
  const int64_t ext_gate[2] = {B, T};
  if (p->g)
    if (auto s = check_span("g", p->g_strides, ext_gate, 2, HV, sizeof(float))) return s;
  if (p->eta)
    if (auto s = check_span("eta", p->eta_strides, ext_gate, 2, HV, sizeof(float))) return s;
  if (!p->eta && !std::isfinite(p->eta_value))
    return fail(KLA_ERROR_INVALID_VALUE, "eta_value is not finite");
  if (!std::isfinite(p->eps) || p->eps < 0.0f)
    return fail(KLA_ERROR_INVALID_VALUE, cat("eps = ", p->eps, " must be finite and >= 0"));
  if (readout != KLA_READOUT_Q_L2NORM && !std::isfinite(p->scale))
    return fail(KLA_ERROR_INVALID_VALUE, "scale is not finite");

  // Sequences.
  int64_t N = B;
  if (p->cu_seqlens || p->cu_seqlens_host) {
    if (!p->cu_seqlens)
      return fail(KLA_ERROR_NULL_POINTER, "cu_seqlens is NULL while cu_seqlens_host is set");
    if (!p->cu_seqlens_host)
      return fail(KLA_ERROR_NULL_POINTER,
                  "cu_seqlens_host is NULL (the host copy of cu_seqlens is required)");
    if (B != 1)
      return fail(KLA_ERROR_SHAPE_MISMATCH, cat("cu_seqlens needs batch = 1, got batch = ", B));
    if (p->num_seqs <= 0)
      return fail(KLA_ERROR_INVALID_SIZE, cat("num_seqs = ", p->num_seqs, " must be positive"));
    if (p->num_seqs > INT32_MAX)
      return fail(KLA_ERROR_INVALID_SIZE, cat("num_seqs = ", p->num_seqs, " exceeds 2^31-1"));
    N = p->num_seqs;
    const int32_t* cu = p->cu_seqlens_host;
    if (cu[0] != 0)
      return fail(KLA_ERROR_BAD_CU_SEQLENS, cat("cu_seqlens[0] = ", cu[0], " must be 0"));
    for (int64_t n = 0; n < N; ++n)
      if (cu[n + 1] < cu[n])
        return fail(KLA_ERROR_BAD_CU_SEQLENS,
                    cat("cu_seqlens is not monotonic: cu_seqlens[", n + 1, "] = ", cu[n + 1],
                        " < cu_seqlens[", n, "] = ", cu[n]));
    if (cu[N] != T)
      return fail(KLA_ERROR_BAD_CU_SEQLENS,
                  cat("cu_seqlens[", N, "] = ", cu[N], " must equal seq_len = ", T));
  }

  // States: N (or pool_size) x HV x K x V fp32, sizes checked against overflow.
  int64_t state_elems = 0, row_bytes = 0, states_bytes = 0;
  if (__builtin_mul_overflow(HV, K * V, &state_elems) ||
      __builtin_mul_overflow(state_elems, static_cast<int64_t>(sizeof(float)), &row_bytes) ||
      __builtin_mul_overflow(row_bytes, N, &states_bytes))
    return fail(KLA_ERROR_INVALID_SIZE, "states [N, HV, K, V] span more than 2^63-1 bytes");
  if (p->state_pool) {
    if (p->initial_state || p->final_state)
      return fail(KLA_ERROR_INVALID_VALUE,
                  "state_pool excludes initial_state and final_state (set them to NULL)");
    if (!aligned16(p->state_pool))
      return fail(KLA_ERROR_MISALIGNED, "state_pool is not 16-byte aligned");
    if (p->pool_size <= 0)
      return fail(KLA_ERROR_INVALID_SIZE, cat("pool_size = ", p->pool_size, " must be positive"));
    if (p->pool_size > INT32_MAX)  // state_indices are int32
      return fail(KLA_ERROR_INVALID_SIZE, cat("pool_size = ", p->pool_size, " exceeds 2^31-1"));
    int64_t pool_bytes = 0;
    if (__builtin_mul_overflow(row_bytes, p->pool_size, &pool_bytes))
      return fail(KLA_ERROR_INVALID_SIZE,
                  cat("pool_size = ", p->pool_size, " makes the pool span more than 2^63-1 bytes"));
    if (!p->state_indices) return fail(KLA_ERROR_NULL_POINTER, "state_indices is NULL");
    if (!p->state_indices_host)
      return fail(KLA_ERROR_NULL_POINTER,
                  "state_indices_host is NULL (the host copy of state_indices is required)");
    std::unordered_set<int32_t> seen;
    for (int64_t n = 0; n < N; ++n) {
      const int32_t idx = p->state_indices_host[n];
      if (idx < -1 || idx >= p->pool_size)
        return fail(KLA_ERROR_BAD_INDEX, cat("state_indices[", n, "] = ", idx,
                                             " is outside [-1, pool_size = ", p->pool_size, ")"));
      if (idx >= 0 && !seen.insert(idx).second)
        return fail(KLA_ERROR_BAD_INDEX, cat("state_indices[", n, "] = ", idx,
                                             " repeats an earlier index (rows would race)"));
    }
  } else if (p->state_indices || p->state_indices_host) {
    return fail(KLA_ERROR_NULL_POINTER, "state_indices given but state_pool is NULL");
  }
  if (p->initial_state && !aligned16(p->initial_state))
    return fail(KLA_ERROR_MISALIGNED, "initial_state is not 16-byte aligned");
  if (p->final_state && !aligned16(p->final_state))
    return fail(KLA_ERROR_MISALIGNED, "final_state is not 16-byte aligned");
  if (p->initial_state && p->final_state && p->initial_state != p->final_state) {
    const auto a = reinterpret_cast<std::uintptr_t>(p->initial_state);
    const auto b = reinterpret_cast<std::uintptr_t>(p->final_state);
    const auto bytes = static_cast<std::uintptr_t>(states_bytes);
    if (a < b + bytes && b < a + bytes)
      return fail(
          KLA_ERROR_INVALID_VALUE,
          "final_state partially overlaps initial_state (use the same pointer for in place)");
  }
  if (p->workspace) {
    if (!aligned16(p->workspace))
      return fail(KLA_ERROR_MISALIGNED, "workspace is not 16-byte aligned");
    const std::size_t need = kla_workspace_size(p);
    if (p->workspace_size < need)
      return fail(KLA_ERROR_INVALID_SIZE, cat("workspace_size = ", p->workspace_size,
                                              " is less than kla_workspace_size() = ", need));
  }
  return KLA_SUCCESS;
}

size_t kla_workspace_size(const kla_params* p) {
  // Depends on sizes (batch / num_seqs, seq_len, num_heads, num_v_heads, head dims) and the
  // dtype; 0 where they are unusable.
  if (!p || p->abi_version != KLA_ABI_VERSION || p->struct_size != sizeof(kla_params) ||
      p->seq_len <= 0 || p->num_v_heads <= 0 || p->seq_len > INT32_MAX)
    return 0;
  // Head dims not set (<= 0): the size for the largest supported ones (256) plus the largest K
  // / Q images (K = 128, any dtype), so a buffer sized before the head dims are known serves
  // every call with these sizes. num_heads not set: num_v_heads (at least as many).
  const bool dims_set = p->head_dim_k > 0 && p->head_dim_v > 0;
  const int64_t K = p->head_dim_k > 0 ? p->head_dim_k : 256,
                V = p->head_dim_v > 0 ? p->head_dim_v : 256;
  if (K > 4096 || V > 4096) return 0;
  const bool packed = p->cu_seqlens != nullptr || p->cu_seqlens_host != nullptr;
  const int64_t N = packed ? p->num_seqs : p->batch;
  const int64_t H = p->num_heads > 0 ? p->num_heads : p->num_v_heads;
  if (N <= 0 || N > INT32_MAX || p->num_v_heads > INT32_MAX || H > p->num_v_heads) return 0;
  const int64_t slots = kla::layout::chunk_slots(N, p->seq_len, packed);
  const int64_t image =
      dims_set ? kla::layout::wy_image_bytes(
                     K, kla::layout::wy_needs_images(kla::detail::enum_bits(p->dtype),
                                                     kla::detail::enum_bits(p->arithmetic)))
               : kla::layout::wy_image_bytes(128, true);
  // The records, then one K and one Q image per (chunk slot, key head); checked in double
  // first so the int64 products below cannot overflow.
  const double total =
      double(slots) * (double(p->num_v_heads) * double(kla::layout::ws_record_bytes(K, V)) +
                       2.0 * double(H) * double(image));
  if (total > 9.0e18) return 0;
  const int64_t base = kla::layout::ws_records_bytes(N, p->seq_len, packed, p->num_v_heads, K, V) +
                       slots * 2 * H * image;
  // The sequence split's buffers (its passes' records included) wherever the plan may split the
  // call (cp/segments.hpp), for the requested segments or the most the plan takes; head dims not
  // set: the largest split (K + V = 256, every K). A call uses one or the other from offset 0.
  int64_t split = 0;
  if (p->segments != 1) {
    kla_params s = *p;
    s.num_heads = H;
    const int n = p->segments >= 2 ? p->segments : kla::cp::kMaxSegments;
    if (dims_set) {
      if (kla::cp::split_possible(s)) split = kla::cp::split_layout(s, n).total;
    } else {
      for (int64_t k = 16; k <= 240; k += 16) {
        s.head_dim_k = k, s.head_dim_v = 256 - k;
        if (kla::cp::split_possible(s)) split = std::max(split, kla::cp::split_layout(s, n).total);
      }
    }
  }
  return static_cast<size_t>(std::max(base, split));  // a call runs one pass or the split
}

void kla_backward_params_init_abi(kla_backward_params* p, uint32_t abi_version,
                                  uint32_t struct_size) {
  if (!p) return;
  if (abi_version != KLA_ABI_VERSION || struct_size != sizeof(kla_backward_params)) {
    if (struct_size >= 2 * sizeof(uint32_t)) {  // the stamp only (as kla_params_init_abi)
      p->abi_version = abi_version;
      p->struct_size = struct_size;
    }
    return;
  }
  std::memset(p, 0, sizeof(*p));
  p->abi_version = abi_version;
  p->struct_size = struct_size;
  kla_params_init_abi(&p->forward, abi_version, uint32_t(sizeof(kla_params)));
}

kla_status kla_validate_backward(const kla_backward_params* p) {
  using namespace kla::detail;
  clear_error();
  if (!p) return fail(KLA_ERROR_NULL_POINTER, "backward params is NULL");
  if (p->abi_version != KLA_ABI_VERSION || p->struct_size != sizeof(kla_backward_params))
    return fail(KLA_ERROR_ABI_MISMATCH,
                cat("backward params are stamped abi_version = ", p->abi_version,
                    ", struct_size = ", p->struct_size, "; this library is ABI ", KLA_ABI_VERSION,
                    " (struct_size ", sizeof(kla_backward_params),
                    "): the caller was built against another kla.h"));
  const kla_params& fw = p->forward;
  // The forward's checks, with d_o in o's place (its shape and dtype); what the backward ignores
  // is cleared first. A forward stamped for another layout is left as it is: kla_validate refuses
  // it by its stamp before reading any other field.
  kla_params f = fw;
  if (fw.abi_version == KLA_ABI_VERSION && fw.struct_size == sizeof(kla_params)) {
    if (fw.state_pool)
      return fail(KLA_ERROR_INVALID_VALUE,
                  "backward: forward.state_pool is not differentiable (pass initial_state)");
    f.o = const_cast<void*>(p->d_o);  // read only: validated as o
    for (int d = 0; d < 3; ++d) f.o_strides[d] = p->d_o_strides[d];
    f.final_state = nullptr;
    f.workspace = nullptr;
    f.workspace_size = 0;
    f.path = KLA_PATH_AUTO;
    f.value_slice = 0;  // (arithmetic is the backward's too: checked as the forward's)
    f.segments = 0;     // the forward's split does not change its gradients
  }
  if (kla_status s = kla_validate(&f)) {
    std::string m = kla_last_error_message();
    if (m.rfind("kla: ", 0) == 0) m = m.substr(5);
    return fail(s, cat("backward: forward.", m, " (o here is d_o)"));
  }
  const int64_t B = f.batch, T = f.seq_len, H = f.num_heads, HV = f.num_v_heads;
  const int64_t K = f.head_dim_k, V = f.head_dim_v;
  if (K > kla::layout::kBwdMaxHeadDim || V > kla::layout::kBwdMaxHeadDim)
    return fail(KLA_ERROR_UNSUPPORTED_HEAD_DIM,
                cat("backward: head dims K = ", K, ", V = ", V, " exceed ",
                    kla::layout::kBwdMaxHeadDim, ", the largest the backward kernels support"));
  const std::size_t eb = dtype_bytes(f.dtype);
  const int64_t ext_qk[3] = {B, T, H}, ext_vo[3] = {B, T, HV};
  const struct {
    const char* name;
    const void* ptr;
    const int64_t* strides;
    const int64_t* ext;
    int64_t last;
  } grads[] = {{"dq", p->dq, p->dq_strides, ext_qk, K},
               {"dk", p->dk, p->dk_strides, ext_qk, K},
               {"dv", p->dv, p->dv_strides, ext_vo, V}};
  for (const auto& t : grads) {
    if (!t.ptr) return fail(KLA_ERROR_NULL_POINTER, cat("backward: ", t.name, " is NULL"));
    if (!aligned16(t.ptr))
      return fail(KLA_ERROR_MISALIGNED, cat("backward: ", t.name, " is not 16-byte aligned"));
    if (auto s = check_strides(t.name, t.strides, t.ext, eb)) return s;
    if (auto s = check_span(t.name, t.strides, t.ext, 3, t.last, eb)) return s;
    if (auto s = check_no_overlap(t.name, t.strides, t.ext, t.last)) return s;
  }
  const struct {
    const char* name;
    const float* grad;
    const int64_t* strides;
    const float* input;
    const char* input_name;
  } gates[] = {{"dg", p->dg, p->dg_strides, f.g, "forward.g"},
               {"deta", p->deta, p->deta_strides, f.eta, "forward.eta"}};
  const int64_t ext_gate[2] = {B, T};
  for (const auto& gt : gates) {
    if (gt.input && !gt.grad)
      return fail(KLA_ERROR_NULL_POINTER,
                  cat("backward: ", gt.name, " is NULL while ", gt.input_name, " is given"));
    if (!gt.input && gt.grad)
      return fail(KLA_ERROR_INVALID_VALUE,
                  cat("backward: ", gt.name, " is given but ", gt.input_name,
                      " is NULL (nothing to differentiate)"));
    if (auto s = check_gate(gt.name, gt.grad, gt.strides, B, T)) return s;
    if (gt.grad)
      if (auto s = check_span(gt.name, gt.strides, ext_gate, 2, HV, sizeof(float))) return s;
  }
  if (p->d_final_state && !aligned16(p->d_final_state))
    return fail(KLA_ERROR_MISALIGNED, "backward: d_final_state is not 16-byte aligned");
  if (p->d_initial_state && !aligned16(p->d_initial_state))
    return fail(KLA_ERROR_MISALIGNED, "backward: d_initial_state is not 16-byte aligned");
  if (!p->workspace)
    return fail(KLA_ERROR_NULL_POINTER,
                "backward: workspace is NULL (kla_backward_workspace_size bytes are required)");
  if (!aligned16(p->workspace))
    return fail(KLA_ERROR_MISALIGNED, "backward: workspace is not 16-byte aligned");
  const std::size_t need = kla_backward_workspace_size(p);
  if (p->workspace_size < need)
    return fail(KLA_ERROR_INVALID_SIZE,
                cat("backward: workspace_size = ", p->workspace_size,
                    " is less than kla_backward_workspace_size() = ", need));
  return KLA_SUCCESS;
}

size_t kla_saved_states_size(const kla_params* p) {
  // Pure host arithmetic on the sizes, as kla_workspace_size; 0 with the reason where the call
  // cannot save.
  using kla::detail::cat;
  using kla::detail::fail;
  kla::detail::clear_error();
  if (!p) return (void)fail(KLA_ERROR_NULL_POINTER, "params is NULL"), 0;
  if (p->abi_version != KLA_ABI_VERSION || p->struct_size != sizeof(kla_params))
    return (void)fail(KLA_ERROR_ABI_MISMATCH, "params are stamped for another kla.h"), 0;
  if (const std::string why = kla::detail::saved_states_refusal(*p); !why.empty())
    return (void)fail(KLA_ERROR_UNSUPPORTED_PATH, cat("kla_saved_states_size: ", why)), 0;
  const bool packed = p->cu_seqlens != nullptr || p->cu_seqlens_host != nullptr;
  const int64_t N = packed ? p->num_seqs : p->batch;
  if (p->seq_len <= 0 || p->seq_len > INT32_MAX || N <= 0 || N > INT32_MAX || p->num_v_heads <= 0 ||
      p->num_v_heads > INT32_MAX)
    return (void)fail(KLA_ERROR_INVALID_SIZE, "kla_saved_states_size: unusable sizes"), 0;
  const int64_t slots = kla::layout::chunk_slots(N, p->seq_len, packed);
  const int64_t rec = kla::layout::saved_record_elems(p->head_dim_k, p->head_dim_v) * 2;
  if (double(slots) * double(p->num_v_heads) * double(rec) > 9.0e18)
    return (void)fail(KLA_ERROR_INVALID_SIZE, "kla_saved_states_size: more than 2^63 bytes"), 0;
  return static_cast<size_t>(slots * p->num_v_heads * rec);
}

size_t kla_backward_workspace_size(const kla_backward_params* p) {
  if (!p || p->abi_version != KLA_ABI_VERSION || p->struct_size != sizeof(kla_backward_params))
    return 0;
  const kla_params& f = p->forward;
  if (f.abi_version != KLA_ABI_VERSION || f.struct_size != sizeof(kla_params) || f.seq_len <= 0 ||
      f.seq_len > INT32_MAX || f.num_v_heads <= 0 || f.num_v_heads > INT32_MAX ||
      f.head_dim_k <= 0 || f.head_dim_v <= 0 || f.head_dim_k > 4096 || f.head_dim_v > 4096)
    return 0;
  const bool packed = f.cu_seqlens != nullptr || f.cu_seqlens_host != nullptr;
  const int64_t N = packed ? f.num_seqs : f.batch;
  if (N <= 0 || N > INT32_MAX) return 0;
  const int64_t slots = kla::layout::chunk_slots(N, f.seq_len, packed);
  const int64_t rec = kla::layout::BwdRecord(f.head_dim_k, f.head_dim_v).floats;
  const double total = double(slots) * double(f.num_v_heads) * double(rec) * 4.0;
  if (total > 9.0e18) return 0;
  return static_cast<size_t>(slots * f.num_v_heads * rec * 4);
}

const char* kla_status_string(kla_status status) {
  switch (kla::detail::enum_bits(status)) {
    case KLA_SUCCESS: return "KLA_SUCCESS";
    case KLA_ERROR_NULL_POINTER: return "KLA_ERROR_NULL_POINTER";
    case KLA_ERROR_INVALID_SIZE: return "KLA_ERROR_INVALID_SIZE";
    case KLA_ERROR_SHAPE_MISMATCH: return "KLA_ERROR_SHAPE_MISMATCH";
    case KLA_ERROR_BAD_STRIDE: return "KLA_ERROR_BAD_STRIDE";
    case KLA_ERROR_MISALIGNED: return "KLA_ERROR_MISALIGNED";
    case KLA_ERROR_UNSUPPORTED_DTYPE: return "KLA_ERROR_UNSUPPORTED_DTYPE";
    case KLA_ERROR_UNSUPPORTED_HEAD_DIM: return "KLA_ERROR_UNSUPPORTED_HEAD_DIM";
    case KLA_ERROR_BAD_CU_SEQLENS: return "KLA_ERROR_BAD_CU_SEQLENS";
    case KLA_ERROR_BAD_INDEX: return "KLA_ERROR_BAD_INDEX";
    case KLA_ERROR_INVALID_VALUE: return "KLA_ERROR_INVALID_VALUE";
    case KLA_ERROR_NO_DEVICE: return "KLA_ERROR_NO_DEVICE";
    case KLA_ERROR_CUDA: return "KLA_ERROR_CUDA";
    case KLA_ERROR_UNSUPPORTED_PATH: return "KLA_ERROR_UNSUPPORTED_PATH";
    case KLA_ERROR_ABI_MISMATCH: return "KLA_ERROR_ABI_MISMATCH";
  }
  return "KLA_ERROR_UNKNOWN_STATUS";
}

const char* kla_last_error_message(void) {
  return kla::detail::t_last_error.c_str();
}

const char* kla_version_string(void) {
  return KLA_VERSION_STRING;
}

uint32_t kla_abi_version(void) {
  return KLA_ABI_VERSION;
}

const char* kla_path_name(kla_path path) {
  switch (kla::detail::enum_bits(path)) {
    case KLA_PATH_AUTO: return "auto";
    case KLA_PATH_WY: return "wy";
    case KLA_PATH_WY_TRANSPOSED: return "wy_transposed";
    case KLA_PATH_TF32: return "tf32";
    case KLA_PATH_GENERIC: return "generic";
    case KLA_PATH_TOKENWISE: return "tokenwise";
  }
  return "unknown";
}

}  // extern "C"
