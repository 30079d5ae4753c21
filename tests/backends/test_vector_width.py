"""The numba backend turns LLVM's 256-bit preference off on AVX-512 hosts, before numba compiles
anything and only where the user left numba's CPU settings alone (``vector_width``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tensorlogic.backends.numba.vector_width import features_without_preference

# the host features a fake AVX-512 host reports: nothing is compiled under them here (this
# machine may not run AVX-512 code), the child only reports numba's configuration
_CHILD = """
import os, sys
import llvmlite.binding as llvm
class _Features:
    def flatten(self):
        return "+avx2,+avx512f,+fma,+prefer-256-bit"
llvm.get_host_cpu_features = lambda: _Features()
if sys.argv[1] == "compiled-first":
    import numba
    numba.njit(lambda x: x + 1)(1)
import numba
import tensorlogic.backends.numba as nb
print(os.environ.get("NUMBA_CPU_FEATURES"), numba.config.CPU_FEATURES, sep="|")
"""


def _child(mode: str, **env) -> list[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    full.pop("TL_NUMBA_WIDE_VECTORS", None)
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join([os.getcwd(), full.get("PYTHONPATH", "")])
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, mode],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1].split("|")


def test_feature_string():
    assert features_without_preference("+avx2,+avx512f,+prefer-256-bit") == (
        "+avx2,+avx512f,-prefer-256-bit"
    )
    assert features_without_preference("+avx2,+avx512f") == "+avx2,+avx512f,-prefer-256-bit"
    assert features_without_preference("+avx2,-avx512f,+fma") is None  # no AVX-512: unchanged
    assert features_without_preference("") is None


@pytest.mark.parametrize(
    "mode,env,expect",
    [
        ("fresh", {}, "+avx2,+avx512f,+fma,-prefer-256-bit"),
        ("fresh", {"TL_NUMBA_WIDE_VECTORS": "0"}, None),  # turned off
        ("fresh", {"NUMBA_CPU_NAME": "generic"}, None),  # the user's numba settings stand
        ("compiled-first", {}, None),  # numba's target is fixed once it has compiled
    ],
)
def test_set_only_where_it_applies_to_the_whole_process(mode, env, expect):
    in_env, in_config = _child(mode, **env)
    if expect is None:
        assert in_env == "None" and in_config in ("None", "")
    else:
        assert in_env == expect and in_config == expect
