"""Run records: atomic writes, locks, JSONL, run files, re-run rules, inputs, provenance, fingerprints."""
