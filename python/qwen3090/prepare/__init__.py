"""Model preparation (``qwen3090 prepare``): steps that derive files from a checkpoint and
record them, checksummed, in a manifest beside it (:mod:`qwen3090.prepare.record`)."""
