// tensor.hpp: forward() over the kernel layouts (SPEC §3). The expected values come from the
// independent oracle run on per-head inputs gathered here from the logical (row-major) copy of
// each tensor — the strided storage that forward() reads is written by this file's own offset
// arithmetic, so TensorView indexing is under test too.
#include <functional>

#include "kla/ref/tensor.hpp"
#include "test_support.hpp"

using namespace kla::test;
using kla::ref::Algorithm;
using kla::ref::forward;
using kla::ref::SequenceBatch;
using kla::ref::TensorView;
using I64 = std::int64_t;

namespace {

template <int N>
using Shape = std::array<I64, N>;

template <int N>
void for_each_index(const Shape<N>& shape, const std::function<void(const Shape<N>&)>& f) {
  I64 total = 1;
  for (I64 s : shape) total *= s;
  Shape<N> i{};
  for (I64 flat = 0; flat < total; ++flat) {
    I64 r = flat;
    for (int d = N - 1; d >= 0; --d) {
      i[size_t(d)] = r % shape[size_t(d)];
      r /= shape[size_t(d)];
    }
    f(i);
  }
}

/// A tensor with a logical row-major copy and a strided storage the views point into. Storage
/// layout: `order` lists the dimensions from outermost to innermost (the last must be N−1, the
/// contiguous one) and `pad` adds unused elements after each dimension; every unused element
/// holds `fill`.
template <class E, int N>
struct Tensor {
  Shape<N> shape{}, stride{};
  std::vector<E> logical, storage;
  E fill{};

  Tensor() = default;
  Tensor(Shape<N> s, E fill_value, Shape<N> pad = {}, std::array<int, N> order = identity())
      : shape(s), fill(fill_value) {
    I64 n = 1;
    for (I64 x : s) n *= x;
    logical.assign(size_t(n), fill_value);
    I64 st = 1;
    for (int p = N - 1; p >= 0; --p) {
      const auto d = size_t(order[size_t(p)]);
      stride[d] = st;
      st *= s[d] + pad[d];
    }
    storage.assign(size_t(std::max<I64>(st, 1)), fill_value);
  }
  static std::array<int, N> identity() {
    std::array<int, N> o{};
    for (int d = 0; d < N; ++d) o[size_t(d)] = d;
    return o;
  }
  I64 logical_offset(const Shape<N>& i) const {
    I64 off = 0;
    for (size_t d = 0; d < N; ++d) off = off * shape[d] + i[d];
    return off;
  }
  I64 storage_offset(const Shape<N>& i) const {
    I64 off = 0;
    for (size_t d = 0; d < N; ++d) off += i[d] * stride[d];
    return off;
  }
  template <class... Ix>
  E& at(Ix... ix) {
    return logical[size_t(logical_offset(Shape<N>{I64(ix)...}))];
  }
  template <class... Ix>
  const E& at(Ix... ix) const {
    return logical[size_t(logical_offset(Shape<N>{I64(ix)...}))];
  }
  /// logical -> storage
  void push() {
    for_each_index<N>(shape, [&](const Shape<N>& i) {
      storage[size_t(storage_offset(i))] = logical[size_t(logical_offset(i))];
    });
  }
  /// storage -> logical
  void pull() {
    for_each_index<N>(shape, [&](const Shape<N>& i) {
      logical[size_t(logical_offset(i))] = storage[size_t(storage_offset(i))];
    });
  }
  TensorView<const E, N> cview() const { return {storage.data(), shape, stride}; }
  TensorView<E, N> view() { return {storage.data(), shape, stride}; }
  /// Every storage element not addressed by a logical index still holds `fill`.
  bool padding_untouched() const {
    std::vector<char> used(storage.size(), 0);
    for_each_index<N>(shape, [&](const Shape<N>& i) { used[size_t(storage_offset(i))] = 1; });
    for (size_t j = 0; j < storage.size(); ++j)
      if (!used[j] && !(storage[j] == fill)) return false;
    return true;
  }
  bool all_equal_fill() const {
    for (const E& x : storage)
      if (!(x == fill)) return false;
    return true;
  }
};

struct Dims {
  I64 B = 2, T = 5, H = 2, HV = 4, K = 3, V = 2;
};

enum class Gate { none, decay, log_decay, decay_diag };

/// All inputs of one forward() call, logical values and strided storage.
template <class E>
struct Problem {
  Dims d;
  std::vector<std::int32_t> cu;  // empty: B sequences of length T
  Tensor<E, 4> q, k, v, decay_diag, initial_state;
  Tensor<E, 3> decay, log_decay, eta;
  Gate gate = Gate::decay;
  bool has_initial = true;

