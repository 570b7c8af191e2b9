"""The wheel is self-contained: `pip wheel` of the sources, installed into a fresh virtual
environment outside the source tree, imports from site-packages, ships its C headers (found by
get_include()) and its .pxd, lets a downstream Cython extension cimport megafuse._kernels and
call the C-level kernels, and passes tests against the installed package.

Marked `slow` (~1-2 minutes: it compiles every extension once); it runs by default, and
`pytest -m "not slow"` leaves it out (cibuildwheel's test-command does: it tests the wheel it
just installed instead).
"""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import zipfile

import pytest

from helpers import hang_timeout

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

pytestmark = pytest.mark.slow

SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".pytest_cache", ".mypy_cache",
             ".benchmarks", ".hypothesis", "benchmarks"}

CHECK_INSTALLED = textwrap.dedent('''\
    import os, sys
    import numpy as np
    import megafuse
    root, prefix = os.path.realpath(sys.argv[1]), os.path.realpath(sys.prefix)
    here = os.path.realpath(megafuse.__file__)
    assert here.startswith(prefix + os.sep), f"megafuse imported from {here}, not the venv"
    assert not here.startswith(root + os.sep), f"megafuse imported from the source tree: {here}"
    assert "site-packages" in here, here
    inc = os.path.realpath(megafuse.get_include())
    assert inc.startswith(os.path.dirname(here)), f"get_include() outside the package: {inc}"
    for name in ("mega_fused_attention.h", "ckernel_dtype.h"):
        assert os.path.isfile(os.path.join(inc, "megafuse", name)), name
    pkg = os.path.dirname(here)
    for name in ("_kernels.pxd", "__init__.pyi", "py.typed"):
        assert os.path.isfile(os.path.join(pkg, name)), name
    # the version from the wheel's metadata; the build configuration compiled in
    from importlib.metadata import version
    from megafuse._build_info import BUILD_CONFIG
    assert megafuse.__version__ == version("megafuse"), megafuse.__version__
    assert BUILD_CONFIG["compile_flags"], BUILD_CONFIG
    # a whole layer through the installed kernels, against the installed reference
    rng = np.random.default_rng(0)
    E, H, G, D, I = 128, 2, 1, 64, 256
    w = lambda r, c: (rng.standard_normal((r, c)) / np.sqrt(c)).astype(np.float32)
    layer = megafuse.DecoderLayer.from_arrays(
        ln1_gamma=np.ones(E, np.float32), ln2_gamma=np.ones(E, np.float32), wq=w(H * D, E),
        wk=w(G * D, E), wv=w(G * D, E), wo=w(E, H * D), w1=w(2 * I, E), w2=w(E, I),
        num_heads=H, num_kv_heads=G, cache_capacity=16)
    x = rng.standard_normal((6, E)).astype(np.float32)
    got, want = layer.prefill(x), layer.reference(x)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < 1e-5, err
    print("installed-ok", megafuse.simd_level(), inc)
''')

