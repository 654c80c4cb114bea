"""The resolver's stages, one module each; ``qwen3090.plan.resolve`` runs them in order.

This package's ``__init__`` imports nothing, so a stage importing a sibling never runs the
others first (no import circle through the package).
"""
