// Ground truth of the precision report: KLA in MPFR (kla::ref::Mpfr's precision) on the same
// rounded inputs the columns see, plus the exact-rational helpers of §3.
#include <mpfr.h>

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>

#include "common.hpp"
#include "head.hpp"
#include "kla/ref.hpp"

namespace kla::report {

namespace ref = kla::ref;

int truth_bits() {
  return std::numeric_limits<ref::Mpfr>::digits;
}

namespace {

/// One MPFR number at the truth precision (RAII; not copyable, arrays via unique_ptr<Mp[]>).
struct Mp {
  mpfr_t x;
  Mp() { mpfr_init2(x, truth_bits()); }
  ~Mp() { mpfr_clear(x); }
  Mp(const Mp&) = delete;
  Mp& operator=(const Mp&) = delete;
};

std::unique_ptr<Mp[]> mp_array(size_t n) {
  return std::unique_ptr<Mp[]>(new Mp[n]);
}

constexpr mpfr_rnd_t R = MPFR_RNDN;

}  // namespace

RunResult truth_forward(const Problem& p, double eps) {
  const int dk = p.dk, dv = p.dv;
  auto S = mp_array(size_t(dk) * dv);
  auto k = mp_array(size_t(dk));
  auto e = mp_array(size_t(dv));
  Mp kk, beta, acc, bk;
  for (int i = 0; i < dk * dv; ++i) mpfr_set_zero(S[i].x, 1);
  RunResult out;
  out.o.resize(size_t(p.T) * dv);
  for (int t = 0; t < p.T; ++t) {
    const double* kt = &p.k[size_t(t) * dk];
    const double* vt = &p.v[size_t(t) * dv];
    const double* qt = &p.q[size_t(t) * dk];
    // S̃ = α S (doubles convert exactly, so every step below is one MPFR rounding).
    if (!p.alpha.empty() && p.alpha[t] != 1.0)
      for (int i = 0; i < dk * dv; ++i) mpfr_mul_d(S[i].x, S[i].x, p.alpha[t], R);
    mpfr_set_zero(kk.x, 1);
    for (int i = 0; i < dk; ++i) {
      mpfr_set_d(k[i].x, kt[i], R);
      mpfr_fma(kk.x, k[i].x, k[i].x, kk.x, R);
    }
    // e = v − S̃ᵀk
    for (int j = 0; j < dv; ++j) {
      mpfr_set_zero(acc.x, 1);
      for (int i = 0; i < dk; ++i) mpfr_fma(acc.x, S[i * dv + j].x, k[i].x, acc.x, R);
      mpfr_d_sub(e[j].x, vt[j], acc.x, R);
    }
    // β = η/(‖k‖²+ε), β = 0 when the denominator vanishes (SPEC §1 convention).
    mpfr_add_d(acc.x, kk.x, eps, R);
    if (mpfr_zero_p(acc.x))
      mpfr_set_zero(beta.x, 1);
    else
      mpfr_d_div(beta.x, p.eta[t], acc.x, R);
    for (int i = 0; i < dk; ++i) {
      mpfr_mul(bk.x, beta.x, k[i].x, R);
      for (int j = 0; j < dv; ++j) mpfr_fma(S[i * dv + j].x, bk.x, e[j].x, S[i * dv + j].x, R);
    }
    // o = S_tᵀ q
    for (int i = 0; i < dk; ++i) mpfr_set_d(k[i].x, qt[i], R);
    for (int j = 0; j < dv; ++j) {
      mpfr_set_zero(acc.x, 1);
      for (int i = 0; i < dk; ++i) mpfr_fma(acc.x, S[i * dv + j].x, k[i].x, acc.x, R);
      out.o[size_t(t) * dv + j] = mpfr_get_d(acc.x, R);
    }
  }
  out.state.resize(size_t(dk) * dv);
  for (int i = 0; i < dk * dv; ++i) out.state[i] = mpfr_get_d(S[i].x, R);
  return out;
}

namespace {

template <class T>
RunResult result_of(const ref::HeadOutputs<T>& r) {
  RunResult out;
  for (Eigen::Index t = 0; t < r.o.rows(); ++t)
    for (Eigen::Index j = 0; j < r.o.cols(); ++j) out.o.push_back(ref::to_double(r.o(t, j)));
  for (Eigen::Index i = 0; i < r.state.rows(); ++i)
    for (Eigen::Index j = 0; j < r.state.cols(); ++j)
      out.state.push_back(ref::to_double(r.state(i, j)));
  return out;
}

}  // namespace

RunResult reference_mpfr(const Problem& p, double eps, const Algo& a) {
  using T = ref::Mpfr;
  ref::Options<T> opt;
  opt.eps = T(eps);
  auto in = to_head<T>(p);
  if (a.normalized) {
    in = ref::normalize_keys(in, opt.eps);
    opt.coefficient = ref::Coefficient::given;
  }
  return result_of(a.chunked ? ref::chunk_forward(in, opt, a.chunk)
                             : ref::recurrent_forward(in, opt));
}

RunResult reference_rational(const Problem& p, double eps) {
  using T = ref::Rational;
  ref::Options<T> opt;
  opt.eps = T(eps);
  return result_of(ref::recurrent_forward(to_head<T>(p), opt));
}

double loss_ratio(const double* Sa, const double* Sb, const double* k, const double* v, int dk,
                  int dv, int& cmp, bool& a_zero) {
  Mp la, lb, acc, d;
  mpfr_set_zero(la.x, 1);
  mpfr_set_zero(lb.x, 1);
  auto km = mp_array(size_t(dk));
  for (int i = 0; i < dk; ++i) mpfr_set_d(km[i].x, k[i], R);
  for (int pass = 0; pass < 2; ++pass) {
    const double* S = pass == 0 ? Sa : Sb;
    mpfr_ptr L = pass == 0 ? la.x : lb.x;
    for (int j = 0; j < dv; ++j) {
      mpfr_set_d(acc.x, -v[j], R);
      for (int i = 0; i < dk; ++i) {
        mpfr_set_d(d.x, S[i * dv + j], R);
        mpfr_fma(acc.x, d.x, km[i].x, acc.x, R);
      }
      mpfr_fma(L, acc.x, acc.x, L, R);  // ½ is common to both sides and cancels
    }
  }
  cmp = mpfr_cmp(lb.x, la.x);
  a_zero = mpfr_zero_p(la.x);
  if (mpfr_zero_p(la.x)) return mpfr_zero_p(lb.x) ? 1.0 : std::numeric_limits<double>::infinity();
  mpfr_div(acc.x, lb.x, la.x, R);
  return mpfr_get_d(acc.x, R);
}

double interpolation_defect(const double* decayed, const double* state, const double* k,
                            const double* v, double eta, double eps, int dk, int dv,
                            double& eps_weight, bool exact_step) {
  using Q = ref::Rational;
  ref::Mat<Q> St(dk, dv), S(dk, dv);
  ref::Vec<Q> kq(dk), vq(dv);
  for (int i = 0; i < dk; ++i) kq(i) = Q(k[i]);
  for (int j = 0; j < dv; ++j) vq(j) = Q(v[j]);
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) {
      St(i, j) = Q(decayed[i * dv + j]);
      S(i, j) = Q(state[i * dv + j]);
    }
  const Q kk = kq.squaredNorm();
  const Q denom = kk + Q(eps);
  // Weight of v in the read-back: η‖k‖²/(‖k‖²+ε) (0 under the β = 0 convention).
  const Q w = denom == Q(0) ? Q(0) : Q(Q(eta) * kk / denom);
  eps_weight = denom == Q(0) ? 1.0 : ref::to_double(Q(Q(eps) / denom));
  const ref::Vec<Q> pred = St.transpose() * kq;
  const ref::Vec<Q> f = w * vq + (Q(1) - w) * pred;
  if (exact_step) {
    ref::Options<Q> opt;
    opt.eps = Q(eps);
    S = St;
    ref::token_step<Q>(S, ref::Vec<Q>::Constant(dk, Q(1)), kq, vq, Q(eta), opt);
  }
  const ref::Vec<Q> got = S.transpose() * kq;
  const Q num = (got - f).squaredNorm();
  const Q den = f.squaredNorm();
  if (num == Q(0)) return 0.0;
  if (den == Q(0)) return std::numeric_limits<double>::infinity();
  return std::sqrt(ref::to_double(Q(num / den)));
}

}  // namespace kla::report
