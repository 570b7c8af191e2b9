#!/usr/bin/env bash
# Run C test programs that use AMX-INT8 and AVX-512 bare metal (no OS) on an emulated Intel Sapphire
# Rapids: the Bochs emulator, built here with a fix for its AMX-INT8 signedness bug, on an x86-64
# Linux host that has no AMX (Debian bookworm or later), as root.
#
#   tools/amx-emulated.sh                     tools/amx-emulated/amx_tiles_check.c
#   tools/amx-emulated.sh PROG.c [PROG.c ...]
#   MF_AMX_CFLAGS=-DFOO=1 tools/amx-emulated.sh PROG.c
#
# A program defines `int test_main(void)` (0: pass) and may use printf, malloc and the other C
# functions the megafuse headers call (tools/amx-emulated/rt.h lists what the runtime gives; its
# libm is accurate to about 1 ulp, not glibc's bits).  Each program is compiled by the host's gcc
# with -I include and the megafuse avx512 + amx flags, linked with the boot stub and the runtime
# into a Multiboot kernel, booted by GRUB from an ISO image in Bochs (cpu model sapphire_rapids), and
# what it writes to the serial port is printed.  The runtime ends with `RESULT PASS (exit code 0)`
# or `RESULT FAIL (exit code N)`; a CPU exception (an AMX shape error is #UD) is reported with its
# source line and is a FAIL.  The exit status is 0 only if each program's last RESULT line is
# `RESULT PASS`.
#
# Each step is skipped when already done (a second run only compiles and boots the programs):
#   1. the host: debootstrap and gcc (apt-get) if missing;
#   2. a Debian trixie root (debootstrap --variant=minbase from the Debian mirror apt uses; 1-3 min),
#      with grub-pc-bin, grub-common, xorriso, mtools (grub-mkrescue), g++, make, patch, xz-utils
#      (the Bochs build) and bochsbios, vgabios (the emulated PC's firmware, trixie's bochsbios is
#      3.0+dfsg-1, the same release as the emulator).  Trixie, not bookworm: bookworm's Bochs 2.7
#      has no AMX, and the root keeps the emulator off the host;
#   3. Bochs 3.0 from Debian's source archive (pool/main/b/bochs/bochs_3.0+dfsg.orig.tar.xz, the
#      sha256 below from trixie's Sources), tools/amx-emulated/bochs-amx-int8-signedness.patch
#      applied, configured headless (nogui, no plugins) with AMX and AVX-512, built and installed
#      as /opt/bochs-amx/bin/bochs in the root (2-5 min on 2 cores; the build tree stays in
#      /src/bochs).  Rebuilt when the patch, the tarball or the configure flags change;
#   4. for each PROG: compile and link on the host, grub-mkrescue and Bochs in the root (chroot; no
#      mounts needed), print the serial output and the verdict.  The total time is printed last.
#
# Environment:
#   MF_AMX_ROOT     the root (default /var/cache/megafuse/amx-trixie; ~800 MB with the Bochs build)
#   MF_AMX_MIRROR   the Debian mirror (default: the first .../debian URI of apt's sources)
#   MF_AMX_JOBS     parallel compiles of the Bochs build (default: the number of CPUs)
#   MF_AMX_CC       the programs' compiler (default gcc; GCC 11+ for -mamx-int8)
#   MF_AMX_OPT      the programs' optimisation (default -O3, as setup.py builds megafuse)
#   MF_AMX_CFLAGS   more flags for the programs, e.g. -DMF_CHECK_NO_AMX=1
#   MF_AMX_MEM      guest memory in MiB (default 512; the heap is what the kernel leaves)
#   MF_AMX_TIMEOUT  wall seconds a program may run in Bochs (default 900)
#   MF_AMX_BOCHS    the emulator that runs the programs, a path inside the root (default
#                   /opt/bochs-amx/bin/bochs, the patched build)
#   MF_AMX_KEEP=1   keep each run's directory ($MF_AMX_ROOT/runs/NAME.PID: kernel.elf, boot.iso,
#                   bochsrc, serial.txt, bochs.log); it is always kept when a program fails
# To see the bug the patch fixes, an unpatched build beside the patched one (seconds: only amx.cc
# is compiled again); with it TDPBUUD is right and TDPBSSD/TDPBSUD/TDPBUSD are wrong, and the
# default check reports 120 of 120 cases differing:
#   cd "$MF_AMX_ROOT/src" && cp -a bochs bochs-stock && patch -d bochs-stock -R -p1 <bochs.patch
#   chroot "$MF_AMX_ROOT" sh -c 'make -C /src/bochs-stock && install -D /src/bochs-stock/bochs /opt/bochs-stock/bin/bochs'
#   MF_AMX_BOCHS=/opt/bochs-stock/bin/bochs tools/amx-emulated.sh
# Bochs runs plain code at roughly 100 M instructions/s; booting (BIOS, GRUB) and powering off take
# about a second.  Delete the root with `rm -rf --one-file-system "$MF_AMX_ROOT"`.
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
DIR="$HERE/tools/amx-emulated"
ROOT="${MF_AMX_ROOT:-/var/cache/megafuse/amx-trixie}"
JOBS="${MF_AMX_JOBS:-$(nproc)}"
CC="${MF_AMX_CC:-gcc}"
OPT="${MF_AMX_OPT:--O3}"
MEM="${MF_AMX_MEM:-512}"
TIMEOUT="${MF_AMX_TIMEOUT:-900}"
SUITE=trixie
DEBS=(grub-pc-bin grub-common xorriso mtools g++ make patch xz-utils bochsbios vgabios)
# Debian's Bochs 3.0 source (trixie: bochs 3.0+dfsg-1); sha256 from dists/trixie/main/source/Sources
BOCHS_TARBALL=bochs_3.0+dfsg.orig.tar.xz
BOCHS_POOL=pool/main/b/bochs
BOCHS_SHA256=78f6c73d4a6472d5130a87ab9dc306d02c7c71ed8e25b3a8ef642e2a7acd282b
PATCH="$DIR/bochs-amx-int8-signedness.patch"
BOCHS_CONFIGURE=(--prefix=/opt/bochs-amx --with-nogui --disable-plugins --disable-debugger
    --disable-docbook --disable-instrumentation --enable-x86-64 --enable-cpu-level=6 --enable-avx
    --enable-evex --enable-amx --enable-all-optimizations --enable-repeat-speedups --enable-fpu
    --enable-cdrom --enable-pci --enable-a20-pin --enable-protection-keys --enable-cet
    --enable-vmx=2 --enable-monitor-mwait --enable-smp --enable-uintr)