  I64 num_seqs() const { return cu.empty() ? d.B : I64(cu.size()) - 1; }

  SequenceBatch<E> batch() const {
    SequenceBatch<E> b;
    b.q = q.cview();
    b.k = k.cview();
    b.v = v.cview();
    b.eta = eta.cview();
    if (gate == Gate::decay) b.decay = decay.cview();
    if (gate == Gate::log_decay) b.log_decay = log_decay.cview();
    if (gate == Gate::decay_diag) b.decay_diag = decay_diag.cview();
    if (has_initial) b.initial_state = initial_state.cview();
    b.cu_seqlens = cu;
    return b;
  }
};

/// Fills a problem with values drawn by `draw(kind)`: kind 0 = q/k/v/state entry, 1 = η,
/// 2 = decay factor in (0, 1].
template <class E>
Problem<E> make_problem(const Dims& d, std::vector<std::int32_t> cu,
                        const std::function<E(int)>& draw, const Shape<4>& pad4 = {},
                        const Shape<3>& pad3 = {}, std::array<int, 4> order4 = {0, 1, 2, 3},
                        std::array<int, 3> order3 = {0, 1, 2}) {
  Problem<E> p;
  p.d = d;
  p.cu = std::move(cu);
  const E zero(0);
  p.q = Tensor<E, 4>({d.B, d.T, d.H, d.K}, zero, pad4, order4);
  p.k = Tensor<E, 4>({d.B, d.T, d.H, d.K}, zero, pad4, order4);
  p.v = Tensor<E, 4>({d.B, d.T, d.HV, d.V}, zero, pad4, order4);
  p.decay_diag = Tensor<E, 4>({d.B, d.T, d.HV, d.K}, zero, pad4, order4);
  p.decay = Tensor<E, 3>({d.B, d.T, d.HV}, zero, pad3, order3);
  p.log_decay = Tensor<E, 3>({d.B, d.T, d.HV}, zero, pad3, order3);
  p.eta = Tensor<E, 3>({d.B, d.T, d.HV}, zero, pad3, order3);
  p.initial_state = Tensor<E, 4>({p.num_seqs(), d.HV, d.K, d.V}, zero, pad4);
  for (auto* t : {&p.q, &p.k, &p.v, &p.initial_state})
    for (auto& x : t->logical) x = draw(0);
  for (auto& x : p.eta.logical) x = draw(1);
  for (auto& x : p.decay.logical) x = draw(2);
  for (auto& x : p.decay_diag.logical) x = draw(2);
  for (auto* t : {&p.q, &p.k, &p.v, &p.decay_diag, &p.initial_state}) t->push();
  for (auto* t : {&p.decay, &p.eta}) t->push();
  return p;
}

/// Sequence n as [batch row, first token, end token).
std::array<I64, 3> seq_range(const Dims& d, const std::vector<std::int32_t>& cu, I64 n) {
  if (cu.empty()) return {n, 0, d.T};
  return {0, cu[size_t(n)], cu[size_t(n) + 1]};
}

/// Gathers the per-head inputs of (sequence n, value head hv) from the logical copies, with
/// query/key head h = hv / (HV/H), and converts them to T.
template <class T, class E>
HeadInputs<T> gather(const Problem<E>& p, I64 n, I64 hv, Mat<T>& S0) {
  const auto [b, t0, t1] = seq_range(p.d, p.cu, n);
  const I64 h = hv / (p.d.HV / p.d.H), L = t1 - t0;
  HeadInputs<T> in;
  in.q.resize(L, p.d.K);
  in.k.resize(L, p.d.K);
  in.v.resize(L, p.d.V);
  in.eta.resize(L);
  if (p.gate == Gate::decay) in.alpha.resize(L, 1);
  if (p.gate == Gate::decay_diag) in.alpha.resize(L, p.d.K);
  for (I64 t = 0; t < L; ++t) {
    for (I64 c = 0; c < p.d.K; ++c) {
      in.q(t, c) = scalar_cast<T>(p.q.at(b, t0 + t, h, c));
      in.k(t, c) = scalar_cast<T>(p.k.at(b, t0 + t, h, c));
      if (p.gate == Gate::decay_diag)
        in.alpha(t, c) = scalar_cast<T>(p.decay_diag.at(b, t0 + t, hv, c));
    }
    for (I64 c = 0; c < p.d.V; ++c) in.v(t, c) = scalar_cast<T>(p.v.at(b, t0 + t, hv, c));
    in.eta(t) = scalar_cast<T>(p.eta.at(b, t0 + t, hv));
    if (p.gate == Gate::decay) in.alpha(t, 0) = scalar_cast<T>(p.decay.at(b, t0 + t, hv));
  }
  S0 = Mat<T>::Zero(p.d.K, p.d.V);
  if (p.has_initial)
    for (I64 i = 0; i < p.d.K; ++i)
      for (I64 j = 0; j < p.d.V; ++j) S0(i, j) = scalar_cast<T>(p.initial_state.at(n, hv, i, j));
  return in;
}

/// A random small rational: kind 0 in {−3..3}/{1,2}, η in (0,1], decay in (0,1].
std::function<Rational(int)> rational_draw(std::mt19937_64& rng) {
  return [&rng](int kind) {
    if (kind == 0) return random_rational(rng, -3, 3, 2);
    return random_alpha(rng);
  };
}
std::function<double(int)> double_draw(std::mt19937_64& rng) {
  return [&rng](int kind) {
    std::uniform_real_distribution<double> a(-1, 1), b(0.1, 0.9), c(0.6, 1.0);
    return kind == 0 ? a(rng) : kind == 1 ? b(rng) : c(rng);
  };
}

const Rational kSentinelR = R(-999983, 7);
constexpr double kSentinelD = -12345.678;

/// forward() in Rational against the oracle for every (sequence, value head), exactly.
void expect_exact_against_oracle(const Problem<Rational>& p, const Options<Rational>& opt,
                                 Algorithm alg) {
  Tensor<Rational, 4> o({p.d.B, p.d.T, p.d.HV, p.d.V}, kSentinelR);
  Tensor<Rational, 4> fs({p.num_seqs(), p.d.HV, p.d.K, p.d.V}, kSentinelR);
  forward<Rational>(p.batch(), opt, alg, o.view(), fs.view());
  o.pull();
  fs.pull();
  for (I64 n = 0; n < p.num_seqs(); ++n) {
    const auto [b, t0, t1] = seq_range(p.d, p.cu, n);
    for (I64 hv = 0; hv < p.d.HV; ++hv) {
      SCOPED_TRACE(::testing::Message() << "sequence " << n << " value head " << hv);
      Mat<Rational> S0;
      const auto in = gather<Rational>(p, n, hv, S0);
      const auto ref = oracle(in, opt, S0);
      for (I64 t = t0; t < t1; ++t)
        for (I64 c = 0; c < p.d.V; ++c) ASSERT_EQ(o.at(b, t, hv, c), ref.o(t - t0, c));
      for (I64 i = 0; i < p.d.K; ++i)
        for (I64 j = 0; j < p.d.V; ++j) ASSERT_EQ(fs.at(n, hv, i, j), ref.state(i, j));
    }
  }
  // Every o element belongs to exactly one sequence: nothing may be left at the sentinel.
  for (const auto& x : o.logical) ASSERT_NE(x, kSentinelR);
}

}  // namespace

