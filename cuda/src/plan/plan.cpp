// plan_chunk / plan_tokenwise: the order of preference among the paths, the tiling heuristics and
// the reason string. Requested paths (kla_params.path, value_slice) bypass the heuristics but not
// the predicates: a request that cannot run is refused with the predicate's reason.
#include "plan/plan.hpp"

#include <algorithm>
#include <cstring>

#include "api/errors.hpp"
#include "cp/segments.hpp"
#include "layout/tf32_layout.hpp"
#include "layout/tokenwise_layout.hpp"
#include "layout/wy_layout.hpp"
#include "plan/paths.hpp"

namespace kla::plan {
namespace {

using layout::Elem;

using detail::cat;

const char* elem_name(Elem e) {
  return e == Elem::F32 ? "fp32" : e == Elem::BF16 ? "bf16" : "fp16";
}

/// "a; b; " -> "a; b": the list of declined paths without its trailing separator.
std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == ';')) s.pop_back();
  return s;
}

kla_status refuse(kla_path path, const std::string& why) {
  return detail::fail(KLA_ERROR_UNSUPPORTED_PATH,
                      cat("path ", kla_path_name(path), " cannot run this call: ", why));
}

int64_t records_bytes(const Problem& pb) {
  return layout::ws_records_bytes(pb.N, pb.T, pb.packed, pb.HV, pb.K, pb.V);
}

// ---- WY -----------------------------------------------------------------------------------------

/// The WY scan's slice width where none is requested: 32 columns halve the per-column traffic of
/// the scan (every slice reads the chunk's record and K / Q tiles) and are taken while they still
/// give at least one block for every two multiprocessors; 8 columns where 16 would leave more
/// than half the multiprocessors idle (few sequences and heads), K >= 96 only; else 16, or, where
/// 16 do not fit, any width that does. 0 (with the reason in `why`) when none fits.
int wy_auto_slice(const Problem& pb, const DeviceInfo& dev, std::string& why) {
  const bool fits32 = wy_slice_can_implement(pb, dev, 32).empty();
  const int64_t b32 = pb.V % 32 == 0 ? pb.N * pb.HV * (pb.V / 32) : 0,
                b16 = pb.N * pb.HV * (pb.V / 16);
  if (fits32 && b32 >= dev.sms / 2) {
    why = cat(b32, " blocks of 32 columns still give one block for every two of the ", dev.sms,
              " multiprocessors");
    return 32;
  }
  if (wy_slice_can_implement(pb, dev, 8).empty() && b16 <= dev.sms / 2) {
    why = cat(b16, " blocks of 16 columns would leave more than half of the ", dev.sms,
              " multiprocessors idle");
    return 8;
  }
  if (wy_slice_can_implement(pb, dev, 16).empty()) {
    why = cat(b16, " blocks of 16 columns (",
              fits32 ? cat(b32, " of 32 would be too few") : std::string("32 columns do not fit"),
              ")");
    return 16;
  }
  // 16 columns do not fit (a described device with less shared memory): any slice that does.
  for (int vs : {8, 32})
    if (wy_slice_can_implement(pb, dev, vs).empty()) {
      why = cat(vs, " columns, the only slice that fits");
      return vs;
    }
  why = wy_slice_can_implement(pb, dev, 16);
  return 0;
}

/// Whether the transposed scan pays where none is requested: its chunk step costs less a value
/// column than a 32-column step but more a block, so it is taken only where its 64-column blocks
/// still fill the multiprocessors (at least 7/8 of them; docs/prefill_notes.md, 'Design
/// decisions').
bool wy_transposed_pays(const Problem& pb, const DeviceInfo& dev, std::string& why) {
  const int64_t b64 = pb.N * pb.HV * (pb.V / 64);
  const bool pays = b64 >= dev.sms - dev.sms / 8;
  why = cat(b64, " blocks of 64 columns ", pays ? "fill" : "would leave idle", " the ", dev.sms,
            " multiprocessors (the transposed scan pays from ", dev.sms - dev.sms / 8, ")");
  return pays;
}