BOCHS_BUILT=/opt/bochs-amx/bin/bochs             # inside the root
BOCHS="${MF_AMX_BOCHS:-$BOCHS_BUILT}"
# the programs: freestanding, linked at 1 MiB, no libc (the runtime stands in for it)
KFLAGS=(-m64 -ffreestanding -fno-pic -fno-pie -no-pie -mno-red-zone -mcmodel=small
    -fno-stack-protector -fno-asynchronous-unwind-tables -fno-exceptions -nostdlib -static
    -fno-tree-loop-distribute-patterns -g)
# setup.py's SIMD_LEVELS["amx"] (avx512 + AMX) and its BASE_FLAGS' fp flags
MFFLAGS=(-mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vnni -mfma -mf16c -mavx2
    -mamx-tile -mamx-int8 -ffp-contract=off -fno-math-errno)

T_START=$SECONDS
log() { printf '[amx-emulated %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 2; }

default_mirror() {
    local files=() uri
    [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
    files+=(/etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
    uri="$(grep -hoE '^(URIs:|deb) +https?://[^ ]+' "${files[@]}" 2>/dev/null \
           | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)"
    echo "${uri:-http://deb.debian.org/debian}"
}
MIRROR="${MF_AMX_MIRROR:-$(default_mirror)}"
MIRROR="${MIRROR%/}"

# a command inside the root, in a clean environment
in_root() {
    chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -c "$1"
}

host_setup() {
    [ "$(id -u)" = 0 ] || die "run as root (debootstrap and chroot need it)"
    [ "$(uname -m)" = x86_64 ] || die "an x86-64 host is needed"
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v "$CC" >/dev/null || missing+=(gcc)
    command -v objcopy >/dev/null || missing+=(binutils)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "host: apt-get install ${missing[*]}"
        apt-get update -q >/dev/null
        apt-get install -y -q "${missing[@]}" >/dev/null
    fi
}

make_root() {
    # debootstrap deletes $ROOT/debootstrap when its second stage has finished
    if [ -x "$ROOT/usr/bin/apt-get" ] && [ ! -e "$ROOT/debootstrap" ]; then
        log "$SUITE root: $ROOT (cached)"
    else
        if [ -e "$ROOT" ]; then
            log "removing the unfinished root $ROOT"
            rm -rf --one-file-system "$ROOT"
        fi
        local t0=$SECONDS include
        include="$(IFS=,; echo "${DEBS[*]}")"
        mkdir -p "$(dirname "$ROOT")"
        log "debootstrap --variant=minbase --include=$include $SUITE $ROOT $MIRROR (1-3 min)"
        debootstrap --variant=minbase --include="$include" "$SUITE" "$ROOT" "$MIRROR" \
            >"$ROOT.debootstrap.log" 2>&1 || die "debootstrap failed: see $ROOT.debootstrap.log"
        echo "${DEBS[*]}" >"$ROOT/opt/.megafuse-amx-debs"
        log "root made in $((SECONDS - t0)) s"
    fi
    cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
    if [ "$(cat "$ROOT/opt/.megafuse-amx-debs" 2>/dev/null)" != "${DEBS[*]}" ]; then
        local t0=$SECONDS
        log "apt-get install ${DEBS[*]} (inside)"
        in_root "apt-get update -q >/dev/null && apt-get install -y -q ${DEBS[*]} >/dev/null"
        echo "${DEBS[*]}" >"$ROOT/opt/.megafuse-amx-debs"
        log "packages installed in $((SECONDS - t0)) s"
    fi
    log "inside: $(in_root '. /etc/os-release; echo "$PRETTY_NAME"'), bochsbios \
$(in_root "dpkg-query -W -f='\${Version}' bochsbios"), vgabios $(in_root "dpkg-query -W -f='\${Version}' vgabios")"
}

build_bochs() {
    local want have
    want="$BOCHS_SHA256 $(sha256sum <"$PATCH" | cut -d' ' -f1) ${BOCHS_CONFIGURE[*]}"
    have="$(cat "$ROOT/opt/bochs-amx/.megafuse-build" 2>/dev/null || true)"
    if [ "$want" = "$have" ] && [ -x "$ROOT$BOCHS_BUILT" ]; then
        log "Bochs: $ROOT$BOCHS_BUILT (cached)"
        return
    fi
    local t0=$SECONDS tarball="/src/$BOCHS_TARBALL"
    mkdir -p "$ROOT/src"
    if ! echo "$BOCHS_SHA256  $ROOT$tarball" | sha256sum -c --status 2>/dev/null; then
        log "download $MIRROR/$BOCHS_POOL/$BOCHS_TARBALL (inside)"
        rm -f "$ROOT$tarball" "$ROOT/tmp/$BOCHS_TARBALL"*
        # apt's downloader (the root has no curl or wget) checks the sha256 too; it drops root
        # for user _apt, who may write in /tmp
        in_root "/usr/lib/apt/apt-helper download-file '$MIRROR/$BOCHS_POOL/$BOCHS_TARBALL' \
                 '/tmp/$BOCHS_TARBALL' 'SHA256:$BOCHS_SHA256' && mv '/tmp/$BOCHS_TARBALL' '$tarball'" \
            >/dev/null || die "could not download $MIRROR/$BOCHS_POOL/$BOCHS_TARBALL"
    fi
    echo "$BOCHS_SHA256  $ROOT$tarball" | sha256sum -c --status \
        || die "$ROOT$tarball: sha256 is not $BOCHS_SHA256"
    log "sha256 $BOCHS_SHA256 $BOCHS_TARBALL: OK"
    rm -rf "$ROOT/src/bochs" "$ROOT/opt/bochs-amx"
    mkdir -p "$ROOT/src/bochs"
    tar -xJf "$ROOT$tarball" -C "$ROOT/src/bochs" --strip-components=1 --no-same-owner
    cp "$PATCH" "$ROOT/src/bochs.patch"
    in_root "cd /src/bochs && patch -p1 </src/bochs.patch" >&2 || die "the patch did not apply"
    log "Bochs: configure, make -j$JOBS (inside; log in $ROOT/src/bochs.build.log; 2-5 min)"
    local cfg
    cfg="$(printf '%q ' "${BOCHS_CONFIGURE[@]}")"
    if ! in_root "set -e; cd /src/bochs; ./configure $cfg; make -j$JOBS; \
                  install -D -m 755 bochs $BOCHS_BUILT" >"$ROOT/src/bochs.build.log" 2>&1; then
        tail -n 40 "$ROOT/src/bochs.build.log" >&2
        die "the Bochs build failed: see $ROOT/src/bochs.build.log"
    fi
    echo "$want" >"$ROOT/opt/bochs-amx/.megafuse-build"
    log "Bochs built in $((SECONDS - t0)) s: $(in_root "$BOCHS_BUILT --help 2>&1 | grep -m1 -o 'Bochs x86 Emulator [^ ]*'" || true)"
}

# the boot stub and the runtime, once for all the programs: $RUN/lib/{boot.o,librt.a}
build_runtime() {
    local lib="$1/lib"
    mkdir -p "$lib"
    "$CC" "${KFLAGS[@]}" -O2 -c "$DIR/boot.S" -o "$lib/boot.o"
    "$CC" "${KFLAGS[@]}" -O2 -c "$DIR/rt.c" -o "$lib/rt.o"
    "$CC" "${KFLAGS[@]}" -O2 "${MFFLAGS[@]}" -c "$DIR/libm.c" -o "$lib/libm.o"
    "$CC" "${KFLAGS[@]}" -O2 -c "$DIR/posix.c" -o "$lib/posix.o"
    ar rcs "$lib/librt.a" "$lib/rt.o" "$lib/libm.o" "$lib/posix.o"
}

# run_prog PROG.c LIBDIR: 0 if its last RESULT line is RESULT PASS
run_prog() {
    local prog="$1" lib="$2" name rel b t0 t1 brc=0 last rip
    name="$(basename "$prog" .c)"
    rel="runs/$name.$$"                 # the run's directory, as the root sees it
    b="$ROOT/$rel"
    rm -rf "$b"
    mkdir -p "$b/iso/boot/grub"
    t0=$SECONDS
    log "$name: compile ($CC $OPT)"
    # shellcheck disable=SC2086  # MF_AMX_CFLAGS is a list of flags
    if ! "$CC" "${KFLAGS[@]}" "$OPT" "${MFFLAGS[@]}" -I"$HERE/include" -I"$DIR" \
            -include "$DIR/rt.h" ${MF_AMX_CFLAGS:-} -c "$prog" -o "$b/prog.o" \
        || ! "$CC" "${KFLAGS[@]}" -Wl,-T,"$DIR/linker.ld" -Wl,--build-id=none \
            -Wl,--no-warn-rwx-segments -Wl,-z,noexecstack -Wl,-z,max-page-size=4096 \
            "$lib/boot.o" "$b/prog.o" "$lib/librt.a" -lgcc -o "$b/kernel.elf" \
        || ! objcopy -O binary "$b/kernel.elf" "$b/iso/boot/kernel.bin"; then
        log "$name: FAILED to build (run directory $b)"
        return 1
    fi
    cat >"$b/iso/boot/grub/grub.cfg" <<'EOF'
set timeout=0
set default=0
menuentry "amx-emulated" {
  multiboot /boot/kernel.bin
  boot
}
EOF
    if ! in_root "grub-mkrescue -o /$rel/boot.iso /$rel/iso" >"$b/grub-mkrescue.log" 2>&1; then
        cat "$b/grub-mkrescue.log" >&2
        log "$name: FAILED: grub-mkrescue (run directory $b)"
        return 1
    fi
    cat >"$b/bochsrc" <<EOF
memory: guest=$MEM, host=$MEM
romimage: file=/usr/share/bochs/BIOS-bochs-latest
vgaromimage: file=/usr/share/vgabios/vgabios.bin
cpu: model=sapphire_rapids, count=1, ips=100000000, reset_on_triple_fault=0
clock: sync=none, time0=946681200
ata0-master: type=cdrom, path=/$rel/boot.iso, status=inserted
boot: cdrom
com1: enabled=1, mode=file, dev=/$rel/serial.txt
display_library: nogui
log: /$rel/bochs.log
panic: action=fatal
error: action=report
info: action=report
debug: action=ignore
EOF
    t1=$SECONDS
    log "$name: built in $((t1 - t0)) s; boot in $BOCHS (sapphire_rapids)"
    # Bochs's own exit status is 1 even after a normal power-off (it ends through its fatal path)
    timeout -k 5 "$TIMEOUT" chroot "$ROOT" "$BOCHS" -q -f "/$rel/bochsrc" \
        </dev/null >"$b/bochs.stdout" 2>&1 || brc=$?
    echo "===== serial output: $name ====="
    tr -d '\r' <"$b/serial.txt" 2>/dev/null || true
    echo "===== end: $name ====="
    rip="$(tr -d '\r' <"$b/serial.txt" 2>/dev/null | grep -o 'CPU exception.*rip=0x[0-9a-f]*' \
           | grep -o '0x[0-9a-f]*$' | head -n1 || true)"
    [ -n "$rip" ] && echo "faulting rip $rip: $(addr2line -f -i -e "$b/kernel.elf" "$rip" | tr '\n' ' ')"
    last="$(tr -d '\r' <"$b/serial.txt" 2>/dev/null | grep '^RESULT ' | tail -n1 || true)"
    local ok=1 why
    if [ "$brc" = 124 ] || [ "$brc" = 137 ]; then
        why="timed out after $TIMEOUT s"
    elif [ -z "$last" ]; then
        why="no RESULT line (crash or Bochs panic: see $b/bochs.log)"
        grep -E 'PANIC|FATAL|ERROR' "$b/bochs.log" 2>/dev/null | tail -n 5 >&2 || true
    elif [[ "$last" == "RESULT PASS"* ]]; then
        ok=0
    else
        why="$last"
    fi
    if [ "$ok" = 0 ]; then
        log "$name: PASS (Bochs $((SECONDS - t1)) s)"
        [ "${MF_AMX_KEEP:-0}" = 1 ] && log "run directory kept: $b" || rm -rf "$b"
        return 0
    fi
    log "$name: FAILED: $why (Bochs $((SECONDS - t1)) s; run directory kept: $b)"
    return 1
}

main() {
    local progs=("$@") p
    [ "${#progs[@]}" -gt 0 ] || progs=("$DIR/amx_tiles_check.c")
    for p in "${progs[@]}"; do
        [ -f "$p" ] || die "no such file: $p"
    done
    host_setup
    make_root
    build_bochs
    [ -x "$ROOT$BOCHS" ] || die "no emulator $ROOT$BOCHS"
    local run="$ROOT/runs/lib.$$" status=0 passed=0 failed=()
    rm -rf "$run"
    trap 'rm -rf "$ROOT/runs/lib.$$"' EXIT
    build_runtime "$run" || die "the boot stub or the runtime did not compile"
    for p in "${progs[@]}"; do
        if run_prog "$(readlink -f "$p")" "$run/lib"; then
            passed=$((passed + 1))
        else
            failed+=("$(basename "$p")")
            status=1
        fi
    done
    log "${passed} of ${#progs[@]} passed${failed:+; failed: ${failed[*]}}; total $((SECONDS - T_START)) s"
    return "$status"
}
main "$@"; exit  # one line: bash reads no further, even if this file changed while it ran