TEST(TensorLayout, GroupedValueHeadsExact) {
  // HV = 2H: value heads 0,1 read query/key head 0 and 2,3 read head 1 (h = hv / 2, not hv % H).
  KLA_SEEDED_RNG(rng);
  Dims d;  // B=2, T=5, H=2, HV=4, K=3, V=2
  const auto p = make_problem<Rational>(d, {}, rational_draw(rng));
  Options<Rational> opt;
  opt.eps = R(1, 2);
  opt.scale = R(1, 3);
  expect_exact_against_oracle(p, opt, Algorithm{Algorithm::tokenwise, 64});
  expect_exact_against_oracle(p, opt, Algorithm{Algorithm::chunkwise, 2});
  opt.coefficient = Coefficient::given;
  expect_exact_against_oracle(p, opt, Algorithm{Algorithm::tokenwise, 64});
  // HV = 3H as well.
  Dims d3 = d;
  d3.HV = 6;
  d3.B = 1;
  const auto p3 = make_problem<Rational>(d3, {}, rational_draw(rng));
  expect_exact_against_oracle(p3, Options<Rational>{}, Algorithm{Algorithm::chunkwise, 3});
}

TEST(TensorLayout, DiagonalDecayExact) {
  KLA_SEEDED_RNG(rng);
  Dims d;
  d.B = 1;
  auto p = make_problem<Rational>(d, {}, rational_draw(rng));
  p.gate = Gate::decay_diag;
  Options<Rational> opt;
  opt.eps = R(1);
  expect_exact_against_oracle(p, opt, Algorithm{Algorithm::tokenwise, 64});
  expect_exact_against_oracle(p, opt, Algorithm{Algorithm::chunkwise, 2});
}

