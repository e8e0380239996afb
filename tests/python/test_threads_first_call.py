"""Threads whose first cubevec call is also the process's first NumPy array (NumPy not imported by
the caller): a deadlock on pybind11's one-time NumPy setup before the module made it at import."""

import os
import subprocess
import sys

SOURCE = os.environ.get("CUBEVEC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def test_eight_threads_first_calls_without_numpy_imported_finish(tmp_path):
    script = tmp_path / "first_calls.py"
    script.write_text(f"""
import threading, cubevec
pipe = cubevec.FluxPipeline.from_pretrained({os.path.join(SOURCE, "assets", "tinyflux")!r})
threads = [threading.Thread(target=lambda: pipe(prompt="a red circle", num_inference_steps=2, width=32, height=32,
                                                output_type="np")) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("done")
""")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
