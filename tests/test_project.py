"""The project's housekeeping: the build configuration compiled into the package."""
import io

import megafuse


def test_build_configuration_is_compiled_in():
    from megafuse import _build_info, _simd

    config = _build_info.BUILD_CONFIG
    assert set(config) >= {"compile_flags", "simd_flags", "openmp", "debug", "simd_levels"}
    assert isinstance(config["openmp"], bool) and isinstance(config["debug"], bool)
    assert set(_simd.built_levels()) <= set(config["simd_levels"]) == set(config["simd_flags"])
    shown = megafuse.show_config(file=io.StringIO())
    assert shown["compiler_flags"] == config["compile_flags"] != "unknown"
    assert shown["openmp"] is config["openmp"] and shown["debug_build"] is config["debug"]
    assert shown["version"] == megafuse.__version__
