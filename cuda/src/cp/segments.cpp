// The sequence split's host side (cp/segments.hpp): cuts, predicates, workspace layout, the two
// passes' params. Pure host arithmetic on validated params.
#include "cp/segments.hpp"

#include <algorithm>

#include "api/errors.hpp"
#include "layout/chunk_geometry.hpp"

namespace kla::cp {
namespace {

using detail::cat;

int64_t elem_bytes(kla_dtype d) {
  return d == KLA_DTYPE_FP32 ? 4 : 2;
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
    for (const auto& x : t)
      if (x.ptr && x.batch != p.seq_len * x.token)
        return cat(x.name, "'s batch stride ", x.batch, " is not seq_len times its token stride ",
                   x.token, " (the segments are packed over batch x tokens)");
  }
  if (num_seqs(p) * p.seq_len > INT32_MAX && !packed(p))
    return "batch x seq_len exceeds 2^31-1 tokens";
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
  SplitLayout L;
  L.n = n;
  L.N = num_seqs(p);
  L.M = L.N * n;
  L.tokens = packed(p) ? p.seq_len : p.batch * p.seq_len;
  L.HV = p.num_v_heads, L.K = p.head_dim_k, L.V = p.head_dim_v;
  const int64_t W = L.K + L.V, es = elem_bytes(p.dtype);
  // The passes' own workspace: kla_workspace_size of each, shapes only (packed, M sequences).
  int32_t dummy = 0;
  kla_params s = p;
  s.batch = 1, s.seq_len = L.tokens, s.num_seqs = L.M;
  s.cu_seqlens = nullptr, s.cu_seqlens_host = &dummy;  // packed: only the flag is read
  s.segments = 1;
  const int64_t second = int64_t(kla_workspace_size(&s));
  s.head_dim_v = W;
  const int64_t maps = int64_t(kla_workspace_size(&s));
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t off = at;
    at += round16(bytes);
    return off;
  };
  L.passes = round16(std::max(second, maps));
  take(L.passes);
  L.values = take(L.tokens * L.HV * W * es);
  L.maps_out = take(L.tokens * L.HV * W * es);
  L.identity = take(L.M * L.HV * L.K * W * 4);
  L.maps = take(L.M * L.HV * L.K * W * 4);
  L.states = take(L.M * L.HV * L.K * L.V * 4);
  L.finals = take(L.M * L.HV * L.K * L.V * 4);
  L.cuts = take((L.M + 1) * 4);
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