TEST(TensorLayout, AbsentDecayAndInitialState) {
  // No decay (α = 1) and no initial state (S0 = 0).
  KLA_SEEDED_RNG(rng);
  Dims d;
  auto p = make_problem<Rational>(d, {}, rational_draw(rng));
  p.gate = Gate::none;
  p.has_initial = false;
  expect_exact_against_oracle(p, Options<Rational>{}, Algorithm{Algorithm::tokenwise, 64});
  // Without final_state forward() still writes o (the optional output is really optional).
  Tensor<Rational, 4> o({d.B, d.T, d.HV, d.V}, kSentinelR);
  forward<Rational>(p.batch(), Options<Rational>{}, Algorithm{}, o.view());
  o.pull();
  for (const auto& x : o.logical) ASSERT_NE(x, kSentinelR);
}

TEST(TensorVarlen, PackedEqualsSeparateRuns) {
  // cu_seqlens = {0, 3, 3, 9, 10}: lengths 3, 0 (empty), 6, 1, each with its own initial state.
  KLA_SEEDED_RNG(rng);
  Dims d;
  d.B = 1;
  d.T = 10;
  const std::vector<std::int32_t> cu = {0, 3, 3, 9, 10};
  const auto p = make_problem<Rational>(d, cu, rational_draw(rng));
  Options<Rational> opt;
  opt.eps = R(1, 4);
  // (a) against the oracle, per sequence and head (state never leaks across sequences).
  expect_exact_against_oracle(p, opt, Algorithm{Algorithm::tokenwise, 64});
  expect_exact_against_oracle(p, opt, Algorithm{Algorithm::chunkwise, 4});
  // (b) against forward() on each sequence packed alone (B = 1, T = its length).
  Tensor<Rational, 4> o({1, d.T, d.HV, d.V}, kSentinelR);
  Tensor<Rational, 4> fs({4, d.HV, d.K, d.V}, kSentinelR);
  forward<Rational>(p.batch(), opt, Algorithm{}, o.view(), fs.view());
  o.pull();
  fs.pull();
  for (I64 n = 0; n < 4; ++n) {
    const I64 t0 = cu[size_t(n)], L = cu[size_t(n) + 1] - t0;
    Dims dn = d;
    dn.T = L;
    Problem<Rational> s = make_problem<Rational>(dn, {}, [](int) { return Rational(0); });
    s.initial_state = Tensor<Rational, 4>({1, d.HV, d.K, d.V}, Rational(0));
    for (I64 t = 0; t < L; ++t) {
      for (I64 h = 0; h < d.H; ++h)
        for (I64 c = 0; c < d.K; ++c) {
          s.q.at(0, t, h, c) = p.q.at(0, t0 + t, h, c);
          s.k.at(0, t, h, c) = p.k.at(0, t0 + t, h, c);
        }
      for (I64 hv = 0; hv < d.HV; ++hv) {
        for (I64 c = 0; c < d.V; ++c) s.v.at(0, t, hv, c) = p.v.at(0, t0 + t, hv, c);
        s.eta.at(0, t, hv) = p.eta.at(0, t0 + t, hv);
        s.decay.at(0, t, hv) = p.decay.at(0, t0 + t, hv);
      }
    }
    for (I64 hv = 0; hv < d.HV; ++hv)
      for (I64 i = 0; i < d.K; ++i)
        for (I64 j = 0; j < d.V; ++j)
          s.initial_state.at(0, hv, i, j) = p.initial_state.at(n, hv, i, j);
    for (auto* t : {&s.q, &s.k, &s.v, &s.initial_state}) t->push();
    for (auto* t : {&s.decay, &s.eta}) t->push();
    Tensor<Rational, 4> so({1, L, d.HV, d.V}, kSentinelR);
    Tensor<Rational, 4> sfs({1, d.HV, d.K, d.V}, kSentinelR);
    forward<Rational>(s.batch(), opt, Algorithm{}, so.view(), sfs.view());
    so.pull();
    sfs.pull();
    for (I64 t = 0; t < L; ++t)
      for (I64 hv = 0; hv < d.HV; ++hv)
        for (I64 c = 0; c < d.V; ++c) ASSERT_EQ(o.at(0, t0 + t, hv, c), so.at(0, t, hv, c));
    for (I64 hv = 0; hv < d.HV; ++hv)
      for (I64 i = 0; i < d.K; ++i)
        for (I64 j = 0; j < d.V; ++j) {
          ASSERT_EQ(fs.at(n, hv, i, j), sfs.at(0, hv, i, j)) << "sequence " << n;
          if (L == 0) {
            ASSERT_EQ(fs.at(n, hv, i, j), p.initial_state.at(n, hv, i, j));
          }
        }
  }
}

