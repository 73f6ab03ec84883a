// Downstream use of kla::reference: one exact Kaczmarz step reads back its value (Theorem 1).
#include <cstdio>

#include <kla/ref.hpp>

int main() {
  using kla::ref::Rational;
  kla::ref::Mat<Rational> S = kla::ref::Mat<Rational>::Zero(2, 1);
  kla::ref::Vec<Rational> k(2), v(1), alpha(2);
  k << Rational(1, 2), Rational(-3);
  v << Rational(7, 5);
  alpha << Rational(1), Rational(1);
  kla::ref::Options<Rational> opt;
  kla::ref::token_step<Rational>(S, alpha, k, v, Rational(1), opt);
  const bool ok = (S.transpose() * k)(0) == v(0);
  std::printf("kla %s downstream reference: %s\n", KLA_VERSION_STRING, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
