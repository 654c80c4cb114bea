"""Probe for xgrammar-spec-terminated: vLLM's XgrammarGrammar on a real xgrammar matcher.

The vocabulary is ten raw tokens and the grammar a JSON object, so ``{`` ``}`` completes it,
the stop token (id 7) terminates it, and a newline after that is what a speculative verify
window (or ``ignore_eos``) carries past the stop token.
"""

from __future__ import annotations

from typing import Any

from _result import report

VOCAB = ["{", "}", '"', "a", ":", " ", "\n", "<eos>", "1", ","]
OPEN, CLOSE, NEWLINE, STOP = 0, 1, 6, 7


def main() -> None:
    import xgrammar as xgr
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    info = xgr.TokenizerInfo(VOCAB, vocab_type=xgr.VocabType.RAW, stop_token_ids=[STOP])
    ctx = xgr.GrammarCompiler(info).compile_json_schema('{"type": "object"}',
                                                        any_whitespace=False)

    def grammar() -> Any:
        return XgrammarGrammar(vocab_size=len(VOCAB), matcher=xgr.GrammarMatcher(ctx), ctx=ctx)

    window = grammar()
    accepted_window = window.accept_tokens("r", [OPEN, CLOSE, STOP, NEWLINE])
    window_state = {"terminated": window.is_terminated(),
                    "num_processed_tokens": window.num_processed_tokens}
    accepted_after = window.accept_tokens("r", [NEWLINE])

    rejected = grammar().accept_tokens("r", [CLOSE])

    probe = grammar()
    validated = probe.validate_tokens([OPEN, CLOSE, STOP, NEWLINE])
    # validate_tokens must leave the matcher where it was: a fresh grammar's first token.
    still_fresh = probe.accept_tokens("r", [OPEN]) and not probe.is_terminated()

    done = grammar()
    done.accept_tokens("r", [OPEN, CLOSE, STOP])
    validated_after_stop = done.validate_tokens([NEWLINE])
    done.reset()
    reset_state = {"terminated": done.is_terminated(),
                   "accepts_again": done.accept_tokens("r", [OPEN, CLOSE, STOP])}

    report({
        "window_accepted": accepted_window,
        "window_state": window_state,
        "accepted_after_termination": accepted_after,
        "mid_grammar_rejection_accepted": rejected,
        "validated": validated,
        "validate_rolled_back": still_fresh,
        "validated_after_termination": validated_after_stop,
        "after_reset": reset_state,
    })


if __name__ == "__main__":
    main()
