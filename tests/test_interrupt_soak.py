"""The Ctrl-C soak (`benchmarks.interrupt_soak`) in short: no face wedges, no env is lost."""

from __future__ import annotations

import pytest

from benchmarks.interrupt_soak import FACES, soak


@pytest.mark.long
@pytest.mark.parametrize("face", FACES)
def test_random_sigints_into_every_verb_wedge_nothing_and_lose_nothing(face):
    """500 calls of `face` cut by real SIGINTs at random moments: every next call works."""
    counts = soak(face, signals=500, seed=1)
    assert counts["interrupts"] == 500
    assert counts["signals"] >= 500  # (and a few that arrived once their call was over)
    assert counts["wedges"] == 0
    assert counts["lost"] == 0