TEST(TensorStrides, NonContiguousEqualsContiguous) {
  // Same logical data stored (a) contiguously and (b) with padded outer dimensions in time-major
  // order [T, B, H, K] (gates [T, B, HV]); results must be bitwise identical and the padding of
  // o and final_state untouched.
  KLA_SEEDED_RNG(rng);
  Dims d;
  d.B = 3;
  d.T = 7;
  auto draw = double_draw(rng);
  auto a = make_problem<double>(d, {}, draw);
  auto b = make_problem<double>(d, {}, [](int) { return 0.0; }, {2, 1, 3, 0}, {1, 2, 3},
                                {1, 0, 2, 3}, {1, 0, 2});
  using P4 = std::pair<Tensor<double, 4>*, Tensor<double, 4>*>;
  using P3 = std::pair<Tensor<double, 3>*, Tensor<double, 3>*>;
  for (auto [src, dst] :
       {P4{&a.q, &b.q}, P4{&a.k, &b.k}, P4{&a.v, &b.v}, P4{&a.decay_diag, &b.decay_diag},
        P4{&a.initial_state, &b.initial_state}}) {
    dst->logical = src->logical;
    dst->push();
  }
  for (auto [src, dst] : {P3{&a.decay, &b.decay}, P3{&a.eta, &b.eta}}) {
    dst->logical = src->logical;
    dst->push();
  }
  ASSERT_NE(b.q.stride[0], b.q.stride[1] * d.T);  // really not contiguous
  Options<double> opt;
  opt.eps = 1e-2;
  opt.scale = 0.25;
  for (Gate gate : {Gate::decay, Gate::decay_diag}) {
    for (Algorithm alg :
         {Algorithm{Algorithm::tokenwise, 64}, Algorithm{Algorithm::chunkwise, 3}}) {
      a.gate = b.gate = gate;
      Tensor<double, 4> oa({d.B, d.T, d.HV, d.V}, kSentinelD);
      Tensor<double, 4> fa({d.B, d.HV, d.K, d.V}, kSentinelD);
      Tensor<double, 4> ob({d.B, d.T, d.HV, d.V}, kSentinelD, {1, 2, 1, 3}, {1, 0, 2, 3});
      Tensor<double, 4> fb({d.B, d.HV, d.K, d.V}, kSentinelD, {1, 0, 2, 1});
      forward<double>(a.batch(), opt, alg, oa.view(), fa.view());
      forward<double>(b.batch(), opt, alg, ob.view(), fb.view());
      oa.pull();
      fa.pull();
      ob.pull();
      fb.pull();
      EXPECT_EQ(oa.logical, ob.logical);
      EXPECT_EQ(fa.logical, fb.logical);
      EXPECT_TRUE(ob.padding_untouched());
      EXPECT_TRUE(fb.padding_untouched());
      // And the values are right: within the tokenwise/chunk bound of the exact oracle.
      for (I64 n = 0; n < d.B; ++n)
        for (I64 hv = 0; hv < d.HV; ++hv) {
          Mat<double> S0;
          const auto in = gather<double>(a, n, hv, S0);
          const auto ex = oracle(cast_inputs<Rational>(in), cast_options<Rational>(opt),
                                 cast_mat<Rational>(S0));
          const double sigma = ex.sigma(), u = ScalarTraits<double>::unit_roundoff();
          Mat<double> got(d.T, d.V);
          for (I64 t = 0; t < d.T; ++t)
            for (I64 c = 0; c < d.V; ++c) got(t, c) = oa.at(n, t, hv, c);
          const double bound = bounds::token_output(double(d.K), double(d.T), 1, u) +
                               bounds::chunk_total(double(d.K), 3, 0.9, double(d.T), 1, u);
          EXPECT_LE(max_row_error(got, ex.o, in.q) / (0.25 * sigma), bound);
        }
    }
  }
}

