"""Code that runs inside the sandbox: the worker loop, the value codec and the seccomp filter.

Standard library only, and no imports from the rest of ``molrl``: this directory is bound read-only
into each sandbox as the only molrl code the sandboxed interpreter can see.
"""
