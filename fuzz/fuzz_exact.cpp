// Fuzz target 2: exact differential. Tokenwise vs chunkwise reference over Rational (GMP) on
// fuzzer-chosen tiny problems (T <= 8, dk, dv <= 4): outputs and final state must be EQUAL.
//
// Two modes, picked by the first byte:
//  * head: kla::ref::recurrent_forward vs chunk_forward(chunk = 1..9) on one head, scalar,
//    per-channel or no decay, Kaczmarz or given coefficient, eps = 0 or a small rational,
//    optional initial state; values are small rationals (int8 / {1,2,3,4}), so k = 0 rows and
//    the degenerate case k = 0, eps = 0 come up often. Each token is also replayed with
//    token_step to check the convention: k = 0 and eps = 0 give beta = 0 and S_t = diag(alpha) S.
//  * batched: kla::ref::forward (tensor.hpp) on [B,T,H,K] / [B,T,HV,V] layouts with grouped
//    value heads and optional cu_seqlens, tokenwise vs chunkwise, both against a per-head
//    recurrent_forward indexed by the harness. Bad requests for Rational (log-decay, q l2-norm
//    read-out) must throw std::invalid_argument and leave o and final_state untouched.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "bytes.hpp"
#include "kla/ref/chunk.hpp"
#include "kla/ref/recurrence.hpp"
#include "kla/ref/tensor.hpp"

namespace ref = kla::ref;
using kla::fuzz::Bytes;
using Q = ref::Rational;
using Idx = Eigen::Index;

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fuzz_exact: %s\n", what);
  std::abort();
}

// A small rational: int8 numerator over 1, 2, 3 or 4.
Q value(Bytes& r) {
  const auto n = static_cast<std::int8_t>(r.u8());
  const int d = r.range(1, 4);
  return Q(n) / Q(d);
}
// A decay factor in (0, 1]: j/16, j = 1..16.
Q decay(Bytes& r) {
  return Q(r.range(1, 16)) / Q(16);
}

void head_mode(Bytes& r) {
  const Idx T = r.range(0, 9), dk = r.range(1, 4), dv = r.range(1, 4), chunk = r.range(1, 9);
  const int decay_kind = r.range(0, 3);
  ref::Options<Q> opt;
  opt.coefficient = r.flag() ? ref::Coefficient::given : ref::Coefficient::kaczmarz;
  opt.eps = r.flag() ? Q(0) : Q(r.u8()) / Q(64);
  opt.scale = value(r);
  ref::HeadInputs<Q> in;
  in.q.resize(T, dk), in.k.resize(T, dk), in.v.resize(T, dv), in.eta.resize(T);
  if (decay_kind == 1) in.alpha.resize(T, 1);
  if (decay_kind == 2) in.alpha.resize(T, dk);
  const int zero_k_every = r.range(0, 4);  // make some keys exactly zero
  for (Idx t = 0; t < T; ++t) {
    for (Idx c = 0; c < dk; ++c) in.q(t, c) = value(r);
    for (Idx c = 0; c < dk; ++c) in.k(t, c) = value(r);
    if (zero_k_every && t % zero_k_every == 0) in.k.row(t).setZero();
    for (Idx c = 0; c < dv; ++c) in.v(t, c) = value(r);
    in.eta(t) = Q(static_cast<std::int8_t>(r.u8())) / Q(16);
    for (Idx c = 0; c < in.alpha.cols(); ++c) in.alpha(t, c) = decay(r);
  }
  ref::Mat<Q> S0;
  if (r.flag()) {
    S0.resize(dk, dv);
    for (Idx i = 0; i < dk; ++i)
      for (Idx j = 0; j < dv; ++j) S0(i, j) = value(r);
  }
  const auto tok = ref::recurrent_forward(in, opt, S0);
  const auto chk = ref::chunk_forward(in, opt, chunk, S0);
  if (tok.o != chk.o) die("head: chunkwise o != tokenwise o");
  if (tok.state != chk.state) die("head: chunkwise state != tokenwise state");
  // The degenerate convention, token by token.
  ref::Mat<Q> S = S0.size() ? S0 : ref::Mat<Q>::Zero(dk, dv);
  for (Idx t = 0; t < T; ++t) {
    const ref::Mat<Q> before = S;
    const ref::Vec<Q> k = in.k.row(t).transpose();
    const auto tr = ref::token_step<Q>(S, in.decay(t), k, in.v.row(t).transpose(), in.eta(t), opt);
    if (opt.coefficient == ref::Coefficient::kaczmarz && k.squaredNorm() == 0 && opt.eps == 0) {
      if (tr.beta != 0) die("k = 0, eps = 0: beta != 0");
      if (S != ref::Mat<Q>(in.decay(t).asDiagonal() * before))
        die("k = 0, eps = 0: state not just decayed");
    }
  }
  if (S != tok.state) die("token_step replay != recurrent_forward");
}