void fill_wy(const Problem& pb, int VS, Plan& out) {
  const int K = int(pb.K);
  out.path = KLA_PATH_WY;
  out.chunk = layout::kChunk;
  out.value_slice = VS;
  out.stages = layout::wy_scan_stages(pb.elem, K, VS);
  out.threads = layout::wy_scan_threads(pb.elem);
  out.blocks = pb.N * pb.HV * (pb.V / VS);
  out.prep_blocks = pb.max_chunks * pb.HV * pb.N;
  out.smem_bytes = layout::wy_scan_smem_bytes(pb.elem, K, VS);
  out.prep_smem_bytes = layout::wy_prep_layout(pb.elem, K).bytes;
  out.prep_images = layout::wy_kq_images(pb.elem);
  const int64_t image = layout::wy_image_bytes(K, out.prep_images);
  out.workspace_bytes =
      records_bytes(pb) + layout::chunk_slots(pb.N, pb.T, pb.packed) * 2 * pb.H * image;
  // fp32 runs here only under FAST (wy_can_implement); the bf16 / fp16 scan has one arithmetic.
  out.arithmetic = pb.elem == Elem::F32 ? KLA_ARITHMETIC_FAST : KLA_ARITHMETIC_ACCURATE;
}

void fill_wy_transposed(const Problem& pb, Plan& out) {
  const int K = int(pb.K);
  out.path = KLA_PATH_WY_TRANSPOSED;
  out.chunk = layout::kChunk;
  out.value_slice = layout::kWyTColumns;
  out.stages = 2;
  out.threads = layout::kWyTThreads;
  out.blocks = pb.N * pb.HV * (pb.V / layout::kWyTColumns);
  out.prep_blocks = pb.max_chunks * pb.HV * pb.N;
  out.smem_bytes = layout::wy_t_smem_bytes(K);
  out.prep_smem_bytes = layout::wy_prep_layout(pb.elem, K).bytes;
  out.prep_images = false;  // the transposed scan reads K and Q by tensor copies
  out.workspace_bytes = records_bytes(pb);
  out.arithmetic = pb.fast ? KLA_ARITHMETIC_FAST : KLA_ARITHMETIC_ACCURATE;
}

// ---- TF32 ---------------------------------------------------------------------------------------

/// Slice width and copy stages where none is requested: estimated time ~ waves * (1 + VS / 16)
/// (per-chunk work grows with VS, partly fixed), waves from the blocks that fit a multiprocessor;
/// ties go to the narrower slice, then to the deeper pipeline. requested_vs pins the width.
bool tf32_tiling(const Problem& pb, const DeviceInfo& dev, int requested_vs, int& VS, int& stages) {
  VS = 0, stages = 0;
  double best = 0.0;
  const int es = layout::elem_bytes(pb.elem);
  for (int cand : {8, 16, 32}) {
    if (requested_vs && cand != requested_vs) continue;
    for (int st : {2, 1}) {
      if (!tf32_slice_can_implement(pb, dev, cand, st).empty()) continue;
      const int64_t b = layout::tf32_scan_smem_bytes(int(pb.K), cand, es, st);
      const int64_t cap = (dev.max_smem + 1024) / (b + 1024) * dev.sms;
      const int64_t blocks = pb.N * pb.HV * (pb.V / cand);
      const double cost = double((blocks + cap - 1) / cap) * (1.0 + cand / 16.0);
      if (VS == 0 || cost < best) VS = cand, stages = st, best = cost;
    }
  }
  return VS != 0;
}

void fill_tf32(const Problem& pb, int VS, int stages, Plan& out) {
  const int K = int(pb.K), es = layout::elem_bytes(pb.elem);
  out.path = KLA_PATH_TF32;
  out.chunk = layout::kChunk;
  out.value_slice = VS;
  out.stages = stages;
  out.threads = layout::kTf32ScanThreads;
  out.blocks = pb.N * pb.HV * (pb.V / VS);
  out.prep_blocks = pb.max_chunks * pb.HV * pb.N;
  out.smem_bytes = layout::tf32_scan_smem_bytes(K, VS, es, stages);
  out.prep_smem_bytes = layout::tf32_prep_smem_bytes(K, es);
  out.workspace_bytes = records_bytes(pb);
}

// ---- generic ------------------------------------------------------------------------------------

/// Slices narrow enough to give every multiprocessor about two blocks (32 columns only where they
/// fit), and 64-token chunks where K <= 64 and they fit (32 otherwise). requested_vs pins the
/// width.
layout::GenericTiling generic_tiling(const Problem& pb, const DeviceInfo& dev, int requested_vs) {
  layout::GenericTiling t{32, 16};
  if (requested_vs)
    t.VS = requested_vs;
  else if (pb.V % 32 == 0 && pb.N * pb.HV * (pb.V / 32) >= 2LL * dev.sms &&
           layout::generic_smem_floats(int(pb.K), {32, 32}) * 4 <= dev.max_smem)
    t.VS = 32;
  if (pb.K <= 64 && layout::generic_smem_floats(int(pb.K), {64, t.VS}) * 4 <= dev.max_smem)
    t.C = 64;
  return t;
}

