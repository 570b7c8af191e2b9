# How this installation of megafuse was built, for megafuse.show_config().
#
# setup.py generates megafuse_build_config.h in its build directory (never in the source tree)
# and compiles it into this module, so the configuration travels with the binaries: an in-place
# build, an editable install and a wheel each report their own.

import json

cdef extern from "megafuse_build_config.h":
    const char *MF_BUILD_CONFIG_JSON   # a JSON object: compile_flags, simd_flags, openmp, ...

BUILD_CONFIG = json.loads((<bytes>MF_BUILD_CONFIG_JSON).decode("utf-8"))