DOWNSTREAM_PYX = textwrap.dedent('''\
    # A downstream Cython module using megafuse's C-level surface (megafuse/_kernels.pxd).
    from megafuse._ckernel_dtype cimport CKDataType, CK_DT_Q8_0
    from megafuse._kernels cimport (
        c_mega_fuse_get_optimal_tiles, c_mega_fused_attention_decode_workspace,
        c_mega_fused_attention_prefill, c_mega_fused_attention_prefill_q8_0,
        c_mega_fused_attention_prefill_scratch_size,
        c_mega_fused_attention_prefill_q8_0_scratch_size, c_mega_fused_outproj_mlp_prefill,
        c_mega_fused_outproj_mlp_prefill_scratch_size, c_mega_fused_mlp_prefill,
        c_mega_fused_mlp_prefill_f32, c_mega_fused_mlp_prefill_scratch_size)

    Q8_0 = CK_DT_Q8_0


    def scratch_sizes(int T, int E, int H, int D, int I):
        return (c_mega_fused_attention_prefill_scratch_size(T, E, H, D),
                c_mega_fused_attention_prefill_q8_0_scratch_size(T, E, H, D),
                c_mega_fused_outproj_mlp_prefill_scratch_size(T, E, H, D, I),
                c_mega_fused_mlp_prefill_scratch_size(T, E, I))


    def prefill(bint int8, float[:, ::1] output, const float[:, ::1] x, const float[::1] gamma,
                const unsigned char[::1] wq, const unsigned char[::1] wk,
                const unsigned char[::1] wv, const unsigned char[::1] wo, int dt,
                float[::1] cache_k, float[::1] cache_v, const float[::1] cos,
                const float[::1] sin, int T, int C, int E, int H, int G, int D,
                unsigned char[::1] scratch):
        cdef CKDataType w_dt = <CKDataType>dt
        with nogil:
            if int8:
                c_mega_fused_attention_prefill_q8_0(
                    &output[0, 0], &x[0, 0], &x[0, 0], &gamma[0], &wq[0], NULL, w_dt, &wk[0],
                    NULL, w_dt, &wv[0], NULL, w_dt, &wo[0], NULL, w_dt, &cache_k[0],
                    &cache_v[0], &cos[0], &sin[0], 0, T, C, E, E, H, G, D, D, 1e-6, &scratch[0])
            else:
                c_mega_fused_attention_prefill(
                    &output[0, 0], &x[0, 0], &x[0, 0], &gamma[0], &wq[0], NULL, w_dt, &wk[0],
                    NULL, w_dt, &wv[0], NULL, w_dt, &wo[0], NULL, w_dt, &cache_k[0],
                    &cache_v[0], &cos[0], &sin[0], 0, T, C, E, E, H, G, D, D, 1e-6, &scratch[0])


    def mlp(bint f32, float[:, ::1] output, const float[:, ::1] x, const float[::1] gamma,
            const unsigned char[::1] w1, const unsigned char[::1] w2, int dt, int T, int E,
            int I, unsigned char[::1] scratch):
        with nogil:
            if f32:
                c_mega_fused_mlp_prefill_f32(&output[0, 0], &x[0, 0], &x[0, 0], &gamma[0],
                                             &w1[0], NULL, <CKDataType>dt, &w2[0], NULL,
                                             <CKDataType>dt, T, E, E, I, I, 1e-6, &scratch[0])
            else:
                c_mega_fused_mlp_prefill(&output[0, 0], &x[0, 0], &x[0, 0], &gamma[0], &w1[0],
                                         NULL, <CKDataType>dt, &w2[0], NULL, <CKDataType>dt, T,
                                         E, E, I, I, 1e-6, &scratch[0])


    def outproj_mlp(float[:, ::1] output, const float[::1] attn, const float[::1] gamma,
                    const unsigned char[::1] wo, const unsigned char[::1] w1,
                    const unsigned char[::1] w2, int dt, int T, int E, int H, int D, int I,
                    unsigned char[::1] scratch):
        with nogil:
            c_mega_fused_outproj_mlp_prefill(
                &output[0, 0], &attn[0], NULL, &gamma[0], &wo[0], NULL, <CKDataType>dt,
                &w1[0], NULL, <CKDataType>dt, &w2[0], NULL, <CKDataType>dt, T, E, E, H, D, I,
                I, 1e-6, &scratch[0])


    def tiles(int head_dim):
        cdef int q_tile = 0, kv_tile = 0
        c_mega_fuse_get_optimal_tiles(&q_tile, &kv_tile, head_dim)
        return q_tile, kv_tile


    def decode(float[::1] output, const float[::1] x, const float[::1] gamma,
               const float[::1] wq, const float[::1] wk, const float[::1] wv,
               const float[::1] wo, float[::1] cache_k, float[::1] cache_v,
               const float[::1] cos, const float[::1] sin, int pos, int E, int H, int G,
               int D, int C, float[::1] q_ws, float[::1] kv_ws):
        with nogil:
            c_mega_fused_attention_decode_workspace(
                &output[0], &x[0], &x[0], &gamma[0], &wq[0], NULL, &wk[0], NULL, &wv[0],
                NULL, &wo[0], NULL, &cache_k[0], &cache_v[0], &cos[0], &sin[0], pos, E, E,
                H, G, D, D, C, 1e-6, &q_ws[0], q_ws.shape[0] * 4, &kv_ws[0],
                kv_ws.shape[0] * 4)
''')

