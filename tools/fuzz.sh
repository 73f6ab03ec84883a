#!/usr/bin/env bash
# Fuzzing (issue 5; docs/fuzzing.md). Needs clang-14 + libfuzzer-14-dev (tools/install_deps.sh).
#   tools/fuzz.sh smoke                  configure + build the `fuzz` preset (build-fuzz/) and run
#                                        its ctest entries: every corpus and regression file once
#   tools/fuzz.sh run TARGET SECONDS [libFuzzer flags...]
#                                        fuzz TARGET (validate | exact | rounded) for SECONDS:
#                                        reads fuzz/corpus/TARGET, writes new inputs to
#                                        fuzz/artifacts/corpus-TARGET/ (scratch), crashes to
#                                        fuzz/artifacts/ (gitignored). KLA_FUZZ_MASK_KNOWN=1 builds
#                                        in build-fuzz-masked/ with the known findings masked.
#   tools/fuzz.sh list                   the targets
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(validate exact rounded report_cli)

build() {  # build DIR TARGET EXTRA_CMAKE_ARGS...
  local dir=$1 t=$2; shift 2
  cmake --preset fuzz -B "$dir" "$@" >/dev/null
  cmake --build "$dir" --target "fuzz_$t"
}

case "${1:-}" in
  smoke)
    cmake --preset fuzz
    cmake --build --preset fuzz
    ctest --preset fuzz
    ;;
  run)
    t=${2:?usage: tools/fuzz.sh run TARGET SECONDS}
    secs=${3:?usage: tools/fuzz.sh run TARGET SECONDS}
    shift 3
    [[ " ${targets[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (${targets[*]})" >&2; exit 2; }
    if [[ "${KLA_FUZZ_MASK_KNOWN:-0}" == 1 ]]; then
      dir=build-fuzz-masked; build "$dir" "$t" -DKLA_FUZZ_MASK_KNOWN=ON
    else
      dir=build-fuzz; build "$dir" "$t" -DKLA_FUZZ_MASK_KNOWN=OFF
    fi
    scratch=fuzz/artifacts/corpus-$t
    mkdir -p "$scratch"
    # New inputs go to the first directory (scratch); the committed corpus is only read.
    exec "$dir/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix=fuzz/artifacts/"$t"- "$@" "$scratch" "fuzz/corpus/$t"
    ;;
  list) printf '%s\n' "${targets[@]}" ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
