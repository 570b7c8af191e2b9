#!/usr/bin/env bash
# Build and test megafuse on aarch64 under emulation (qemu-user), on an x86-64 Linux host, as root.
#
#   nice -n 19 tools/aarch64-emulated.sh [PYTEST ARGS...]
#   nice -n 19 tools/aarch64-emulated.sh tests/kernels -x -q -p no:cacheprovider
#   nice -n 19 tools/aarch64-emulated.sh --levels [PYTEST ARGS...]    every ARM level, at once
#   tools/aarch64-emulated.sh --shell          a shell inside the root, in the copy of the tree
#
# Each step is skipped when already done, so a second run only copies the changed files and
# rebuilds the modules they touch:
#   1. the host: qemu-user-static, binfmt-support, debootstrap (apt-get), binfmt_misc mounted,
#      the qemu-aarch64 handler enabled;
#   2. an arm64 Debian bookworm root (debootstrap --variant=buildd, from the Debian mirror apt
#      uses; 3-10 min) with the host's resolv.conf and CA bundle (pip inside trusts what the
#      host's pip trusts); python3, python3-venv, python3-dev, build-essential from Debian; a venv
#      with numpy>=2, cython>=3, setuptools>=77, pytest, hypothesis, gguf, pytest-benchmark from PyPI (arm64 wheels;
#      Debian's numpy 1.24 and Cython 0.29 cannot build megafuse);
#   3. the working tree copied into the root (rsync; git-ignored files such as build products are
#      left out), built in place (`setup.py build_ext --inplace`; 6-12 min from scratch);
#   4. `python -m pytest ARGS` in the copy (no ARGS: the default suite).  The exit status is
#      pytest's.
# megafuse builds its four aarch64 levels (generic, neon, neon_dotprod, i8mm).  QEMU_CPU
# (cortex-a53, neoverse-n1, max, ...), MEGAFUSE_SIMD, MEGAFUSE_TEST_LEVELS and OMP_NUM_THREADS are
# passed through to the emulated processes.  MEGAFUSE_TEST_TIMEOUT_SCALE (default 40) stretches the
# tests' hang guards (subprocess, server and queue timeouts; tests/helpers.py): under qemu a wheel
# build or a Ray start takes ten times its native time, the float-mode serving tests several
# hundred times, more beside other runs.
#
# --levels: three runs, each on the emulated CPU whose best level is the one it tests:
#   QEMU_CPU=cortex-a53  (ARMv8.0: no dotprod)  -> neon          (kernel tests at generic and neon)
#   QEMU_CPU=neoverse-n1 (dotprod, no i8mm)     -> neon_dotprod  (kernel tests at neon_dotprod)
#   QEMU_CPU=max         (dotprod, i8mm)        -> i8mm          (kernel tests at i8mm)
# Each first checks that megafuse chooses that level by itself (`megafuse info` is printed: the
# level above it shows as not supported, naming the feature the CPU lacks), then runs pytest ARGS
# with MEGAFUSE_TEST_LEVELS set as above, so every kernel test runs once at each level and every
# other test (models, serving) at the run's level.  The three runs go at once, each in a copy of
# the built tree of its own (MF_A64_SRC-<cpu>), its pytest output in MF_A64_SRC-<cpu>.pytest.log
# beside it; a line for each run says how it ended.  The exit status is 1 if any run failed.
#
# Environment:
#   MF_A64_ROOT    the root (default /var/cache/megafuse/arm64-bookworm; ~1.3 GB with the venv)
#   MF_A64_MIRROR  the Debian mirror (default: the first .../debian URI of apt's sources)
#   MF_A64_JOBS    parallel compiles inside the root (default 2)
#   MF_A64_SRC     the copy of the tree inside the root (default /opt/megafuse); two runs at once
#                  need two copies
#   MF_A64_CPUS    --levels: only the runs on these emulated CPUs (default: all three), e.g.
#                  "cortex-a53 max"
# proc, sys and dev are mounted into the root while runs of the script use it; the last run to exit
# unmounts what the runs mounted.  Delete the root with `rm -rf --one-file-system` when no run is left.
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
ROOT="${MF_A64_ROOT:-/var/cache/megafuse/arm64-bookworm}"
JOBS="${MF_A64_JOBS:-2}"
SRC="${MF_A64_SRC:-/opt/megafuse}"   # the copy of the tree, inside the root
VENV=/opt/venv               # the venv, inside the root
# the host's CA bundle, kept apart from the root's own (Debian's ca-certificates rewrites that one)
CA_IN_ROOT=/etc/ssl/host-ca-bundle.crt
DEBS=(python3 python3-venv python3-dev build-essential)
PYPI=("numpy>=2" "cython>=3" "setuptools>=77" "wheel" "pytest" "hypothesis" "gguf" "pytest-benchmark")

