// §1 of the report: where, how and from what it was computed, and the cross-check of its MPFR
// ground truth against the reference library.
#include <mpfr.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <Eigen/Core>

#include "kla/version.hpp"
#include "report/problems.hpp"
#include "report/sections/sections.hpp"

namespace kla::report {

namespace {

/// The trimmed standard output of a shell command ("" when it fails).
std::string run_cmd(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen((cmd + " 2>/dev/null").c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace

/// The fast MPFR truth against the reference library itself (Mpfr tokenwise and chunkwise,
/// normalised form, and exact rationals).
std::vector<CrossCheck> cross_check(const Config& cfg, const std::string& dir) {
  Draw d;
  d.T = cfg.quick ? 24 : 96;
  d.dk = d.dv = cfg.quick ? 4 : 8;
  d.knorm_lo = 1e-2;
  d.knorm_hi = 1e2;
  const Problem p = draw(d, mix_seed(cfg.seed, 1)).rounded(Storage::bf16);
  const double eps = double(1e-6f);
  const RunResult t = truth_forward(p, eps);
  std::vector<CrossCheck> cc;
  auto add = [&](const std::string& n, const RunResult& r) {
    cc.push_back({n, std::max(rel_rms(r.o, t.o).rel, rel_rms(r.state, t.state).rel)});
  };
  add("kla::ref::recurrent_forward<Mpfr>", reference_mpfr(p, eps, Algo{false, 64, false}));
  add("kla::ref::chunk_forward<Mpfr> (C=16)", reference_mpfr(p, eps, Algo{true, 16, false}));
  add("normalize_keys + chunk_forward<Mpfr> (C=16)", reference_mpfr(p, eps, Algo{true, 16, true}));
  Problem shortp = p;  // exact rationals: entries grow ~28 bits per token, keep it short
  shortp.T = 12;
  for (auto* v : {&shortp.q, &shortp.k}) v->resize(size_t(shortp.T) * shortp.dk);
  shortp.v.resize(size_t(shortp.T) * shortp.dv);
  shortp.eta.resize(size_t(shortp.T));
  shortp.alpha.resize(size_t(shortp.T));
  const RunResult ts = truth_forward(shortp, eps), rs = reference_rational(shortp, eps);
  cc.push_back({"kla::ref::recurrent_forward<Rational> (T=12, exact)",
                std::max(rel_rms(ts.o, rs.o).rel, rel_rms(ts.state, rs.state).rel)});
  Csv csv(dir + "/groundtruth_check.csv", {"check", "max_rel_diff"});
  for (const auto& c : cc) csv.row({c.name, num(c.diff)});
  return cc;
}

Section section_provenance(const Config& cfg, const Backends& bk, const CudaStatus& cuda,
                           const std::vector<CrossCheck>& cc, double seconds) {
  // KLA_REPORT_COMMIT: the commit recorded where the binary was built (tools/report_gpu.sh
  // stage), for machines that run a carried binary without the git checkout.
  const char* env_commit = std::getenv("KLA_REPORT_COMMIT");
  std::string commit;
  if (env_commit && *env_commit) {
    commit = env_commit;
  } else {
    commit = run_cmd("git -C '" KLA_SOURCE_DIR "' rev-parse HEAD");
    if (commit.empty())
      commit = "unknown (not a git checkout)";
    else if (!run_cmd("git -C '" KLA_SOURCE_DIR
                      "' status --porcelain --untracked-files=no -- . ':(exclude)docs/report'")
                  .empty())
      commit += " + uncommitted changes";
  }
  std::string nvcc = run_cmd("nvcc --version | tail -n 2 | head -n 1");
  if (nvcc.empty()) nvcc = run_cmd("/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1");
  const std::string smi = run_cmd("nvidia-smi -L");
  std::string toolkit, gpu;
  if (cuda.available) {
    toolkit = (nvcc.empty() ? std::string() : nvcc + "; ") + cuda.versions;
    gpu = cuda.device + " (the cuda-* columns)" + (cuda.note.empty() ? "" : "; " + cuda.note);
  } else {
    toolkit = nvcc.empty() ? "none found (CPU-only report)"
                           : nvcc + " (not used: " +
                                 (cuda.compiled ? cuda.why : "no CUDA backend in this build") + ")";
    gpu = "none (CPU reference columns only)";
    if (!smi.empty()) gpu += "; nvidia-smi lists " + smi + ", not used: " + cuda.why;
  }
  const std::string via = std::getenv("KLA_REPORT_VIA") ? std::getenv("KLA_REPORT_VIA") : "";
  std::ostringstream os;
  os << md_table(
      {"item", "value"},
      {{"kla version", KLA_VERSION_STRING},
       {"commit", "`" + commit + "`"},
       {"compiler", std::string(KLA_CXX_COMPILER) + " (" + __VERSION__ + "), " + KLA_BUILD_TYPE},
       {"CUDA toolkit", toolkit},
       {"GPU", gpu},
       {"CPU", cpu_model() + ", " + std::to_string(std::thread::hardware_concurrency()) +
                   " hardware threads, " + std::to_string(cfg.threads) + " used"},
       {"MPFR / Eigen", std::string("MPFR ") + mpfr_get_version() + ", Eigen " +
                            std::to_string(EIGEN_WORLD_VERSION) + "." +
                            std::to_string(EIGEN_MAJOR_VERSION) + "." +
                            std::to_string(EIGEN_MINOR_VERSION)},
       {"base seed", std::to_string(cfg.seed) + " (every input is a function of it and the cell; "
                                                "re-running reproduces the numbers)"},
       {"sweep", std::string(cfg.quick  ? "--quick"
                             : cfg.full ? "--full"
                                        : "default") +
                     ": dk = " + std::to_string(cfg.dk) + ", dv = " + std::to_string(cfg.dv) +
                     ", section 4 up to " + std::to_string(cfg.max_len) +
                     " tokens at dk = dv = " + std::to_string(cfg.long_dim)},
       {"command", "`" + cfg.command + "`" + (via.empty() ? "" : " (run by `" + via + "`)")},
       {"run time", fmt(seconds, 3) + " s"}});
  os << "\nColumns. Every column reads the same inputs as its ground truth: q, k, v, eta and alpha "
        "are drawn in fp64 and rounded once to the column's storage dtype (alpha and eta too, so "
        "that one "
        "truth serves all columns of a storage dtype; the kernels keep them in fp32). eps is a "
        "float "
        "parameter.\n\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& b : bk) {
    const DtypeSpec s = b->dtypes();
    rows.push_back({b->id(), s.storage, s.state, s.accumulation, s.coefficient, s.eps, s.note});
  }
  rows.push_back({"truth", "as the column", "MPFR " + std::to_string(truth_bits()) + " bits",
                  "MPFR", "MPFR", "exact float value",
                  "tokenwise raw form, direct MPFR loop (cross-checked below)"});
  os << md_table({"column", "storage (q,k,v,eta,alpha)", "state S", "accumulation",
                  "coefficient beta", "eps", "what"},
                 rows);
  os << "\nThe emulated columns round every operation (dot products included) to bf16/fp16, which "
        "no "
        "real kernel does: they bound the damage from above. The *-store columns keep the inputs "
        "in "
        "bf16/fp16 but compute in fp32, like a kernel with fp32 state and fp32 accumulation (real "
        "kernels additionally round the operands of their intra-chunk matrix products to "
        "bf16/fp16, so "
        "they sit between the two). \"Error\" is the relative RMS error of the outputs o_t = S_t^T "
        "q_t "
        "against the truth on the same rounded inputs; \"including input rounding\" compares with "
        "the "
        "truth on the unrounded fp64 inputs instead.\n\n";
  if (cuda.available)
    os << "The cuda-* columns are the kla::cuda kernels themselves, run on " << cuda.device
       << " through the C ABI on the very inputs of the other columns of their storage dtype "
          "(tools/report/cuda_backend.cpp). Head dimensions are zero-padded to a multiple of 16, "
          "the kernels' granularity (the FAST columns: dk to 64 or 128, dv to a multiple of 64, "
          "the transposed scan's): zero components add exact zeros, so the padded run computes "
          "the same values. In the tables, token kernel = tokenwise/raw and chunk kernel = "
          "chunk64/raw; the -fast columns (kla_params.arithmetic = FAST, on the transposed scan, "
          "modelled by the <dtype>-fast-model columns) run chunk64/raw only.\n\n";
  os << "Ground-truth cross-check: the direct MPFR loop used as truth against the reference "
        "library "
        "itself, on bf16-rounded inputs with key norms from 1e-2 to 1e2 (relative difference of "
        "outputs and "
        "final state after rounding both to fp64, so 0 means they agree to fp64 resolution, "
        "1e-16):\n\n";
  std::vector<std::vector<std::string>> crow;
  for (const auto& c : cc) crow.push_back({c.name, fmt(c.diff)});
  os << md_table({"truth vs", "max relative difference"}, crow) << "\n";
  Section sec;
  sec.title = "1. Provenance";
  double worst = 0;
  for (const auto& c : cc) worst = std::max(worst, c.diff);
  sec.finding = std::string("This report was computed on the CPU (") + cpu_model() + ")" +
                (cuda.available ? " and the GPU (" + cuda.device + ")" : std::string()) +
                " from commit " + commit + " with seed " + std::to_string(cfg.seed) +
                "; its MPFR ground truth agrees with the reference library's Mpfr and "
                "exact rational instantiations to " +
                (worst == 0 ? std::string("the last bit of fp64") : fmt(worst)) + ".";
  sec.body = os.str();
  return sec;
}

}  // namespace kla::report
