"""Running molrl's sandbox jobs on sandbox servers elsewhere.

``harness``: one raw job carried over a SandboxFusion-style ``POST /run_code`` server inside a harness program, with the
verdict still decided by ``SandboxPool`` here (see docs/sandbox.md, "run_code servers").
"""
