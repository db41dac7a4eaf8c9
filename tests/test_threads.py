"""How OpenMP threads wait (util/threads.py): set before torch loads, never over the user's choice."""

import subprocess
import sys

from evo_attention.util import threads


def test_configure_sets_the_wait_settings_unless_the_user_chose():
    env = {}
    assert threads.configure(env) == "GOMP_SPINCOUNT=1000" and env == threads.SETTINGS
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    assert "the user's settings (OMP_WAIT_POLICY=PASSIVE)" == threads.configure(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {threads.OFF: "off"}
    assert threads.configure(env).startswith("OpenMP's defaults") and env == {threads.OFF: "off"}


def test_importing_the_library_sets_them_before_torch_loads():
    code = ("import os, sys; import evo_attention; from evo_attention.util import threads; "
            "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules, threads.state())")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split()[:2] == ["1000", "True"], out.stderr
    late = subprocess.run([sys.executable, "-c", "import torch; " + code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert late.stdout.startswith("None True OpenMP's defaults (torch was imported before"), late.stderr
