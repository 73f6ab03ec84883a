// CPU columns of the report: the header-only reference instantiated in float and in emulated
// bf16/fp16 (every operation rounded), and the "storage" variants that keep bf16/fp16 inputs
// but compute in float, which is closer to what a real kernel does (fp32 state and
// accumulation, β in fp32).
#include <cmath>
#include <exception>

#include "common.hpp"
#include "head.hpp"
#include "kla/ref.hpp"

namespace kla::report {

namespace ref = kla::ref;

namespace {

template <class T>
std::vector<double> flat(const ref::Mat<T>& m) {
  std::vector<double> out;
  out.reserve(size_t(m.size()));
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) out.push_back(ref::to_double(m(i, j)));
  return out;
}

/// ε is a float in the kernels' ABI; the compute type T then rounds it once more (to 0 or a
/// subnormal in fp16 for small ε, see report §2).
template <class T>
T eps_in(double eps) {
  return ref::scalar_cast<T>(float(eps));
}

template <class T>
RunResult run_ref(const Problem& p, double eps, const Algo& a) {
  RunResult out;
  try {
    ref::Options<T> opt;
    opt.eps = eps_in<T>(eps);
    ref::HeadInputs<T> in = to_head<T>(p);
    if (a.normalized) {
      // Normalised-key form: k̂ = k/r, v̂ = v/r with r = sqrt(‖k‖²+ε), then GDN with β = η.
      in = ref::normalize_keys(in, opt.eps);
      opt.coefficient = ref::Coefficient::given;
    }
    const auto r =
        a.chunked ? ref::chunk_forward(in, opt, a.chunk) : ref::recurrent_forward(in, opt);
    out.o = flat(r.o);
    out.state = flat(r.state);
  } catch (const std::exception& e) {
    // E.g. a NaN key norm rejected by normalize_keys: the run produced no usable output.
    out.error = e.what();
    out.o.assign(size_t(p.T) * p.dv, std::nan(""));
    out.state.assign(size_t(p.dk) * p.dv, std::nan(""));
  }
  return out;
}

template <class T>
std::vector<TokenRecord> trace_ref(const Problem& p, double eps) {
  ref::Options<T> opt;
  opt.eps = eps_in<T>(eps);
  const ref::HeadInputs<T> in = to_head<T>(p);
  ref::Mat<T> S = ref::Mat<T>::Zero(p.dk, p.dv);
  std::vector<TokenRecord> recs;
  recs.reserve(size_t(p.T));
  for (int t = 0; t < p.T; ++t) {
    const auto tr = ref::token_step<T>(S, in.decay(t), in.k.row(t).transpose(),
                                       in.v.row(t).transpose(), in.eta(t), opt);
    recs.push_back({flat(tr.decayed), flat(S)});
  }
  return recs;
}

/// The reference in compute type T on inputs stored in `storage`.
template <class T>
class RefBackend final : public Backend {
 public:
  RefBackend(std::string id, Storage storage, DtypeSpec spec)
      : id_(std::move(id)), storage_(storage), spec_(std::move(spec)) {}
  std::string id() const override { return id_; }
  Storage storage() const override { return storage_; }
  DtypeSpec dtypes() const override { return spec_; }
  double unit_roundoff() const override { return ref::ScalarTraits<T>::unit_roundoff(); }
  RunResult run(const Problem& p, double eps, const Algo& a) const override {
    return run_ref<T>(p, eps, a);
  }
  std::optional<std::vector<TokenRecord>> trace(const Problem& p, double eps) const override {
    return trace_ref<T>(p, eps);
  }
  double stored_eps(double eps) const override { return ref::to_double(eps_in<T>(eps)); }

 private:
  std::string id_;
  Storage storage_;
  DtypeSpec spec_;
};

}  // namespace

std::vector<std::unique_ptr<Backend>> make_cpu_backends() {
  std::vector<std::unique_ptr<Backend>> b;
  const std::string ref_note = "kla::ref reference, CPU";
  b.push_back(std::make_unique<RefBackend<float>>(
      "fp32", Storage::fp32,
      DtypeSpec{"fp32", "fp32", "fp32", "fp32", "fp32", ref_note + "; fp32 inputs"}));
  b.push_back(std::make_unique<RefBackend<ref::bf16>>(
      "bf16-emul", Storage::bf16,
      DtypeSpec{"bf16", "bf16", "bf16 (every op rounded)", "bf16", "bf16",
                ref_note + "; all arithmetic emulated in bf16 (harsher than any real kernel)"}));
  b.push_back(std::make_unique<RefBackend<float>>(
      "bf16-store", Storage::bf16,
      DtypeSpec{"bf16", "fp32", "fp32", "fp32", "fp32",
                ref_note + "; bf16 inputs, fp32 compute (what a kernel with fp32 state does, "
                           "minus bf16 rounding of intra-chunk matmul operands)"}));
  b.push_back(std::make_unique<RefBackend<ref::fp16>>(
      "fp16-emul", Storage::fp16,
      DtypeSpec{"fp16", "fp16", "fp16 (every op rounded)", "fp16", "fp16",
                ref_note + "; all arithmetic emulated in fp16 (harsher than any real kernel)"}));
  b.push_back(std::make_unique<RefBackend<float>>(
      "fp16-store", Storage::fp16,
      DtypeSpec{"fp16", "fp32", "fp32", "fp32", "fp32", ref_note + "; fp16 inputs, fp32 compute"}));
  return b;
}

std::vector<std::unique_ptr<Backend>> make_backends(CudaStatus& st, int max_head_dim) {
  std::vector<std::unique_ptr<Backend>> b = make_cpu_backends();
  for (auto& c : make_arithmetic_models()) b.push_back(std::move(c));
  for (auto& c : make_cuda_backends(st, max_head_dim)) b.push_back(std::move(c));
  return b;
}

}  // namespace kla::report
