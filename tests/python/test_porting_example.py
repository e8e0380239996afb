"""docs/porting-python.md's worked example (examples/port_flux_block.py) runs and passes: the f32 port
within 1e-5 of the NumPy reference, bf16 within 3e-2, and the rotate-half slip caught."""

import os
import subprocess

SOURCE = os.environ.get("CUBEVEC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def test_the_porting_example_passes_and_catches_the_slip():
    r = subprocess.run(["/usr/bin/python3", os.path.join(SOURCE, "examples", "port_flux_block.py")], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("f32 port") and line.endswith("within") for line in lines), r.stdout
    assert any(line.startswith("rotate-half slip") and line.endswith("OUTSIDE") for line in lines), r.stdout
