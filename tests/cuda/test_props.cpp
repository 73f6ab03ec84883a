// RapidCheck properties on kernel outputs (ctest label cuda_props), each a GoogleTest that
// skips with a message where no GPU exists:
//   * both entry points vs the MPFR reference (133 bits) on random shapes: T not a multiple of
//     the chunk, varlen batches, grouped value heads, initial state, fp32/bf16/fp16,
//     eps in {0, 1e-12, 1e-6, 1e-3, 1}, key norms spread over 1e-4..1e2 inside one chunk,
//     decays from none to strong, eta in (0, 1];
//   * Theorem 1 (eta = 1, eps = 0): with q = k and scale 1 the read-out o_t = S_t^T k_t is v_t;
//   * Proposition 2: the residual after a step is (1 - eta|k|^2/(|k|^2+eps)) times the one before;
//   * normalised-key equivalence: KLA(q,k,v,eta) = GDN(q, k/r, v/r, beta = eta);
//   * consistency: chunkwise == tokenwise; prefill T + n decode steps == prefill T+n; a
//     sequence split across calls with state hand-off == one call;
//   * long sequences (1000 to 5000 tokens, the benchmark's shape classes: K, V up to 128, or 256
//     where the path takes it, grouped value heads up to ratio 3, decays down to -5, varlen with
//     empty and one-token sequences, eta_value != 1) against MPFR on a sample of value columns
//     (the columns of the state evolve independently, so a column sample is exact).
// Bounds: tolerance.hpp's per-path model (checks.hpp); Theorem 1 and Proposition 2 use the same
// model, stated next to them.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cstdlib>

#include "checks.hpp"
#include "mutant_flag.hpp"

