"""The sandbox past one machine: ``RemoteBackend`` (the client, ``sandbox.backend: remote``), ``molrl sandbox serve``
(the server), their protocol, and the harness that carries a job over SandboxFusion's ``run_code``."""
