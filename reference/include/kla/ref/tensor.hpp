// Batched reference over the kernels' layouts (SPEC §3), so one set of test data feeds both the
// reference and the CUDA kernels: q, k [B,T,H,K]; v, o [B,T,HV,V] (HV a multiple of H; value
// head h reads query/key head h / (HV/H)); decay and η [B,T,HV]; states [N,HV,K,V]; optional
// cu_seqlens [N+1] packing N sequences into B = 1. Outer strides are free (element strides).
// Inputs are read in their storage type and converted once to the compute type T.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kla/ref/chunk.hpp"
#include "kla/ref/recurrence.hpp"

namespace kla::ref {

/// A strided view of N-dimensional data it does not own. A null `data` means "absent".
template <class E, int N>
struct TensorView {
  E* data = nullptr;
  std::array<std::int64_t, N> shape{};
  std::array<std::int64_t, N> stride{};

  /// Row-major contiguous view of `shape`.
  static TensorView contiguous(E* p, std::array<std::int64_t, N> shape) {
    TensorView t{p, shape, {}};
    std::int64_t s = 1;
    for (int d = N - 1; d >= 0; --d) {
      t.stride[static_cast<size_t>(d)] = s;
      s *= shape[static_cast<size_t>(d)];
    }
    return t;
  }
  template <class... I>
  E& operator()(I... idx) const {
    static_assert(sizeof...(I) == N);
    const std::array<std::int64_t, N> i{static_cast<std::int64_t>(idx)...};
    std::int64_t off = 0;
    for (size_t d = 0; d < N; ++d) off += i[d] * stride[d];
    return data[off];
  }
  explicit operator bool() const { return data != nullptr; }
};

/// The inputs of one forward call. At most one of `log_decay` (g = ln α, exponentiated in T)
/// and `decay` (α itself; the only choice over Rational) is set; `decay_diag` [B,T,HV,K] is the
/// per-channel variant of `decay`. Absent decay means α = 1.
template <class E>
struct SequenceBatch {
  TensorView<const E, 4> q, k, v;
  TensorView<const E, 3> log_decay, decay;
  TensorView<const E, 4> decay_diag;
  TensorView<const E, 3> eta;
  TensorView<const E, 4> initial_state;  ///< [N,HV,K,V], optional
  std::vector<std::int32_t> cu_seqlens;  ///< empty, or N+1 offsets with B = 1
};

struct Algorithm {
  enum Kind { tokenwise, chunkwise } kind = tokenwise;
  Eigen::Index chunk = 64;
};

namespace detail {
[[noreturn]] inline void bad(const std::string& m) {
  throw std::invalid_argument("kla::ref::forward: " + m);
}
}  // namespace detail

/// Runs every (sequence, value head) through the tokenwise or chunkwise reference and writes o
/// [B,T,HV,V] and, if given, final_state [N,HV,K,V]. Throws std::invalid_argument on
/// inconsistent shapes before writing anything.
template <class T, class E, class Out>
void forward(const SequenceBatch<E>& in, const Options<T>& opt, Algorithm alg, TensorView<Out, 4> o,
             TensorView<Out, 4> final_state = {}) {
  using detail::bad;
  if (!in.q || !in.k || !in.v || !in.eta || !o) bad("q, k, v, eta and o are required");
  const auto B = in.k.shape[0], Tn = in.k.shape[1], H = in.k.shape[2], K = in.k.shape[3];
  const auto HV = in.v.shape[2], V = in.v.shape[3];
  if (in.q.shape != in.k.shape) bad("q and k must have the same shape [B,T,H,K]");
  if (in.v.shape[0] != B || in.v.shape[1] != Tn) bad("v must be [B,T,HV,V]");
  if (B < 0 || Tn < 0 || K <= 0 || V <= 0) bad("sizes must be non-negative and K, V positive");
  if (H <= 0 || HV % H != 0) bad("HV must be a positive multiple of H");
  if (o.shape != in.v.shape) bad("o must have the shape of v");
  const std::array<std::int64_t, 3> gate{B, Tn, HV};
  if (in.eta.shape != gate) bad("eta must be [B,T,HV]");
  if ((in.log_decay && in.log_decay.shape != gate) || (in.decay && in.decay.shape != gate))
    bad("decay must be [B,T,HV]");
  if (int(bool(in.log_decay)) + int(bool(in.decay)) + int(bool(in.decay_diag)) > 1)
    bad("give at most one of log_decay, decay, decay_diag");
  if (in.decay_diag && in.decay_diag.shape != std::array<std::int64_t, 4>{B, Tn, HV, K})
    bad("decay_diag must be [B,T,HV,K]");
  // Sequences: [begin, end) in (batch row, token) coordinates.
  std::vector<std::array<std::int64_t, 3>> seqs;
  if (in.cu_seqlens.empty()) {
    for (std::int64_t b = 0; b < B; ++b) seqs.push_back({b, 0, Tn});
  } else {
    if (B != 1) bad("cu_seqlens needs B = 1");
    if (in.cu_seqlens.size() < 2 || in.cu_seqlens.front() != 0 || in.cu_seqlens.back() != Tn)
      bad("cu_seqlens must start at 0 and end at T");
    for (size_t n = 0; n + 1 < in.cu_seqlens.size(); ++n) {
      if (in.cu_seqlens[n + 1] < in.cu_seqlens[n]) bad("cu_seqlens must be non-decreasing");
      seqs.push_back({0, in.cu_seqlens[n], in.cu_seqlens[n + 1]});
    }
  }
  const std::array<std::int64_t, 4> state_shape{std::int64_t(seqs.size()), HV, K, V};
  if (in.initial_state && in.initial_state.shape != state_shape)
    bad("initial_state must be [N,HV,K,V]");
  if (final_state && final_state.shape != state_shape) bad("final_state must be [N,HV,K,V]");
  if (alg.kind == Algorithm::chunkwise && alg.chunk < 1) bad("chunk length must be >= 1");
  if constexpr (!ScalarTraits<T>::has_transcendentals) {
    // Refused here, not per head, so nothing is written before the error.
    if (in.log_decay) bad("log_decay needs a scalar type with exp; pass decay factors instead");
    if (opt.readout == Readout::q_l2norm || opt.readout == Readout::qk_l2norm)
      bad("q l2-norm read-outs need a scalar type with sqrt");
  }

  const std::int64_t group = HV / H;
  for (size_t n = 0; n < seqs.size(); ++n) {
    const auto [b, t0, t1] = seqs[n];
    const Eigen::Index L = t1 - t0;
    for (std::int64_t hv = 0; hv < HV; ++hv) {
      const std::int64_t h = hv / group;
      HeadInputs<T> hi;
      hi.q.resize(L, K);
      hi.k.resize(L, K);
      hi.v.resize(L, V);
      hi.eta.resize(L);
      if (in.log_decay || in.decay) hi.alpha.resize(L, 1);
      if (in.decay_diag) hi.alpha.resize(L, K);
      for (Eigen::Index t = 0; t < L; ++t) {
        for (std::int64_t c = 0; c < K; ++c) {
          hi.q(t, c) = scalar_cast<T>(in.q(b, t0 + t, h, c));
          hi.k(t, c) = scalar_cast<T>(in.k(b, t0 + t, h, c));
          if (in.decay_diag) hi.alpha(t, c) = scalar_cast<T>(in.decay_diag(b, t0 + t, hv, c));
        }
        for (std::int64_t c = 0; c < V; ++c) hi.v(t, c) = scalar_cast<T>(in.v(b, t0 + t, hv, c));
        hi.eta(t) = scalar_cast<T>(in.eta(b, t0 + t, hv));
        if (in.decay) hi.alpha(t, 0) = scalar_cast<T>(in.decay(b, t0 + t, hv));
        if (in.log_decay) {
          if constexpr (ScalarTraits<T>::has_transcendentals)
            hi.alpha(t, 0) = exp_of(scalar_cast<T>(in.log_decay(b, t0 + t, hv)));
        }
      }
      Mat<T> S0 = Mat<T>::Zero(K, V);
      if (in.initial_state)
        for (std::int64_t i = 0; i < K; ++i)
          for (std::int64_t j = 0; j < V; ++j)
            S0(i, j) = scalar_cast<T>(in.initial_state(std::int64_t(n), hv, i, j));
      const HeadOutputs<T> r = alg.kind == Algorithm::tokenwise
                                   ? recurrent_forward(hi, opt, S0)
                                   : chunk_forward(hi, opt, alg.chunk, S0);
      for (Eigen::Index t = 0; t < L; ++t)
        for (std::int64_t c = 0; c < V; ++c) o(b, t0 + t, hv, c) = scalar_cast<Out>(r.o(t, c));
      if (final_state)
        for (std::int64_t i = 0; i < K; ++i)
          for (std::int64_t j = 0; j < V; ++j)
            final_state(std::int64_t(n), hv, i, j) = scalar_cast<Out>(r.state(i, j));
    }
  }
}

}  // namespace kla::ref
