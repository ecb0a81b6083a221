"""cuvil-opt's exit statuses and streams (its output is checked in depth by tests/filecheck)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from cuvil.tools.cuvil_opt import main

GOOD = """cuvil.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %n1 = cuvil.neg %x : tensor<4xf32> -> tensor<4xf32>
  %n2 = cuvil.neg %n1 : tensor<4xf32> -> tensor<4xf32>
  cuvil.return %n2 : tensor<4xf32>
}
"""
SIMPLIFIED = """cuvil.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  cuvil.return %x : tensor<4xf32>
}
"""


@pytest.fixture
def source(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "in.cvl"
        path.write_text(text)
        return str(path)
    return write


def test_success_prints_the_result(source, capsys):
    assert main([source(GOOD), "-p", "canonicalize"]) == 0
    out = capsys.readouterr()
    assert out.out == SIMPLIFIED and out.err == ""


def test_output_file(source, tmp_path, capsys):
    target = tmp_path / "out.cvl"
    assert main([source(GOOD), "-p", "canonicalize", "-o", str(target)]) == 0
    assert target.read_text() == SIMPLIFIED and capsys.readouterr().out == ""


def test_bad_ir_exits_1_with_the_location(source, capsys):
    path = source(GOOD.replace("%n1 : tensor<4xf32> -> tensor<4xf32>", "%n9 : tensor<4xf32> -> tensor<4xf32>"))
    assert main([path]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == [f"{path}:3:19: error: use of undefined value '%n9'",
                                    "  %n2 = cuvil.neg %n9 : tensor<4xf32> -> tensor<4xf32>",
                                    "                  ^"]


def test_bad_pipeline_and_missing_file_exit_2(source, capsys):
    assert main([source(GOOD), "-p", "canonicalize{fold=1}"]) == 2
    assert "unknown option 'fold' for pass 'canonicalize'" in capsys.readouterr().err
    assert main(["/nonexistent/in.cvl"]) == 2
    assert "No such file or directory" in capsys.readouterr().err


def test_split_input_file_reports_every_chunk_and_fails_if_any_did(source, capsys):
    bad = "cuvil.func @g(%x: tensor<4xf32>) -> tensor<4xf32> {\n  cuvil.return %y : tensor<4xf32>\n}\n"
    path = source(GOOD + "// -----\n" + bad)
    assert main([path, "--split-input-file", "-p", "canonicalize"]) == 1
    out = capsys.readouterr()
    assert out.out == SIMPLIFIED + "// -----\n"
    assert out.err.startswith(f"{path}:8:16: error: use of undefined value '%y'")
    assert main([path, "--split-input-file", "--verify-diagnostics"]) == 0
    assert "8:16: error: use of undefined value '%y'" in capsys.readouterr().out


def test_console_entry_points_run_as_a_process(source):
    """`python -m cuvil.tools.cuvil_opt` works from stdin, and a parse error is no traceback."""
    ok = subprocess.run([sys.executable, "-m", "cuvil.tools.cuvil_opt", "-", "-p", "canonicalize"], input=GOOD,
                        capture_output=True, text=True, timeout=120)
    assert (ok.returncode, ok.stdout) == (0, SIMPLIFIED)
    bad = subprocess.run([sys.executable, "-m", "cuvil.tools.cuvil_opt", "-"], input="cuvil.func @f(",
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("<stdin>:1:15: error: ") and "Traceback" not in bad.stderr
