"""Generation engines: the choice rule, the backends (transformers, vLLM, the server tier), export."""