TEST(TensorGates, LogDecayMatchesDecayFactors) {
  // g = ln α in double vs α itself. exp(fl(ln α)) = α(1 + δ) with |δ| ≤ |ln α|·u + u_exp, and
  // |ln α| ≤ 0.52 for α ≥ 0.6, glibc exp errs < 1 ulp: |δ| ≤ 2u. A relative perturbation δ of α
  // changes the decayed state by ≤ δΣ per token, so each run is within the tokenwise bound of
  // its own exact result and the two exact results differ by ≤ 2u·Σ·L: total
  // 2·token_output + 2·(2u·L) (factor 2 as in test_support.hpp), L = min(T, 1/(1 − α_max)).
  KLA_SEEDED_RNG(rng);
  Dims d;
  d.T = 40;
  d.K = 8;
  d.V = 4;
  auto p = make_problem<double>(d, {}, double_draw(rng));
  for (I64 i = 0; i < I64(p.decay.logical.size()); ++i)
    p.log_decay.logical[size_t(i)] = std::log(p.decay.logical[size_t(i)]);
  p.log_decay.push();
  Options<double> opt;
  opt.eps = 1e-3;
  opt.scale = 1 / std::sqrt(8.0);
  Tensor<double, 4> o1({d.B, d.T, d.HV, d.V}, 0.0), o2({d.B, d.T, d.HV, d.V}, 0.0);
  Tensor<double, 4> f1({d.B, d.HV, d.K, d.V}, 0.0), f2({d.B, d.HV, d.K, d.V}, 0.0);
  p.gate = Gate::decay;
  forward<double>(p.batch(), opt, Algorithm{}, o1.view(), f1.view());
  p.gate = Gate::log_decay;
  forward<double>(p.batch(), opt, Algorithm{}, o2.view(), f2.view());
  o1.pull();
  o2.pull();
  f1.pull();
  f2.pull();
  const double u = ScalarTraits<double>::unit_roundoff();
  for (I64 n = 0; n < d.B; ++n)
    for (I64 hv = 0; hv < d.HV; ++hv) {
      p.gate = Gate::decay;
      Mat<double> S0;
      const auto in = gather<double>(p, n, hv, S0);
      const auto orc = oracle(in, opt, S0);
      const double sigma = orc.sigma(), amax = max_alpha(in);
      const double L = bounds::memory(double(d.T), amax);
      const double bound = 2 * bounds::token_output(double(d.K), double(d.T), amax, u) + 4 * u * L;
      Mat<double> a(d.T, d.V), b(d.T, d.V);
      for (I64 t = 0; t < d.T; ++t)
        for (I64 c = 0; c < d.V; ++c) {
          a(t, c) = o1.at(n, t, hv, c);
          b(t, c) = o2.at(n, t, hv, c);
        }
      EXPECT_LE(max_row_error(a, b, in.q) / (opt.scale * sigma), bound);
    }
  // (Taking g itself as the decay — negative — or ignoring it would miss this bound by O(1).)
  // log_decay = 0 everywhere is α = 1: identical to absent decay.
  for (auto& x : p.log_decay.logical) x = 0.0;
  p.log_decay.push();
  p.gate = Gate::log_decay;
  forward<double>(p.batch(), opt, Algorithm{}, o1.view(), f1.view());
  p.gate = Gate::none;
  forward<double>(p.batch(), opt, Algorithm{}, o2.view(), f2.view());
  EXPECT_EQ(o1.storage, o2.storage);
  EXPECT_EQ(f1.storage, f2.storage);
}

TEST(TensorTypes, Bf16StorageDoubleComputeFloatOutput) {
  // Storage bf16, compute double, output float: o equals the exact result on the bf16 inputs
  // within the double bound plus one float rounding of each output (≤ 2^-24 |o|).
  KLA_SEEDED_RNG(rng);
  Dims d;
  d.T = 12;
  auto draw_d = double_draw(rng);
  const auto p = make_problem<bf16>(d, {}, [&](int kind) { return bf16(float(draw_d(kind))); });
  Options<double> opt;
  opt.eps = 0.0625;
  Tensor<float, 4> o({d.B, d.T, d.HV, d.V}, 0.0f);
  forward<double>(p.batch(), opt, Algorithm{}, o.view());
  o.pull();
  const double u = ScalarTraits<double>::unit_roundoff(), uf = ScalarTraits<float>::unit_roundoff();
  for (I64 n = 0; n < d.B; ++n)
    for (I64 hv = 0; hv < d.HV; ++hv) {
      Mat<Rational> S0;
      const auto in = gather<Rational>(p, n, hv, S0);
      const auto ex = oracle(in, cast_options<Rational>(opt), S0);
      const double sigma = ex.sigma();
      const double bound = bounds::token_output(double(d.K), double(d.T), 1, u);
      for (I64 t = 0; t < d.T; ++t) {
        double qn = 0;
        for (I64 c = 0; c < d.K; ++c) qn += std::pow(to_double(in.q(t, c)), 2);
        for (I64 c = 0; c < d.V; ++c) {
          const double exact = to_double(ex.o(t, c));
          EXPECT_LE(std::abs(double(o.at(n, t, hv, c)) - exact),
                    1.01 * uf * std::abs(exact) + bound * sigma * std::sqrt(qn));
        }
      }
    }
}

