// CPU columns that model the chunkwise kernels' two arithmetic contracts on the tensor cores
// (kla_params.arithmetic, issue 26), for bf16 and fp16 storage: SPEC §1's chunk step (C = 64,
// the Kaczmarz coefficient from the raw keys, so algorithm chunk64/raw) in double, each operand
// of a tensor-core product rounded as the arithmetic rounds it, the outputs rounded to the
// storage dtype last. tools/state_precision_study.py is the same model in numpy (its design
// study); these columns put it beside the reference and the kernels on every input of the report.
//   <dt>-fast-model     FAST: the state S in K S and Q S and the update X of S <- g S + K^T X
//                       rounded once to the dtype (fp16: each value column first scaled by a power
//                       of two into fp16's range, as the transposed scan does); T, P T and R keep
//                       two parts (hi + lo). What the transposed scan runs under FAST.
//   <dt>-onepart-model  every operand one part in the dtype (no scaling): the arithmetic of
//                       flash-linear-attention (and FlashInfer, FlashQLA), the FAST contract's bar.
// Numerical contract: sums, scalars, the chunk system's inverse and the state between chunks are
// double (the state rounded to fp32 at each hand-off, where the kernels keep it), ~1e-16 against
// effects of 1e-4 and more; so a column's error is its operand roundings'.
#include <Eigen/Dense>
#include <cmath>
#include <memory>

#include "common.hpp"