void batched_mode(Bytes& r) {
  const std::int64_t B = r.range(1, 2), T = r.range(0, 7), H = r.range(1, 2);
  const std::int64_t HV = H * r.range(1, 2), K = r.range(1, 3), V = r.range(1, 3);
  std::vector<std::int32_t> cu;
  if (B == 1 && r.flag()) {
    const int N = r.range(1, 3);
    cu.push_back(0);
    for (int n = 1; n < N; ++n) cu.push_back(std::int32_t(r.u8() % (T + 1)));
    cu.push_back(std::int32_t(T));
    std::sort(cu.begin(), cu.end());
  }
  const std::int64_t N = cu.empty() ? B : std::int64_t(cu.size()) - 1;
  const int decay_kind = r.range(0, 4);  // none, decay, decay_diag, log_decay (must throw)
  const bool l2 = r.u8() % 8 == 0;       // q l2-norm read-out (must throw for Rational)
  const bool has_init = r.flag(), has_final = r.flag();
  const ref::Algorithm::Kind kinds[2] = {ref::Algorithm::tokenwise, ref::Algorithm::chunkwise};
  const Idx chunk = r.range(1, 8);
  ref::Options<Q> opt;
  opt.coefficient = r.flag() ? ref::Coefficient::given : ref::Coefficient::kaczmarz;
  opt.eps = r.flag() ? Q(0) : Q(r.u8()) / Q(64);
  opt.readout = l2 ? ref::Readout::q_l2norm : ref::Readout::scale;
  opt.scale = Q(static_cast<std::int8_t>(r.u8())) / Q(8);

  // Storage: doubles holding small dyadic values (exact as rationals). Every buffer gets one
  // spare element: a view with a null data pointer means "absent" to kla::ref::forward, and an
  // empty std::vector may hand out nullptr.
  auto dy = [&] { return double(static_cast<std::int8_t>(r.u8())) / 8.0; };
  std::vector<double> q(size_t(B * T * H * K + 1)), k(q.size()), v(size_t(B * T * HV * V + 1));
  std::vector<double> eta(size_t(B * T * HV + 1)), dec(eta.size()), dd(size_t(B * T * HV * K + 1));
  std::vector<double> s0(size_t(N * HV * K * V + 1));
  for (auto& x : q) x = dy();
  for (auto& x : k) x = r.u8() % 4 == 0 ? 0.0 : dy();
  for (auto& x : v) x = dy();
  for (auto& x : eta) x = dy();
  for (auto& x : dec) x = double(r.range(1, 16)) / 16.0;
  for (auto& x : dd) x = double(r.range(1, 16)) / 16.0;
  for (auto& x : s0) x = dy();

  ref::SequenceBatch<double> in;
  in.q = ref::TensorView<const double, 4>::contiguous(q.data(), {B, T, H, K});
  in.k = ref::TensorView<const double, 4>::contiguous(k.data(), {B, T, H, K});
  in.v = ref::TensorView<const double, 4>::contiguous(v.data(), {B, T, HV, V});
  in.eta = ref::TensorView<const double, 3>::contiguous(eta.data(), {B, T, HV});
  if (decay_kind == 1)
    in.decay = ref::TensorView<const double, 3>::contiguous(dec.data(), {B, T, HV});
  if (decay_kind == 2)
    in.decay_diag = ref::TensorView<const double, 4>::contiguous(dd.data(), {B, T, HV, K});
  if (decay_kind == 3)
    in.log_decay = ref::TensorView<const double, 3>::contiguous(dec.data(), {B, T, HV});
  if (has_init)
    in.initial_state = ref::TensorView<const double, 4>::contiguous(s0.data(), {N, HV, K, V});
  in.cu_seqlens = cu;

  const Q sentinel(12345);
  std::vector<Q> o[2], fs[2];
  bool threw[2] = {false, false};
  char why[256] = "";
  for (int a = 0; a < 2; ++a) {
    o[a].assign(v.size(), sentinel);
    fs[a].assign(s0.size(), sentinel);
    auto ov = ref::TensorView<Q, 4>::contiguous(o[a].data(), {B, T, HV, V});
    auto fv = ref::TensorView<Q, 4>::contiguous(fs[a].data(), {N, HV, K, V});
    if (!has_final) fv = {};
    try {
      ref::forward<Q>(in, opt, ref::Algorithm{kinds[a], chunk}, ov, fv);
    } catch (const std::invalid_argument& e) {
      threw[a] = true;
      std::snprintf(why, sizeof why, "%s", e.what());
      for (const auto& x : o[a])
        if (x != sentinel) die("batched: threw after writing o");
#ifndef KLA_FUZZ_MASK_KNOWN  // known finding: see fuzz/regressions/exact/ and docs/fuzzing.md
      for (const auto& x : fs[a])
        if (x != sentinel) die("batched: threw after writing final_state");
#endif
    }
  }
  const bool must_throw = decay_kind == 3 || l2;
  // A request Rational cannot serve is refused only when some sequence has a token.
  if (threw[0] != threw[1]) die("batched: only one algorithm threw");
  if (threw[0] && !must_throw) {
    std::fprintf(stderr, "fuzz_exact: %s\n", why);
    die("batched: threw on a valid request");
  }
  if (threw[0]) return;
  if (o[0] != o[1]) die("batched: chunkwise o != tokenwise o");
  if (fs[0] != fs[1]) die("batched: chunkwise final_state != tokenwise final_state");
  if (must_throw && T > 0) die("batched: an impossible request did not throw");
  if (must_throw) return;
  // Independent per-head indexing.
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t b = cu.empty() ? n : 0, t0 = cu.empty() ? 0 : cu[size_t(n)];
    const std::int64_t t1 = cu.empty() ? T : cu[size_t(n) + 1];
    for (std::int64_t hv = 0; hv < HV; ++hv) {
      const std::int64_t h = hv / (HV / H);
      ref::HeadInputs<Q> hi;
      const Idx L = t1 - t0;
      hi.q.resize(L, K), hi.k.resize(L, K), hi.v.resize(L, V), hi.eta.resize(L);
      if (decay_kind == 1) hi.alpha.resize(L, 1);
      if (decay_kind == 2) hi.alpha.resize(L, K);
      for (Idx t = 0; t < L; ++t) {
        const std::int64_t bt = b * T + t0 + t;
        for (std::int64_t c = 0; c < K; ++c) {
          hi.q(t, c) = Q(q[size_t((bt * H + h) * K + c)]);
          hi.k(t, c) = Q(k[size_t((bt * H + h) * K + c)]);
          if (decay_kind == 2) hi.alpha(t, c) = Q(dd[size_t((bt * HV + hv) * K + c)]);
        }
        for (std::int64_t c = 0; c < V; ++c) hi.v(t, c) = Q(v[size_t((bt * HV + hv) * V + c)]);
        hi.eta(t) = Q(eta[size_t(bt * HV + hv)]);
        if (decay_kind == 1) hi.alpha(t, 0) = Q(dec[size_t(bt * HV + hv)]);
      }
      ref::Mat<Q> S0 = ref::Mat<Q>::Zero(K, V);
      if (has_init)
        for (std::int64_t i = 0; i < K; ++i)
          for (std::int64_t j = 0; j < V; ++j)
            S0(i, j) = Q(s0[size_t(((n * HV + hv) * K + i) * V + j)]);
      const auto want = ref::recurrent_forward(hi, opt, S0);
      for (Idx t = 0; t < L; ++t)
        for (std::int64_t c = 0; c < V; ++c)
          if (o[0][size_t(((b * T + t0 + t) * HV + hv) * V + c)] != want.o(t, c))
            die("batched: o differs from the per-head recurrence");
      if (has_final)
        for (std::int64_t i = 0; i < K; ++i)
          for (std::int64_t j = 0; j < V; ++j)
            if (fs[0][size_t(((n * HV + hv) * K + i) * V + j)] != want.state(i, j))
              die("batched: final_state differs from the per-head recurrence");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes r(data, size);
  if (r.u8() % 4 == 3)
    batched_mode(r);
  else
    head_mode(r);
  return 0;
}
