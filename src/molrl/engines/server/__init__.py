"""molrl's client to a tier of vLLM servers (``engine: vllm_server``, ``engine_servers: [URL, ...]``).

The servers are vLLM's own OpenAI-compatible server, started by ``molrl serve`` (or by hand with the same flags);
molrl writes only the client and the sync. Token ids in, sampled ids and their processed log-probs out, one request
per row (``client``); requests spread over the servers, each to the one with the fewest outstanding, and resent
when a server dies (``pool``); the trained adapter is saved under ``engine_sync_dir`` and loaded on every server
under a new name after each optimiser step (``sync``); ``generator`` is the eval and collect stages' generator on it.
This package imports neither torch nor vLLM.
"""
