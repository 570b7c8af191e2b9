#!/usr/bin/env bash
# The default test suite on every Python the wheels claim (3.10 .. 3.14) that this machine has,
# each from a clean copy of the working tree into a venv of its own, with the README's install
# and test commands (as .ci/run does for one Python).
#
#   tools/python-matrix.sh              every interpreter found, oldest first
#   tools/python-matrix.sh 3.10 3.13    these only
#
# An interpreter 3.X is python3.X on PATH (not a pyenv shim), else pyenv's newest 3.X.
# Environment:
#   MF_MATRIX_DIR  where the copies, venvs and logs go (default ${TMPDIR:-/tmp}/megafuse-matrix)
#   PYTEST_ARGS    extra arguments for pytest (default none: the whole default suite)
# Prints one line per interpreter: its version, NumPy's, the test counts and the time; exits 1
# if any interpreter failed (or none was found).
set -uo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${MF_MATRIX_DIR:-${TMPDIR:-/tmp}/megafuse-matrix}"
VERSIONS=("$@")
[ "${#VERSIONS[@]}" -gt 0 ] || VERSIONS=(3.10 3.11 3.12 3.13 3.14)

log() { printf '[python-matrix %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

find_python() {
    local v=$1 py root
    py="$(command -v "python$v" 2>/dev/null || true)"
    if [ -n "$py" ] && [[ "$py" != */shims/* ]]; then
        echo "$py"
        return 0
    fi
    root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
    py="$(ls -d "$root"/versions/"$v".*/bin/"python$v" 2>/dev/null | sort -V | tail -n1)"
    [ -n "$py" ] && [ -x "$py" ] && echo "$py"
}

mkdir -p "$DIR"
results=()
status=0
found=0
for v in "${VERSIONS[@]}"; do
    py="$(find_python "$v")"
    if [ -z "$py" ]; then
        log "Python $v: not found"
        results+=("$(printf '%-8s %-9s %-8s %s' "$v" "-" "-" "not found on this machine")")
        continue
    fi
    found=$((found + 1))
    src="$DIR/src-$v" venv="$DIR/venv-$v" logf="$DIR/pytest-$v.log"
    log "Python $v: $py -> $src, $venv"
    rm -rf "$src" "$venv"
    mkdir -p "$src"
    (cd "$HERE" && git ls-files -z --cached --others --exclude-standard \
        | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$src"
    t0=$SECONDS
    if ! "$py" -m venv "$venv" >"$DIR/install-$v.log" 2>&1 \
        || ! (cd "$src" && "$venv/bin/python" -m pip install -U pip >>"$DIR/install-$v.log" 2>&1 \
              && "$venv/bin/python" -m pip install -e ".[test]" >>"$DIR/install-$v.log" 2>&1); then
        log "Python $v: install FAILED (see $DIR/install-$v.log)"
        results+=("$(printf '%-8s %-9s %-8s %s' "$v" "-" "-" "install failed: $DIR/install-$v.log")")
        status=1
        continue
    fi
    full="$("$venv/bin/python" -c 'import sys; print(sys.version.split()[0])')"
    np="$("$venv/bin/python" -c 'import numpy; print(numpy.__version__)')"
    log "Python $full, NumPy $np: installed in $((SECONDS - t0)) s; pytest ${PYTEST_ARGS:-}"
    t1=$SECONDS
    # shellcheck disable=SC2086
    # the venv's scripts first on PATH, as `source $venv/bin/activate` in .ci/run puts them
    (cd "$src" && PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" MEGAFUSE_REQUIRE_MODEL=1 \
        "$venv/bin/pytest" -p no:cacheprovider ${PYTEST_ARGS:-}) >"$logf" 2>&1
    rc=$?
    # pytest's last line: "=== 3196 passed, 4 skipped in 1366.14s ===", without the rules under -q
    summary="$(grep -E '^=* ?[0-9]+ (passed|failed|error|skipped).* in [0-9.]+s' "$logf" | tail -n1 \
               | sed 's/=//g; s/^ *//; s/ *$//')"
    [ "$rc" -eq 0 ] || status=1
    [ "$rc" -eq 5 ] && summary="no tests collected" && status=1
    results+=("$(printf '%-8s %-9s %-8s %s (pytest exit %d, %d s)' "$full" "$np" \
                 "$([ "$rc" -eq 0 ] && echo passed || echo FAILED)" "${summary:-see $logf}" \
                 "$rc" "$((SECONDS - t1))")")
    log "Python $full: ${summary:-no summary} (exit $rc)"
done
[ "$found" -gt 0 ] || status=1

printf '\n%-8s %-9s %-8s %s\n' python numpy result "tests (pytest's summary)"
printf '%s\n' "${results[@]}"
exit $status