namespace kla::report {

namespace {

using Mat = Eigen::MatrixXd;
using Vec = Eigen::VectorXd;

enum class Parts { one, two };

/// Each column of x scaled by the power of two that takes its largest magnitude into
/// [2^14, 2^15) before the rounding (the kernels' fp16_range_scale), undone after.
double column_scale(const Mat& x, Eigen::Index j) {
  const double m = x.col(j).cwiseAbs().maxCoeff();
  return m > 0 && std::isfinite(m) ? std::exp2(14 - std::floor(std::log2(m))) : 1.0;
}

/// A tensor-core operand: one part or hi + lo in the dtype, the columns scaled first when asked
/// (the value columns of S and X in the fp16 transposed scan).
Mat operand(const Mat& x, Storage s, Parts parts, bool scale_columns) {
  Mat out(x.rows(), x.cols());
  for (Eigen::Index j = 0; j < x.cols(); ++j) {
    const double f = scale_columns ? column_scale(x, j) : 1.0;
    for (Eigen::Index i = 0; i < x.rows(); ++i) {
      const double v = double(float(x(i, j) * f));
      const double hi = round_to(s, v);
      out(i, j) = (parts == Parts::one ? hi : hi + round_to(s, v - hi)) / f;
    }
  }
  return out;
}

/// One arithmetic: how S and X (the state products), and R, T, P T (the chunk's own products)
/// enter the tensor cores.
struct Arithmetic {
  Parts state, chunk;
  bool scale_columns;  // S and X scaled per value column before their rounding (fp16 FAST)
};

RunResult run_model(const Problem& p, double eps, Storage s, const Arithmetic& ar) {
  const int T = p.T, dk = p.dk, dv = p.dv, C = 64;
  const double e = double(float(eps));
  RunResult out;
  out.o.assign(size_t(T) * dv, 0.0);
  Mat S = Mat::Zero(dk, dv);
  const auto k = [&](int t, int i) { return p.k[size_t(t) * dk + i]; };
  for (int c0 = 0; c0 < T; c0 += C) {
    const int L = std::min(C, T - c0);
    Mat K(L, dk), Q(L, dk), V(L, dv);
    Vec beta(L), lg(L);
    double acc = 0;
    for (int i = 0; i < L; ++i) {
      const int t = c0 + i;
      double n2 = 0;
      for (int r = 0; r < dk; ++r) {
        K(i, r) = k(t, r);
        Q(i, r) = p.q[size_t(t) * dk + r];
        n2 += K(i, r) * K(i, r);
      }
      for (int r = 0; r < dv; ++r) V(i, r) = p.v[size_t(t) * dv + r];
      const double den = n2 + e;
      beta(i) = den > 0 ? p.eta[size_t(t)] / den : 0.0;  // β = 0 for k = 0 at ε = 0
      acc += p.alpha.empty() ? 0.0 : std::log(p.alpha[size_t(t)]);
      lg(i) = acc;
    }
    // The chunk system in the u-form: (I + L) R = V - D_γ K S, L_ij = β_j (γ_i/γ_j) k_i.k_j
    // (j < i), u_j = β_j R_j; outputs D_γ Q S + P R with P_ij = β_j (γ_i/γ_j) q_i.k_j (j <= i).
    const Mat KK = K * K.transpose(), QK = Q * K.transpose();
    Mat A = Mat::Identity(L, L), P = Mat::Zero(L, L);
    for (int i = 0; i < L; ++i)
      for (int j = 0; j <= i; ++j) {
        const double dec = std::exp(lg(i) - lg(j));
        if (j < i) A(i, j) = beta(j) * dec * KK(i, j);
        P(i, j) = beta(j) * dec * QK(i, j);
      }
    const Mat Tm = A.triangularView<Eigen::UnitLower>().solve(Mat::Identity(L, L));
    S = S.unaryExpr([](double x) { return double(float(x)); });  // the fp32 state
    const Mat Sop = operand(S, s, ar.state, ar.scale_columns);
    Vec gam(L);
    for (int i = 0; i < L; ++i) gam(i) = std::exp(lg(i));
    const Mat rhs = V - gam.asDiagonal() * (K * Sop);
    const Mat R = operand(Tm, s, ar.chunk, false) * operand(rhs, s, ar.chunk, false);
    const Mat O = gam.asDiagonal() * (Q * Sop) +
                  operand(P, s, ar.chunk, false) * operand(R, s, ar.chunk, false);
    Vec upd(L);
    for (int j = 0; j < L; ++j) upd(j) = beta(j) * std::exp(lg(L - 1) - lg(j));
    const Mat X = upd.asDiagonal() * R;
    S = std::exp(lg(L - 1)) * S + K.transpose() * operand(X, s, ar.state, ar.scale_columns);
    for (int i = 0; i < L; ++i)
      for (int r = 0; r < dv; ++r) out.o[size_t(c0 + i) * dv + r] = round_to(s, O(i, r));
  }
  out.state.assign(size_t(dk) * dv, 0.0);
  for (int i = 0; i < dk; ++i)
    for (int r = 0; r < dv; ++r) out.state[size_t(i) * dv + r] = S(i, r);
  return out;
}

class ArithmeticModel final : public Backend {
 public:
  ArithmeticModel(Storage s, bool fast) : s_(s), fast_(fast) {}
  std::string id() const override {
    return storage_name(s_) + (fast_ ? "-fast-model" : "-onepart-model");
  }
  Storage storage() const override { return s_; }
  DtypeSpec dtypes() const override {
    const std::string d = storage_name(s_);
    return {d,
            "fp32",
            "fp32 (modelled in double)",
            "fp32",
            "fp32",
            fast_ ? "model of arithmetic FAST (kla_params.arithmetic; the transposed scan): the "
                    "state and the update rounded once to " +
                        d + (s_ == Storage::fp16 ? " (each value column scaled into range)" : "") +
                        " in their products, T, P T and R as two parts; outputs rounded to " + d
                  : "model of one-part arithmetic (flash-linear-attention's, the FAST contract's "
                    "bar): every tensor-core operand rounded once to " +
                        d + "; outputs rounded to " + d};
  }
  double unit_roundoff() const override { return s_ == Storage::bf16 ? 0x1p-8 : 0x1p-11; }
  /// The kernels' chunk of 64 tokens with the raw keys' coefficient, only.
  bool supports(const Algo& a) const override {
    return a.chunked && a.chunk == 64 && !a.normalized;
  }
  RunResult run(const Problem& p, double eps, const Algo&) const override {
    const Arithmetic ar = fast_ ? Arithmetic{Parts::one, Parts::two, s_ == Storage::fp16}
                                : Arithmetic{Parts::one, Parts::one, false};
    return run_model(p, eps, s_, ar);
  }
  std::optional<std::vector<TokenRecord>> trace(const Problem&, double) const override {
    return std::nullopt;
  }
  bool has_trace() const override { return false; }
  double stored_eps(double eps) const override { return double(float(eps)); }

 private:
  Storage s_;
  bool fast_;
};

}  // namespace

std::vector<std::unique_ptr<Backend>> make_arithmetic_models() {
  std::vector<std::unique_ptr<Backend>> b;
  for (Storage s : {Storage::bf16, Storage::fp16})
    for (bool fast : {true, false}) b.push_back(std::make_unique<ArithmeticModel>(s, fast));
  return b;
}

}  // namespace kla::report