namespace kla::test {
namespace {

using Mpfr = kla::ref::Mpfr;

const float kEps[] = {0.0f, 1e-12f, 1e-6f, 1e-3f, 1.0f};

/// A random problem small enough for the MPFR reference (T <= 100 a sequence; K, V <= 64, or up
/// to 128 on a single key head). Under a pinned WY path (--kla_path, path_pin.hpp) the dtype and
/// head dims are drawn from that path's domain, so the pinned run exercises it.
Config gen_config() {
  const PathPin& pin = pinned_path();
  const bool wy = pin.path == KLA_PATH_WY, tr = pin.path == KLA_PATH_WY_TRANSPOSED;
  Config c;
  c.dtype = wy   ? *rc::gen::element(KLA_DTYPE_BF16, KLA_DTYPE_FP16, KLA_DTYPE_FP32)
            : tr ? *rc::gen::element(KLA_DTYPE_BF16, KLA_DTYPE_FP16)
                 : *rc::gen::element(KLA_DTYPE_FP32, KLA_DTYPE_BF16, KLA_DTYPE_FP16);
  // Both arithmetic contracts (fp32 FAST runs the WY path on sm_90a, bf16 / fp16 FAST its own
  // arithmetic on the transposed scan; other paths run ACCURATE under either).
  c.arithmetic = wy && c.dtype == KLA_DTYPE_FP32
                     ? KLA_ARITHMETIC_FAST
                     : *rc::gen::element(KLA_ARITHMETIC_ACCURATE, KLA_ARITHMETIC_FAST);
  if (wy)
    c.K = pin.value_slice == 8 ? *rc::gen::element(96, 128) : *rc::gen::element(64, 96, 128);
  else if (tr)
    c.K = *rc::gen::element(64, 128);
  else
    c.K = *rc::gen::element(16, 32, 48, 64, 80, 64, 96, 128);
  const int vs = pin.value_slice > 16 ? pin.value_slice : 16;  // V: a multiple of 16 and the slice
  c.V = tr   ? *rc::gen::element(64, 128)
        : wy ? vs * *rc::gen::inRange(1, 128 / vs + 1)
             : 16 * *rc::gen::inRange(1, 5);
  c.H = *rc::gen::inRange(1, 3);
  c.HV = c.H * *rc::gen::inRange(1, 4);                               // group ratios 1, 2, 3
  if (c.K > 64 || c.V > 64) c.H = 1, c.HV = *rc::gen::inRange(1, 4);  // the reference's cost
  if (*rc::gen::arbitrary<bool>()) {
    // Varlen: lengths from 0 to 70, one of them 0 or 1 in most cases.
    const int n = *rc::gen::inRange(1, 5);
    c.cu_seqlens = {0};
    const int special = *rc::gen::inRange(0, n + 1);  // n: none
    for (int i = 0; i < n; ++i)
      c.cu_seqlens.push_back(c.cu_seqlens.back() +
                             (i == special ? *rc::gen::inRange(0, 2) : *rc::gen::inRange(0, 70)));
    c.B = 1;
    c.T = std::max(1, c.cu_seqlens.back());
    c.cu_seqlens.back() = c.T;
  } else {
    c.B = *rc::gen::inRange(1, 3);
    c.T = *rc::gen::inRange(1, 100);
  }
  c.eps = *rc::gen::elementOf(std::vector<float>(std::begin(kEps), std::end(kEps)));
  c.coefficient = *rc::gen::element(KLA_COEFF_KACZMARZ, KLA_COEFF_KACZMARZ, KLA_COEFF_GIVEN);
  c.readout = *rc::gen::element(KLA_READOUT_SCALE, KLA_READOUT_Q_L2NORM, KLA_READOUT_QK_L2NORM);
  c.has_g = *rc::gen::arbitrary<bool>();
  c.decay_max = *rc::gen::element(0.01, 0.2, 1.0, 5.0);
  c.has_eta = *rc::gen::arbitrary<bool>();
  c.eta_lo = *rc::gen::element(0.01, 0.5, 1.0);
  if (!c.has_eta) c.eta_value = *rc::gen::element(1.0f, 1.0f, 0.3f, 0.9f);
  c.has_init = *rc::gen::arbitrary<bool>();
  c.pad_qk = 8 * *rc::gen::inRange(0, 3);
  c.pad_o = 8 * *rc::gen::inRange(0, 2);
  if (c.coefficient == KLA_COEFF_GIVEN) {
    c.knorm_lo = 0.3, c.knorm_hi = 1.0;  // GDN needs eta|k|^2 <= 2 to stay bounded
  } else {
    c.knorm_lo = 1e-4, c.knorm_hi = 1e2;
  }
  c.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
  return c;
}

/// A case's report into RapidCheck's log (printed when the case fails) and, with
/// KLA_PROPS_VERBOSE=1, to stdout for every case, passing or not (how close each came).
void log_case(const std::string& report) {
  RC_LOG() << report << "\n";
  if (const char* v = std::getenv("KLA_PROPS_VERBOSE"); v && *v == '1')
    std::printf("kla props case: %s\n", report.c_str());
}

void prop_vs_reference(Entry e) {
  const Config c = gen_config();
  const Data d = make_data(c);
  DeviceProblem dp(d);
  const Outputs got = run_device(dp, e);
  const Outputs ref = run_reference<Mpfr>(d);
  const Comparison cmp = compare(got, ref, d);
  log_case(cmp.report);
  RC_ASSERT(cmp.ok);
  RC_ASSERT(padding_untouched(got.o, d));
}

#define KLA_PROP(name, ...)                             \
  TEST(CudaProps, name) {                               \
    KLA_REQUIRE_GPU();                                  \
    EXPECT_TRUE(rc::check(#name, [] { __VA_ARGS__; })); \
  }

KLA_PROP(ChunkMatchesMpfrReference, prop_vs_reference(Entry::chunk))
KLA_PROP(TokenwiseMatchesMpfrReference, prop_vs_reference(Entry::tokenwise))

/// Theorem 1 (eta = 1, eps = 0): S_t^T k_t = v_t, read through o_t = S_t^T q_t with q = k and
/// scale 1, for every token of the call. Bound (tolerance.hpp): v is exact in the dtype, so
/// |o - v| <= 2 |o^ - v| (o^ the unrounded result), and o^ - v = dS_t^T k_t for the state's error
/// dS_t, at most 6 sigma_t ||S_t[:, j]|| ||k_t|| per column j (sigma_t: the path's model after
/// t + 1 tokens). The exact projection writes S_t = (I - k^ k^^T) S~ + k^ v_t^T / ||k_t||, two
/// orthogonal parts, and the decay only shrinks S~, so ||S_t[:, j]||^2 <= ||S_0[:, j]||^2 +
/// sum_{s <= t} v_sj^2 / ||k_s||^2: a bound from the inputs alone.
void prop_thm1(Entry e) {
  Config c = gen_config();
  c.cu_seqlens.clear();
  c.B = *rc::gen::inRange(1, 3);
  c.T = *rc::gen::inRange(1, 80);
  c.coefficient = KLA_COEFF_KACZMARZ;
  c.readout = KLA_READOUT_SCALE;
  c.scale = 1.0f;
  c.eps = 0.0f;
  c.has_eta = false;  // eta = 1
  c.eta_value = 1.0f;
  c.knorm_lo = 0.5, c.knorm_hi = 2.0;
  Data d = make_data(c);
  d.q = d.k;
  DeviceProblem dp(d);
  const Outputs got = run_device(dp, e);
  const PathArithmetic a = path_arithmetic(got.ran, c.dtype, c.K);
  const int group = c.HV / c.H;
  double worst = 0;
  for (int b = 0; b < c.B; ++b)
    for (int hv = 0; hv < c.HV; ++hv) {
      std::vector<double> col2(c.V, 0.0);  // the bound on ||S_t[:, j]||^2
      if (!d.s0.empty())
        for (int r = 0; r < c.K; ++r)
          for (int i = 0; i < c.V; ++i) {
            const double s = d.s0[((int64_t(b) * c.HV + hv) * c.K + r) * c.V + i];
            col2[i] += s * s;
          }
      for (int t = 0; t < c.T; ++t) {
        const float* k = d.k.data() + b * d.qs[0] + t * d.qs[1] + (hv / group) * d.qs[2];
        double kn2 = 0;
        for (int r = 0; r < c.K; ++r) kn2 += double(k[r]) * k[r];
        const double sigma = model_sigma(a, t + 1, c.has_g ? c.decay_max : 0.0);
        for (int i = 0; i < c.V; ++i) {
          const double v = d.v[b * d.vs[0] + t * d.vs[1] + hv * d.vs[2] + i];
          col2[i] += v * v / kn2;
          const double o = got.o[b * d.os[0] + t * d.os[1] + hv * d.os[2] + i];
          const double bound = 2 * 6 * sigma * std::sqrt(col2[i] * kn2);
          worst = std::max(worst, std::abs(o - v) / bound);
          RC_ASSERT(std::abs(o - v) <= bound);
        }
      }
    }
  tolerance_ledger().add("thm1 " + a.key, worst, 0, 0, 0, c.describe());
}
KLA_PROP(Thm1ReadBackChunk, prop_thm1(Entry::chunk))
KLA_PROP(Thm1ReadBackTokenwise, prop_thm1(Entry::tokenwise))

/// Proposition 2: one decode step from a known state S0; residual before e = v - alpha S0^T k
/// (double, on the host) and after e+ = v - S_1^T k = v - o (q = k, scale 1). Claim:
/// e+ = (1 - eta |k|^2/(|k|^2+eps)) e. Bound (tolerance.hpp, one token): the final rounding
/// u_d |o^| <= 2 u_d |o|, plus the unrounded result's error, 6 sigma_1 times the magnitudes it is
/// computed from, |v| and alpha ||S0[:, j]|| ||k|| (the step's coefficient times |k|^2 is at most
/// eta <= 1, so the update adds no larger magnitude), counted twice (tolerance.hpp's o bound).
void prop_contraction(Entry e) {
  Config c = gen_config();
  c.cu_seqlens.clear();
  c.T = 1;
  c.coefficient = KLA_COEFF_KACZMARZ;
  c.readout = KLA_READOUT_SCALE;
  c.scale = 1.0f;
  c.has_init = true;
  c.knorm_lo = 0.1, c.knorm_hi = 3.0;
  Data d = make_data(c);
  d.q = d.k;
  DeviceProblem dp(d);
  const Outputs got = run_device(dp, e);
  const double ud = unit_roundoff(c.dtype);
  const int group = c.HV / c.H;
  const PathArithmetic a = path_arithmetic(got.ran, c.dtype, c.K);
  const double sigma = model_sigma(a, 1, 0.0);
  double worst = 0;
  for (int b = 0; b < c.B; ++b)
    for (int hv = 0; hv < c.HV; ++hv) {
      const float* k = d.k.data() + b * d.qs[0] + (hv / group) * d.qs[2];
      const float* s0 = d.s0.data() + (int64_t(b) * c.HV + hv) * c.K * c.V;
      const double alpha = d.g.empty() ? 1.0 : std::exp(double(d.g[b * d.gs[0] + hv]));
      const double eta = d.eta.empty() ? double(c.eta_value) : d.eta[b * d.gs[0] + hv];
      double n2 = 0;
      for (int r = 0; r < c.K; ++r) n2 += double(k[r]) * k[r];
      const double f = 1.0 - eta * n2 / (n2 + double(c.eps));
      RC_ASSERT(f >= -1e-12);
      RC_ASSERT(f < 1.0);
      for (int i = 0; i < c.V; ++i) {
        double sk = 0, sn2 = 0;
        for (int r = 0; r < c.K; ++r) {
          sk += double(s0[r * c.V + i]) * k[r];
          sn2 += double(s0[r * c.V + i]) * s0[r * c.V + i];
        }
        const double v = d.v[b * d.vs[0] + hv * d.vs[2] + i];
        const double before = v - alpha * sk;
        const double o = got.o[b * d.os[0] + hv * d.os[2] + i];
        const double after = v - o;
        const double bound =
            2 * ud * std::abs(o) + 2 * 6 * sigma * (std::abs(v) + alpha * std::sqrt(sn2 * n2));
        worst = std::max(worst, std::abs(after - f * before) / bound);
        RC_ASSERT(std::abs(after - f * before) <= bound);
      }
    }
  tolerance_ledger().add("prop2 " + a.key, worst, 0, 0, 0, c.describe());
}
KLA_PROP(Prop2ContractionChunk, prop_contraction(Entry::chunk))
KLA_PROP(Prop2ContractionTokenwise, prop_contraction(Entry::tokenwise))

/// Normalised-key form: KLA(q, k, v, eta) vs GDN(q, k^, v^, beta = eta) with k^ = k/r,
/// v^ = v/r rounded to the dtype (fp32 only: the rounding of k^ and v^ to bf16/fp16 is itself
/// an O(u_d) change of the problem). Bound: twice the kernel-vs-reference tolerance.
void prop_normalized(Entry e) {
  Config c = gen_config();
  c.dtype = KLA_DTYPE_FP32;
  c.coefficient = KLA_COEFF_KACZMARZ;
  if (c.readout == KLA_READOUT_QK_L2NORM) c.readout = KLA_READOUT_SCALE;  // it renormalises k
  c.knorm_lo = 1e-2, c.knorm_hi = 1e1;
  const Data d = make_data(c);
  Data dn = d;
  dn.cfg.coefficient = KLA_COEFF_GIVEN;
  const int group = c.HV / c.H;
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t)
      for (int h = 0; h < c.H; ++h) {
        float* k = dn.k.data() + b * d.qs[0] + t * d.qs[1] + h * d.qs[2];
        double n2 = 0;
        for (int r = 0; r < c.K; ++r) n2 += double(k[r]) * k[r];
        const double rinv = 1.0 / std::sqrt(n2 + double(c.eps));
        for (int r = 0; r < c.K; ++r) k[r] = float(k[r] * rinv);
        for (int hv = h * group; hv < (h + 1) * group; ++hv)
          for (int i = 0; i < c.V; ++i) {
            float& v = dn.v[b * d.vs[0] + t * d.vs[1] + hv * d.vs[2] + i];
            v = float(v * rinv);
          }
      }
  DeviceProblem a(d), bn(dn);
  const Outputs oa = run_device(a, e), ob = run_device(bn, e);
  const Comparison cmp = compare(oa, ob, d, /*pair=*/true);
  log_case(cmp.report);
  RC_ASSERT(cmp.ok);
}
KLA_PROP(NormalizedKeyFormChunk, prop_normalized(Entry::chunk))
KLA_PROP(NormalizedKeyFormTokenwise, prop_normalized(Entry::tokenwise))

/// chunkwise == tokenwise within twice the kernel-vs-reference tolerance.
KLA_PROP(ChunkEqualsTokenwise, {
  const Config c = gen_config();
  DeviceProblem dp(make_data(c));
  const Outputs a = run_device(dp, Entry::chunk), b = run_device(dp, Entry::tokenwise);
  const Comparison cmp = compare(a, b, dp.data, /*pair=*/true);
  log_case(cmp.report);
  RC_ASSERT(cmp.ok);
})

/// Splits each sequence of a problem at token `cut`: the first part's final state becomes the
/// second part's initial state; outputs and final state must equal one call over the whole.
/// `second` runs the second part (decode steps: tokenwise, or chunkwise).
void prop_split(Entry first, Entry second, bool decode_tail) {
  Config c = gen_config();
  c.cu_seqlens.clear();
  c.T = *rc::gen::inRange(2, 100);
  const int cut =
      decode_tail ? c.T - *rc::gen::inRange(1, std::min(c.T, 5)) : *rc::gen::inRange(1, c.T);
  const Data whole = make_data(c);
  DeviceProblem dw(whole);
  const Outputs one = run_device(dw, first);

  auto part = [&](int t0, int t1) {
    Data p = whole;
    p.cfg.T = t1 - t0;
    p.qs[0] = whole.qs[0];
    p.q.clear(), p.k.clear(), p.v.clear(), p.g.clear(), p.eta.clear();
    // Same strides; just copy the tokens [t0, t1) into a buffer of T' tokens.
    p.qs[0] = p.qs[1] * p.cfg.T;
    p.vs[0] = p.vs[1] * p.cfg.T;
    p.os[0] = p.os[1] * p.cfg.T;
    p.gs[0] = int64_t(c.HV) * p.cfg.T;
    p.q.resize(c.B * p.qs[0]), p.k.resize(c.B * p.qs[0]), p.v.resize(c.B * p.vs[0]);
    for (int b = 0; b < c.B; ++b)
      for (int t = t0; t < t1; ++t) {
        for (int64_t i = 0; i < p.qs[1]; ++i) {
          p.q[b * p.qs[0] + (t - t0) * p.qs[1] + i] =
              whole.q[b * whole.qs[0] + t * whole.qs[1] + i];
          p.k[b * p.qs[0] + (t - t0) * p.qs[1] + i] =
              whole.k[b * whole.qs[0] + t * whole.qs[1] + i];
        }
        for (int64_t i = 0; i < p.vs[1]; ++i)
          p.v[b * p.vs[0] + (t - t0) * p.vs[1] + i] =
              whole.v[b * whole.vs[0] + t * whole.vs[1] + i];
        for (int hv = 0; hv < c.HV; ++hv) {
          if (!whole.g.empty()) p.g.push_back(whole.g[b * whole.gs[0] + t * whole.gs[1] + hv]);
          if (!whole.eta.empty())
            p.eta.push_back(whole.eta[b * whole.gs[0] + t * whole.gs[1] + hv]);
        }
      }
    return p;
  };
  const Data d1 = part(0, cut);
  DeviceProblem p1(d1);
  const Outputs r1 = run_device(p1, first);
  Data d2 = part(cut, c.T);
  d2.cfg.has_init = true;
  d2.s0.assign(r1.state.begin(), r1.state.end());
  DeviceProblem p2(d2);
  const Outputs r2 = run_device(p2, second);
  // Stitch o back together in the whole problem's layout.
  Outputs stitched;
  stitched.o.assign(whole.o_elems(), 0.0);
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t)
      for (int64_t i = 0; i < whole.os[1]; ++i)
        stitched.o[b * whole.os[0] + t * whole.os[1] + i] =
            t < cut ? r1.o[b * d1.os[0] + t * d1.os[1] + i]
                    : r2.o[b * d2.os[0] + (t - cut) * d2.os[1] + i];
  stitched.state = r2.state;
  const Comparison cmp = compare(stitched, one, whole, /*pair=*/true);
  log_case("cut " + std::to_string(cut) + ": " + cmp.report);
  RC_ASSERT(cmp.ok);
}
KLA_PROP(PrefillThenDecodeEqualsLongerPrefill, prop_split(Entry::chunk, Entry::tokenwise, true))
KLA_PROP(SplitWithStateHandOffChunk, prop_split(Entry::chunk, Entry::chunk, false))
KLA_PROP(SplitWithStateHandOffTokenwise, prop_split(Entry::tokenwise, Entry::tokenwise, false))

/// The value columns `cols` of a problem (v, the initial state; q, k and the gates unchanged):
/// every column of the state evolves on its own (S[:, j] <- alpha S[:, j] + beta k (v_j -
/// alpha S[:, j]^T k)), so the reference on a column sample is the reference of those columns.
Data column_sample(const Data& d, const std::vector<int>& cols) {
  Data s;
  s.cfg = d.cfg;
  s.cfg.V = int(cols.size());
  s.cfg.pad_v = s.cfg.pad_o = 0;
  static_cast<Strides&>(s) = row_major_strides(s.cfg.shape(), d.cfg.pad_qk, 0, 0);
  s.q = d.q, s.k = d.k, s.g = d.g, s.eta = d.eta;
  const Config& c = d.cfg;
  s.v.assign(std::size_t(c.B) * s.vs[0], 0.f);
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t)
      for (int hv = 0; hv < c.HV; ++hv)
        for (std::size_t j = 0; j < cols.size(); ++j)
          s.v[b * s.vs[0] + t * s.vs[1] + hv * s.vs[2] + j] =
              d.v[b * d.vs[0] + t * d.vs[1] + hv * d.vs[2] + cols[j]];
  if (!d.s0.empty()) {
    s.s0.assign(s.state_elems(), 0.f);
    for (int n = 0; n < c.N(); ++n)
      for (int hv = 0; hv < c.HV; ++hv)
        for (int r = 0; r < c.K; ++r)
          for (std::size_t j = 0; j < cols.size(); ++j)
            s.s0[((int64_t(n) * c.HV + hv) * c.K + r) * cols.size() + j] =
                d.s0[((int64_t(n) * c.HV + hv) * c.K + r) * c.V + cols[j]];
  }
  return s;
}

/// The same columns of a full problem's outputs, in the sample's layout.
Outputs sample_outputs(const Outputs& full, const Data& d, const Data& s,
                       const std::vector<int>& cols) {
  Outputs out;
  out.ran = full.ran;
  const Config& c = d.cfg;
  out.o.assign(s.o_elems(), 0.0);
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t)
      for (int hv = 0; hv < c.HV; ++hv)
        for (std::size_t j = 0; j < cols.size(); ++j)
          out.o[b * s.os[0] + t * s.os[1] + hv * s.os[2] + j] =
              full.o[b * d.os[0] + t * d.os[1] + hv * d.os[2] + cols[j]];
  out.state.assign(s.state_elems(), 0.0);
  for (int n = 0; n < c.N(); ++n)
    for (int hv = 0; hv < c.HV; ++hv)
      for (int r = 0; r < c.K; ++r)
        for (std::size_t j = 0; j < cols.size(); ++j)
          out.state[((int64_t(n) * c.HV + hv) * c.K + r) * cols.size() + j] =
              full.state[((int64_t(n) * c.HV + hv) * c.K + r) * c.V + cols[j]];
  return out;
}