void fill_generic(const Problem& pb, layout::GenericTiling t, Plan& out) {
  out.path = KLA_PATH_GENERIC;
  out.chunk = t.C;
  out.value_slice = t.VS;
  out.stages = 1;
  out.threads = layout::kGenericThreads;
  out.blocks = pb.N * pb.HV * (pb.V / t.VS);
  out.prep_blocks = 0;
  out.smem_bytes = layout::generic_smem_floats(int(pb.K), t) * 4;
  out.prep_smem_bytes = 0;
  out.workspace_bytes = 0;
}

std::string shape_summary(const Problem& pb) {
  return cat(elem_name(pb.elem), pb.fast ? " (FAST)" : "", ", K = ", pb.K, ", V = ", pb.V, ", ",
             pb.N, " sequences x ", pb.HV, " value heads");
}

}  // namespace

BuildInfo this_build() {
#ifdef KLA_HAVE_SM90A
  return {true};
#else
  return {false};
#endif
}

Problem describe(const kla_params& p) {
  Problem pb;
  pb.p = &p;
  pb.elem = static_cast<Elem>(p.dtype);
  pb.packed = p.cu_seqlens != nullptr;
  pb.N = pb.packed ? p.num_seqs : p.batch;
  pb.T = p.seq_len, pb.H = p.num_heads, pb.HV = p.num_v_heads;
  pb.K = p.head_dim_k, pb.V = p.head_dim_v;
  int64_t longest = p.seq_len;
  if (pb.packed) {
    longest = 0;
    for (int64_t n = 0; n < p.num_seqs; ++n)
      longest = std::max<int64_t>(longest, p.cu_seqlens_host[n + 1] - p.cu_seqlens_host[n]);
  }
  pb.max_chunks = (longest + layout::kChunk - 1) / layout::kChunk;
  pb.workspace = p.workspace != nullptr;
  pb.fast = p.arithmetic == KLA_ARITHMETIC_FAST;
  return pb;
}

