// The sequence split's host side (cp/segments.hpp): cuts, predicates, workspace layout, the two
// passes' params. Pure host arithmetic on validated params, except split_possible and
// split_layout, which kla_workspace_size calls before validation (after its own size checks:
// head dims in (0, 4096], seq_len, sequences and value heads in [1, 2^31-1]): they read enums as
// raw bits and check every product of a caller's value for overflow.
#include "cp/segments.hpp"

#include <algorithm>
#include <climits>
#include <initializer_list>

#include "api/errors.hpp"
#include "layout/chunk_geometry.hpp"

namespace kla::cp {
namespace {

using detail::cat;

/// Bytes of an element of the call's dtype, read as raw bits: kla_workspace_size sees params
/// before validation, whose enum fields may hold any value.
int64_t elem_bytes(const kla_dtype& d) {
  return detail::enum_bits(d) == KLA_DTYPE_FP32 ? 4 : 2;
}
int64_t round16(int64_t x) {
  return (x + 15) / 16 * 16;
}

bool packed(const kla_params& p) {
  return p.cu_seqlens != nullptr || p.cu_seqlens_host != nullptr;
}
int64_t num_seqs(const kla_params& p) {
  return packed(p) ? p.num_seqs : p.batch;
}

/// Why the split cannot run p, workspace aside ("" if it can).
std::string layout_refusal(const kla_params& p) {
  if (p.state_pool) return "a state pool is the decode's (kla_tokenwise_forward)";
  if (p.head_dim_k + p.head_dim_v > 256)
    return cat("K + V = ", p.head_dim_k + p.head_dim_v,
               " exceeds 256 (the maps pass runs K + V value columns)");
  if (!packed(p) && p.batch > 1) {
    // The segments are packed sequences over B * T tokens: batch b's token t is token b T + t.
    const struct {
      const char* name;
      const void* ptr;
      int64_t batch, token;
    } t[] = {{"q", p.q, p.q_strides[0], p.q_strides[1]},
             {"k", p.k, p.k_strides[0], p.k_strides[1]},
             {"v", p.v, p.v_strides[0], p.v_strides[1]},
             {"o", p.o, p.o_strides[0], p.o_strides[1]},
             {"g", p.g, p.g_strides[0], p.g_strides[1]},
             {"eta", p.eta, p.eta_strides[0], p.eta_strides[1]}};
    int64_t span = 0;  // (strides are not validated yet where kla_workspace_size asks)
    for (const auto& x : t)
      if (x.ptr && (__builtin_mul_overflow(p.seq_len, x.token, &span) || x.batch != span))
        return cat(x.name, "'s batch stride ", x.batch, " is not seq_len times its token stride ",
                   x.token, " (the segments are packed over batch x tokens)");
  }
  // Its buffers for the most segments it may take (the requested count, else kMaxSegments).
  if (split_layout(p, p.segments >= 2 ? p.segments : kMaxSegments).total < 0)
    return "the split's buffers would exceed 2^62 bytes, its segments or batch x seq_len tokens "
           "2^31-1";
  return "";
}

}  // namespace

std::string split_can_implement(const kla_params& p) {
  if (!p.workspace) return "no workspace";
  return layout_refusal(p);
}

bool split_possible(const kla_params& p) {
  if (p.segments == 1 || !layout_refusal(p).empty()) return false;
  return p.segments >= 2 || num_seqs(p) * p.num_v_heads <= kAutoMaxHeads;
}

int auto_segments(const kla_params& p, int sms, std::string& why) {
  const int64_t NH = num_seqs(p) * p.num_v_heads;
  if (NH > kAutoMaxHeads) {
    why = cat(NH, " sequences x value heads (over ", kAutoMaxHeads, ")");
    return 1;
  }
  if (auto s = split_can_implement(p); !s.empty()) {
    why = s;
    return 1;
  }
  if (NH * (p.head_dim_v / 8) >= sms) {
    why = cat(NH * (p.head_dim_v / 8), " blocks of 8 columns fill the ", sms, " multiprocessors");
    return 1;
  }
  int64_t longest = p.seq_len;
  if (packed(p)) {
    longest = 0;
    for (int64_t n = 0; n < p.num_seqs; ++n)
      longest = std::max<int64_t>(longest, p.cu_seqlens_host[n + 1] - p.cu_seqlens_host[n]);
  }
  const int64_t chunks = (longest + 63) / 64;
  if (NH > 2 && chunks < kAutoLongChunks) {
    why = cat(NH, " sequences x value heads and ", chunks, " chunks (a split pays there from ",
              kAutoLongChunks, ")");
    return 1;
  }
  const int n = NH > 2 ? 8 : int(std::min<int64_t>(kMaxSegments, chunks / kAutoMinChunks));
  if (n < 4) {
    why = cat("the longest sequence's ", chunks, " chunks make fewer than 4 segments of ",
              kAutoMinChunks);
    return 1;
  }
  why = cat(NH, " sequences x value heads leave most of the ", sms,
            " multiprocessors idle in one pass; ", chunks, " chunks");
  return n;
}

SplitLayout split_layout(const kla_params& p, int n) {
  constexpr int64_t kLimit = int64_t(1) << 62;
  SplitLayout L;
  L.n = n;
  L.N = num_seqs(p);
  L.HV = p.num_v_heads, L.K = p.head_dim_k, L.V = p.head_dim_v;
  L.tokens = p.seq_len;
  L.total = -1;
  if (__builtin_mul_overflow(L.N, int64_t(n), &L.M) || L.M > INT32_MAX) return L;
  if (!packed(p) && (__builtin_mul_overflow(p.batch, p.seq_len, &L.tokens) || L.tokens > INT32_MAX))
    return L;
  // The passes' own workspace: kla_workspace_size for M packed sequences over the tokens (its
  // records do not depend on V, so one size serves both passes).
  int32_t dummy = 0;
  kla_params s = p;
  s.batch = 1, s.seq_len = L.tokens, s.num_seqs = L.M;
  s.cu_seqlens = nullptr, s.cu_seqlens_host = &dummy;  // packed: only the flag is read
  s.segments = 1;
  const int64_t passes = int64_t(kla_workspace_size(&s));
  if (passes == 0) return L;
  // Each piece a product of positive factors rounded up to 16 bytes; every sum checked.
  int64_t at = 0;
  auto take = [&](std::initializer_list<int64_t> factors) {
    int64_t x = 1;
    for (int64_t f : factors)
      if (at < 0 || __builtin_mul_overflow(x, f, &x) || x > kLimit) return at = -1, int64_t(-1);
    const int64_t off = at;
    if (at < 0 || __builtin_add_overflow(at, round16(x), &at) || at > kLimit) at = -1;
    return off;
  };
  const int64_t W = L.K + L.V, es = elem_bytes(p.dtype);
  L.passes = round16(passes);
  take({passes});
  L.values = take({L.tokens, L.HV, W, es});    // [0 | v]
  L.maps_out = take({L.tokens, L.HV, W, es});  // the maps pass's outputs (not read)
  L.identity = take({L.M, L.HV, L.K, W, 4});   // [I | 0]
  L.maps = take({L.M, L.HV, L.K, W, 4});       // [A | L]
  L.states = take({L.M, L.HV, L.K, L.V, 4});   // S_in
  L.finals = take({L.M, L.HV, L.K, L.V, 4});   // the second pass's final states
  L.cuts = take({L.M + 1, 4});                 // the segments' cu_seqlens
  L.total = at;
  return L;
}

std::vector<int32_t> segment_cuts(const kla_params& p, int n) {
  const int64_t N = num_seqs(p);
  std::vector<int32_t> cuts;
  cuts.reserve(size_t(N * n + 1));
  for (int64_t b = 0; b < N; ++b) {
    const int64_t base = packed(p) ? p.cu_seqlens_host[b] : b * p.seq_len;
    const int64_t len = packed(p) ? p.cu_seqlens_host[b + 1] - base : p.seq_len;
    for (int j = 0; j < n; ++j) cuts.push_back(int32_t(base + segment_start(len, n, j)));
  }
  cuts.push_back(int32_t(packed(p) ? p.cu_seqlens_host[N] : N * p.seq_len));
  return cuts;
}

kla_params pass_params(const kla_params& p, const SplitLayout& L, bool maps,
                       const std::vector<int32_t>& cuts) {
  char* ws = static_cast<char*>(p.workspace);
  auto at = [&](int64_t off) { return ws ? ws + off : nullptr; };
  kla_params s = p;
  s.batch = 1, s.seq_len = L.tokens, s.num_seqs = L.M;
  s.cu_seqlens = reinterpret_cast<const int32_t*>(at(L.cuts));
  s.cu_seqlens_host = cuts.data();
  s.segments = 1;
  s.workspace = at(0);
  s.workspace_size = size_t(L.passes);
  // One packed batch: the batch strides span the tokens (unread with B = 1, but validated).
  s.q_strides[0] = L.tokens * p.q_strides[1];
  s.k_strides[0] = L.tokens * p.k_strides[1];
  s.v_strides[0] = L.tokens * p.v_strides[1];
  s.o_strides[0] = L.tokens * p.o_strides[1];
  s.g_strides[0] = L.tokens * p.g_strides[1];
  s.eta_strides[0] = L.tokens * p.eta_strides[1];
  if (maps) {
    const int64_t W = L.K + L.V;
    s.head_dim_v = W;
    s.v = at(L.values);
    s.o = at(L.maps_out);
    s.v_strides[0] = s.o_strides[0] = L.tokens * L.HV * W;
    s.v_strides[1] = s.o_strides[1] = L.HV * W;
    s.v_strides[2] = s.o_strides[2] = W;
    s.initial_state = reinterpret_cast<const float*>(at(L.identity));
    s.final_state = reinterpret_cast<float*>(at(L.maps));
  } else {
    s.initial_state = reinterpret_cast<const float*>(at(L.states));
    s.final_state = p.final_state ? reinterpret_cast<float*>(at(L.finals)) : nullptr;
  }
  return s;
}

}  // namespace kla::cp