/// A long problem in the benchmark's shape classes, from the pinned path's domain (gen_config):
/// 1000 to 5000 tokens a sequence (16 to 80 chunks), or varlen with an empty and a one-token
/// sequence beside long ones; group ratios 1 to 3; K, V = 192 / 256 where the path takes them
/// (the generic and tokenwise kernels); the reference's cost bounded by N HV <= 8.
Config gen_long_config() {
  Config c = gen_config();
  const PathPin& pin = pinned_path();
  if ((pin.path == KLA_PATH_AUTO || pin.path == KLA_PATH_GENERIC) && *rc::gen::element(0, 0, 1)) {
    c.K = *rc::gen::element(192, 256, 128);
    c.V = *rc::gen::element(192, 256, 64);
  }
  c.H = *rc::gen::inRange(1, 3);
  c.HV = c.H * *rc::gen::inRange(1, 4);
  if (*rc::gen::arbitrary<bool>()) {
    c.B = 1;
    c.cu_seqlens = {0, *rc::gen::inRange(500, 3000)};
    c.cu_seqlens.push_back(c.cu_seqlens.back() + *rc::gen::inRange(0, 2));  // empty or one token
    c.cu_seqlens.push_back(c.cu_seqlens.back() + *rc::gen::inRange(500, 3000));
    c.T = c.cu_seqlens.back();
  } else {
    c.cu_seqlens.clear();
    c.B = *rc::gen::inRange(1, 3);
    c.T = *rc::gen::inRange(1000, 5001);
  }
  while (c.N() * c.HV > 8) c.HV -= c.H;
  c.has_g = *rc::gen::element(true, true, true, false);
  return c;
}