// ---- bad input: throws std::invalid_argument, writes nothing -----------------------------------

namespace {

struct BadCase {
  const char* name;
  std::function<void(Problem<double>&, Dims&, Algorithm&)> mutate;
};

/// Builds a valid varlen-capable problem, applies `mutate`, runs forward with o and final_state
/// pre-filled with a sentinel, and demands std::invalid_argument with both left untouched.
void expect_rejected(const BadCase& bc, std::mt19937_64& rng) {
  SCOPED_TRACE(bc.name);
  Dims d;
  auto p = make_problem<double>(d, {}, double_draw(rng));
  Dims od = d;  // shape of o / final_state
  Algorithm alg{};
  bc.mutate(p, od, alg);
  Tensor<double, 4> o({od.B, od.T, od.HV, od.V}, kSentinelD);
  Tensor<double, 4> fs({p.num_seqs(), od.HV, od.K, od.V}, kSentinelD);
  EXPECT_THROW(forward<double>(p.batch(), Options<double>{}, alg, o.view(), fs.view()),
               std::invalid_argument);
  EXPECT_TRUE(o.all_equal_fill()) << "o was written";
  EXPECT_TRUE(fs.all_equal_fill()) << "final_state was written";
}

/// Re-shapes a tensor (new logical/storage, random-free zero contents).
template <class E, int N>
void reshape(Tensor<E, N>& t, Shape<N> s) {
  t = Tensor<E, N>(s, E(0));
}

void varlen(Problem<double>& p, Dims& od, std::vector<std::int32_t> cu) {
  p.d.B = 1;
  od.B = 1;
  reshape(p.q, {1, p.d.T, p.d.H, p.d.K});
  reshape(p.k, {1, p.d.T, p.d.H, p.d.K});
  reshape(p.v, {1, p.d.T, p.d.HV, p.d.V});
  reshape(p.eta, {1, p.d.T, p.d.HV});
  reshape(p.decay, {1, p.d.T, p.d.HV});
  p.cu = std::move(cu);
  p.has_initial = false;
}

}  // namespace

TEST(TensorBadInput, ThrowsAndWritesNothing) {
  KLA_SEEDED_RNG(rng);
  const std::vector<BadCase> cases = {
      {"cu_seqlens not monotonic",
       [](auto& p, auto& od, auto&) {
         varlen(p, od, {0, 4, 2, 5});
       }},
      {"cu_seqlens not ending at T",
       [](auto& p, auto& od, auto&) {
         varlen(p, od, {0, 2, 4});
       }},
      {"cu_seqlens ending past T",
       [](auto& p, auto& od, auto&) {
         varlen(p, od, {0, 2, 6});
       }},
      {"cu_seqlens not starting at 0",
       [](auto& p, auto& od, auto&) {
         varlen(p, od, {1, 5});
       }},
      {"cu_seqlens with one entry", [](auto& p, auto& od, auto&) { varlen(p, od, {5}); }},
      {"cu_seqlens with B = 2",
       [](auto& p, auto&, auto&) {
         p.cu = {0, 2, 5};
       }},
      {"HV % H != 0",
       [](auto& p, auto& od, auto&) {
         od.HV = 3;
         reshape(p.v, {p.d.B, p.d.T, 3, p.d.V});
         reshape(p.eta, {p.d.B, p.d.T, 3});
         reshape(p.decay, {p.d.B, p.d.T, 3});
       }},
      {"q and k shapes differ",
       [](auto& p, auto&, auto&) {
         reshape(p.q, {2, 5, 2, 4});
       }},
      {"v has other T",
       [](auto& p, auto&, auto&) {
         reshape(p.v, {2, 4, 4, 2});
       }},
      {"o shape differs from v", [](auto&, auto& od, auto&) { od.V = 3; }},
      {"eta shape",
       [](auto& p, auto&, auto&) {
         reshape(p.eta, {2, 5, 2});
       }},
      {"decay shape",
       [](auto& p, auto&, auto&) {
         reshape(p.decay, {2, 5, 3});
       }},
      {"decay_diag shape",
       [](auto& p, auto&, auto&) {
         p.gate = Gate::decay_diag;
         reshape(p.decay_diag, {2, 5, 4, 2});
       }},
      {"initial_state wrong N",
       [](auto& p, auto&, auto&) {
         reshape(p.initial_state, {3, 4, 3, 2});
       }},
      {"final_state wrong shape", [](auto&, auto& od, auto&) { od.K = 2; }},
      {"chunk length 0",
       [](auto&, auto&, auto& alg) {
         alg = Algorithm{Algorithm::chunkwise, 0};
       }},
      {"q empty shape",
       [](auto& p, auto&, auto&) {
         reshape(p.q, {0, 0, 0, 0});
       }},
  };
  for (const auto& bc : cases) expect_rejected(bc, rng);
  // Two gates at once and missing pointers, on a batch edited by hand.
  Dims d;
  auto p = make_problem<double>(d, {}, double_draw(rng));
  p.log_decay = p.decay;
  Tensor<double, 4> o({d.B, d.T, d.HV, d.V}, kSentinelD);
  auto batch = p.batch();
  batch.log_decay = p.log_decay.cview();
  EXPECT_THROW(forward<double>(batch, Options<double>{}, Algorithm{}, o.view()),
               std::invalid_argument);
  batch = p.batch();
  batch.decay_diag = p.decay_diag.cview();
  EXPECT_THROW(forward<double>(batch, Options<double>{}, Algorithm{}, o.view()),
               std::invalid_argument);
  batch = p.batch();
  batch.q.data = nullptr;
  EXPECT_THROW(forward<double>(batch, Options<double>{}, Algorithm{}, o.view()),
               std::invalid_argument);
  EXPECT_THROW(forward<double>(p.batch(), Options<double>{}, Algorithm{}, TensorView<double, 4>{}),
               std::invalid_argument);
  EXPECT_TRUE(o.all_equal_fill());
}

