// seg.combine — issue 26 (sequence-parallel scans), the identity they rest on: every token is an
// affine map of the state (S_t = A_t S_{t−1} + B_t, A_t = (I − β k kᵀ) diag(α_t)), so a sequence
// cut into segments, each run from a zero state into its map (M, L), the maps composed in order
// for every segment's incoming state, and each segment's outputs read from that state, gives
// exactly (==) the outputs and final state of one tokenwise pass. Random cuts (empty segments,
// one segment, one token each), any decay, both coefficients, with and without S_0; and the
// composition is associative (a tree of combines, as a parallel scan does, equals the chain).
#include "generators.hpp"
#include "kla/ref/segment.hpp"
#include "statement.hpp"

using namespace kla::proofs;

KLA_STATEMENT("seg.combine", "issue 26 (segment maps; Sections 3-4)") {
  const Idx dk = dim(10), dv = dim(10);
  const Idx T = uniform(1, 14);
  const auto in = head_inputs(T, dk, dv, any_decay());
  const auto opt = options();
  const std::vector<Idx> lengths = segment_lengths(T);
  const bool zero_state = *rc::gen::element(false, false, false, true);
  const Mat<Q> S0 = zero_state ? Mat<Q>() : Mat<Q>(*matrix(dk, dv));

  const auto tok = kla::ref::recurrent_forward<Q>(in, opt, S0);
  const auto seg = kla::ref::segment_forward<Q>(in, opt, lengths, S0);
  require_equal(seg.o, tok.o, "segmented O and tokenwise O");
  require_equal(seg.state, tok.state, "combined segment maps and tokenwise S_T");

  // Associativity: ((a b) c) == (a (b c)) for three consecutive segments of the sequence.
  const Idx c1 = uniform(0, T), c2 = uniform(c1, T);
  const auto a = kla::ref::segment_map<Q>(in, opt, 0, c1);
  const auto b = kla::ref::segment_map<Q>(in, opt, c1, c2 - c1);
  const auto c = kla::ref::segment_map<Q>(in, opt, c2, T - c2);
  const auto left = kla::ref::combine(kla::ref::combine(a, b), c);
  const auto right = kla::ref::combine(a, kla::ref::combine(b, c));
  require_equal(left.M, right.M, "(ab)c and a(bc): M");
  require_equal(left.L, right.L, "(ab)c and a(bc): L");
  const auto whole = kla::ref::segment_map<Q>(in, opt, 0, T);
  require_equal(left.M, whole.M, "composed and whole-sequence M");
  require_equal(left.L, whole.L, "composed and whole-sequence L");
}