/// Long sequences vs MPFR on four random value columns of every head.
void prop_long(Entry e) {
  const Config c = gen_long_config();
  const Data d = make_data(c);
  DeviceProblem dp(d);
  const Outputs got = run_device(dp, e);
  std::vector<int> cols;
  const int j0 = *rc::gen::inRange(0, c.V);
  for (int j = 0; j < 4; ++j) cols.push_back((j0 + j * 37) % c.V);
  const Data s = column_sample(d, cols);
  const Outputs ref = run_reference<Mpfr>(s);
  const Comparison cmp = compare(sample_outputs(got, d, s, cols), ref, s);
  log_case(cmp.report);
  RC_ASSERT(cmp.ok);
  RC_ASSERT(padding_untouched(got.o, d));
}

/// rc::check with at most n cases (RC_PARAMS' max_success if smaller): the long properties cost
/// seconds a case in the reference.
template <class Fn>
bool check_cases(const std::string& name, int n, Fn fn) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = std::min(params.maxSuccess, n);
  rc::detail::TestMetadata meta;
  meta.id = meta.description = name;
  const auto result = rc::detail::checkTestable(fn, meta, params);
  rc::detail::printResultMessage(result, std::cerr);
  std::cerr << "\n";
  return result.template is<rc::detail::SuccessResult>();
}

