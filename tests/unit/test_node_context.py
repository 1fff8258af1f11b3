"""A node's context: read as given (or the defaults), then its torch thread count applied on the node's thread."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from profiling_agent.nodes.common import apply_threads, context_of, read_context
from profiling_agent.state import Context


def test_reading_the_context_sets_no_threads_and_context_of_applies_them():
    before = torch.get_num_threads()
    want = before + 1
    runtime = SimpleNamespace(context={"threads": want, "not_a_setting": 3})  # another version's key is ignored
    try:
        assert read_context(runtime).threads == want and torch.get_num_threads() == before
        assert context_of(runtime).threads == want and torch.get_num_threads() == want
        apply_threads(Context())  # threads 0: torch's count stays as it is
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)
    assert read_context(None) == Context() and read_context(SimpleNamespace(context=None)) == Context()
    given = Context(threads=1)
    assert read_context(SimpleNamespace(context=given)) is given
