"""The sandbox past one machine: ``RemoteBackend`` (client), ``molrl sandbox serve`` (server), their protocol, and
the harness that carries a job over SandboxFusion's ``run_code``."""