int long_cases() {
  const char* s = std::getenv("KLA_LONG_CASES");
  return s ? std::max(1, std::atoi(s)) : 6;
}

TEST(CudaProps, LongSequencesChunkMatchMpfrColumns) {
  KLA_REQUIRE_GPU();
  EXPECT_TRUE(check_cases("LongSequencesChunk", long_cases(), [] { prop_long(Entry::chunk); }));
}
// The decode kernel over thousands of tokens; the same under every pin, so only unpinned runs.
TEST(CudaProps, LongSequencesTokenwiseMatchMpfrColumns) {
  KLA_REQUIRE_GPU();
  if (pinned_path().path != KLA_PATH_AUTO) GTEST_SKIP() << "the tokenwise kernel is not pinned";
  EXPECT_TRUE(
      check_cases("LongSequencesTokenwise", long_cases(), [] { prop_long(Entry::tokenwise); }));
}

}  // namespace
}  // namespace kla::test

int main(int argc, char** argv) {
  // Property runs call the MPFR reference: keep the default case count modest and skip
  // shrinking (each shrink step reruns the reference); RC_PARAMS overrides both.
  setenv("RC_PARAMS", "max_success=40 noshrink=1", 0);
  kla::test::parse_path_flag(argc, argv);
  kla::test::parse_mutant_flag(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