namespace {

kla_status decide_chunk(const Problem& pb, const DeviceInfo& dev, const BuildInfo& build,
                        Plan& out) {
  const kla_params& p = *pb.p;
  const kla_path want = p.path;
  const int vs = p.value_slice;
  out = Plan{};
  out.num_seqs = pb.N, out.max_chunks = pb.max_chunks;  // for translate: described once a call
  if (want == KLA_PATH_TOKENWISE)
    return refuse(want, "it is kla_tokenwise_forward's path, not kla_chunk_forward's");

  // The WY paths.
  const std::string wy = wy_can_implement(pb, dev, build);
  if (want == KLA_PATH_WY || want == KLA_PATH_WY_TRANSPOSED) {
    if (!wy.empty()) return refuse(want, wy);
    if (want == KLA_PATH_WY_TRANSPOSED) {
      if (vs != 0 && vs != layout::kWyTColumns)
        return refuse(want, cat("value_slice = ", vs, " (the transposed scan takes 64 columns)"));
      if (auto s = wy_transposed_can_implement(pb, dev); !s.empty()) return refuse(want, s);
      fill_wy_transposed(pb, out);
      out.reason = cat("wy_transposed as requested (", shape_summary(pb), ")");
      return KLA_SUCCESS;
    }
    std::string why;
    const int VS = vs ? vs : wy_auto_slice(pb, dev, why);
    if (VS == 0) return refuse(want, why);
    if (auto s = wy_slice_can_implement(pb, dev, VS); !s.empty()) return refuse(want, s);
    fill_wy(pb, VS, out);
    out.reason =
        vs ? cat("wy, ", VS, "-column slices as requested (", shape_summary(pb), ")")
           : cat("wy as requested, ", VS, "-column slices (", why, "; ", shape_summary(pb), ")");
    return KLA_SUCCESS;
  }
  std::string declined;  // AUTO: why each preferred path declined
  if (want == KLA_PATH_AUTO) {
    if (wy.empty()) {
      std::string why_t;
      const std::string t = wy_transposed_can_implement(pb, dev);
      if (t.empty() && wy_transposed_pays(pb, dev, why_t)) {
        fill_wy_transposed(pb, out);
        out.reason = cat("wy_transposed: ", shape_summary(pb), "; ", why_t);
        return KLA_SUCCESS;
      }
      std::string why;
      const int VS = wy_auto_slice(pb, dev, why);
      if (VS != 0) {
        fill_wy(pb, VS, out);
        out.reason = cat("wy, ", VS, "-column slices: ", shape_summary(pb), "; ", why,
                         "; not wy_transposed: ", t.empty() ? why_t : t);
        return KLA_SUCCESS;
      }
      if (t.empty()) {  // no [token][column] slice fits, the transposed scan does
        fill_wy_transposed(pb, out);
        out.reason = cat("wy_transposed: ", shape_summary(pb), "; not wy: ", why);
        return KLA_SUCCESS;
      }
      declined += cat("not wy: ", why, "; not wy_transposed: ", t, "; ");
    } else {
      declined += cat("not wy: ", wy, "; ");
    }
  }

  // The TF32 path.
  const std::string tf = tf32_can_implement(pb, dev);
  if (want == KLA_PATH_TF32 || (want == KLA_PATH_AUTO && tf.empty())) {
    if (!tf.empty()) return refuse(want, tf);
    int VS = 0, stages = 0;
    if (tf32_tiling(pb, dev, vs, VS, stages)) {
      fill_tf32(pb, VS, stages, out);
      out.reason = cat(
          "tf32, ", VS, "-column slices, ", stages, " copy stage", stages > 1 ? "s" : "",
          want == KLA_PATH_AUTO ? ": " : " as requested: ", shape_summary(pb),
          want == KLA_PATH_AUTO && !declined.empty() ? "; " + trimmed(declined) : std::string());
      return KLA_SUCCESS;
    }
    // The narrowest single-stage scan is the cheapest: its clause says why none runs.
    const std::string s = tf32_slice_can_implement(pb, dev, vs ? vs : 8, 1);
    if (want == KLA_PATH_TF32) return refuse(want, s);
    declined += cat("not tf32: ", s, "; ");
  } else if (want == KLA_PATH_AUTO) {
    declined += cat("not tf32: ", tf, "; ");
  }

  // The generic kernel: any device, no workspace.
  const layout::GenericTiling t = generic_tiling(pb, dev, want == KLA_PATH_GENERIC ? vs : 0);
  if (auto s = generic_can_implement(pb, dev, t); !s.empty())
    return want == KLA_PATH_GENERIC
               ? refuse(want, s)
               : detail::fail(KLA_ERROR_UNSUPPORTED_PATH,
                              cat("no path can run this call: ", declined, "not generic: ", s));
  fill_generic(pb, t, out);
  out.reason =
      cat("generic, ", t.C, "-token chunks, ", t.VS, "-column slices",
          want == KLA_PATH_AUTO ? ": " : " as requested: ", shape_summary(pb),
          want == KLA_PATH_AUTO && !declined.empty() ? "; " + trimmed(declined) : std::string());
  return KLA_SUCCESS;
}

/// One pass over the call as it is (no split).
kla_status plan_one_pass(const kla_params& p, const DeviceInfo& dev, const BuildInfo& build,
                         Plan& out) {
  const Problem pb = describe(p);
  const kla_status s = decide_chunk(pb, dev, build, out);
  // FAST is a bound on the error, which ACCURATE meets: a path without a FAST arithmetic for the
  // dtype runs its ACCURATE one, and the plan says so first (the reason may be truncated).
  if (s == KLA_SUCCESS && pb.fast && out.arithmetic != KLA_ARITHMETIC_FAST)
    out.reason = cat("arithmetic ACCURATE: the ", kla_path_name(out.path),
                     " path has no FAST arithmetic for ", elem_name(pb.elem), " (",
                     pb.elem == Elem::F32 ? "wy" : "wy_transposed",
                     " has), and ACCURATE meets the FAST contract; ", out.reason);
  return s;
}

/// The sequence split (cp/segments.hpp) over a planned one-pass call: requested (segments >= 2,
/// the passes on the requested path and tiling, refused where either cannot run) or the plan's
/// (segments 0, path AUTO, a two-pass path: where few sequences and value heads leave the
/// multiprocessors idle; one pass where a pass cannot be planned).
kla_status plan_split(const kla_params& p, const DeviceInfo& dev, const BuildInfo& build,
                      Plan& out) {
  std::string why = "as requested";
  int n = 1;
  const bool requested = p.segments >= 2;
  if (requested) {
    if (auto s = cp::split_can_implement(p); !s.empty())
      return detail::fail(KLA_ERROR_UNSUPPORTED_PATH,
                          cat("segments = ", p.segments, " cannot run this call: ", s));
    n = p.segments;
  } else if (p.segments == 0 && p.path == KLA_PATH_AUTO && out.path != KLA_PATH_GENERIC &&
             cp::split_possible(p)) {
    n = cp::auto_segments(p, dev.sms, why);
    if (n <= 1) out.reason += cat("; one pass (", why, ")");
  }
  if (n <= 1) return KLA_SUCCESS;
  const cp::SplitLayout L = cp::split_layout(p, n);
  const std::vector<int32_t> cuts = cp::segment_cuts(p, n);
  Plan maps, second;
  kla_status s = plan_one_pass(cp::pass_params(p, L, true, cuts), dev, build, maps);
  if (s == KLA_SUCCESS) s = plan_one_pass(cp::pass_params(p, L, false, cuts), dev, build, second);
  if (s != KLA_SUCCESS) {
    if (requested) return s;  // the message names the pass's path and why
    detail::clear_error();
    out.reason += "; one pass (a split's pass cannot be planned)";
    return KLA_SUCCESS;
  }
  // A FAST request the second pass runs ACCURATE keeps plan_one_pass's leading clause.
  const std::string fast_clause = second.reason.rfind("arithmetic ACCURATE: the ", 0) == 0
                                      ? second.reason.substr(0, second.reason.find("; ") + 2)
                                      : std::string();
  out = second;
  out.segments = n;
  out.workspace_bytes = L.total;
  out.reason =
      cat(fast_clause, "split into ", n, " segments a sequence (", why, "), ", L.M,
          " segments: maps pass ", kla_path_name(maps.path), "/", maps.value_slice,
          " over K + V = ", L.K + L.V, " columns, fold, second pass ", kla_path_name(second.path),
          "/", second.value_slice, second.arithmetic == KLA_ARITHMETIC_FAST ? " (FAST)" : "");
  return KLA_SUCCESS;
}

}  // namespace