TEST(TensorBadInput, LogDecayOverRationalsThrowsWritesNothing) {
  KLA_SEEDED_RNG(rng);
  Dims d;
  auto p = make_problem<Rational>(d, {}, rational_draw(rng));
  p.gate = Gate::log_decay;
  Tensor<Rational, 4> o({d.B, d.T, d.HV, d.V}, kSentinelR);
  Tensor<Rational, 4> fs({d.B, d.HV, d.K, d.V}, kSentinelR);
  EXPECT_THROW(forward<Rational>(p.batch(), Options<Rational>{}, Algorithm{}, o.view(), fs.view()),
               std::invalid_argument);
  EXPECT_TRUE(o.all_equal_fill());
  EXPECT_TRUE(fs.all_equal_fill());
}

TEST(TensorBadInput, QL2NormOverRationalsThrowsWritesNothing) {
  KLA_SEEDED_RNG(rng);
  Dims d;
  const auto p = make_problem<Rational>(d, {}, rational_draw(rng));
  Options<Rational> opt;
  opt.readout = Readout::q_l2norm;
  Tensor<Rational, 4> o({d.B, d.T, d.HV, d.V}, kSentinelR);
  Tensor<Rational, 4> fs({d.B, d.HV, d.K, d.V}, kSentinelR);
  EXPECT_THROW(forward<Rational>(p.batch(), opt, Algorithm{}, o.view(), fs.view()),
               std::invalid_argument);
  EXPECT_TRUE(o.all_equal_fill());
  EXPECT_TRUE(fs.all_equal_fill());
}

TEST(TensorBadInput, LogDecayOverRationalsWithLeadingEmptySequence) {
  // Same bad input (log_decay with a compute type that has no exp), but the first packed sequence
  // is empty: forward() must still throw before writing anything (SPEC §3: nothing is written).
  KLA_SEEDED_RNG(rng);
  Dims d;
  d.B = 1;
  auto p = make_problem<Rational>(d, {0, 0, 5}, rational_draw(rng));
  p.gate = Gate::log_decay;
  Tensor<Rational, 4> o({1, d.T, d.HV, d.V}, kSentinelR);
  Tensor<Rational, 4> fs({2, d.HV, d.K, d.V}, kSentinelR);
  EXPECT_THROW(forward<Rational>(p.batch(), Options<Rational>{}, Algorithm{}, o.view(), fs.view()),
               std::invalid_argument);
  EXPECT_TRUE(o.all_equal_fill());
  EXPECT_TRUE(fs.all_equal_fill()) << "final_state of the empty sequence 0 was written";
  // The same with q_l2norm read-out over Rational.
  p.gate = Gate::decay;
  Options<Rational> opt;
  opt.readout = Readout::q_l2norm;
  Tensor<Rational, 4> fs2({2, d.HV, d.K, d.V}, kSentinelR);
  EXPECT_THROW(forward<Rational>(p.batch(), opt, Algorithm{}, o.view(), fs2.view()),
               std::invalid_argument);
  EXPECT_TRUE(o.all_equal_fill());
  EXPECT_TRUE(fs2.all_equal_fill()) << "final_state of the empty sequence 0 was written (q_l2norm)";
}
