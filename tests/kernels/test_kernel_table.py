"""The Cython mirror of the model step's C structs (megafuse/kernels/kernel_table.pxd) against
their one definition (include/megafuse/mf_model.h).

Cython takes an extern struct's layout from the C header, so offsets cannot drift; what can
drift is a field the mirror names with another type (a conversion Cython would then generate
wrongly) or a field of the model the mirror leaves out (one the boundary then never fills).  So
the model's structs must be mirrored whole -- the same fields, in order, with the same types --
and the step's structs field by field for what the mirror declares."""
import os
import re

import pytest

from helpers import ROOT

HEADER = os.path.join(ROOT, "include", "megafuse", "mf_model.h")
MIRROR = os.path.join(ROOT, "megafuse", "kernels", "kernel_table.pxd")
WHOLE = ("mf_model_layer", "mf_model", "mf_one_token_plan",
         "mf_segment")                              # every field mirrored
PARTIAL = ("mf_step_scratch", "mf_lane", "mf_phase", "mf_step")   # the fields Cython uses


def _declarations(text):
    """[(type, name)] of declarations like 'const void *wq, *wk' or 'int a, b' or 'T x[8]'."""
    out = []
    for decl in text:
        decl = " ".join(decl.replace("volatile", "").split())
        if not decl:
            continue
        first, *others = decl.split(",")
        m = re.match(r"^(.*?)(\**)\s*([A-Za-z_]\w*)\s*(\[[^\]]*\])?$", first.strip())
        base = m.group(1).strip()
        for item in [first[m.start(2):]] + others:
            d = re.match(r"^\s*(\**)\s*([A-Za-z_]\w*)\s*(\[[^\]]*\])?\s*$", item)
            out.append((base + d.group(1) + ("[]" if d.group(3) else ""), d.group(2)))
    return out


def c_struct(name):
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    m = re.search(r"typedef struct\s*\{([^{}]*)\}\s*" + name + r"\s*;", text)
    assert m, f"{name}: no typedef struct in mf_model.h"
    return _declarations(m.group(1).split(";"))


def pxd_struct(name):
    with open(MIRROR) as f:
        lines = f.read().split("\n")
    start = next(i for i, line in enumerate(lines)
                 if line.strip() == f"ctypedef struct {name}:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line.split("#")[0])
    return _declarations(body)


@pytest.mark.parametrize("name", WHOLE)
def test_the_model_structs_are_mirrored_whole(name):
    assert pxd_struct(name) == c_struct(name)


@pytest.mark.parametrize("name", PARTIAL)
def test_the_step_structs_mirror_declares_c_fields(name):
    c = {field: t for t, field in c_struct(name)}
    for t, field in pxd_struct(name):
        assert c.get(field) == t, f"{name}.{field}: mirrored as {t}, C has {c.get(field)}"


def test_the_parser_sees_what_the_header_says():
    """The comparison is not vacuous: the parser finds the fields the header spells."""
    fields = {n: t for t, n in c_struct("mf_model_layer")}
    assert fields["wq"] == "const void*" and fields["ln1_gamma"] == "const float*"
    assert fields["w2_dt"] == "int" and fields["k_cache"] == "void*"
    assert {n: t for t, n in c_struct("mf_phase")}["lanes"] == "mf_lane[]"