DOWNSTREAM_SETUP = textwrap.dedent('''\
    import numpy
    import megafuse
    from Cython.Build import cythonize
    from setuptools import Extension, setup

    setup(name="downstream", ext_modules=cythonize(
        [Extension("downstream", ["downstream.pyx"],
                   include_dirs=[megafuse.get_include(), numpy.get_include()])],
        compiler_directives={"language_level": 3}, quiet=True))
''')

DOWNSTREAM_RUN = textwrap.dedent('''\
    import numpy as np
    import megafuse
    import downstream

    assert downstream.tiles(64) == megafuse.mega_fuse_get_optimal_tiles(64)
    rng = np.random.default_rng(1)
    E, H, G, D, C, pos = 128, 4, 2, 32, 8, 5
    f = lambda *s: rng.standard_normal(s).astype(np.float32).reshape(-1)
    x, gamma = f(E), np.ones(E, np.float32)
    wq, wk, wv, wo = f(H * D, E), f(G * D, E), f(G * D, E), f(E, H * D)
    cos, sin = (t.reshape(-1) for t in megafuse.rope_tables(D, C))
    k, v = f(G, C, D), f(G, C, D)                  # a history at positions < pos
    caches = [k, v, k.copy(), v.copy()]
    out_c, out_py = np.zeros(E, np.float32), np.zeros(E, np.float32)
    downstream.decode(out_c, x, gamma, wq, wk, wv, wo, caches[0], caches[1], cos, sin, pos,
                      E, H, G, D, C, np.zeros(2 * H * D, np.float32),
                      np.zeros(2 * G * D, np.float32))
    megafuse.mega_fused_attention_decode(out_py, x, x, gamma, wq, None, wk, None, wv, None, wo,
                                         None, caches[2], caches[3], cos, sin, pos, E, E, H, G,
                                         D, D, C, 1e-6)
    assert np.array_equal(out_c, out_py) and np.any(out_c != 0)
    assert np.array_equal(caches[0], caches[2])

    # prefill, prefill_q8_0 and the MLPs through c_<name>: the bits of the Python functions
    assert downstream.Q8_0 == megafuse.CK_DT_Q8_0
    T, I = 6, 256
    assert downstream.scratch_sizes(T, E, H, D, I) == (
        megafuse.mega_fused_attention_prefill_scratch_size(T, E, H, D),
        megafuse.mega_fused_attention_prefill_q8_0_scratch_size(T, E, H, D),
        megafuse.mega_fused_outproj_mlp_prefill_scratch_size(T, E, H, D, I),
        megafuse.mega_fused_mlp_prefill_scratch_size(T, E, I))
    assert downstream.scratch_sizes(0, E, H, D, I) == (2**64 - 1,) * 4   # SIZE_MAX: refused
    dt = megafuse.CK_DT_Q8_0
    q = lambda *s: megafuse.quantize(f(*s).reshape(s) / 8, dt)  # noqa: E731
    b = lambda w: w.reshape(-1).view(np.uint8)  # noqa: E731
    wq, wk, wv, wo = q(H * D, E), q(G * D, E), q(G * D, E), q(E, H * D)
    w1, w2 = q(2 * I, E), q(E, I)
    xs = rng.standard_normal((T, E)).astype(np.float32)
    for int8 in (False, True):
        fn = (megafuse.mega_fused_attention_prefill_q8_0 if int8
              else megafuse.mega_fused_attention_prefill)
        size = (megafuse.mega_fused_attention_prefill_q8_0_scratch_size if int8
                else megafuse.mega_fused_attention_prefill_scratch_size)(T, E, H, D)
        outs, kc = [], []
        for via_c in (True, False):
            out, ck, cv = np.zeros((T, E), np.float32), f(G * C * D) * 0, f(G * C * D) * 0
            scratch = np.zeros(size, np.uint8)
            if via_c:
                downstream.prefill(int8, out, xs, gamma, b(wq), b(wk), b(wv), b(wo), dt, ck, cv,
                                   cos, sin, T, C, E, H, G, D, scratch)
            else:
                fn(out, xs, xs, gamma, wq, None, dt, wk, None, dt, wv, None, dt, wo, None, dt,
                   ck, cv, cos, sin, 0, T, C, E, E, H, G, D, D, 1e-6, scratch)
            outs.append(out)
            kc.append(ck)
        assert np.array_equal(outs[0], outs[1]) and np.any(outs[0] != 0), int8
        assert np.array_equal(kc[0], kc[1]) and np.any(kc[0] != 0), int8
    for f32 in (False, True):
        fn = megafuse.mega_fused_mlp_prefill_f32 if f32 else megafuse.mega_fused_mlp_prefill
        outs = []
        for via_c in (True, False):
            out = np.zeros((T, E), np.float32)
            scratch = np.zeros(megafuse.mega_fused_mlp_prefill_scratch_size(T, E, I), np.uint8)
            if via_c:
                downstream.mlp(f32, out, xs, gamma, b(w1), b(w2), dt, T, E, I, scratch)
            else:
                fn(out, xs, xs, gamma, w1, None, dt, w2, None, dt, T, E, E, I, I, 1e-6, scratch)
            outs.append(out)
        assert np.array_equal(outs[0], outs[1]) and np.any(outs[0] != 0), f32
    attn = f(H, T, D)
    outs = []
    for via_c in (True, False):
        out = np.zeros((T, E), np.float32)
        scratch = np.zeros(megafuse.mega_fused_outproj_mlp_prefill_scratch_size(T, E, H, D, I),
                           np.uint8)
        if via_c:
            downstream.outproj_mlp(out, attn, gamma, b(wo), b(w1), b(w2), dt, T, E, H, D, I,
                                   scratch)
        else:
            megafuse.mega_fused_outproj_mlp_prefill(out, attn, None, gamma, wo, None, dt, w1,
                                                    None, dt, w2, None, dt, T, E, E, H, D, I, I,
                                                    1e-6, scratch)
        outs.append(out)
    assert np.array_equal(outs[0], outs[1]) and np.any(outs[0] != 0)
    print("downstream-ok", downstream.tiles(64))
''')


