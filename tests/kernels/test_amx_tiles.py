"""The amx level's prefill tiles (include/megafuse/mf_amx_tiles.h) against the avx512 tiles and
the one-row dots, bit for bit: tools/amx-emulated/amx_tiles_check.c built as a program of this
host.  With AMX-INT8 (and the OS's permission) it runs every check; elsewhere, on AVX-512 VNNI,
its avx512 half (-DMF_CHECK_NO_AMX), which keeps the check itself honest and compiling.  Hosts
without AMX run the whole check under emulation: tools/amx-emulated.sh (docs/design.md, "AMX
under emulation")."""
import os
import platform
import shutil
import subprocess
import sys

import pytest

import megafuse
from megafuse.kernels import simd as _simd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "tools", "amx-emulated", "amx_tiles_check.c")
X86_LINUX = (platform.machine().lower() in ("x86_64", "amd64")
             and sys.platform.startswith("linux"))


@pytest.mark.skipif(not X86_LINUX, reason="the amx level: x86-64 Linux")
@pytest.mark.skipif(not os.path.exists(CHECK), reason="no source tree (tools/amx-emulated)")
@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")
def test_amx_tile_check_on_this_host(tmp_path):
    from megafuse._build_info import BUILD_CONFIG
    if _simd.missing_features("avx512"):
        pytest.skip("needs AVX-512 VNNI (the avx512 tiles)")
    amx = "amx" in _simd.supported_levels()
    level = "amx" if amx else "avx512"
    exe = str(tmp_path / "amx_tiles_check")
    cmd = [os.environ.get("CC", "cc"), "-O2", "-ffp-contract=off", "-fno-math-errno",
           *BUILD_CONFIG["simd_flags"][level].split(), "-I", megafuse.get_include(),
           "-Dtest_main=main", *([] if amx else ["-DMF_CHECK_NO_AMX"]), CHECK, "-o", exe]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    ran = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    lines = ran.stdout.splitlines()
    assert ran.returncode == 0 and lines[-1] == "RESULT PASS", ran.stdout[-3000:]
    assert lines[-2] == "0 of 120 cases differ"
    cases = [line for line in lines if " n=" in line]
    assert len(cases) == 120
    assert all("rows16 same bits" in c and "avx512 tile same bits" in c for c in cases)
    want = "amx tile same bits" if amx else "amx tile not run"
    assert all(want in c for c in cases)
