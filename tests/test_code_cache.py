"""The simulator's generated code is compiled once per (source, filename): one code object
serves every namespace it runs in, each build keeping its own globals."""

from popxl_core.sim.code_cache import compiled


def test_one_code_object_runs_in_separate_namespaces():
    src = "def f():\n    return K\n"
    code = compiled(src, "<test code cache>")
    assert compiled(src, "<test code cache>") is code
    a, b = {"K": 1}, {"K": 2}
    exec(code, a)
    exec(code, b)
    assert (a["f"](), b["f"]()) == (1, 2)
    assert a["f"] is not b["f"]


def test_a_different_source_or_filename_is_compiled_anew():
    src = "x = 1\n"
    assert compiled(src, "<a>") is not compiled(src, "<b>")
    assert compiled(src, "<a>") is not compiled("x = 2\n", "<a>")
    assert compiled(src, "<b>").co_filename == "<b>"