kla_status plan_chunk(const kla_params& p, const DeviceInfo& dev, const BuildInfo& build,
                      Plan& out) {
  if (kla_status s = plan_one_pass(p, dev, build, out)) return s;
  return plan_split(p, dev, build, out);
}

kla_status plan_tokenwise(const kla_params& p, const DeviceInfo& dev, Plan& out) {
  (void)dev;
  out = Plan{};
  if (p.path != KLA_PATH_AUTO && p.path != KLA_PATH_TOKENWISE)
    return refuse(p.path,
                  "kla_tokenwise_forward runs the tokenwise kernel only (path AUTO or "
                  "TOKENWISE)");
  if (p.value_slice != 0 && p.value_slice != layout::kTokSlice)
    return refuse(KLA_PATH_TOKENWISE,
                  cat("value_slice = ", p.value_slice, " (the tokenwise kernel takes 16 columns)"));
  const Problem pb = describe(p);
  out.num_seqs = pb.N, out.max_chunks = pb.max_chunks;
  out.path = KLA_PATH_TOKENWISE;
  out.value_slice = layout::kTokSlice;
  out.threads = layout::kTokWarps * 32;
  out.blocks = layout::tokenwise_blocks(pb.N, pb.HV, pb.V);
  out.kmax = layout::tokenwise_kmax(int(pb.K));
  if (out.blocks > kGridXMax)
    return refuse(KLA_PATH_TOKENWISE, cat(out.blocks, " blocks exceed the grid's 2^31-1"));
  out.reason = cat("tokenwise: ", shape_summary(pb), "; state rows in the K <= ", out.kmax,
                   " register family, one warp per 16 value columns");
  return KLA_SUCCESS;
}

void to_c(const Plan& in, kla_plan& out) {
  std::memset(&out, 0, sizeof out);
  out.path = in.path;
  out.path_name = kla_path_name(in.path);
  out.chunk_len = in.chunk;
  out.value_slice = in.value_slice;
  out.stages = in.stages;
  out.threads = in.threads;
  out.blocks = in.blocks;
  out.prep_blocks = in.prep_blocks;
  out.smem_bytes = in.smem_bytes;
  out.prep_smem_bytes = in.prep_smem_bytes;
  out.workspace_bytes = size_t(in.workspace_bytes);
  out.arithmetic = in.arithmetic;
  out.segments = in.segments;
  const size_t n = std::min(in.reason.size(), sizeof out.reason - 1);
  std::memcpy(out.reason, in.reason.data(), n);
  out.reason[n] = '\0';
}

DeviceInfo from_c(const kla_device_info& d) {
  DeviceInfo r;
  r.cc_major = d.compute_major, r.cc_minor = d.compute_minor;
  r.sms = d.multiprocessors;
  r.max_smem = d.max_smem_per_block;
  r.tensor_maps = d.tensor_maps != 0;
  return r;
}

}  // namespace kla::plan