log() { printf '[aarch64-emulated %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }

default_mirror() {
    local files=() uri
    [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
    files+=(/etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
    uri="$(grep -hoE '^(URIs:|deb) +https?://[^ ]+' "${files[@]}" 2>/dev/null \
           | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)"
    echo "${uri:-http://deb.debian.org/debian}"
}

host_setup() {
    [ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot and mounts need it)"
    local missing=()
    command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
    command -v update-binfmts >/dev/null || missing+=(binfmt-support)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v rsync >/dev/null || missing+=(rsync)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "apt-get install ${missing[*]}"
        apt-get install -y -q "${missing[@]}" >/dev/null
    fi
    [ -e /proc/sys/fs/binfmt_misc/register ] \
        || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    grep -qs '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 || update-binfmts --enable qemu-aarch64
    grep -qs '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
        || die "the qemu-aarch64 binfmt handler is not enabled"
}

# proc, sys and dev stay mounted while any run of this script uses the root: each live run has
# a file $RUNS/<pid>; the last one to leave unmounts what runs mounted (listed in $RUNS/mounted),
# so a run that ends first does not pull them from under another (mounts made by hand stay)
RUNS="$ROOT/.megafuse-runs"
mount_root() {
    local d
    mkdir -p "$RUNS"
    : >"$RUNS/$$"
    for d in proc sys dev dev/pts; do
        mountpoint -q "$ROOT/$d" && continue
        if [ "$d" = proc ]; then mount -t proc proc "$ROOT/proc"; else mount --bind "/$d" "$ROOT/$d"; fi
        echo "$ROOT/$d" >>"$RUNS/mounted"
    done
}

umount_root() {
    local f m
    [ -e "$RUNS/$$" ] || return 0
    rm -f "$RUNS/$$"
    for f in "$RUNS"/[0-9]*; do              # another live run: the mounts are its to remove
        [ -e "$f" ] && kill -0 "${f##*/}" 2>/dev/null && return 0
        rm -f "$f"                           # a run that was killed without its exit trap
    done
    [ -e "$RUNS/mounted" ] || return 0
    tac "$RUNS/mounted" | while read -r m; do umount -l "$m" || true; done
    rm -f "$RUNS/mounted"
}

# a command inside the root, in a clean environment with the venv first on PATH
in_root() {
    chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
        PATH="$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        PIP_CERT="$CA_IN_ROOT" SSL_CERT_FILE="$CA_IN_ROOT" REQUESTS_CA_BUNDLE="$CA_IN_ROOT" \
        PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=120 DEBIAN_FRONTEND=noninteractive \
        PYTHONPATH="$SRC" \
        ${QEMU_CPU:+QEMU_CPU="$QEMU_CPU"} ${MEGAFUSE_SIMD:+MEGAFUSE_SIMD="$MEGAFUSE_SIMD"} \
        ${OMP_NUM_THREADS:+OMP_NUM_THREADS="$OMP_NUM_THREADS"} \
        ${MEGAFUSE_TEST_LEVELS:+MEGAFUSE_TEST_LEVELS="$MEGAFUSE_TEST_LEVELS"} \
        MEGAFUSE_TEST_TIMEOUT_SCALE="${MEGAFUSE_TEST_TIMEOUT_SCALE:-40}" \
        /bin/bash -c "$1"
}

make_root() {
    # debootstrap deletes $ROOT/debootstrap when its second stage has finished
    if [ -x "$ROOT/usr/bin/apt-get" ] && [ ! -e "$ROOT/debootstrap" ]; then
        log "arm64 root: $ROOT (cached)"
    else
        if [ -e "$ROOT" ]; then
            log "removing the unfinished root $ROOT"
            local d
            for d in dev/pts dev sys proc; do       # left by a run that was killed
                if mountpoint -q "$ROOT/$d"; then umount -l "$ROOT/$d"; fi
            done
            rm -rf --one-file-system "$ROOT"
        fi
        local mirror="${MF_A64_MIRROR:-$(default_mirror)}" t0=$SECONDS
        mkdir -p "$(dirname "$ROOT")"
        log "debootstrap --arch=arm64 --variant=buildd bookworm $ROOT $mirror (3-10 min)"
        debootstrap --arch=arm64 --variant=buildd bookworm "$ROOT" "$mirror" \
            >"$ROOT.debootstrap.log" 2>&1 || die "debootstrap failed: see $ROOT.debootstrap.log"
        log "root made in $((SECONDS - t0)) s"
    fi
    cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
    mkdir -p "$ROOT/etc/ssl"
    cp -L "${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}" "$ROOT$CA_IN_ROOT"
    mount_root
    local want="${DEBS[*]} | ${PYPI[*]}"
    if [ "$(cat "$ROOT/opt/.megafuse-deps" 2>/dev/null)" != "$want" ]; then
        local t0=$SECONDS
        log "apt-get install ${DEBS[*]} (inside)"
        in_root "apt-get update -q >/dev/null && apt-get install -y -q ${DEBS[*]} >/dev/null"
        log "venv $VENV: pip install ${PYPI[*]} (inside)"
        in_root "[ -x $VENV/bin/python ] || python3 -m venv $VENV; pip install -q -U pip \
                 && pip install -q -U $(printf "'%s' " "${PYPI[@]}")"
        echo "$want" >"$ROOT/opt/.megafuse-deps"
        log "dependencies installed in $((SECONDS - t0)) s"
    fi
    in_root 'python -c "import platform, numpy, Cython; print(\"inside:\", platform.machine(),
             \"Python\", platform.python_version(), \"NumPy\", numpy.__version__,
             \"Cython\", Cython.__version__)"' >&2
}

build() {
    log "rsync $HERE -> $ROOT$SRC ($(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo '?'))"
    mkdir -p "$ROOT$SRC"
    # times kept, so that unchanged files rebuild nothing; git-ignored files (build products,
    # caches) are neither copied nor deleted in the copy.  rsync reads .gitignore's megafuse/**/*.c
    # as at least one folder deep, hence the generated C files' own exclude.
    rsync -a --delete --exclude=.git --exclude='/megafuse/**.c' --filter=':- .gitignore' \
        "$HERE/" "$ROOT$SRC/"
    # the project's test extra (tokenizers, jinja2, the serving stack, ...), as `pip install -e
    # ".[test]"` would give it, installed again only when pyproject.toml's list changes
    local extra
    extra="$(in_root "cd $SRC && python -c 'import tomllib; print(\" \".join(repr(r) for r in \
             tomllib.load(open(\"pyproject.toml\", \"rb\"))[\"project\"][\"optional-dependencies\"][\"test\"]))'")"
    if [ "$(cat "$ROOT/opt/.megafuse-test-extra" 2>/dev/null)" != "$extra" ]; then
        log "pip install the test extra (inside): $extra"
        in_root "pip install -q $extra" || die "the test extra did not install inside the root"
        echo "$extra" >"$ROOT/opt/.megafuse-test-extra"
    fi
    local t0=$SECONDS
    log "setup.py build_ext --inplace -j $JOBS (inside; 6-12 min from scratch)"
    # the compiler's output to a log beside the copy; its end shown if the build fails
    local build_log="$ROOT$SRC.build.log"
    if ! in_root "cd $SRC && python setup.py build_ext --inplace -j $JOBS" >"$build_log" 2>&1; then
        tail -n 40 "$build_log" >&2
        die "the build failed inside the root: see $build_log"
    fi
    log "built in $((SECONDS - t0)) s"
}

# QEMU_CPU, the level megafuse must choose on it, MEGAFUSE_TEST_LEVELS (see the top)
LEVEL_RUNS=("cortex-a53 neon generic,neon" "neoverse-n1 neon_dotprod neon_dotprod" "max i8mm i8mm")

run_levels() {
    local status=0 run cpu level tested chosen t0 args="" copy i
    local pids=() copies=() names=()
    [ "$#" -gt 0 ] && args="$(printf '%q ' "$@")"
    for run in "${LEVEL_RUNS[@]}"; do
        read -r cpu level tested <<<"$run"
        [[ " ${MF_A64_CPUS:-$cpu} " == *" $cpu "* ]] || continue
        log "QEMU_CPU=$cpu: megafuse info (inside)"
        QEMU_CPU=$cpu in_root "cd $SRC && python -m megafuse info" | grep -A8 '^simd_level ' >&2 || true
        chosen="$(QEMU_CPU=$cpu in_root "cd $SRC && python -c 'import megafuse; print(megafuse.simd_level())'" || true)"
        if [ "$chosen" != "$level" ]; then
            log "FAILED: on QEMU_CPU=$cpu megafuse chose '$chosen', not $level"
            status=1
            continue
        fi
        # each run in a copy of its own (build products included): the runs go at once
        copy="$SRC-$cpu"
        rm -rf --one-file-system "${ROOT:?}$copy"
        cp -a "$ROOT$SRC" "$ROOT$copy"
        log "QEMU_CPU=$cpu MEGAFUSE_TEST_LEVELS=$tested python -m pytest $args(inside $copy; output in $ROOT$copy.pytest.log)"
        (
            SRC=$copy
            QEMU_CPU=$cpu MEGAFUSE_TEST_LEVELS=$tested in_root "cd $copy && python -m pytest $args"
        ) >"$ROOT$copy.pytest.log" 2>&1 &
        pids+=("$!")
        copies+=("$copy")
        names+=("$level on $cpu")
    done
    t0=$SECONDS
    for i in "${!pids[@]}"; do
        if wait "${pids[$i]}"; then
            log "${names[$i]}: pytest passed after $((SECONDS - t0)) s: $(tail -n 1 "$ROOT${copies[$i]}.pytest.log")"
        else
            log "${names[$i]}: pytest FAILED after $((SECONDS - t0)) s (see $ROOT${copies[$i]}.pytest.log):"
            tail -n 30 "$ROOT${copies[$i]}.pytest.log" >&2
            status=1
        fi
    done
    return "$status"
}

main() {
    host_setup
    trap umount_root EXIT
    make_root
    build
    if [ "${1:-}" = --shell ]; then
        in_root "cd $SRC && exec bash -i"
        return
    fi
    if [ "${1:-}" = --levels ]; then
        shift
        run_levels "$@"
        return
    fi
    local t0=$SECONDS status=0 args=""
    [ "$#" -gt 0 ] && args="$(printf '%q ' "$@")"
    log "python -m pytest $args(inside)"
    in_root "cd $SRC && python -m pytest $args" || status=$?
    log "pytest exited $status after $((SECONDS - t0)) s"
    return "$status"
}
main "$@"; exit  # one line: bash reads no further, even if this file changed while it ran
