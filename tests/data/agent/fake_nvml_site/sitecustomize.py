"""Test-only: makes ``pynvml`` answer from a FakeNvml fixture in every Python process.

``tests/agent/test_agent_gpu_capture.py`` puts this folder first on PYTHONPATH and names
the fixture in TANDEM_FAKE_NVML, so the capture script's subprocesses (agent,
summary, inner pytest) see the scripted GPUs of that file through the real
module's names. Nothing outside that test puts this folder on the path.
"""

import json
import os

fixture = os.environ.get("TANDEM_FAKE_NVML")
if fixture:
    import pynvml

    from lab.fakes.nvml import FakeNvml

    with open(fixture, encoding="utf-8") as fh:
        _fake = FakeNvml.from_json(json.load(fh))
    for _name in dir(_fake):
        if _name.startswith("nvml") and callable(getattr(_fake, _name)):
            setattr(pynvml, _name, getattr(_fake, _name))