def _ignore(folder, names):
    """What a source distribution would not carry: VCS and build output, compiled modules,
    and the C files Cython generates (regenerated from the .pyx)."""
    skip = set()
    for name in names:
        build_output = name in SKIP_DIRS or name.endswith((".egg-info", ".so", ".pyd"))
        generated_c = (name.endswith(".c")
                       and os.path.exists(os.path.join(folder, name[:-2] + ".pyx")))
        stale = name == "_build_config.py"          # an older setup.py wrote it here
        if build_output or generated_c or stale:
            skip.add(name)
    return skip


def _run(cmd, cwd, env=None):
    done = subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=hang_timeout(900))
    assert done.returncode == 0, (f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def _clean_env():
    """The environment for the venv's processes: nothing pointing at the source tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _venv_python(venv):
    return os.path.join(venv, "Scripts", "python.exe") if os.name == "nt" else \
        os.path.join(venv, "bin", "python")


def _have_build_deps():
    """Whether this interpreter already satisfies pyproject.toml's [build-system] requires, so
    the wheel can be built without an isolated build environment. A venv made by `python -m
    venv` carries an old setuptools (65 on Python 3.11) that cannot read `license = "MIT"`:
    then pip must build in isolation, with the versions pyproject.toml asks for."""
    import importlib.metadata
    try:
        import tomllib
        from pip._vendor.packaging.requirements import Requirement
    except ImportError:
        return False
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        requires = tomllib.load(f)["build-system"]["requires"]
    for spec in requires:
        req = Requirement(spec)
        try:
            have = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            return False
        if not req.specifier.contains(have, prereleases=True):
            return False
    return True


def test_wheel_installs_into_a_fresh_venv_and_is_self_contained(tmp_path):
    if not os.path.isfile(os.path.join(ROOT, "setup.py")):
        pytest.skip("needs the source tree (setup.py) to build a wheel from")
    tmp = os.path.realpath(str(tmp_path))
    assert not tmp.startswith(os.path.realpath(ROOT) + os.sep)
    env = _clean_env()

    # 0. meanwhile (in the background): a fresh venv outside the source tree, with numpy,
    #    pytest, and what the downstream build needs (Cython, setuptools)
    venv = os.path.join(tmp, "venv")
    py = _venv_python(venv)
    venv_log = os.path.join(tmp, "venv.log")
    with open(venv_log, "w") as log:                # the child writes it through its own copy
        prepare = subprocess.Popen(
            f'"{sys.executable}" -m venv "{venv}" && "{py}" -m pip install -q numpy pytest '
            f'"Cython>=3.0" "setuptools>=64"', shell=True, cwd=tmp, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=os.name != "nt")

    try:
        # 1. the wheel, built from a copy of the sources (the working tree is left alone: no
        #    build/ folder, no regenerated .c files under other people's feet)
        src = os.path.join(tmp, "src")
        shutil.copytree(ROOT, src, ignore=_ignore)
        dist = os.path.join(tmp, "dist")
        cmd = [sys.executable, "-m", "pip", "wheel", src, "-w", dist, "--no-deps", "-q"]
        if _have_build_deps():
            cmd.append("--no-build-isolation")      # the build requirements are here already
        # compile the extensions in parallel (setuptools reads DIST_EXTRA_CONFIG)
        extra_cfg = os.path.join(tmp, "build-parallel.cfg")
        with open(extra_cfg, "w") as f:
            f.write(f"[build_ext]\nparallel = {max(2, os.cpu_count() or 1)}\n")
        _run(cmd, tmp, dict(env, DIST_EXTRA_CONFIG=extra_cfg))
        wheels = [f for f in os.listdir(dist)
                  if f.startswith("megafuse-") and f.endswith(".whl")]
        assert len(wheels) == 1, wheels
        wheel = os.path.join(dist, wheels[0])
        with zipfile.ZipFile(wheel) as whl:
            names = whl.namelist()
        for needed in ("megafuse/include/megafuse/mega_fused_attention.h",
                       "megafuse/_kernels.pxd", "megafuse/__init__.pyi", "megafuse/py.typed",
                       "megafuse/llm/layer.py", "megafuse/llm/gguf.py"):
            assert needed in names, needed
        assert not any(n.startswith("tests/") for n in names)

        # 2. the wheel into the fresh venv
        status = prepare.wait(timeout=hang_timeout(900))
        with open(venv_log) as log:
            assert status == 0, f"creating the venv failed:\n{log.read()[-3000:]}"
        _run([py, "-m", "pip", "install", "-q", "--no-deps", wheel], tmp, env)

    finally:
        if prepare.poll() is None:                 # a failure above: stop it (and its pip)
            if os.name != "nt":
                os.killpg(prepare.pid, signal.SIGKILL)
            else:
                prepare.kill()
            prepare.wait()

    # 3. imported from site-packages, headers and .pxd shipped, the kernels run
    check = os.path.join(tmp, "check_installed.py")
    with open(check, "w") as f:
        f.write(CHECK_INSTALLED)
    out = _run([py, check, ROOT], tmp, env)
    assert "installed-ok" in out

    # 4. a downstream Cython extension cimports megafuse._kernels and calls the C functions
    down = os.path.join(tmp, "downstream")
    os.makedirs(down)
    for name, text in (("downstream.pyx", DOWNSTREAM_PYX), ("setup.py", DOWNSTREAM_SETUP),
                       ("run.py", DOWNSTREAM_RUN)):
        with open(os.path.join(down, name), "w") as f:
            f.write(text)
    _run([py, "setup.py", "-q", "build_ext", "--inplace"], down, env)
    assert "downstream-ok" in _run([py, "run.py"], down, env)

    # 5. tests against the installed package (the rest of the suite needs more test extras)
    out = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", tmp,
                os.path.join(ROOT, "tests", "llm", "test_layer.py")], tmp, env)
    assert " passed" in out
