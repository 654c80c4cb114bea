"""Measurement tools that do not lie about this deployment (issue 10, gotchas 1, 6, 33, 42-52).

Each tool talks to any OpenAI-compatible server, prints a table and writes JSON that names the
compile-cache fingerprint and the build's series digest (gotcha 48). The scoring functions are
pure and live beside each tool so they can be tested without a server.
"""
